use mllm_dsl::prelude::*;

#[module]
struct Mlp {
    up_proj: Linear,
    #[module(skip, rename = "cache")]
    scratch: Linear,
}

fn main() {}

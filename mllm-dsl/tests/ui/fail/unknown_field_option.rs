use mllm_dsl::prelude::*;

#[module]
struct Mlp {
    #[module(name = "up_proj")]
    up: Linear,
}

fn main() {}

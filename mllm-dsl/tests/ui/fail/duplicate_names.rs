use mllm_dsl::prelude::*;

#[module]
struct Attention {
    #[module(rename = "o_proj")]
    out: Linear,
    o_proj: Linear,
}

fn main() {}

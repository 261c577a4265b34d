use mllm_dsl::prelude::*;

#[module(name = "mlp")]
struct Mlp {
    up_proj: Linear,
}

fn main() {}

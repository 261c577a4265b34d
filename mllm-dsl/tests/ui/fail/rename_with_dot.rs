use mllm_dsl::prelude::*;

#[module]
struct Mlp {
    #[module(rename = "mlp.up_proj")]
    up: Linear,
}

fn main() {}

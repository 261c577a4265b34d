use mllm_dsl::prelude::*;

#[module]
struct Mlp {
    up_proj: Linear,
}

#[module]
impl Mlp {
    fn forward(x: &Tensor) -> Result<Tensor> {
        x.silu()
    }
}

fn main() {}

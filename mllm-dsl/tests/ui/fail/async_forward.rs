use mllm_dsl::prelude::*;

#[module]
struct Mlp {
    up_proj: Linear,
}

#[module]
impl Mlp {
    async fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.up_proj.forward(x)
    }
}

fn main() {}

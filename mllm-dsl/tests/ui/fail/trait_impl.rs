use mllm_dsl::prelude::*;

#[module]
#[derive(Clone)]
struct Mlp {
    up_proj: Linear,
}

trait Forward {
    fn forward(&self, x: &Tensor) -> Result<Tensor>;
}

#[module]
impl Forward for Mlp {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.up_proj.forward(x)
    }
}

fn main() {}

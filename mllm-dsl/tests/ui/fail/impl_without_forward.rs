use mllm_dsl::prelude::*;

#[module]
struct Mlp {
    up_proj: Linear,
}

#[module]
impl Mlp {
    fn call(&self, x: &Tensor) -> Result<Tensor> {
        self.up_proj.forward(x)
    }
}

fn main() {}

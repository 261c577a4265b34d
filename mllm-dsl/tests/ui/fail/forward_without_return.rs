use mllm_dsl::prelude::*;

#[module]
struct Mlp {
    up_proj: Linear,
}

#[module]
impl Mlp {
    fn forward(&self, x: &Tensor) {
        let _ = self.up_proj.forward(x);
    }
}

fn main() {}

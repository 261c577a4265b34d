// Misuse inside a trait impl is reported like in an inherent impl, every problem in one build.
use mllm_dsl::prelude::*;

#[module]
struct Mlp {
    up_proj: Linear,
}

trait Forward {
    fn forward(x: &Tensor) -> Result<Tensor>;
    fn forward_rows(&self, x: &Tensor);
}

#[module]
impl Forward for Mlp {
    fn forward(x: &Tensor) -> Result<Tensor> {
        Ok(x.clone())
    }

    fn forward_rows(&self, _x: &Tensor) {}
}

fn main() {}

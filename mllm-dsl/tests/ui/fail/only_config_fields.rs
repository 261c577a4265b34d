use mllm_dsl::prelude::*;

#[module]
struct Config {
    hidden: usize,
    eps: f32,
    name: String,
    sizes: Vec<usize>,
    dtype: DType,
}

fn main() {}

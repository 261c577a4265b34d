use mllm_dsl::prelude::*;

#[module]
enum Layer {
    A(Linear),
    B(Conv2d),
}

fn main() {}

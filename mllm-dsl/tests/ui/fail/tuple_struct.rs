use mllm_dsl::prelude::*;

#[module]
struct Pair(Linear, Conv2d);

fn main() {}

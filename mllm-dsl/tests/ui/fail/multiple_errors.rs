// Every problem is reported in one build: two bad fields give two errors.
use mllm_dsl::prelude::*;

#[module]
struct Mlp {
    #[module(rename = "up.proj")]
    up: Linear,
    #[module(bogus)]
    down: Linear,
    gate: Linear,
}

fn main() {}

//! Text generation on the CPU from an HF checkpoint directory.
//!
//! ```text
//! cargo run --release --example generate -- --model fixtures/qwen3-dev-f32 --prompt-ids 5,17,42
//! ```
//! Prints `ids: a,b,c,…` (prompt then generated ids); with `--prompt` also the decoded text.
//!
//! A quantized checkpoint (mllm's pymllm export, or `quantize`'s output) runs in fake-quant mode:
//! weights, norms, embedding and RoPE tables are decoded from the file and every QDQ point
//! quantizes with its stored parameters. `--float` runs it without the QDQ points instead.

use clap::Parser;
use mllm_examples::generate_cli::{run_generate, GenerateArgs};

fn main() -> anyhow::Result<()> {
    for line in run_generate(&GenerateArgs::parse())? {
        println!("{line}");
    }
    Ok(())
}

//! The main job: an LLM checkpoint to QNN graphs ahead of time, with a per-stage accuracy ledger.
//!
//! ```text
//! cargo run --example qwen3_aot                       # the embedded tiny Qwen3, nothing to download
//! cargo run --release --example qwen3_aot -- --model HF_DIR --calib-ids calib.safetensors --out DIR
//! cargo run --release --example qwen3_aot -- --quantized PYMLLM_DIR --out DIR
//! ```
//!
//! `--help` documents every argument and the files written; the README walks through the flow
//! ("Compile a model ahead of time"). The logic is the `aot` crate ([`aot::run`]), the command
//! line [`mllm_examples::aot_cli`].

use clap::Parser;
use mllm_examples::aot_cli::{run_aot, AotArgs};

fn main() -> anyhow::Result<()> {
    let args = AotArgs::parse();
    let report = run_aot(&args)?;
    print!("{}", report.summary());
    println!("report: {}", args.options().out.join("report.json").display());
    Ok(())
}

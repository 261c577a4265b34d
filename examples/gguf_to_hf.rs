//! Converts a llama-architecture GGUF file into a Hugging Face checkpoint directory with the
//! project's own reader (`checkpoint::gguf`): f32 `model.safetensors`, `config.json`,
//! `generation_config.json`, `tokenizer.json`, `tokenizer_config.json` (with the chat template).
//!
//! ```text
//! cargo run --release --example gguf_to_hf -- SmolLM2-135M-Instruct.Q4_1.gguf smollm2-hf
//! ```
//! OUT_DIR must not exist; it appears complete or not at all (written to a temporary sibling,
//! then renamed).

use anyhow::Result;
use clap::Parser;
use std::path::PathBuf;
use std::time::Instant;

#[derive(Parser, Debug)]
#[command(about = "Convert a llama GGUF file into an HF checkpoint directory")]
struct Args {
    /// The GGUF file.
    gguf: PathBuf,
    /// The HF directory to create (must not exist).
    out_dir: PathBuf,
}

fn main() -> Result<()> {
    let args = Args::parse();
    let t0 = Instant::now();
    let gguf = checkpoint::gguf::GgufFile::open(&args.gguf)?;
    checkpoint::gguf::convert_to_hf_dir(&gguf, &args.out_dir)?;
    eprintln!("converted {} in {:.1} s", args.gguf.display(), t0.elapsed().as_secs_f64());
    println!("{}", args.out_dir.display());
    Ok(())
}

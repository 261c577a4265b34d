//! Converts a llama-architecture GGUF file into a Hugging Face checkpoint directory with the
//! project's own reader (`checkpoint::gguf`): f32 `model.safetensors`, `config.json`,
//! `generation_config.json`, `tokenizer.json`, `tokenizer_config.json` (with the chat template).
//!
//! ```text
//! cargo run --release -p checkpoint --example gguf_to_hf -- SmolLM2-135M-Instruct.Q4_1.gguf smollm2-hf
//! ```
//! OUT_DIR must not exist; it appears complete or not at all (written to a temporary sibling,
//! then renamed). It lives in the checkpoint crate so that `scripts/fetch-smollm2` builds only
//! this crate, not the backends.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

const USAGE: &str = "usage: gguf_to_hf GGUF_FILE OUT_DIR";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [gguf, out] = args.as_slice() else {
        eprintln!("{USAGE}");
        return ExitCode::from(2);
    };
    let (gguf, out) = (PathBuf::from(gguf), PathBuf::from(out));
    let t0 = Instant::now();
    let result =
        checkpoint::gguf::GgufFile::open(&gguf).and_then(|file| checkpoint::gguf::convert_to_hf_dir(&file, &out));
    match result {
        Ok(()) => {
            eprintln!("converted {} in {:.1} s", gguf.display(), t0.elapsed().as_secs_f64());
            println!("{}", out.display());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

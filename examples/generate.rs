//! Text generation on the CPU from an HF checkpoint directory.
//!
//! ```text
//! cargo run --release --example generate -- --model fixtures/qwen3-dev-f32 --prompt-ids 5,17,42
//! ```
//! Prints `ids: a,b,c,…` (prompt then generated ids); with `--prompt` the text first, as it is
//! produced. `--chat` applies the model's own chat template (`--system` sets the system prompt);
//! without `--prompt` it reads user turns from standard input, one per line:
//!
//! ```text
//! cargo run --release --example generate -- --model "$(scripts/fetch-smollm2)" --chat \
//!     --prompt "What is the capital of France?"
//! ```
//!
//! A quantized checkpoint (mllm's pymllm export, or `quantize`'s output) runs in fake-quant mode:
//! weights, norms, embedding and RoPE tables are decoded from the file and every QDQ point
//! quantizes with its stored parameters. `--float` runs it without the QDQ points instead.
//!
//! `--qnn-context FILE` generates from a QNN context binary built from the same quantized
//! checkpoint (graphs `model.0.s<chunk>` + `model.0.s1` at `--context`) instead of the CPU model.
//! Running it on the QNN SDK needs `--features qnn-sdk` and `QNN_SDK_ROOT` (without them the
//! error says so); `--qnn-emulate` runs it on the CPU, executing the graphs lowered again from
//! `--model` with backend-qnn's reference interpreter (`backend_qnn::sdk::EmulatedHtp`):
//!
//! ```text
//! cargo run --release --example generate -- --model fixtures/pymllm-qwen3-dev-f32 --prompt-ids 5,17,99 \
//!     --chunk 4 --context 16 --qnn-context qwen3-tiny.bin --qnn-emulate
//! ```

use clap::Parser;
use mllm_examples::generate_cli::{run_generate_io, GenerateArgs};

fn main() -> anyhow::Result<()> {
    let args = GenerateArgs::parse();
    // Text prompts stream their answer as it is produced; the summary lines follow.
    let stream = args.prompt.is_some() || args.chat;
    let mut stdout = std::io::stdout();
    for line in run_generate_io(&args, &mut std::io::stdin().lock(), &mut stdout, stream)? {
        println!("{line}");
    }
    Ok(())
}

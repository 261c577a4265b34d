//! Where a quantized checkpoint loses: the float model with one group of linears at a time (each
//! family, each layer) replaced by the checkpoint's int4 weights, scored on a text against float.
//!
//! ```text
//! cargo run --release --example loss_breakdown -- --model HF_DIR --quantized QDIR \
//!     --text fixtures/text/eval.txt [--rotation hadamard] [--json FILE]
//! ```
//!
//! `--rotation` must be the one `QDIR` was quantized with. The logic is [`aot::loss_breakdown`].

use std::path::PathBuf;

use anyhow::Result;
use aot::loss_breakdown::{weight_loss_breakdown, BreakdownOptions};
use aot::text_quality::load_text_ids;
use clap::Parser;
use mllm_dsl::files::write_json_atomic;
use mllm_examples::ScoreFlags;

#[derive(Parser, Debug)]
#[command(about = "Weight-only loss of a quantized checkpoint per linear family and per layer")]
struct Args {
    /// HF float checkpoint directory the quantized one was made from (unrotated) or a GGUF file (converted once into the cache).
    #[arg(long, value_name = "HF_DIR|GGUF")]
    model: PathBuf,
    /// The quantized checkpoint (pymllm's format: `quantize`'s, `perplexity`'s or `qwen3_aot`'s output).
    #[arg(long, value_name = "DIR")]
    quantized: PathBuf,
    /// The rotation the checkpoint was quantized with (none, hadamard).
    #[arg(long, value_name = "ROTATION", default_value = "none")]
    rotation: backend_cpu::quant::Rotation,
    /// Evaluation text (plain UTF-8). Never the calibration text.
    #[arg(long, value_name = "FILE")]
    text: PathBuf,
    /// Tokens of the text scored (its first N).
    #[arg(long, value_name = "N", default_value_t = 256)]
    tokens: usize,
    /// Tokens per prefill window; each window starts with no past.
    #[arg(long, value_name = "N", default_value_t = 256)]
    window: usize,
    #[command(flatten)]
    flags: ScoreFlags,
}

fn main() -> Result<()> {
    let mut args = Args::parse();
    args.model = aot::resolve_model(&args.model)?;
    backend_cpu::kernels::set_num_threads(args.flags.threads)?;
    let ids = load_text_ids(&args.text, &args.model.join("tokenizer.json"), args.tokens)?;
    let rows = weight_loss_breakdown(&BreakdownOptions {
        model: args.model.clone(),
        quantized: args.quantized.clone(),
        rotation: args.rotation,
        ids,
        window: args.window,
        progress: aot::progress::bars(!args.flags.quiet),
    })?;
    println!(
        "{} with linears of {} (weights only) on the first {} predictions of {}",
        args.model.display(),
        args.quantized.display(),
        rows.rows[0].predictions,
        args.text.display()
    );
    print!("{}", rows.table());
    if let Some(path) = &args.flags.json {
        write_json_atomic(path, &rows.to_json())?;
    }
    Ok(())
}

//! Quantizes an HF float checkpoint for mllm's QNN AOT flow (W4A16, uint8 KV cache), in Rust:
//! calibration, LPBQ / uint16 weight quantization and export in pymllm's checkpoint format, then
//! an accuracy report of fake-quant against float.
//!
//! ```text
//! cargo run --release --example quantize -- --model HF_DIR [--aot-config JSON] \
//!     (--calib-ids FILE | --calib-text FILE) [--mllm-compatible] --out DIR
//! ```
//!
//! `--calib-ids`: safetensors with `calib_ids`, int64 `[N, L]` (each row one sequence).
//! `--calib-text`: a text file whose blank-line separated paragraphs are tokenized with the
//! model's `tokenizer.json` (with `--chat`, each as a user turn through the model's own chat template,
//! as pymllm does).
//! `--recipe mllm` (or `--mllm-compatible`) reproduces pymllm's calibration, quirks included; the
//! default is the best recipe of the model's family (`aot::recipe`), printed at the start. `DIR` receives `model.safetensors`, `config.json` (with
//! `linear_block_size`), the tokenizer files and `report.json`; `generate --model DIR` then runs
//! it in fake-quant mode.

use std::path::PathBuf;

use anyhow::{Context, Result};
use aot::{load_id_sequences, quantize, CalibSource, QuantizeOptions, RecipeName};
use clap::Parser;
use mllm_examples::RecipeFlags;
use models::hf::HfConfig;

#[derive(Parser, Debug)]
#[command(about = "Calibrate and quantize an HF checkpoint into pymllm's W4A16KV8 checkpoint format")]
struct Args {
    /// HF float checkpoint directory (config.json + safetensors) or a GGUF file (converted once into the cache).
    #[arg(long)]
    model: PathBuf,
    /// mllm QNN AOT config JSON (quant recipe, LPBQ block size); default: the built-in 1.7B one.
    #[arg(long)]
    aot_config: Option<PathBuf>,
    /// Calibration token ids: safetensors with `calib_ids`, int64 [N, L].
    #[arg(long, conflicts_with = "calib_text", required_unless_present = "calib_text")]
    calib_ids: Option<PathBuf>,
    /// Calibration text: paragraphs separated by blank lines, tokenized with tokenizer.json.
    #[arg(long)]
    calib_text: Option<PathBuf>,
    /// With --calib-text: each paragraph as a user turn through the model's own chat template
    /// (chat_template.jinja or tokenizer_config.json; Qwen3's in non-thinking mode).
    #[arg(long, requires = "calib_text")]
    chat: bool,
    /// With --calib-text: tokens kept per paragraph.
    #[arg(long, default_value_t = 1024)]
    max_length: usize,
    /// With --calib-text: paragraphs used.
    #[arg(long, default_value_t = 128)]
    num_samples: usize,
    /// Evaluation ids for the report: safetensors with `eval_ids` (or `input_ids`), int64 [N, L].
    /// Default: the calibration sequences.
    #[arg(long)]
    eval_ids: Option<PathBuf>,
    /// Reproduce pymllm's observed parameters (its calibration quirks included): `--recipe mllm`.
    #[arg(long)]
    mllm_compatible: bool,
    /// Rows of the RoPE tables (mllm_qualcomm_max_length).
    #[arg(long, default_value_t = 1024)]
    max_positions: usize,
    /// The quantization recipe (default: the best of the model's family, printed at the start).
    #[command(flatten)]
    recipe: RecipeFlags,
    /// Output directory, replaced whole when the run succeeds (built in a staging directory next
    /// to it; a failed run leaves it as it was). It may not be or contain --model.
    #[arg(long)]
    out: PathBuf,
    /// CPU threads (0: all cores; more than the machine has are capped with a warning).
    #[arg(long, default_value_t = 0)]
    threads: usize,
    /// No progress bars.
    #[arg(long)]
    quiet: bool,
}

fn main() -> Result<()> {
    let mut args = Args::parse();
    args.model = aot::resolve_model(&args.model)?;
    backend_cpu::kernels::set_num_threads(args.threads)?;
    let hf = HfConfig::from_dir(&args.model)?;
    let source = match (&args.calib_ids, &args.calib_text) {
        (Some(path), _) => CalibSource::Ids(path.clone()),
        (None, Some(path)) => CalibSource::Text { path: path.clone(), chat: args.chat },
        (None, None) => unreachable!("clap requires one calibration source"),
    };
    let calibration = source.load(&args.model, hf.vocab_size, args.max_length, args.num_samples)?;
    let evaluation = match &args.eval_ids {
        Some(path) => {
            let file = checkpoint::SafetensorsCheckpoint::open_file(path)
                .with_context(|| format!("opening {}", path.display()))?;
            let key = if file.contains("eval_ids") { "eval_ids" } else { "input_ids" };
            drop(file);
            Some(load_id_sequences(path, key, hf.vocab_size)?)
        }
        None => None,
    };
    // `--mllm-compatible` is the `mllm` recipe by another name.
    let mut recipe_flags = args.recipe.clone();
    if args.mllm_compatible {
        anyhow::ensure!(
            matches!(recipe_flags.recipe, None | Some(RecipeName::Mllm)),
            "--mllm-compatible is --recipe mllm; it cannot be combined with --recipe {}",
            recipe_flags.recipe.map_or("", RecipeName::name)
        );
        recipe_flags.recipe = Some(RecipeName::Mllm);
    }
    let chosen = recipe_flags.choose(Some((&args.model, &hf)))?;
    eprintln!("{}", chosen.line());
    let recipe = chosen.recipe;
    let mode = recipe.mode;
    let opts = QuantizeOptions {
        model: args.model.clone(),
        aot_config: args.aot_config.clone(),
        calibration,
        evaluation,
        mode,
        out: args.out.clone(),
        max_positions: args.max_positions,
        progress: aot::progress::bars(!args.quiet),
        weight_method: recipe.weight_method,
        act_ranges: recipe.act_ranges,
        rotation: recipe.rotation,
        sink_prefix: aot::sink_prefix_ids(&recipe.sink_prefix, &args.model, hf.vocab_size)
            .map_err(mllm_examples::with_flag_names)?,
        weight_budget: recipe.weight_budget,
    };
    let outcome = quantize(&opts).map_err(mllm_examples::with_flag_names)?;
    for w in &outcome.warnings {
        eprintln!("warning: {w}");
    }
    if let Some(mixed) = &outcome.mixed {
        print!("{}", mixed.table());
        println!("sensitivities measured in {:.1} s", outcome.sensitivity_seconds);
    }
    println!(
        "calibrated {} QDQ points ({} mode) on {} sequences in {:.1} s",
        outcome.calibration.params.len(),
        mode.name(),
        opts.calibration.len(),
        outcome.calibration_seconds
    );
    println!(
        "quantized {:.1} MB of weights (LPBQ block {}) and wrote {} in {:.1} s",
        outcome.weight_input_bytes as f64 / 1e6,
        outcome.block_size,
        args.out.display(),
        outcome.weight_seconds
    );
    if let Some(sink) = &outcome.sink_prefix {
        let (ids, clamped, values) = (&sink.ids, sink.clamped, sink.values);
        println!(
            "attention-sink prefix {ids:?}: its K/V shipped on the K/V grid ({clamped} of {values} values clamped)"
        );
    }
    print!("{}", outcome.report.table());
    println!("report: {}", args.out.join("report.json").display());
    Ok(())
}

//! Quantization quality the way users measure it: perplexity on a text, float vs fake-quant, with
//! mean KL(float‖quant), top-1 agreement with float, and the naive weight-only RTN baseline.
//!
//! ```text
//! cargo run --release --example perplexity -- --model HF_DIR --text fixtures/text/eval.txt \
//!     (--quantized QDIR | --calib-text fixtures/text/calibration.txt [--out DIR]) [--tokens 256]
//! ```
//!
//! `--quantized` scores a quantized checkpoint (pymllm's format, `quantize`'s or `qwen3_aot`'s
//! `quantized/`), repeatable; `--calib-text` / `--calib-ids` first calibrates and quantizes the model
//! with the W4A16KV8 recipe (`--aot-config`) into `--out`. The logic is [`aot::text_quality`].

use std::path::PathBuf;

use anyhow::Result;
use aot::text_quality::{load_text_ids, text_quality, RtnBaseline, TextQualityOptions};
use aot::{quantize, CalibSource, QuantizeOptions};
use clap::Parser;
use mllm_dsl::files::write_json_atomic;
use mllm_examples::{RecipeFlags, ScoreFlags};
use models::hf::HfConfig;

#[derive(Parser, Debug)]
#[command(about = "Perplexity, mean KL and top-1 agreement of quantized models against float on a text file")]
struct Args {
    /// HF float checkpoint directory (config.json, safetensors, tokenizer.json) or a GGUF file (converted once into the cache).
    #[arg(long, value_name = "HF_DIR|GGUF")]
    model: PathBuf,
    /// Evaluation text (plain UTF-8), tokenized with the model's tokenizer.json. Never the calibration text.
    #[arg(long, value_name = "FILE")]
    text: PathBuf,
    /// Tokens of the text scored (its first N).
    #[arg(long, value_name = "N", default_value_t = 256)]
    tokens: usize,
    /// Tokens per prefill window; each window starts with no past.
    #[arg(long, value_name = "N", default_value_t = 256)]
    window: usize,
    /// Quantized checkpoint to score in fake-quant mode (repeatable).
    #[arg(long, value_name = "DIR")]
    quantized: Vec<PathBuf>,
    /// Calibrate and quantize first on this text (paragraphs separated by blank lines); repeatable.
    #[arg(long, value_name = "FILE", conflicts_with = "calib_ids")]
    calib_text: Vec<PathBuf>,
    /// Calibrate and quantize the model first on these ids (safetensors `calib_ids`, int64 [N, L]).
    #[arg(long, value_name = "FILE")]
    calib_ids: Option<PathBuf>,
    /// mllm's QNN AOT config JSON for the calibration; default: the built-in W4A16KV8 one.
    #[arg(long, value_name = "JSON")]
    aot_config: Option<PathBuf>,
    /// Where the calibrated checkpoint goes. Default: <cargo target dir>/perplexity/quantized.
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// RTN baseline block size (input values per float scale).
    #[arg(long, value_name = "N", default_value_t = 16)]
    rtn_block: usize,
    /// RTN baseline bits.
    #[arg(long, value_name = "N", default_value_t = 4)]
    rtn_bits: u32,
    /// With --calib-text / --calib-ids: the quantization recipe (default: the best of the model's
    /// family, printed at the start).
    #[command(flatten)]
    recipe: RecipeFlags,
    /// Skip the RTN baseline.
    #[arg(long)]
    no_rtn: bool,
    /// Also score the float model with bf16 products: each linear's input rounded to bf16, as
    /// `bench_cpu --variants bf16-products` runs it (bf16 weights only).
    #[arg(long)]
    bf16_products: bool,
    #[command(flatten)]
    flags: ScoreFlags,
}

fn main() -> Result<()> {
    run(Args::parse()).map_err(mllm_examples::with_flag_names)
}

fn run(mut args: Args) -> Result<()> {
    args.model = aot::resolve_model(&args.model)?;
    backend_cpu::kernels::set_num_threads(args.flags.threads)?;
    let hf = HfConfig::from_dir(&args.model)?;
    let mut quantized: Vec<(String, PathBuf)> =
        args.quantized.iter().map(|d| (format!("fake-quant {}", d.display()), d.clone())).collect();

    // 1. Calibrate and quantize first, when asked to.
    let sources: Vec<CalibSource> = match &args.calib_ids {
        Some(path) => vec![CalibSource::Ids(path.clone())],
        None => args.calib_text.iter().map(|p| CalibSource::Text { path: p.clone(), chat: false }).collect(),
    };
    let calibration = if sources.is_empty() {
        None
    } else {
        Some(CalibSource::load_all(&sources, &args.model, hf.vocab_size, 1024, 128)?)
    };
    anyhow::ensure!(
        !args.recipe.any() || calibration.is_some(),
        "--recipe, --weight-method, --act-range, --rotation and --sink-prefix are chosen when calibrating \
         (--calib-text / --calib-ids); a --quantized checkpoint brings its own and is scored as it is"
    );
    if let Some(calibration) = calibration {
        let chosen = args.recipe.choose(Some((&args.model, &hf)))?;
        eprintln!("{}", chosen.line());
        let recipe = chosen.recipe;
        let sink_prefix = aot::sink_prefix_ids(&recipe.sink_prefix, &args.model, hf.vocab_size)?;
        let out = args.out.clone().unwrap_or_else(|| aot::default_out_dir("perplexity").join("quantized"));
        let outcome = quantize(&QuantizeOptions {
            model: args.model.clone(),
            aot_config: args.aot_config.clone(),
            calibration,
            evaluation: None,
            mode: recipe.mode,
            out: out.clone(),
            max_positions: 1024,
            progress: aot::progress::bars(!args.flags.quiet),
            weight_method: recipe.weight_method,
            act_ranges: recipe.act_ranges,
            rotation: recipe.rotation,
            sink_prefix,
            weight_budget: recipe.weight_budget,
        })?;
        outcome.warnings.iter().for_each(|w| eprintln!("warning: {w}"));
        if let Some(mixed) = &outcome.mixed {
            eprint!("{}", mixed.table());
            eprintln!("sensitivities measured in {:.1} s", outcome.sensitivity_seconds);
        }
        let (calibrated, quantized_s) = (outcome.calibration_seconds, outcome.weight_seconds);
        eprintln!("calibrated in {calibrated:.1} s, quantized in {quantized_s:.1} s into {}", out.display());
        if let Some((point, range)) = aot::calibrate::largest_residual_range(&outcome.calibration) {
            eprintln!("largest residual-stream range {range:.1} (u16 step {:.4}) at {point}", range / 65535.0);
        }
        quantized.insert(0, ("W4A16KV8 fake-quant".to_string(), out));
    }

    // 2. Score.
    let ids = load_text_ids(&args.text, &args.model.join("tokenizer.json"), args.tokens)?;
    let quality = text_quality(&TextQualityOptions {
        model: args.model.clone(),
        quantized,
        rtn: (!args.no_rtn).then_some(RtnBaseline { bits: args.rtn_bits, block: args.rtn_block }),
        bf16_products: args.bf16_products,
        ids,
        window: args.window,
        progress: aot::progress::bars(!args.flags.quiet),
    })?;
    println!(
        "{} on the first {} predictions of {} ({} window(s) of <= {} tokens)",
        args.model.display(),
        quality.rows[0].predictions,
        args.text.display(),
        quality.windows,
        args.window
    );
    print!("{}", quality.table());
    if let Some(path) = &args.flags.json {
        write_json_atomic(path, &quality.to_json())?;
    }
    Ok(())
}

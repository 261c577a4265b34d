//! Exports an HF float checkpoint as AscendV1 (msModelSlim's format for Huawei Ascend NPUs,
//! loaded by MindIE and vLLM Ascend), calibrated on the CPU with the same model file as the QNN
//! path, and optionally scores the export's fake-quant run against float on a text.
//!
//! ```text
//! cargo run --release --example export_ascend -- --model HF_DIR (--calib-ids FILE | --calib-text FILE) \
//!     --quant-type W8A8 [--float PATTERN]... [--kv-c8] [--rotation hadamard] [--part-file-size GB] --out DIR \
//!     [--group-size G [--weight-method rtn|mse|gptq]] \
//!     [--eval-text FILE [--eval-tokens N]]
//! ```
//!
//! Quant types: FLOAT, W8A16, W8A8 (static), W8A8_DYNAMIC, W4A8_DYNAMIC. `--float` keeps the
//! linears a pattern names in float (`lm_head`, `model.layers.0`, `model.layers.*.mlp.down_proj`).
//! The logic is [`aot::ascend`]; docs/ascend.md has the figures.

use std::path::PathBuf;

use anyhow::Result;
use aot::ascend::{ascend_quality, export_ascend, AscendOptions, QuantType};
use aot::text_quality::load_text_ids;
use aot::CalibSource;
use clap::Parser;
use mllm_dsl::files::write_json_atomic;
use models::hf::HfConfig;

#[derive(Parser, Debug)]
#[command(about = "Calibrate an HF checkpoint and export it as AscendV1 (msModelSlim's format for Ascend NPUs)")]
struct Args {
    /// HF float checkpoint directory or a GGUF file (converted once into the cache).
    #[arg(long, value_name = "HF_DIR|GGUF")]
    model: PathBuf,
    /// Calibration token ids: safetensors with `calib_ids`, int64 [N, L].
    #[arg(long, value_name = "FILE", conflicts_with = "calib_text", required_unless_present = "calib_text")]
    calib_ids: Option<PathBuf>,
    /// Calibration text: paragraphs separated by blank lines, tokenized with tokenizer.json.
    #[arg(long, value_name = "FILE")]
    calib_text: Option<PathBuf>,
    /// With --calib-text: tokens kept per paragraph.
    #[arg(long, default_value_t = 512)]
    max_length: usize,
    /// With --calib-text: paragraphs used.
    #[arg(long, default_value_t = 64)]
    num_samples: usize,
    /// Quant type of every linear not kept float: FLOAT, W8A16, W8A8, W8A8_DYNAMIC or W4A8_DYNAMIC.
    #[arg(long, value_name = "TYPE")]
    quant_type: String,
    /// Keep the linears this pattern names FLOAT (repeatable): dotted segments (`lm_head`,
    /// `model.layers.0`) or a glob (`model.layers.*.mlp.down_proj`). Default: lm_head.
    #[arg(long = "float", value_name = "PATTERN", default_values_t = vec!["lm_head".to_string()])]
    float_patterns: Vec<String>,
    /// Quantize every linear, lm_head included (overrides the default --float lm_head).
    #[arg(long, conflicts_with = "float_patterns")]
    no_float: bool,
    /// Int8 KV cache (C8), per channel, symmetric.
    #[arg(long)]
    kv_c8: bool,
    /// Rotation folded into the float weights first: none or hadamard.
    #[arg(long, value_name = "ROTATION", default_value = "none")]
    rotation: backend_cpu::quant::Rotation,
    /// W4A8_DYNAMIC: int4 weights per group of this many inputs (the description's group_size, which
    /// vLLM Ascend's dense W4A8_DYNAMIC scheme needs); 0 keeps msModelSlim's per-channel weights.
    #[arg(long, value_name = "G", default_value_t = 0)]
    group_size: usize,
    /// With --group-size: how the int4 weights are chosen: rtn (max-abs step per group), mse or gptq
    /// (two-level scales searched with the calibration inputs' statistics; gptq rounds with error
    /// feedback), seqmse, seqmse-gptq.
    #[arg(long, value_name = "METHOD", default_value = "rtn")]
    weight_method: backend_cpu::quant::WeightMethod,
    /// Weight shard size in GB (msModelSlim's part_file_size); 0 writes one file without index.
    #[arg(long, value_name = "GB", default_value_t = 4)]
    part_file_size: u64,
    /// Output directory, replaced whole when the run succeeds.
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
    /// Then score the export's fake-quant run against float on this text (never the calibration text).
    #[arg(long, value_name = "FILE")]
    eval_text: Option<PathBuf>,
    /// Tokens of --eval-text scored.
    #[arg(long, value_name = "N", default_value_t = 512)]
    eval_tokens: usize,
    /// Tokens per evaluation window (each a prefill with no past).
    #[arg(long, value_name = "N", default_value_t = 256)]
    window: usize,
    /// RoPE rows of the calibration model.
    #[arg(long, default_value_t = 1024)]
    max_positions: usize,
    #[command(flatten)]
    flags: mllm_examples::ScoreFlags,
}

fn main() -> Result<()> {
    run(Args::parse()).map_err(|e| mllm_examples::with_names(e, mllm_examples::EXPORT_ASCEND_FLAG_NAMES))
}

fn run(mut args: Args) -> Result<()> {
    args.model = aot::resolve_model(&args.model)?;
    backend_cpu::kernels::set_num_threads(args.flags.threads)?;
    let quant_type: QuantType = args.quant_type.parse()?;
    let hf = HfConfig::from_dir(&args.model)?;
    let source = match (&args.calib_ids, &args.calib_text) {
        (Some(path), _) => CalibSource::Ids(path.clone()),
        (None, Some(path)) => CalibSource::Text { path: path.clone(), chat: false },
        (None, None) => unreachable!("clap requires one calibration source"),
    };
    let calibration = source.load(&args.model, hf.vocab_size, args.max_length, args.num_samples)?;
    let part_bytes = match args.part_file_size {
        0 => None,
        gb => Some(
            gb.checked_mul(1 << 30)
                .ok_or_else(|| anyhow::anyhow!("--part-file-size {gb}: {gb} GB does not fit a 64-bit byte count"))?,
        ),
    };
    let progress = aot::progress::bars(!args.flags.quiet);
    let outcome = export_ascend(&AscendOptions {
        model: args.model.clone(),
        calibration,
        quant_type,
        float_patterns: if args.no_float { Vec::new() } else { args.float_patterns.clone() },
        kv_c8: args.kv_c8,
        part_bytes,
        rotation: args.rotation,
        group_size: args.group_size,
        weight_method: args.weight_method,
        out: args.out.clone(),
        max_positions: args.max_positions,
        progress: progress.clone(),
    })?;
    let float = outcome.linears.iter().filter(|(_, t)| *t == QuantType::Float).count();
    println!(
        "wrote {} ({} tensors, {} shard(s), {:.1} MB) in {:.1} s: {} linears {}, {float} FLOAT, model_quant_type {}{}",
        args.out.display(),
        outcome.tensors,
        outcome.shards,
        outcome.bytes as f64 / 1e6,
        outcome.seconds,
        outcome.linears.len() - float,
        quant_type.tag(),
        outcome.model_quant_type,
        if outcome.kv_points > 0 { format!(", C8 on {} KV points", outcome.kv_points) } else { String::new() }
    );
    if let Some((linear, lo, hi)) = &outcome.widest_static_input {
        println!("widest static input range: [{lo:.2}, {hi:.2}] at {linear}");
    }
    if let Some(text) = &args.eval_text {
        let ids = load_text_ids(text, &args.model.join("tokenizer.json"), args.eval_tokens)?;
        let scratch = args.out.parent().map(PathBuf::from).unwrap_or_else(|| PathBuf::from("."));
        let name = format!("AscendV1 {}", quant_type.tag());
        let q = ascend_quality(&args.model, &[(name, args.out.clone())], &ids, args.window, &scratch, progress)?;
        println!("{} on the first {} predictions of {}", args.model.display(), q.rows[0].predictions, text.display());
        print!("{}", q.table());
        if let Some(path) = &args.flags.json {
            write_json_atomic(path, &q.to_json())?;
        }
    }
    Ok(())
}

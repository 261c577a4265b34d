//! Calibration and quantization beside the CPU executor: an HF float checkpoint becomes a
//! quantized checkpoint in pymllm's format, without Python. Trace the model file to learn its QDQ
//! points and parameters, calibrate on token sequences, quantize and write the weights, then
//! compare fake-quant against float ([`quantize`], [`evaluate`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use crate::error::{ensure, Context, Result};
use backend_cpu::quant::accuracy::Comparison;
use backend_cpu::quant::export::quantize_rope_tables;
use backend_cpu::quant::{
    is_quantized_checkpoint, plan_export, prefill_logits, quantize_weights_with, write_quantized_checkpoint,
    AccuracyReport, Calibration, CalibrationMode, CalibrationWeights, FakeQuantHook, InputStatsHook, LinearQuantizer,
    ObserverHook, QdqParams, RecordingHook, WeightMethod,
};
use backend_cpu::quant::{rotate_checkpoint, Rotation, RotationSummary};
use backend_cpu::{CheckpointStore, CpuBackend, QdqHook};
use checkpoint::SafetensorsCheckpoint;
use mllm_dsl::config::hf::HfConfig;
use mllm_dsl::files::{write_atomic_bytes as write_atomic, write_json_atomic};
use mllm_dsl::module::ParamSource;
use mllm_dsl::quant::act_range::ActRanges;
use mllm_dsl::quant::points::{concat_groups, layer_output_points, linear_inputs, qdq_points};
use mllm_dsl::{ParamFormat, Program, QdqAttr};

use crate::config::load_aot_config;
use crate::load::{build_model, open_model};
use crate::progress::Progress;
use crate::trace::trace_model;

/// Everything `quantize` needs.
pub struct QuantizeOptions {
    /// HF float checkpoint directory.
    pub model: PathBuf,
    /// mllm's QNN AOT config; the built-in W4A16KV8 one (block size 16) when absent.
    pub aot_config: Option<PathBuf>,
    pub calibration: Vec<Vec<i64>>,
    /// Sequences the accuracy report evaluates; the calibration sequences when absent.
    pub evaluation: Option<Vec<Vec<i64>>>,
    pub mode: CalibrationMode,
    pub out: PathBuf,
    /// Rows of the RoPE tables (`mllm_qualcomm_max_length`), 1024 in mllm.
    pub max_positions: usize,
    /// Where the long steps report progress ([`crate::progress::bars`] on a terminal).
    pub progress: std::sync::Arc<dyn Progress>,
    /// How linear weights are rounded (deployed mode only; `--mllm-compatible` is pymllm's).
    pub weight_method: WeightMethod,
    /// How activation and KV ranges are chosen (deployed mode only; `--mllm-compatible` is
    /// pymllm's min/max).
    pub act_ranges: ActRanges,
    /// Rotation folded into the float weights before anything else (deployed mode only).
    pub rotation: Rotation,
}

/// What `quantize` did.
pub struct QuantizeOutcome {
    pub calibration: Calibration,
    pub report: AccuracyReport,
    pub block_size: usize,
    pub weight_input_bytes: u64,
    pub weight_seconds: f64,
    pub calibration_seconds: f64,
    /// The input statistics pass of the weight method (0 for pymllm's rounding).
    pub input_stats_seconds: f64,
    /// The accuracy report: float and fake-quant runs over the evaluation sequences.
    pub evaluate_seconds: f64,
    pub warnings: Vec<String>,
    /// The model file traced once in decode shape with W4A16 parameters: what it quantizes (its
    /// QDQ points), for whoever runs the quantized checkpoint next.
    pub traced: Program,
    /// What the rotation folded in, when there was one.
    pub rotation: Option<RotationSummary>,
}

/// Calibrates `opts.model`, writes the quantized checkpoint (`model.safetensors`, `config.json`,
/// the tokenizer files) and `report.json` into `opts.out`, and evaluates fake-quant against float.
pub fn quantize(opts: &QuantizeOptions) -> Result<QuantizeOutcome> {
    let mut inputs = vec![opts.model.clone()];
    inputs.extend(opts.aot_config.clone());
    mllm_dsl::files::ensure_not_input(&opts.out, &inputs)?;
    let hf = HfConfig::from_dir(&opts.model)?;
    // Built aside and swapped in whole: a failed run leaves the previous `--out` as it was.
    let staging = mllm_dsl::files::StagingDir::new(&opts.out)?;
    let outcome = quantize_to(&hf, opts, staging.path())?;
    staging.commit()?;
    Ok(outcome)
}

/// Where the rotated float checkpoint is written inside the output while the run uses it.
const ROTATED_DIR: &str = "rotated-float";

/// [`quantize`] with the model's config already read (`hf` must be `opts.model`'s), writing
/// straight into `out` (a fresh directory: the caller's staging area).
///
/// With a rotation, the float checkpoint is rotated first into `out/rotated-float/` and everything
/// after (statistics, calibration, weights, the accuracy report) runs on that; it is deleted once
/// the quantized checkpoint is written.
pub(crate) fn quantize_to(hf: &HfConfig, opts: &QuantizeOptions, out: &Path) -> Result<QuantizeOutcome> {
    if opts.rotation == Rotation::None {
        return quantize_from(hf, &opts.model, opts, out);
    }
    ensure!(
        opts.mode != CalibrationMode::MllmCompatible,
        "--rotation {} is not part of pymllm's recipe; --mllm-compatible reproduces that recipe exactly, so use \
         --rotation none with it",
        opts.rotation.name()
    );
    let rotated = out.join(ROTATED_DIR);
    let summary = rotate_checkpoint(&opts.model, hf, &rotated)
        .with_context(|| format!("rotating {} into {}", opts.model.display(), rotated.display()))?;
    let rotated_hf = HfConfig::from_dir(&rotated)?;
    let mut outcome = quantize_from(&rotated_hf, &rotated, opts, out)?;
    std::fs::remove_dir_all(&rotated).with_context(|| format!("removing {}", rotated.display()))?;
    outcome.rotation = Some(summary);
    Ok(outcome)
}

/// [`quantize_to`] from the float checkpoint `model_dir` (config `hf`): `opts.model` itself or its
/// rotated copy.
fn quantize_from(hf: &HfConfig, model_dir: &Path, opts: &QuantizeOptions, out: &Path) -> Result<QuantizeOutcome> {
    ensure!(!opts.calibration.is_empty(), "no calibration sequences");
    let (aot, warnings) = load_aot_config(opts.aot_config.as_deref(), hf)?;
    let source = SafetensorsCheckpoint::open(model_dir)?;
    ensure!(
        !is_quantized_checkpoint(&source),
        "{} already holds a quantized checkpoint; calibrate from the float one",
        model_dir.display()
    );

    // 1. What the model file quantizes: QDQ points, concatenations, parameters.
    let qnn_program = trace_model(hf, opts.max_positions, ParamFormat::QnnW4A16)?;
    let aot_name = match &opts.aot_config {
        Some(p) => format!("AOT config {}", p.display()),
        None => "the built-in W4A16KV8 AOT config".to_string(),
    };
    let plan = plan_export(&qnn_program, &aot, hf.linear_block_size)
        .with_context(|| format!("checking {} against {aot_name}", hf.source.display()))?;
    let points = qdq_points(&qnn_program)?;
    let groups = concat_groups(&qnn_program);

    // 2. The linears' input statistics (float model) when the weight method uses them.
    let start = Instant::now();
    let weight_method =
        if opts.mode == CalibrationMode::MllmCompatible { WeightMethod::Rtn } else { opts.weight_method };
    let stats = if let Some(depth) = weight_method.input_stats() {
        let hook = Arc::new(InputStatsHook::new(&linear_inputs(&qnn_program), depth));
        let backend = CpuBackend::with_qdq(hook.clone());
        let store = CheckpointStore::open(model_dir, backend.clone(), hf.tie_word_embeddings)?;
        let model = build_model(hf, opts.max_positions, &ParamSource::Store(&store), model_dir)?;
        let pb = opts.progress.start("input stats", opts.calibration.len());
        for (i, seq) in opts.calibration.iter().enumerate() {
            prefill_logits(model.as_ref(), &backend, seq).with_context(|| format!("calibration sequence {i}"))?;
            pb.inc(1);
        }
        pb.finish();
        Some(Arc::new(hook.finish()?))
    } else {
        None
    };
    let collected = stats.is_some();
    let linears = LinearQuantizer::new(weight_method, stats)?;
    // With GPTQ this includes factorizing the input Hessians.
    let input_stats_seconds = if collected { start.elapsed().as_secs_f64() } else { 0.0 };

    // 3. Calibration.
    let start = Instant::now();
    let act_ranges = if opts.mode == CalibrationMode::MllmCompatible { ActRanges::default() } else { opts.act_ranges };
    let hook = Arc::new(ObserverHook::with_ranges(&points, &groups, opts.mode, act_ranges));
    let backend = CpuBackend::with_qdq(hook.clone());
    let calibration = {
        let store = CheckpointStore::for_config(model_dir, backend.clone(), hf)?;
        let weights = CalibrationWeights::new(&store, &aot, opts.mode).with_linears(&linears);
        let model = build_model(hf, opts.max_positions, &ParamSource::Store(&weights), model_dir)?;
        let pb = opts.progress.start("calibrating", opts.calibration.len());
        for (i, seq) in opts.calibration.iter().enumerate() {
            ensure!(
                seq.len() <= opts.max_positions,
                "calibration sequence {i} has {} tokens; the RoPE tables cover {}",
                seq.len(),
                opts.max_positions
            );
            prefill_logits(model.as_ref(), &backend, seq).with_context(|| format!("calibration sequence {i}"))?;
            pb.inc(1);
        }
        pb.finish();
        hook.finish()?
    };
    let calibration_seconds = start.elapsed().as_secs_f64();

    // 4. Weights, RoPE tables, QDQ parameters.
    let start = Instant::now();
    let groups_total = plan.params.len();
    let pb = opts.progress.start("quantizing", groups_total);
    let mut weights = quantize_weights_with(&plan, &source, hf.tie_word_embeddings, &linears, &|done, total, key| {
        pb.set_position(done, total);
        pb.set_message(key);
    })?;
    pb.set_message("done");
    pb.finish();
    weights.tensors.extend(quantize_rope_tables(&plan, &calibration.params, &calibration.rope_tables)?);
    write_quantized_checkpoint(out, &hf.source, plan.block_size, &weights.tensors, &calibration.params)?;
    copy_tokenizer_files(&opts.model, out)?;
    let weight_seconds = start.elapsed().as_secs_f64();
    drop(weights);

    // 5. Accuracy of what was written.
    let start = Instant::now();
    let eval = opts.evaluation.as_ref().unwrap_or(&opts.calibration);
    let eval_name = if opts.evaluation.is_some() { "evaluation ids" } else { "the calibration sequences" };
    let report =
        evaluate(hf, &qnn_program, model_dir, out, opts.max_positions, eval, eval_name, opts.progress.as_ref())?;
    let evaluate_seconds = start.elapsed().as_secs_f64();
    // Relative to the output's directory when the model sits next to it (the AOT run's embedded
    // model), so the report does not embed a per-run staging path.
    let model_name = out
        .parent()
        .and_then(|p| opts.model.strip_prefix(p).ok())
        .map_or_else(|| opts.model.display().to_string(), |r| r.display().to_string());
    let json = serde_json::json!({
        "model": model_name,
        "calibration_mode": opts.mode.name(),
        "weight_method": weight_method.name(),
        "act_range": act_ranges.to_string(),
        "rotation": opts.rotation.name(),
        "largest_residual_range": largest_residual_range(&calibration).map(|(point, range)| serde_json::json!({
            "point": point, "range": range, "u16_step": range / 65535.0,
        })),
        "calibration_sequences": opts.calibration.len(),
        "linear_block_size": plan.block_size,
        "qdq_points": calibration.params.len(),
        "accuracy": report.to_json(),
        "warnings": warnings,
    });
    write_json_atomic(&out.join("report.json"), &json)?;
    Ok(QuantizeOutcome {
        calibration,
        report,
        block_size: plan.block_size,
        weight_input_bytes: weights_input_bytes(&source, &plan),
        weight_seconds,
        calibration_seconds,
        input_stats_seconds,
        evaluate_seconds,
        warnings,
        traced: qnn_program,
        rotation: None,
    })
}

/// The residual-stream QDQ point with the widest calibrated range (`max - min`), which sets the
/// u16 step of the stream there: a massive activation stretches it, a rotation spreads it.
pub fn largest_residual_range(calibration: &Calibration) -> Option<(String, f32)> {
    let residual = |key: &str| {
        ["input_layernorm_input_qdq", "add_0_output_qdq", "model.norm_input_qdq"].iter().any(|s| key.ends_with(s))
    };
    calibration
        .ranges
        .iter()
        .filter(|(key, _)| residual(key))
        .map(|(key, (lo, hi))| (key.clone(), hi - lo))
        .max_by(|a, b| a.1.total_cmp(&b.1))
}

fn weights_input_bytes(source: &SafetensorsCheckpoint, plan: &backend_cpu::quant::ExportPlan) -> u64 {
    plan.params
        .iter()
        .filter_map(|p| source.info(p.key()).ok())
        .map(|(d, s)| (s.iter().product::<usize>() * d.bitsize() / 8) as u64)
        .sum()
}

/// Copies the tokenizer and generation files a checkpoint directory usually carries.
fn copy_tokenizer_files(from: &Path, to: &Path) -> Result<()> {
    for name in ["tokenizer.json", "tokenizer_config.json", "generation_config.json", "vocab.json", "merges.txt"] {
        let src = from.join(name);
        if src.is_file() {
            let bytes = std::fs::read(&src).with_context(|| format!("reading {}", src.display()))?;
            write_atomic(&to.join(name), &bytes)?;
        }
    }
    Ok(())
}

/// Runs `sequences` through the float checkpoint `float_dir` and the quantized one `quant_dir`
/// (fake-quant), one model at a time, recording each decoder layer's output, and compares them.
/// `hf` is the model's config and `traced` its model file traced once ([`trace_model`]): which
/// QDQ points there are and which of them are layer outputs.
#[allow(clippy::too_many_arguments)]
pub fn evaluate(
    hf: &HfConfig,
    traced: &Program,
    float_dir: &Path,
    quant_dir: &Path,
    max_positions: usize,
    sequences: &[Vec<i64>],
    what: &str,
    progress: &dyn Progress,
) -> Result<AccuracyReport> {
    let layers: Vec<(String, QdqAttr)> =
        layer_output_points(traced).into_iter().filter_map(|(s, p)| p.map(|p| (s, p))).collect();
    let keys: Vec<String> = layers.iter().map(|(_, p)| p.key.clone()).collect();

    let run = |dir: &Path, inner: Option<Arc<dyn QdqHook>>, label: &str| -> Result<(Vec<f32>, Vec<Vec<f32>>)> {
        let recorder = Arc::new(RecordingHook::new(inner, keys.clone()));
        let backend = CpuBackend::with_qdq(recorder.clone());
        let (model, _store) = open_model(dir, hf, max_positions, &backend)?;
        let pb = progress.start(label, sequences.len());
        let mut logits = Vec::new();
        for seq in sequences {
            logits.extend(prefill_logits(model.as_ref(), &backend, seq)?);
            pb.inc(1);
        }
        pb.finish();
        let per_layer = keys.iter().map(|k| recorder.take(k).concat()).collect();
        Ok((logits, per_layer))
    };

    let (float_logits, float_layers) = run(float_dir, None, "eval float")?;
    let quant_ckpt = SafetensorsCheckpoint::open(quant_dir)?;
    let params = QdqParams::from_checkpoint(&quant_ckpt, &qdq_points(traced)?)?;
    drop(quant_ckpt);
    let (quant_logits, quant_layers) = run(quant_dir, Some(Arc::new(FakeQuantHook::new(&params))), "eval quant")?;

    let mut rows = Vec::new();
    for ((symbol, point), (f, q)) in layers.iter().zip(float_layers.iter().zip(&quant_layers)) {
        let name = format!("{symbol} (at {})", point.key);
        rows.push(Comparison::new(name, f, q, hf.hidden_size)?);
    }
    rows.push(Comparison::new("logits", &float_logits, &quant_logits, hf.vocab_size)?);
    Ok(AccuracyReport {
        // No paths: the report is the same wherever the run writes (its `model` names the input).
        description: format!("fake-quant of the quantized checkpoint vs the float model on {what}"),
        sequences: sequences.len(),
        tokens: sequences.iter().map(Vec::len).sum(),
        rows,
    })
}

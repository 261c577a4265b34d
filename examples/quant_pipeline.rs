//! The quantization path from an HF float checkpoint to a quantized checkpoint in pymllm's
//! format, without Python: trace the model file to learn its QDQ points and parameters,
//! calibrate on token sequences, quantize and write the weights, then compare fake-quant against
//! float ([`quantize`]). Also the loader that runs a quantized checkpoint in fake-quant mode
//! ([`load_model`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, ensure, Context, Result};
use backend_cpu::quant::accuracy::Comparison;
use backend_cpu::quant::export::{quantize_rope_tables, write_atomic};
use backend_cpu::quant::{
    is_quantized_checkpoint, plan_export, prefill_logits, quantize_weights_with, write_quantized_checkpoint,
    AccuracyReport, Calibration, CalibrationMode, CalibrationWeights, FakeQuantHook, InputStatsHook, LinearQuantizer,
    ObserverHook, QdqParams, RecordingHook, WeightMethod,
};
use backend_cpu::{CheckpointStore, CpuBackend, CpuChunkModel, QdqHook};
use checkpoint::SafetensorsCheckpoint;
use indicatif::{ProgressBar, ProgressStyle};
use mllm_dsl::config::aot::AotConfig;
use mllm_dsl::config::hf::HfConfig;
use mllm_dsl::module::ParamSource;
use mllm_dsl::quant::points::{concat_groups, layer_output_points, linear_inputs, qdq_points};
use mllm_dsl::{trace, BackendRef, ParamFormat, Program, QdqAttr};
use models::TransformerConfig;

use crate::CpuModel;

/// RoPE table key whose shape tells how many positions a quantized checkpoint covers.
pub const ROPE_SIN_KEY: &str = "model.mllm_max_sin_embedding";

/// Traces the model file of `hf` once (decode shape: one token, one past position) with symbolic
/// parameters typed as `format`. Cheap: no weights are touched.
pub fn trace_model(hf: &HfConfig, max_positions: usize, format: ParamFormat) -> Result<Program> {
    trace_graph(hf, max_positions, 1, 2, format)
}

/// Traces the model file of `hf` for one graph: `chunk` new tokens, a mask `context` wide (the
/// past K/V cache holds `context - chunk` positions), parameters typed as `format`.
pub fn trace_graph(
    hf: &HfConfig,
    max_positions: usize,
    chunk: usize,
    context: usize,
    format: ParamFormat,
) -> Result<Program> {
    let cfg = TransformerConfig::from_hf(hf, max_positions);
    let mut model = models::build(hf, max_positions)?;
    model.bind_params(&ParamSource::Symbolic(format))?;
    let layers = cfg.num_hidden_layers;
    let inputs = models::io::trace_inputs(&cfg, chunk, context, format);
    let program = trace(&inputs, |t| model.forward(&t[0], &t[1], &t[2], &t[3..3 + layers], &t[3 + layers..]))
        .with_context(|| {
            format!("tracing the model file of {} (chunk {chunk}, context {context})", hf.source.display())
        })?;
    Ok(program)
}

/// mllm's QNN AOT config from `path`, or the built-in W4A16KV8 one (block size 16) with the
/// model's layer count; plus warnings about the pair.
pub fn load_aot_config(path: Option<&Path>, hf: &HfConfig) -> Result<(AotConfig, Vec<String>)> {
    let aot = match path {
        Some(p) => AotConfig::from_file(p)?,
        None => {
            let mut c = AotConfig::w4a16_kv8();
            c.quant_recipe.layers = hf.num_hidden_layers as u32;
            c
        }
    };
    let mut warnings = aot.warnings();
    if aot.quant_recipe.layers as usize != hf.num_hidden_layers {
        warnings.push(format!(
            "AOT config `quant_recipe.layers` is {} but the model has {} layers",
            aot.quant_recipe.layers, hf.num_hidden_layers
        ));
    }
    Ok((aot, warnings))
}

/// How to run a checkpoint directory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunMode {
    /// Fake-quant when the checkpoint is quantized (pymllm's export or this project's), else float.
    Auto,
    /// Float, even for a quantized checkpoint: its weights are decoded and QDQ points do nothing.
    Float,
}

/// Loads `dir` for eager CPU execution, in fake-quant mode when it holds a quantized checkpoint
/// (unless `mode` is [`RunMode::Float`]). A quantized checkpoint's RoPE tables fix how many
/// positions the model covers; `context_len` must not exceed them.
pub fn load_model(dir: &Path, context_len: usize, mode: RunMode) -> Result<CpuModel> {
    let ckpt = SafetensorsCheckpoint::open(dir)?;
    if !is_quantized_checkpoint(&ckpt) {
        return crate::load_float(dir, context_len);
    }
    let config = HfConfig::from_dir(dir)?;
    let max_positions = match ckpt.info(ROPE_SIN_KEY) {
        Ok((_, &[1, rows, _])) => rows,
        Ok((_, shape)) => bail!("{}: `{ROPE_SIN_KEY}` has shape {shape:?}, expected [1, L, head_dim]", dir.display()),
        Err(_) => context_len,
    };
    ensure!(
        context_len <= max_positions,
        "{}: the checkpoint's RoPE tables cover {max_positions} positions; a context of {context_len} needs more",
        dir.display()
    );
    let points = qdq_points(&trace_model(&config, max_positions, ParamFormat::Float)?)?;
    let (backend, used): (BackendRef, Vec<String>) = match mode {
        RunMode::Auto => {
            let params = QdqParams::from_checkpoint(&ckpt, &points)
                .with_context(|| format!("reading the QDQ parameters of {}", dir.display()))?;
            let hook: Arc<dyn QdqHook> = Arc::new(FakeQuantHook::new(&params));
            (CpuBackend::with_qdq(hook), params.source_keys().to_vec())
        }
        // Deliberately ignored, so not worth an "unused" warning.
        RunMode::Float => {
            (CpuBackend::float(), points.iter().flat_map(|p| [p.scale_key(), p.zero_point_key()]).collect())
        }
    };
    let mut model = models::build(&config, max_positions)?;
    let store = CheckpointStore::open(dir, backend.clone(), config.tie_word_embeddings)?;
    model.bind_params(&ParamSource::Store(&store)).with_context(|| format!("loading {}", dir.display()))?;
    for key in used.iter().filter(|k| store.checkpoint().contains(k)) {
        store.checkpoint().mark_used(key)?;
    }
    let unused = store.unused_keys();
    Ok(CpuModel {
        config,
        model: CpuChunkModel::new(model, backend, context_len),
        unused,
        fake_quant: mode == RunMode::Auto,
    })
}

/// Token sequences from `calib_ids`-style safetensors: an int64 (or int32) `[N, L]` tensor `key`.
pub fn load_id_sequences(path: &Path, key: &str, vocab_size: usize) -> Result<Vec<Vec<i64>>> {
    let file = SafetensorsCheckpoint::open_file(path).with_context(|| format!("opening {}", path.display()))?;
    let (dtype, shape) = file.info(key).with_context(|| format!("{}: tensor `{key}`", path.display()))?;
    let shape = shape.to_vec();
    let [n, len] = shape[..] else {
        bail!("{}: `{key}` has shape {shape:?}, expected [N, L] (sequences x tokens)", path.display());
    };
    ensure!(n > 0 && len > 0, "{}: `{key}` is empty ({shape:?})", path.display());
    let ids: Vec<i64> = match dtype {
        checkpoint::StDtype::I64 => file.read_i64(key)?,
        checkpoint::StDtype::I32 => file.read_i32(key)?.into_iter().map(i64::from).collect(),
        other => bail!("{}: `{key}` is {other}, expected int64 (or int32) token ids", path.display()),
    };
    if let Some((i, id)) = ids.iter().enumerate().find(|(_, &id)| id < 0 || id as usize >= vocab_size) {
        bail!("{}: `{key}` element {i} is token id {id}, outside the vocabulary 0..{vocab_size}", path.display());
    }
    Ok(ids.chunks_exact(len).map(<[i64]>::to_vec).collect())
}

/// Calibration sequences from a text file: paragraphs separated by blank lines, each tokenized
/// with `tokenizer.json` (through Qwen3's non-thinking chat template when `chat`, as pymllm's
/// calibration does) and cut to `max_len` tokens; at most `max_samples` of them.
pub fn load_text_sequences(
    path: &Path,
    tokenizer: &Path,
    max_len: usize,
    max_samples: usize,
    chat: bool,
) -> Result<Vec<Vec<i64>>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let tok = tokenizers::Tokenizer::from_file(tokenizer)
        .map_err(|e| anyhow::anyhow!("cannot load tokenizer {}: {e}", tokenizer.display()))?;
    let mut out = Vec::new();
    for para in text.split("\n\n").map(str::trim).filter(|p| !p.is_empty()).take(max_samples) {
        let input = if chat { crate::qwen3_chat_prompt(para) } else { para.to_string() };
        let enc = tok.encode(input, false).map_err(|e| anyhow::anyhow!("tokenizing {}: {e}", path.display()))?;
        let ids: Vec<i64> = enc.get_ids().iter().take(max_len).map(|&i| i64::from(i)).collect();
        if !ids.is_empty() {
            out.push(ids);
        }
    }
    ensure!(!out.is_empty(), "{}: no non-empty paragraph to calibrate on", path.display());
    Ok(out)
}

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
    pub progress: bool,
    /// How linear weights are rounded (deployed mode only; `--mllm-compatible` is pymllm's).
    pub weight_method: WeightMethod,
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
    pub warnings: Vec<String>,
}

/// A progress bar on stderr (hidden when `progress` is off; indicatif hides it without a TTY).
pub fn bar(progress: bool, len: usize, what: &str) -> ProgressBar {
    if !progress {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::new(len as u64);
    let style = ProgressStyle::with_template("{prefix:>12} [{bar:30}] {pos}/{len} {elapsed_precise} {msg}")
        .expect("valid template")
        .progress_chars("=> ");
    pb.set_style(style);
    pb.set_prefix(what.to_string());
    pb
}

/// Calibrates `opts.model`, writes the quantized checkpoint (`model.safetensors`, `config.json`,
/// the tokenizer files) and `report.json` into `opts.out`, and evaluates fake-quant against float.
pub fn quantize(opts: &QuantizeOptions) -> Result<QuantizeOutcome> {
    let model_dir = &opts.model;
    ensure!(!opts.calibration.is_empty(), "no calibration sequences");
    if let (Ok(a), Ok(b)) = (model_dir.canonicalize(), opts.out.canonicalize()) {
        ensure!(
            a != b,
            "--out {} is the model directory; write the quantized checkpoint elsewhere",
            opts.out.display()
        );
    }
    let hf = HfConfig::from_dir(model_dir)?;
    let (aot, warnings) = load_aot_config(opts.aot_config.as_deref(), &hf)?;
    let source = SafetensorsCheckpoint::open(model_dir)?;
    ensure!(
        !is_quantized_checkpoint(&source),
        "{} already holds a quantized checkpoint; calibrate from the float one",
        model_dir.display()
    );

    // 1. What the model file quantizes: QDQ points, concatenations, parameters.
    let qnn_program = trace_model(&hf, opts.max_positions, ParamFormat::QnnW4A16)?;
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
        let mut model = models::build(&hf, opts.max_positions)?;
        model.bind_params(&ParamSource::Store(&store)).with_context(|| format!("loading {}", model_dir.display()))?;
        let pb = bar(opts.progress, opts.calibration.len(), "input stats");
        for (i, seq) in opts.calibration.iter().enumerate() {
            prefill_logits(model.as_ref(), &backend, seq).with_context(|| format!("calibration sequence {i}"))?;
            pb.inc(1);
        }
        pb.finish();
        Some(Arc::new(hook.finish()?))
    } else {
        None
    };
    let linears = LinearQuantizer::new(weight_method, stats)?;
    let input_stats_seconds = start.elapsed().as_secs_f64();

    // 3. Calibration.
    let start = Instant::now();
    let hook = Arc::new(ObserverHook::new(&points, &groups, opts.mode));
    let backend = CpuBackend::with_qdq(hook.clone());
    let calibration = {
        let store = CheckpointStore::open(model_dir, backend.clone(), hf.tie_word_embeddings)?;
        let weights = CalibrationWeights::new(&store, &aot, opts.mode).with_linears(&linears);
        let mut model = models::build(&hf, opts.max_positions)?;
        model.bind_params(&ParamSource::Store(&weights)).with_context(|| format!("loading {}", model_dir.display()))?;
        let pb = bar(opts.progress, opts.calibration.len(), "calibrating");
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
    let pb = bar(opts.progress, groups_total, "quantizing");
    let mut weights = quantize_weights_with(&plan, &source, hf.tie_word_embeddings, &linears, &|done, total, key| {
        pb.set_length(total as u64);
        pb.set_position(done as u64);
        pb.set_message(key.to_string());
    })?;
    pb.finish_with_message("done");
    weights.tensors.extend(quantize_rope_tables(&plan, &calibration.params, &calibration.rope_tables)?);
    write_quantized_checkpoint(&opts.out, &hf.source, plan.block_size, &weights.tensors, &calibration.params)?;
    copy_tokenizer_files(model_dir, &opts.out)?;
    let weight_seconds = start.elapsed().as_secs_f64();
    drop(weights);

    // 5. Accuracy of what was written.
    let eval = opts.evaluation.as_ref().unwrap_or(&opts.calibration);
    let eval_name = if opts.evaluation.is_some() { "evaluation ids" } else { "the calibration sequences" };
    let report = evaluate(model_dir, &opts.out, opts.max_positions, eval, eval_name, opts.progress)?;
    let json = serde_json::json!({
        "model": model_dir.display().to_string(),
        "out": opts.out.display().to_string(),
        "calibration_mode": opts.mode.name(),
        "weight_method": weight_method.name(),
        "calibration_sequences": opts.calibration.len(),
        "linear_block_size": plan.block_size,
        "qdq_points": calibration.params.len(),
        "accuracy": report.to_json(),
        "warnings": warnings,
    });
    let mut text = serde_json::to_string_pretty(&json)?;
    text.push('\n');
    write_atomic(&opts.out.join("report.json"), text.as_bytes())?;
    Ok(QuantizeOutcome {
        calibration,
        report,
        block_size: plan.block_size,
        weight_input_bytes: weights_input_bytes(&source, &plan),
        weight_seconds,
        calibration_seconds,
        input_stats_seconds,
        warnings,
    })
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
pub fn evaluate(
    float_dir: &Path,
    quant_dir: &Path,
    max_positions: usize,
    sequences: &[Vec<i64>],
    what: &str,
    progress: bool,
) -> Result<AccuracyReport> {
    let hf = HfConfig::from_dir(float_dir)?;
    let program = trace_model(&hf, max_positions, ParamFormat::Float)?;
    let layers: Vec<(String, QdqAttr)> =
        layer_output_points(&program).into_iter().filter_map(|(s, p)| p.map(|p| (s, p))).collect();
    let keys: Vec<String> = layers.iter().map(|(_, p)| p.key.clone()).collect();

    let run = |dir: &Path, inner: Option<Arc<dyn QdqHook>>, label: &str| -> Result<(Vec<f32>, Vec<Vec<f32>>)> {
        let recorder = Arc::new(RecordingHook::new(inner, keys.clone()));
        let backend = CpuBackend::with_qdq(recorder.clone());
        let store = CheckpointStore::open(dir, backend.clone(), hf.tie_word_embeddings)?;
        let mut model = models::build(&hf, max_positions)?;
        model.bind_params(&ParamSource::Store(&store)).with_context(|| format!("loading {}", dir.display()))?;
        let pb = bar(progress, sequences.len(), label);
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
    let params = QdqParams::from_checkpoint(&quant_ckpt, &qdq_points(&program)?)?;
    drop(quant_ckpt);
    let (quant_logits, quant_layers) = run(quant_dir, Some(Arc::new(FakeQuantHook::new(&params))), "eval quant")?;

    let mut rows = Vec::new();
    for ((symbol, point), (f, q)) in layers.iter().zip(float_layers.iter().zip(&quant_layers)) {
        let name = format!("{symbol} (at {})", point.key);
        rows.push(Comparison::new(name, f, q, hf.hidden_size).map_err(anyhow::Error::msg)?);
    }
    rows.push(Comparison::new("logits", &float_logits, &quant_logits, hf.vocab_size).map_err(anyhow::Error::msg)?);
    Ok(AccuracyReport {
        description: format!("fake-quant {} vs float {} on {what}", quant_dir.display(), float_dir.display()),
        sequences: sequences.len(),
        tokens: sequences.iter().map(Vec::len).sum(),
        rows,
    })
}

//! The main job end to end, behind `cargo run --example qwen3_aot`: an HF float checkpoint (or an
//! already quantized one) becomes QNN graphs, with a per-stage accuracy ledger that says which
//! stage lost accuracy.
//!
//! 1. **load**: the model directory (or the embedded tiny Qwen3, materialised into the output
//!    directory), its `config.json` and the AOT config;
//! 2. **calibrate** + **quantize** ([`crate::quant_pipeline::quantize`]): observers over the
//!    calibration ids, LPBQ / uint16 weights, a quantized checkpoint in pymllm's format;
//! 3. **trace** one graph per chunk size (mllm's `model.0.s<chunk>`), **passes**: mllm's QNN AOT
//!    pipeline, dumping the IR after every pass;
//! 4. **lower** to QNN with one [`QnnLowering`] (weights shared by name, as in one context),
//!    validate, write `qnn/<graph>.{json,cpp,bin,summary.txt}`;
//! 5. **validate**: the ledger ([`LedgerEntry`]), each stage compared with the one before it on the
//!    same inputs: `float_vs_reference` (CPU float vs the checkpoint's reference logits),
//!    `fakequant_vs_float` (eager fake-quant vs float), `passes_vs_eager` (backend-cpu's IR
//!    interpreter on the final IR vs the eager fake-quant model) and `qnn_vs_fakequant` (backend-qnn's
//!    reference interpreter on the lowered graph vs the CPU fake-quant run of the final IR).
//!
//! Every file is written to a temporary name and renamed. Two runs with the same inputs write
//! byte-identical files, except `report.json`'s `timings_s`, the only field that varies.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, ensure, Context, Result};
use backend_cpu::quant::accuracy::Comparison;
use backend_cpu::quant::export::write_atomic;
use backend_cpu::quant::{
    is_quantized_checkpoint, prefill_logits, CalibrationMode, FakeQuantHook, QdqParams, WeightMethod,
};
use backend_cpu::{CheckpointStore, CpuBackend, InterpMode, Interpreter};
use backend_qnn::artifacts::summary::summarize;
use backend_qnn::artifacts::write_graph_artifacts;
use backend_qnn::interp::TensorValue;
use backend_qnn::target::HtpTarget;
use backend_qnn::{LowerOptions, QnnGraph, QnnLowering};
use checkpoint::{SafetensorsCheckpoint, StDtype};
use mllm_dsl::config::aot::AotConfig;
use mllm_dsl::config::hf::HfConfig;
use mllm_dsl::module::ParamSource;
use mllm_dsl::passes::{Pipeline, QuantParamProvider};
use mllm_dsl::quant::points::qdq_points;
use mllm_dsl::runtime::{dequantize_mask_value, MASK_ATTEND, MASK_MASKED};
use mllm_dsl::{BackendRef, CausalLm, DType, ParamFormat, Storage, Tensor, TensorType};
use models::TransformerConfig;

use crate::quant_pipeline::{
    bar, load_aot_config, load_id_sequences, load_text_sequences, quantize, trace_graph, trace_model, QuantizeOptions,
    ROPE_SIN_KEY,
};

/// Chunk sizes mllm compiles for Qwen3: prefill 32, decode 1.
pub const DEFAULT_CHUNKS: [usize; 2] = [32, 1];
/// mllm's context length for the QNN AOT graphs.
pub const DEFAULT_CONTEXT_LEN: usize = 1024;
/// Rows of the RoPE tables a calibration writes (`mllm_qualcomm_max_length`).
pub const DEFAULT_MAX_POSITIONS: usize = 1024;
/// Valid past tokens in the K/V cache of the ledger's probe inputs (fewer when the graph has less).
pub const PROBE_PAST: usize = 8;

/// The checkpoint the run starts from, embedded in this binary: the tiny random HF Qwen3 of
/// `fixtures/qwen3-dev-f32` (hidden 32, 2 layers, vocab 128) and its reference logits.
const EMBEDDED_MODEL: &[(&str, &[u8])] = &[
    ("config.json", include_bytes!("../fixtures/qwen3-dev-f32/config.json")),
    ("model.safetensors", include_bytes!("../fixtures/qwen3-dev-f32/model.safetensors")),
    ("reference.safetensors", include_bytes!("../fixtures/qwen3-dev-f32/reference.safetensors")),
];
/// Name of the embedded model in reports.
pub const EMBEDDED_MODEL_NAME: &str = "embedded:qwen3-dev-f32";
/// pymllm's calibration ids for that model: `calib_ids`, int64 `[8, 32]` (seed 1234).
const EMBEDDED_CALIB_IDS: &[u8] = include_bytes!("../fixtures/pymllm-qwen3-dev-f32/calib_ids.safetensors");

/// Where the model comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ModelSource {
    /// The embedded tiny Qwen3 (written to `<out>/embedded/`), calibrated on the embedded ids.
    Embedded,
    /// An HF float checkpoint directory, calibrated here.
    Float(PathBuf),
    /// A quantized checkpoint directory (pymllm's export or this project's): no calibration.
    Quantized(PathBuf),
}

/// Calibration token sequences.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CalibSource {
    /// Safetensors with `calib_ids`, int64 (or int32) `[N, L]`.
    Ids(PathBuf),
    /// Paragraphs separated by blank lines, tokenized with the model directory's `tokenizer.json`
    /// (through Qwen3's chat template when `chat`).
    Text { path: PathBuf, chat: bool },
}

/// Everything [`run`] needs.
#[derive(Clone, Debug)]
pub struct AotOptions {
    pub source: ModelSource,
    /// mllm's QNN AOT config JSON; the built-in W4A16KV8 one (with the model's layer count) when absent.
    pub aot_config: Option<PathBuf>,
    /// Required for [`ModelSource::Float`]; the embedded ids for [`ModelSource::Embedded`] when absent.
    pub calibration: Option<CalibSource>,
    /// Positions of the K/V cache plus the current chunk (the mask width).
    pub context_len: usize,
    /// One graph per chunk size, in this order.
    pub chunks: Vec<usize>,
    pub out: PathBuf,
    /// Also build the QNN context binary (needs the `qnn-sdk` feature and `QNN_SDK_ROOT`).
    pub context_binary: bool,
    /// RoPE table rows when calibrating (a quantized checkpoint's tables fix their own).
    pub max_positions: usize,
    pub progress: bool,
    /// How linear weights are rounded to LPBQ when calibrating (docs/quantization.md).
    pub weight_method: WeightMethod,
}

impl AotOptions {
    /// The embedded default: chunks 32 and 1, context 1024, into `out`.
    pub fn embedded(out: impl Into<PathBuf>) -> AotOptions {
        AotOptions {
            source: ModelSource::Embedded,
            aot_config: None,
            calibration: None,
            context_len: DEFAULT_CONTEXT_LEN,
            chunks: DEFAULT_CHUNKS.to_vec(),
            out: out.into(),
            context_binary: false,
            max_positions: DEFAULT_MAX_POSITIONS,
            progress: false,
            weight_method: WeightMethod::Rtn,
        }
    }
}

/// One row of the accuracy ledger: `test` compared with `reference` on the same inputs.
#[derive(Clone, Debug, PartialEq)]
pub struct LedgerEntry {
    /// `float_vs_reference`, `fakequant_vs_float`, `passes_vs_eager` or `qnn_vs_fakequant`.
    pub stage: &'static str,
    /// The graph, for the per-graph stages.
    pub graph: Option<String>,
    /// What was compared on which inputs.
    pub detail: String,
    pub comparison: Comparison,
}

/// Size and content of one lowered graph.
#[derive(Clone, Debug, PartialEq)]
pub struct GraphReport {
    pub name: String,
    pub ops: BTreeMap<String, usize>,
    pub tensors: usize,
    pub static_bytes: u64,
}

/// Wall time of each step, in seconds.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Timings {
    pub load: f64,
    pub calibrate: f64,
    pub quantize: f64,
    pub trace: f64,
    pub passes: f64,
    pub lower: f64,
    pub validate: f64,
    pub total: f64,
}

/// What [`run`] did; `report.json` is [`AotReport::to_json`].
#[derive(Clone, Debug, PartialEq)]
pub struct AotReport {
    pub model: String,
    pub ledger: Vec<LedgerEntry>,
    pub timings: Timings,
    pub graphs: Vec<GraphReport>,
    /// Files written, relative to the output directory, sorted.
    pub artifacts: Vec<String>,
    pub warnings: Vec<String>,
}

impl AotReport {
    /// `report.json`'s content. Infinite SQNR (identical outputs) is written as `null`.
    pub fn to_json(&self) -> serde_json::Value {
        let num = |x: f64| if x.is_finite() { serde_json::json!(x) } else { serde_json::Value::Null };
        let ledger: Vec<_> = self
            .ledger
            .iter()
            .map(|e| {
                let mut row = serde_json::json!({
                    "stage": e.stage,
                    "sqnr_db": num(e.comparison.sqnr_db),
                    "top1_agreement": e.comparison.top1_agreement,
                    "max_abs_err": e.comparison.max_abs_error,
                    "rows": e.comparison.rows,
                    "detail": e.detail,
                });
                if let Some(g) = &e.graph {
                    row["graph"] = serde_json::json!(g);
                }
                row
            })
            .collect();
        let t = &self.timings;
        let round = |x: f64| (x * 1e3).round() / 1e3;
        serde_json::json!({
            "model": self.model,
            "ledger": ledger,
            "timings_s": {
                "load": round(t.load), "calibrate": round(t.calibrate), "quantize": round(t.quantize),
                "trace": round(t.trace), "passes": round(t.passes), "lower": round(t.lower),
                "validate": round(t.validate), "total": round(t.total),
            },
            "graphs": self.graphs.iter().map(|g| serde_json::json!({
                "name": g.name, "ops": g.ops, "tensors": g.tensors, "static_bytes": g.static_bytes,
            })).collect::<Vec<_>>(),
            "artifacts": self.artifacts,
            "warnings": self.warnings,
        })
    }

    /// The short human summary the example prints (the same content as `report.json`).
    pub fn summary(&self) -> String {
        let mut s = format!("model: {}\n\naccuracy ledger (test vs reference, logits):\n", self.model);
        let _ = writeln!(s, "  {:<20} {:<12} {:>9} {:>7} {:>11}", "stage", "graph", "SQNR dB", "top-1", "max |err|");
        for e in &self.ledger {
            let db =
                if e.comparison.sqnr_db.is_finite() { format!("{:.2}", e.comparison.sqnr_db) } else { "inf".into() };
            let _ = writeln!(
                s,
                "  {:<20} {:<12} {:>9} {:>6.1}% {:>11.3e}",
                e.stage,
                e.graph.as_deref().unwrap_or("-"),
                db,
                e.comparison.top1_agreement * 100.0,
                e.comparison.max_abs_error
            );
        }
        s.push_str("\ngraphs:\n");
        for g in &self.graphs {
            let ops: Vec<String> = g.ops.iter().map(|(k, v)| format!("{k} {v}")).collect();
            let _ = writeln!(
                s,
                "  {}: {} tensors, {} static bytes; ops: {}",
                g.name,
                g.tensors,
                g.static_bytes,
                ops.join(", ")
            );
        }
        let t = &self.timings;
        let _ = writeln!(
            s,
            "\ntimings (s): load {:.2}, calibrate {:.2}, quantize {:.2}, trace {:.2}, passes {:.2}, lower {:.2}, \
             validate {:.2}, total {:.2}",
            t.load, t.calibrate, t.quantize, t.trace, t.passes, t.lower, t.validate, t.total
        );
        let _ = writeln!(s, "{} files written", self.artifacts.len());
        for w in &self.warnings {
            let _ = writeln!(s, "warning: {w}");
        }
        s
    }
}

/// How to enable `--context-binary` in a build that cannot do it.
pub const CONTEXT_BINARY_HINT: &str = "--context-binary needs the QNN SDK: build the example with \
     `--features mllm-examples/qnn-sdk` and set QNN_SDK_ROOT=/path/to/qairt/<ver> (libclang is needed for bindgen)";

/// Whether this build can write a QNN context binary.
pub const fn context_binary_available() -> bool {
    cfg!(feature = "qnn-sdk")
}

/// Runs the whole flow into `opts.out` and writes `report.json` there.
pub fn run(opts: &AotOptions) -> Result<AotReport> {
    let start = Instant::now();
    if opts.context_binary && !context_binary_available() {
        bail!("{CONTEXT_BINARY_HINT}");
    }
    check_shapes(opts)?;
    let out = &opts.out;
    std::fs::create_dir_all(out).with_context(|| format!("creating the output directory {}", out.display()))?;
    let mut files = Files::new(out);
    let mut timings = Timings::default();
    let mut warnings = Vec::new();

    // 1. Load.
    let t = Instant::now();
    // The checkpoint directory, and what to calibrate it on (nothing for a quantized one).
    let (model_name, model_dir, calibration_src) = match &opts.source {
        ModelSource::Embedded => {
            let dir = out.join("embedded/qwen3-dev-f32");
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            for (name, bytes) in EMBEDDED_MODEL {
                files.write(&dir.join(name), bytes)?;
            }
            let ids = out.join("embedded/calib_ids.safetensors");
            files.write(&ids, EMBEDDED_CALIB_IDS)?;
            let calib = opts.calibration.clone().unwrap_or(CalibSource::Ids(ids));
            (EMBEDDED_MODEL_NAME.to_string(), dir, Some(calib))
        }
        ModelSource::Float(dir) => {
            let Some(calib) = opts.calibration.clone() else {
                bail!("--model {} needs calibration data: pass --calib-ids FILE or --calib-text FILE", dir.display());
            };
            (dir.display().to_string(), dir.clone(), Some(calib))
        }
        ModelSource::Quantized(dir) => (dir.display().to_string(), dir.clone(), None),
    };
    let hf = HfConfig::from_dir(&model_dir)
        .with_context(|| format!("reading the model config of {}", model_dir.display()))?;
    let (aot, aot_warnings) = load_aot_config(opts.aot_config.as_deref(), &hf)?;
    let target = htp_target(&aot)?;
    warnings.extend(aot_warnings);
    timings.load = t.elapsed().as_secs_f64();

    let mut ledger = Vec::new();
    // 2. Calibrate and quantize (or take the quantized checkpoint as it is).
    let (quant_dir, max_positions) = match calibration_src {
        Some(calib) => {
            let float_dir = &model_dir;
            let t = Instant::now();
            let calibration = match &calib {
                CalibSource::Ids(path) => load_id_sequences(path, "calib_ids", hf.vocab_size)?,
                CalibSource::Text { path, chat } => {
                    load_text_sequences(path, &float_dir.join("tokenizer.json"), opts.max_positions, 128, *chat)?
                }
            };
            timings.load += t.elapsed().as_secs_f64();
            if let Some(entry) = float_vs_reference(float_dir, &hf, opts.max_positions)? {
                ledger.push(entry);
            }
            let quant_dir = out.join("quantized");
            let outcome = quantize(&QuantizeOptions {
                model: float_dir.clone(),
                aot_config: opts.aot_config.clone(),
                calibration,
                evaluation: None,
                mode: CalibrationMode::Deployed,
                out: quant_dir.clone(),
                max_positions: opts.max_positions,
                progress: opts.progress,
                weight_method: opts.weight_method,
            })?;
            // The weight method's input statistics pass is part of calibrating.
            timings.calibrate = outcome.input_stats_seconds + outcome.calibration_seconds;
            timings.quantize = outcome.weight_seconds;
            warnings.extend(outcome.warnings.iter().filter(|w| !warnings.contains(w)).cloned().collect::<Vec<_>>());
            let logits = outcome.report.rows.last().context("the quantization report has no logits row")?;
            ledger.push(LedgerEntry {
                stage: "fakequant_vs_float",
                graph: None,
                detail: format!(
                    "eager fake-quant of the quantized checkpoint vs float, prefill of the {} calibration sequences ({} tokens)",
                    outcome.report.sequences, outcome.report.tokens
                ),
                comparison: logits.clone(),
            });
            files.record_dir(&quant_dir)?;
            (quant_dir, opts.max_positions)
        }
        None => {
            let dir = model_dir.clone();
            let ckpt = SafetensorsCheckpoint::open(&dir)?;
            ensure!(
                is_quantized_checkpoint(&ckpt),
                "--quantized {} holds a float checkpoint (no `*.fake_quant.scale` / `*.scale1` tensors); \
                 calibrate it with --model",
                dir.display()
            );
            let rows = match ckpt.info(ROPE_SIN_KEY) {
                Ok((_, &[1, rows, _])) => rows,
                Ok((_, shape)) => {
                    bail!("{}: `{ROPE_SIN_KEY}` has shape {shape:?}, expected [1, L, head_dim]", dir.display())
                }
                Err(_) => bail!("{}: the quantized checkpoint has no RoPE table `{ROPE_SIN_KEY}`", dir.display()),
            };
            drop(ckpt);
            if let Some(entry) = quantized_vs_reference_float(&dir, &hf, rows)? {
                ledger.push(entry);
            }
            (dir, rows)
        }
    };
    ensure!(
        opts.context_len <= max_positions,
        "--context-len {} exceeds the {max_positions} positions the checkpoint's RoPE tables cover",
        opts.context_len
    );

    // 3. Trace and run the pass pipeline, one graph per chunk size.
    let ckpt = SafetensorsCheckpoint::open(&quant_dir)
        .with_context(|| format!("opening the quantized checkpoint {}", quant_dir.display()))?;
    let mut programs = Vec::new();
    for &chunk in &opts.chunks {
        let name = format!("model.0.s{chunk}");
        let t = Instant::now();
        let mut program = trace_graph(&hf, max_positions, chunk, opts.context_len, ParamFormat::QnnW4A16)?;
        timings.trace += t.elapsed().as_secs_f64();
        let t = Instant::now();
        let dump_dir = out.join("ir").join(&name);
        let report = Pipeline::qnn_aot(&aot, &ckpt)
            .dump_to(&dump_dir)
            .run(&mut program)
            .with_context(|| format!("compiling graph `{name}` with the QNN AOT pass pipeline"))?;
        timings.passes += t.elapsed().as_secs_f64();
        for path in report.dumps {
            files.record(&path);
        }
        programs.push((name, chunk, program));
    }

    // 4. Lower, validate, write the artifacts.
    let t = Instant::now();
    let qnn_dir = out.join("qnn");
    std::fs::create_dir_all(&qnn_dir).with_context(|| format!("creating {}", qnn_dir.display()))?;
    let mut lowering = QnnLowering::new(&ckpt, LowerOptions::default());
    let pb = bar(opts.progress, programs.len(), "lowering");
    let mut graphs = Vec::new();
    for (name, _, program) in &programs {
        pb.set_message(name.clone());
        let mut lowered = lowering.lower_program(program).with_context(|| format!("lowering graph `{name}` to QNN"))?;
        ensure!(lowered.len() == 1, "graph `{name}` lowered to {} QNN graphs, expected 1", lowered.len());
        let graph = lowered.remove(0);
        ensure!(&graph.name == name, "the pipeline named the graph `{}`, expected `{name}`", graph.name);
        let paths = write_graph_artifacts(&graph, &qnn_dir).with_context(|| format!("writing graph `{name}`"))?;
        for p in [&paths.netron_json, &paths.model_cpp, &paths.model_bin, &paths.summary] {
            files.record(p);
        }
        graphs.push(graph);
        pb.inc(1);
    }
    pb.finish();
    timings.lower = t.elapsed().as_secs_f64();

    // 5. Per-graph ledger stages.
    let t = Instant::now();
    for ((name, chunk, program), graph) in programs.iter().zip(&graphs) {
        let probe = Probe::new(&hf, &ckpt, *chunk, opts.context_len)?;
        let eager = probe.run_eager(&quant_dir, &hf, &ckpt, max_positions)?;
        let store = CheckpointStore::open(&quant_dir, CpuBackend::float(), hf.tie_word_embeddings)?;
        let cpu = Interpreter::new(program, &store, InterpMode::FakeQuant(&ckpt))
            .run(&probe.cpu_inputs(&CpuBackend::float())?)
            .with_context(|| format!("running graph `{name}` on backend-cpu's IR interpreter"))?;
        let cpu_logits = cpu[0].as_f32().context("the interpreter's logits hold no f32 data")?;
        ledger.push(LedgerEntry {
            stage: "passes_vs_eager",
            graph: Some(name.clone()),
            detail: probe
                .describe("backend-cpu's interpreter (fake-quant) on the final IR vs the eager fake-quant model"),
            comparison: Comparison::new("logits", &eager, cpu_logits, hf.vocab_size).map_err(anyhow::Error::msg)?,
        });
        let qnn = probe.run_qnn(graph)?;
        ledger.push(LedgerEntry {
            stage: "qnn_vs_fakequant",
            graph: Some(name.clone()),
            detail: probe
                .describe("backend-qnn's reference interpreter on the lowered graph vs the CPU fake-quant run"),
            comparison: Comparison::new("logits", cpu_logits, &qnn, hf.vocab_size).map_err(anyhow::Error::msg)?,
        });
    }
    timings.validate = t.elapsed().as_secs_f64();

    // 6. The context binary, when asked for.
    if opts.context_binary {
        let path = qnn_dir.join("context.bin");
        backend_qnn::context::build_context_binary(&graphs, &target, &path)
            .with_context(|| format!("building the QNN context binary {}", path.display()))?;
        files.record(&path);
    }

    let graph_reports = graphs
        .iter()
        .map(|g| {
            let s = summarize(g);
            GraphReport {
                name: g.name.clone(),
                ops: s.ops_by_type,
                tensors: g.tensors.len(),
                static_bytes: g.static_bytes(),
            }
        })
        .collect();
    files.record(&out.join("report.json"));
    timings.total = start.elapsed().as_secs_f64();
    let report =
        AotReport { model: model_name, ledger, timings, graphs: graph_reports, artifacts: files.relative()?, warnings };
    let mut text = serde_json::to_string_pretty(&report.to_json())?;
    text.push('\n');
    write_atomic(&out.join("report.json"), text.as_bytes())?;
    Ok(report)
}

/// Chunk sizes and context length that make sense together.
fn check_shapes(opts: &AotOptions) -> Result<()> {
    ensure!(!opts.chunks.is_empty(), "no chunk size: pass --chunk N at least once");
    for (i, &c) in opts.chunks.iter().enumerate() {
        ensure!(c >= 1, "--chunk must be at least 1");
        ensure!(
            c < opts.context_len,
            "--chunk {c} must be smaller than --context-len {} (the rest of the context is the K/V cache)",
            opts.context_len
        );
        ensure!(!opts.chunks[..i].contains(&c), "--chunk {c} is given twice");
    }
    Ok(())
}

/// Files this run wrote, for the report.
struct Files<'a> {
    root: &'a Path,
    paths: Vec<PathBuf>,
}

impl<'a> Files<'a> {
    fn new(root: &'a Path) -> Self {
        Files { root, paths: Vec::new() }
    }

    fn write(&mut self, path: &Path, bytes: &[u8]) -> Result<()> {
        write_atomic(path, bytes)?;
        self.record(path);
        Ok(())
    }

    fn record(&mut self, path: &Path) {
        self.paths.push(path.to_path_buf());
    }

    /// Every file directly in `dir`.
    fn record_dir(&mut self, dir: &Path) -> Result<()> {
        for entry in std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
            let path = entry?.path();
            if path.is_file() {
                self.record(&path);
            }
        }
        Ok(())
    }

    fn relative(&self) -> Result<Vec<String>> {
        let mut rel = self
            .paths
            .iter()
            .map(|p| {
                let r = p
                    .strip_prefix(self.root)
                    .with_context(|| format!("{} is outside the output directory", p.display()))?;
                Ok(r.to_string_lossy().replace('\\', "/"))
            })
            .collect::<Result<Vec<_>>>()?;
        rel.sort();
        rel.dedup();
        Ok(rel)
    }
}

/// A `reference.safetensors` next to a checkpoint: `input_ids` `[1, n]` and the logits `key`.
fn reference_logits(dir: &Path, key: &str) -> Result<Option<(Vec<i64>, Vec<f32>)>> {
    let path = dir.join("reference.safetensors");
    if !path.is_file() {
        return Ok(None);
    }
    let file = SafetensorsCheckpoint::open_file(&path).with_context(|| format!("opening {}", path.display()))?;
    if !file.contains(key) {
        return Ok(None);
    }
    let ids = match file.info("input_ids").with_context(|| format!("{}: tensor `input_ids`", path.display()))?.0 {
        StDtype::I64 => file.read_i64("input_ids")?,
        StDtype::I32 => file.read_i32("input_ids")?.into_iter().map(i64::from).collect(),
        other => bail!("{}: `input_ids` is {other}, expected int64 token ids", path.display()),
    };
    let logits = file.read_f32(key).with_context(|| format!("{}: tensor `{key}`", path.display()))?;
    Ok(Some((ids, logits)))
}

/// A model directory on `backend`, for eager prefills.
fn build_model(dir: &Path, hf: &HfConfig, max_positions: usize, backend: &BackendRef) -> Result<Box<dyn CausalLm>> {
    let store = CheckpointStore::open(dir, backend.clone(), hf.tie_word_embeddings)?;
    let mut model = models::build(hf, max_positions)?;
    model.bind_params(&ParamSource::Store(&store)).with_context(|| format!("loading {}", dir.display()))?;
    Ok(model)
}

/// The fake-quant backend of a quantized checkpoint: every QDQ point with its stored parameters.
fn fake_quant_backend(ckpt: &SafetensorsCheckpoint, hf: &HfConfig, max_positions: usize) -> Result<BackendRef> {
    let points = qdq_points(&trace_model(hf, max_positions, ParamFormat::Float)?)?;
    let params = QdqParams::from_checkpoint(ckpt, &points)
        .with_context(|| format!("reading the QDQ parameters of {}", ckpt.root().display()))?;
    Ok(CpuBackend::with_qdq(Arc::new(FakeQuantHook::new(&params))))
}

fn compare(reference: &[f32], test: &[f32], vocab: usize) -> Result<Comparison> {
    Comparison::new("logits", reference, test, vocab).map_err(anyhow::Error::msg)
}

/// `float_vs_reference`: the CPU float model vs the checkpoint's `reference.safetensors` logits.
fn float_vs_reference(dir: &Path, hf: &HfConfig, max_positions: usize) -> Result<Option<LedgerEntry>> {
    let Some((ids, reference)) = reference_logits(dir, "logits")? else { return Ok(None) };
    let backend = CpuBackend::float();
    let model = build_model(dir, hf, max_positions, &backend)?;
    let logits = prefill_logits(model.as_ref(), &backend, &ids).context("float prefill of the reference input_ids")?;
    Ok(Some(LedgerEntry {
        stage: "float_vs_reference",
        graph: None,
        detail: format!("CPU float vs reference.safetensors `logits`, prefill of its {} input_ids", ids.len()),
        comparison: compare(&reference, &logits, hf.vocab_size)?,
    }))
}

/// `fakequant_vs_float` for a quantized checkpoint whose `reference.safetensors` carries the float
/// model's logits (`float_logits`, as pymllm's export in the fixtures does).
fn quantized_vs_reference_float(dir: &Path, hf: &HfConfig, max_positions: usize) -> Result<Option<LedgerEntry>> {
    let Some((ids, reference)) = reference_logits(dir, "float_logits")? else { return Ok(None) };
    let ckpt = SafetensorsCheckpoint::open(dir)?;
    let backend = fake_quant_backend(&ckpt, hf, max_positions)?;
    let model = build_model(dir, hf, max_positions, &backend)?;
    let logits =
        prefill_logits(model.as_ref(), &backend, &ids).context("fake-quant prefill of the reference input_ids")?;
    Ok(Some(LedgerEntry {
        stage: "fakequant_vs_float",
        graph: None,
        detail: format!(
            "eager fake-quant of the checkpoint vs reference.safetensors `float_logits`, prefill of its {} input_ids",
            ids.len()
        ),
        comparison: compare(&reference, &logits, hf.vocab_size)?,
    }))
}

/// Fixed graph inputs for the per-graph ledger stages, on the quantization grid of the graph
/// inputs: deterministic token ids, positions after `past` valid cache entries, the causal mask
/// over them (u16 codes: 65535 attends, 0 is masked) and past K/V u8 codes near the middle of the
/// range (as real K/V are), for every layer.
struct Probe {
    chunk: usize,
    context: usize,
    past: usize,
    ids: Vec<i64>,
    positions: Vec<i64>,
    mask_codes: Vec<u16>,
    /// `past_key_0.., past_value_0..` codes; K `[1, Hkv, D, context - chunk]`, V `[1, Hkv, context - chunk, D]`.
    kv_codes: Vec<Vec<u8>>,
    /// The scale of each K/V input's codes (zero point 128).
    kv_scales: Vec<f32>,
    kv_heads: usize,
    head_dim: usize,
}

impl Probe {
    fn new(hf: &HfConfig, params: &dyn QuantParamProvider, chunk: usize, context: usize) -> Result<Probe> {
        let cfg = TransformerConfig::from_hf(hf, context);
        let cache = context - chunk;
        let past = PROBE_PAST.min(cache);
        let mut seed = 0x2545_f491u32;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 17;
            seed ^= seed << 5;
            seed
        };
        // Ids from 3 up: the tiny vocabularies' 0..2 are special tokens.
        let low = 3.min(hf.vocab_size as u32 - 1);
        let ids = (0..chunk).map(|_| i64::from(low + next() % (hf.vocab_size as u32 - low))).collect();
        let positions = (past..past + chunk).map(|p| p as i64).collect();
        let mut mask_codes = Vec::with_capacity(chunk * context);
        for row in 0..chunk {
            for col in 0..context {
                let attend = col < past || (col >= cache && col - cache <= row);
                mask_codes.push(if attend { MASK_ATTEND } else { MASK_MASKED });
            }
        }
        let (kvh, d, l) = (cfg.num_key_value_heads, cfg.head_dim, cfg.num_hidden_layers);
        let mut kv_codes = Vec::with_capacity(2 * l);
        let mut kv_scales = Vec::with_capacity(2 * l);
        for which in ["k", "v"] {
            for layer in 0..l {
                let key = format!("model.layers.{layer}.self_attn.{which}_cast_to_int8_qdq.fake_quant.scale");
                kv_scales.push(params.scalar_f32(&key)?);
                kv_codes.push((0..kvh * d * cache).map(|_| (96 + next() % 64) as u8).collect());
            }
        }
        Ok(Probe { chunk, context, past, ids, positions, mask_codes, kv_codes, kv_scales, kv_heads: kvh, head_dim: d })
    }

    fn describe(&self, what: &str) -> String {
        format!(
            "{what}; {} deterministic ids at positions {}.., {} valid past K/V entries of {}",
            self.chunk,
            self.past,
            self.past,
            self.context - self.chunk
        )
    }

    /// The inputs as real-valued tensors on `backend` (what the codes mean).
    fn cpu_inputs(&self, backend: &BackendRef) -> Result<Vec<Tensor>> {
        let (chunk, cache, kvh, d) = (self.chunk, self.context - self.chunk, self.kv_heads, self.head_dim);
        let t = |data: Vec<f32>, shape: Vec<usize>, dtype: DType| {
            Tensor::from_storage(TensorType::new(shape, dtype), Storage::F32(data.into()), backend.clone())
        };
        let mask = self.mask_codes.iter().map(|&c| dequantize_mask_value(c)).collect();
        let mut inputs = vec![
            Tensor::from_i64(self.ids.clone(), vec![1, chunk], DType::I32, backend.clone())?,
            Tensor::from_i64(self.positions.clone(), vec![chunk], DType::I32, backend.clone())?,
            t(mask, vec![1, 1, chunk, self.context], DType::F32)?,
        ];
        let layers = self.kv_codes.len() / 2;
        for (i, (codes, &scale)) in self.kv_codes.iter().zip(&self.kv_scales).enumerate() {
            let data = codes.iter().map(|&c| (i32::from(c) - 128) as f32 * scale).collect();
            let shape = if i < layers { vec![1, kvh, d, cache] } else { vec![1, kvh, cache, d] };
            inputs.push(t(data, shape, DType::U8Sym)?);
        }
        Ok(inputs)
    }

    /// The eager model in fake-quant mode on these inputs: its logits.
    fn run_eager(
        &self,
        dir: &Path,
        hf: &HfConfig,
        ckpt: &SafetensorsCheckpoint,
        max_positions: usize,
    ) -> Result<Vec<f32>> {
        let backend = fake_quant_backend(ckpt, hf, max_positions)?;
        let model = build_model(dir, hf, max_positions, &backend)?;
        let x = self.cpu_inputs(&backend)?;
        let l = self.kv_codes.len() / 2;
        let (logits, _, _) =
            model.forward(&x[0], &x[1], &x[2], &x[3..3 + l], &x[3 + l..]).context("eager fake-quant run")?;
        Ok(logits.as_f32().context("eager logits hold no f32 data")?.to_vec())
    }

    /// backend-qnn's reference interpreter on the lowered graph: its logits (graph output 0).
    fn run_qnn(&self, graph: &QnnGraph) -> Result<Vec<f32>> {
        let interp = backend_qnn::interp::Interpreter::new(graph)
            .with_context(|| format!("preparing graph `{}` for the reference interpreter", graph.name))?;
        let mut codes: Vec<Vec<i64>> =
            vec![self.ids.clone(), self.positions.clone(), self.mask_codes.iter().map(|&c| i64::from(c)).collect()];
        codes.extend(self.kv_codes.iter().map(|c| c.iter().map(|&v| i64::from(v)).collect()));
        ensure!(
            codes.len() == graph.inputs.len(),
            "graph `{}` has {} inputs, the probe has {}",
            graph.name,
            graph.inputs.len(),
            codes.len()
        );
        let values = graph
            .inputs
            .iter()
            .zip(codes)
            .map(|(name, codes)| {
                let meta = graph.tensor(name).with_context(|| format!("graph input `{name}` has no tensor"))?;
                TensorValue::from_codes(meta, codes).with_context(|| format!("graph input `{name}`"))
            })
            .collect::<Result<Vec<_>>>()?;
        let outputs = interp.run(&values).with_context(|| format!("running graph `{}`", graph.name))?;
        let logits = outputs.first().context("the graph has no outputs")?;
        Ok(logits.to_real()?)
    }
}

/// The HTP target of the AOT config's `target_machine`, checked against the chipset table
/// (known SoC, arch matching the chipset, VTCM within the chip's).
fn htp_target(aot: &AotConfig) -> Result<HtpTarget> {
    HtpTarget::from_json(&aot.to_json()["target_machine"]).context("AOT config `target_machine`")
}

/// `<target dir>/qwen3_aot`: the target directory this example binary was built into
/// (`<target>/<profile>/examples/qwen3_aot`), else `./target/qwen3_aot`.
pub fn default_out_dir() -> PathBuf {
    let from_exe = std::env::current_exe().ok().and_then(|exe| {
        let examples = exe.parent()?;
        (examples.file_name()? == "examples").then_some(())?;
        Some(examples.parent()?.parent()?.join("qwen3_aot"))
    });
    from_exe.unwrap_or_else(|| PathBuf::from("target/qwen3_aot"))
}

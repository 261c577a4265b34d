//! The main job end to end: an HF float checkpoint (or an already quantized one) becomes QNN
//! graphs, with a per-stage accuracy ledger that says which stage lost accuracy ([`run`]).
//!
//! 1. **load**: the model directory (or the embedded tiny Qwen3, materialised into the output
//!    directory), its `config.json` and the AOT config;
//! 2. **calibrate** + **quantize** ([`crate::quantize`]): observers over the calibration ids,
//!    LPBQ / uint16 weights, a quantized checkpoint in pymllm's format;
//! 3. **trace** one graph per chunk size (mllm's `model.0.s<chunk>`), **passes**: mllm's QNN AOT
//!    pipeline, dumping the IR after every pass;
//! 4. **lower** to QNN with one [`QnnLowering`] (weights shared by name, as in one context),
//!    validate, write `qnn/<graph>.{json,cpp,bin,summary.txt}`;
//! 5. **context binary** ([`crate::htp`]), when Qualcomm's libraries are there: `qnn/context.bin`
//!    (weight-shared, for the device) and `qnn/context.x86.bin` (for the x86 emulation);
//! 6. **validate**: the ledger ([`crate::ledger`]), with `htp_*` rows from Qualcomm's emulation.
//!
//! After a calibration, the accuracy report against float (`fakequant_vs_float`) runs on a second
//! thread beside steps 3-6, which only read the quantized checkpoint too.
//!
//! Every file is written to a temporary name and renamed. Two runs with the same inputs write
//! byte-identical files, except `report.json`'s `timings_s` and the context binaries (Qualcomm's
//! serializer does not reproduce its bytes from run to run).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use crate::error::{bail, ensure, Context, Result};
use backend_cpu::quant::accuracy::Comparison;
use backend_cpu::quant::{is_quantized_checkpoint, CalibrationMode, Rotation, SinkPrefix, Sqnr, WeightMethod};
use backend_cpu::{CheckpointStore, CpuBackend, InterpMode, Interpreter};
use backend_qnn::artifacts::summary::summarize;
use backend_qnn::artifacts::write_shared_artifacts;
use backend_qnn::cost::GraphCost;
use backend_qnn::target::HtpTarget;
use backend_qnn::{LowerOptions, QnnGraph, QnnLowering};
use checkpoint::SafetensorsCheckpoint;
use compiler::aot_config::AotConfig;
use compiler::passes::Pipeline;
use compiler::quant::act_range::ActRanges;
use mllm_dsl::files::{write_atomic_bytes as write_atomic, write_json_atomic};
use mllm_dsl::{ParamFormat, Program};
use models::hf::HfConfig;

use crate::calibrate::{quantize_alongside, QuantizeOptions};
use crate::config::{load_aot_config, DEFAULT_CHUNKS, DEFAULT_CONTEXT_LEN, DEFAULT_MAX_POSITIONS};
use crate::cpu_embedding::{write_table, EmbeddingTable, EMBEDDING_FILE};
use crate::deploy::{ArtifactRuntimes, ArtifactTraits, GraphShape, MllmModelShape, PlannedRun, TargetRuntime};
use crate::divergence::{op_by_op, table as divergence_table};
use crate::embedded::{EMBEDDED_CALIB_IDS, EMBEDDED_MODEL, EMBEDDED_MODEL_NAME};
use crate::family::{check_weights_shared, GraphFamily, GraphNaming, GraphSpec};
use crate::htp::{ContextBinary, QualcommHtp};
use crate::ledger::{float_vs_reference, quantized_vs_reference_float, reference_logits, LedgerEntry};
use crate::load::{fake_quant_backend, open_model, rope_positions};
use crate::probe::{Probe, ProbeText};
use crate::progress::Progress;
use crate::report::{AotReport, GraphReport, Timings};
use crate::run_sizes::{available_memory, RunSizes};
use crate::sequences::CalibSource;
use crate::shard::{
    default_max_memory, plan_shards, AutoLimits, AutoPlan, ModelBytes, ShardCount, BUILD_MEMORY_FACTOR,
    DEFAULT_MAX_CONTEXT_BYTES,
};
use crate::sharded_aot::{
    build_binaries, chain_inputs, chain_label, chain_logits_on_htp, chain_logits_on_interpreter, lower_shards,
};
use crate::sink::sink_prefix_ids;
use crate::trace::{trace_graph, trace_model};
use models::keys::ROPE_SIN_TABLE;

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

/// Everything [`run`] needs.
#[derive(Clone, Debug)]
pub struct AotOptions {
    pub source: ModelSource,
    /// mllm's QNN AOT config JSON; the built-in W4A16KV8 one (with the model's layer count) when absent.
    pub aot_config: Option<PathBuf>,
    /// Calibration sources, concatenated in order. Required for [`ModelSource::Float`]; the
    /// embedded ids for [`ModelSource::Embedded`] when empty.
    pub calibration: Vec<CalibSource>,
    /// Context lengths (positions of the K/V cache plus the current chunk: the mask width); one
    /// graph per chunk size at each ([`GraphFamily`]).
    pub context_lens: Vec<usize>,
    /// One graph per chunk size, in this order.
    pub chunks: Vec<usize>,
    /// How the family's graphs are named ([`crate::family`]).
    pub graph_naming: GraphNaming,
    pub out: PathBuf,
    /// Build `qnn/context.bin` (and the x86 one the `htp_*` ledger rows run) with Qualcomm's
    /// backend: by default whenever its libraries are found (`scripts/fetch-qnn-sdk`).
    pub context_binary: ContextBinary,
    /// RoPE table rows when calibrating (a quantized checkpoint's tables fix their own).
    pub max_positions: usize,
    /// Where the long steps report progress ([`crate::progress::bars`] on a terminal).
    pub progress: Arc<dyn Progress>,
    /// How the observers calibrate: as deployed, or pymllm's calibration bit for bit
    /// ([`crate::recipe`]'s `mllm`).
    pub mode: CalibrationMode,
    /// How linear weights are rounded to LPBQ when calibrating (docs/quantization.md).
    pub weight_method: WeightMethod,
    /// How activation and KV ranges are chosen when calibrating (docs/quantization.md).
    pub act_ranges: ActRanges,
    /// Rotation folded into the float weights before calibrating (docs/quantization.md).
    pub rotation: Rotation,
    /// Also compare every node of each lowered graph with the CPU fake-quant run on the probe and
    /// write the table into `ledger_ops/<graph>.txt` ([`crate::divergence`]; docs/ledger.md).
    pub ledger_ops: bool,
    /// The attention-sink prefix's tokens when calibrating (`--sink-prefix`, each a token's text
    /// or `id:N`; [`backend_cpu::quant::SinkPrefix`]); a quantized checkpoint brings its own.
    pub sink_prefix: Vec<String>,
    /// Mixed 4/8-bit linears within this budget when calibrating (`--weight-budget`; [`crate::mixed`]).
    pub weight_budget: Option<crate::mixed::WeightBudget>,
    /// The runtime the result must run on (`--target-runtime`): for mllm's, every option that
    /// would leave it unable to run the result is refused before any work ([`crate::deploy`]).
    pub target_runtime: TargetRuntime,
    /// `--shards`: the decoder layers cut into this many context binaries ([`crate::shard`]), or
    /// auto: the smallest count whose binaries fit `max_context_bytes` and whose builds fit the
    /// memory budget.
    pub shards: ShardCount,
    /// `--jobs`: shard builds at once (default: what the memory budget allows, at most the cores).
    pub jobs: Option<usize>,
    /// `--max-context-bytes`: static bytes one binary may hold.
    pub max_context_bytes: u64,
    /// `--max-memory`: the memory budget of the shard builds ([`crate::shard::default_max_memory`]
    /// when `None`).
    pub max_memory: Option<u64>,
    /// The program started as `<exe> --build-shard JOB` for each shard's binary (it calls
    /// [`crate::shard_build::child_main_if_requested`]); this executable when `None`.
    pub shard_exe: Option<PathBuf>,
}

impl AotOptions {
    /// The embedded default: chunks 32 and 1, context 1024, into `out`.
    pub fn embedded(out: impl Into<PathBuf>) -> AotOptions {
        AotOptions {
            source: ModelSource::Embedded,
            aot_config: None,
            calibration: Vec::new(),
            context_lens: vec![DEFAULT_CONTEXT_LEN],
            chunks: DEFAULT_CHUNKS.to_vec(),
            graph_naming: GraphNaming::Mllm,
            out: out.into(),
            context_binary: ContextBinary::Auto,
            max_positions: DEFAULT_MAX_POSITIONS,
            progress: crate::progress::silent(),
            mode: CalibrationMode::Deployed,
            weight_method: WeightMethod::Rtn,
            act_ranges: ActRanges::default(),
            rotation: Rotation::None,
            ledger_ops: false,
            sink_prefix: Vec::new(),
            weight_budget: None,
            target_runtime: TargetRuntime::Any,
            shards: ShardCount::Auto,
            jobs: None,
            max_context_bytes: DEFAULT_MAX_CONTEXT_BYTES,
            max_memory: None,
            shard_exe: None,
        }
    }
}

/// Runs the whole flow into `opts.out` and writes `report.json` there.
///
/// The output is built in a fresh staging directory next to `opts.out` and swapped into place
/// only when every step succeeded ([`mllm_dsl::files::StagingDir`]): a failed or killed run leaves
/// the previous `opts.out` byte-identical, and files of an earlier run never linger.
pub fn run(opts: &AotOptions) -> Result<AotReport> {
    let mut inputs: Vec<PathBuf> = opts.aot_config.iter().cloned().collect();
    match &opts.source {
        ModelSource::Float(dir) | ModelSource::Quantized(dir) => inputs.push(dir.clone()),
        ModelSource::Embedded => {}
    }
    inputs.extend(opts.calibration.iter().map(|c| c.path().to_path_buf()));
    mllm_dsl::files::ensure_not_input(&opts.out, &inputs)?;
    let staging = mllm_dsl::files::StagingDir::new(&opts.out)?;
    let report = run_in(opts, staging.path())?;
    staging.commit()?;
    Ok(report)
}

/// [`run`] writing straight into `out` (a fresh directory: the staging area).
fn run_in(opts: &AotOptions, out: &Path) -> Result<AotReport> {
    let start = Instant::now();
    // Process CPU time where /proc is readable (0 elsewhere: the figure is informative only).
    let cpu_at_start = mllm_dsl::memory::cpu_seconds().unwrap_or(0.0);
    let family = opts.family()?;
    if let ShardCount::Fixed(n @ 2..) = opts.shards {
        check_family_shardable(&family, n)?;
    }
    let context_binary = plan_for_target(opts, &family)?;
    let mut files = Files::new(out);
    let mut timings = Timings::default();
    let mut warnings = Vec::new();
    // Before any work: Qualcomm's libraries, when they are asked for (a missing one fails now).
    let qualcomm = match context_binary {
        ContextBinary::Off => None,
        ContextBinary::Required => {
            let why = match opts.target_runtime {
                TargetRuntime::Mllm => {
                    "--target-runtime mllm needs the context binary, built by Qualcomm's QNN libraries"
                }
                TargetRuntime::Any => "--context-binary needs Qualcomm's QNN libraries",
            };
            Some(backend_qnn::sdk::check_sdk_libraries().context(why)?)
        }
        ContextBinary::Auto => match backend_qnn::sdk::check_sdk_libraries() {
            Ok(paths) => Some(paths),
            Err(e) => {
                warnings.push(format!("{e}; qnn/context.bin and the htp_* ledger rows were skipped"));
                None
            }
        },
    };

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
            let calib =
                if opts.calibration.is_empty() { vec![CalibSource::Ids(ids)] } else { opts.calibration.clone() };
            (EMBEDDED_MODEL_NAME.to_string(), dir, Some(calib))
        }
        ModelSource::Float(dir) => {
            if opts.calibration.is_empty() {
                bail!("--model {} needs calibration data: pass --calib-ids FILE or --calib-text FILE", dir.display());
            }
            (dir.display().to_string(), dir.clone(), Some(opts.calibration.clone()))
        }
        ModelSource::Quantized(dir) => (dir.display().to_string(), dir.clone(), None),
    };
    let hf = HfConfig::from_dir(&model_dir)
        .with_context(|| format!("reading the model config of {}", model_dir.display()))?;
    // Sizes checked against each other, the config and the memory before any work (a quantized
    // checkpoint's own RoPE tables are checked against --context-len once it is opened).
    let largest_context = family.contexts().iter().copied().max().unwrap_or(DEFAULT_CONTEXT_LEN);
    let positions = if matches!(opts.source, ModelSource::Quantized(_)) { largest_context } else { opts.max_positions };
    let largest_chunk = family.chunks().iter().copied().max().unwrap_or(1);
    RunSizes { max_positions: positions, context: largest_context, chunk: largest_chunk }
        .check(&hf, available_memory())?;
    let (aot, aot_warnings) = load_aot_config(opts.aot_config.as_deref(), &hf)?;
    let target = HtpTarget::new(&aot.target_machine);
    warnings.extend(aot_warnings);
    timings.load = t.elapsed().as_secs_f64();

    let mut ledger = Vec::new();
    let stage = GraphStage { opts, family: &family, out, hf: &hf, aot: &aot, target: &target, qualcomm };
    // 2. Calibrate and quantize (or take the quantized checkpoint as it is), then 3.-6. compile,
    // build the context binaries and validate the graphs ([`compile_and_validate`]); after a
    // calibration that runs while another thread evaluates the quantized checkpoint against float
    // (both only read it).
    let mut graphs_done = match calibration_src {
        Some(calib) => {
            let float_dir = &model_dir;
            let t = Instant::now();
            let calibration = CalibSource::load_all(&calib, float_dir, hf.vocab_size, opts.max_positions, 128)?;
            timings.load += t.elapsed().as_secs_f64();
            let probe_text = ProbeText {
                ids: calibration.iter().flatten().copied().collect(),
                source: "the calibration sequences, concatenated".into(),
            };
            let t = Instant::now();
            if let Some(entry) = float_vs_reference(float_dir, &hf, opts.max_positions)? {
                ledger.push(entry);
            }
            timings.evaluate = t.elapsed().as_secs_f64();
            let quant_dir = out.join("quantized");
            let sink_prefix = sink_prefix_ids(&opts.sink_prefix, float_dir, hf.vocab_size)?;
            let options = QuantizeOptions {
                model: float_dir.clone(),
                aot_config: opts.aot_config.clone(),
                calibration,
                evaluation: None,
                mode: opts.mode,
                out: quant_dir.clone(),
                max_positions: opts.max_positions,
                progress: opts.progress.clone(),
                weight_method: opts.weight_method,
                act_ranges: opts.act_ranges,
                rotation: opts.rotation,
                sink_prefix,
                weight_budget: opts.weight_budget,
            };
            // Straight into this run's staging directory, which is swapped in as a whole.
            std::fs::create_dir(&quant_dir).with_context(|| format!("creating {}", quant_dir.display()))?;
            let (outcome, done) = quantize_alongside(&hf, &options, &quant_dir, |traced| {
                let quantized = QuantizedModel {
                    dir: &quant_dir,
                    max_positions: opts.max_positions,
                    traced,
                    probe_text: &probe_text,
                };
                compile_and_validate(stage, &quantized, &mut files, &mut timings)
            })?;
            timings.rotate = outcome.rotate_seconds;
            (timings.input_stats, timings.calibrate) = (outcome.input_stats_seconds, outcome.calibration_seconds);
            timings.quantize = outcome.weight_seconds;
            timings.sensitivity = outcome.sensitivity_seconds;
            timings.evaluate += outcome.evaluate_seconds;
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
            done
        }
        None => {
            let dir = model_dir.clone();
            ensure!(
                opts.sink_prefix.is_empty(),
                "--sink-prefix is chosen when calibrating; the quantized checkpoint {} ships its own prefix (or none)",
                dir.display()
            );
            let ckpt = SafetensorsCheckpoint::open(&dir)?;
            ensure!(
                is_quantized_checkpoint(&ckpt),
                "--quantized {} holds a float checkpoint (no `*.fake_quant.scale` / `*.scale1` tensors); \
                 calibrate it with --model",
                dir.display()
            );
            let Some(rows) = rope_positions(&ckpt)? else {
                bail!("{}: the quantized checkpoint has no RoPE table `{ROPE_SIN_TABLE}`", dir.display())
            };
            drop(ckpt);
            let probe_text = match reference_logits(&dir, "float_logits")? {
                Some((ids, _)) => ProbeText { ids, source: "reference.safetensors `input_ids`".into() },
                None => ProbeText::deterministic(hf.vocab_size),
            };
            let traced = trace_model(&hf, rows, ParamFormat::QnnW4A16)?;
            let quantized = QuantizedModel { dir: &dir, max_positions: rows, traced: &traced, probe_text: &probe_text };
            compile_and_validate(stage, &quantized, &mut files, &mut timings)?
        }
    };
    ledger.extend(std::mem::take(&mut graphs_done.ledger));
    let deploy = std::mem::take(&mut graphs_done.deploy);
    let graphs = std::mem::take(&mut graphs_done.graphs);
    // A NaN or infinity in a stage's logits is named, never read as a figure.
    for e in ledger.iter().filter(|e| e.comparison.sqnr() == Sqnr::NonFinite) {
        let graph = e.graph.as_deref().map_or_else(String::new, |g| format!(" ({g})"));
        warnings.push(format!("ledger row {}{graph}: SQNR is non-finite (a NaN or infinity in the logits)", e.stage));
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
                cost: GraphCost::of(g),
            }
        })
        .collect();
    let (shared_static_bytes, unshared_static_bytes) = check_weights_shared(&graphs)?;
    files.record(&out.join("report.json"));
    timings.total = start.elapsed().as_secs_f64();
    timings.total_cpu = mllm_dsl::memory::cpu_seconds().map_or(0.0, |now| now - cpu_at_start);
    let report = AotReport {
        model: model_name,
        ledger,
        timings,
        graphs: graph_reports,
        deploy,
        shared_static_bytes,
        unshared_static_bytes,
        artifacts: files.relative()?,
        warnings,
        shards: graphs_done.shards,
    };
    write_json_atomic(&out.join("report.json"), &report.to_json())?;
    Ok(report)
}

/// What [`compile_and_validate`] works with: the run's options and what loading found.
struct GraphStage<'a> {
    opts: &'a AotOptions,
    family: &'a GraphFamily,
    out: &'a Path,
    hf: &'a HfConfig,
    aot: &'a AotConfig,
    target: &'a HtpTarget,
    /// Qualcomm's libraries, when the context binaries are to be built.
    qualcomm: Option<backend_qnn::sdk::LibraryPaths>,
}

/// The quantized checkpoint [`compile_and_validate`] compiles.
struct QuantizedModel<'a> {
    dir: &'a Path,
    /// Rows of its RoPE tables.
    max_positions: usize,
    /// Its model file traced once for the QDQ points (by the calibration, or for it).
    traced: &'a Program,
    /// The text the per-graph ledger probes are cut from.
    probe_text: &'a ProbeText,
}

/// What [`compile_and_validate`] made: the lowered graphs and their ledger rows.
struct GraphsDone {
    graphs: Vec<QnnGraph>,
    ledger: Vec<LedgerEntry>,
    /// Where the artifacts run ([`crate::deploy::where_it_runs`]).
    deploy: Vec<ArtifactRuntimes>,
    /// How the layers were cut into context binaries, and why.
    shards: Vec<String>,
}

/// Steps 3.-6. on the quantized checkpoint `model`: trace, pass pipeline and lowering per graph, the artifacts, the context binaries and the
/// per-graph ledger rows (for a `--quantized` source also `quantized_vs_reference_float`, first).
fn compile_and_validate(
    job: GraphStage<'_>,
    model: &QuantizedModel<'_>,
    files: &mut Files<'_>,
    timings: &mut Timings,
) -> Result<GraphsDone> {
    let mut graph_ledger = Vec::new();
    for &context_len in job.family.contexts() {
        ensure!(
            context_len <= model.max_positions,
            "--context-len {context_len} exceeds the {} positions the checkpoint's RoPE tables cover",
            model.max_positions
        );
    }

    let t = Instant::now();
    let ckpt = SafetensorsCheckpoint::open(model.dir)
        .with_context(|| format!("opening the quantized checkpoint {}", model.dir.display()))?;
    // The eager fake-quant model, built once for the ledger.
    let eager_backend = fake_quant_backend(&ckpt, model.traced)?;
    let (eager_model, _) = open_model(model.dir, job.hf, model.max_positions, &eager_backend)?;
    let prefix = SinkPrefix::load_beside(model.dir)
        .with_context(|| format!("the attention-sink prefix of {}", model.dir.display()))?;
    timings.validate = t.elapsed().as_secs_f64();
    if matches!(job.opts.source, ModelSource::Quantized(_)) {
        let t = Instant::now();
        if let Some(entry) = quantized_vs_reference_float(model.dir, job.hf, eager_model.as_ref(), &eager_backend)? {
            graph_ledger.push(entry);
        }
        timings.evaluate = t.elapsed().as_secs_f64();
    }

    // 3.-4. Trace, run the pass pipeline and lower, one graph per chunk size; write the artifacts.
    let compile_opts = CompileOptions {
        family: job.family,
        max_positions: model.max_positions,
        dump_ir: Some(&job.out.join("ir")),
        progress: job.opts.progress.as_ref(),
    };
    let compiled = compile(job.hf, &ckpt, job.aot, &compile_opts)?;
    (timings.trace, timings.passes, timings.lower) = (compiled.timings.trace, compiled.timings.passes, 0.0);
    for path in &compiled.ir_dumps {
        files.record(path);
    }
    // How many context binaries, and why (--shards, or mllm's split_graph in the AOT config).
    let sharding = plan_run_shards(job.opts, job.aot.split_graph, &compiled.graphs)?;
    if sharding.plan.count() > 1 {
        check_family_shardable(job.family, sharding.plan.count())?;
    }
    let mut shard_lines = sharding.reasons.clone();
    shard_lines.extend(sharding.plan.table().lines().map(str::to_string));
    let sharded = sharding.plan.count() > 1;
    if sharded && job.opts.target_runtime == TargetRuntime::Mllm {
        bail!(
            "--target-runtime mllm: this model needs {} shards ({}), and mllm's runtime opens one context binary",
            sharding.plan.count(),
            sharding.reasons.join("; ")
        );
    }
    let t = Instant::now();
    let qnn_dir = job.out.join("qnn");
    std::fs::create_dir_all(&qnn_dir).with_context(|| format!("creating {}", qnn_dir.display()))?;
    // With shards: every shard's graphs (mllm's layout), written instead of the whole model's.
    let shard_graphs = match sharded {
        true => Some(lower_shards(&compiled.graphs, &sharding.plan, &ckpt, LowerOptions::default())?),
        false => None,
    };
    let written_graphs: Vec<&QnnGraph> = match &shard_graphs {
        Some(s) => s.iter().flatten().collect(),
        None => compiled.graphs.iter().map(|g| &g.graph).collect(),
    };
    // With shards: the token embedding is gathered on the CPU, from its own file.
    let embedding = match &shard_graphs {
        Some(_) => {
            let path = qnn_dir.join(EMBEDDING_FILE);
            write_table(&ckpt, &path)?;
            files.record(&path);
            Some(EmbeddingTable::open(&path)?)
        }
        None => None,
    };
    // The graphs of one context binary read the same weights: one model.bin per binary holds them.
    let groups: Vec<(String, Vec<&QnnGraph>)> = match &shard_graphs {
        Some(s) if s.len() > 1 => s
            .iter()
            .enumerate()
            .map(|(i, gs)| (format!("weights_{}_of_{}", i + 1, s.len()), gs.iter().collect()))
            .collect(),
        _ => vec![("weights".to_string(), written_graphs.clone())],
    };
    for (bin_stem, group) in &groups {
        let written = write_shared_artifacts(group, &qnn_dir, bin_stem)
            .with_context(|| format!("writing the artifacts of {}", qnn_dir.join(bin_stem).display()))?;
        for paths in &written.graphs {
            for p in [&paths.netron_json, &paths.model_cpp, &paths.summary] {
                files.record(p);
            }
        }
        files.record(&written.model_bin);
    }
    timings.lower = compiled.timings.lower + t.elapsed().as_secs_f64();
    let graphs: Vec<QnnGraph> = written_graphs.into_iter().cloned().collect();
    // With shards: each shard's binaries built in child processes, the chain run on the x86 ones.
    let shard_htp = match (sharded, job.qualcomm.clone()) {
        (true, Some(paths)) => {
            let t = Instant::now();
            let exe = match &job.opts.shard_exe {
                Some(exe) => exe.clone(),
                None => std::env::current_exe().context("locating this program to build the shards")?,
            };
            let built = build_binaries(
                &exe,
                model.dir,
                job.opts.aot_config.as_deref(),
                &sharding,
                job.family.chunks(),
                job.family.contexts()[0],
                &qnn_dir,
                &job.out.join(".shard-jobs"),
            )?;
            built.written.iter().for_each(|p| files.record(p));
            timings.context_binary = t.elapsed().as_secs_f64();
            let htp_graphs = lower_shards(&compiled.graphs, &sharding.plan, &ckpt, LowerOptions::qualcomm_htp())?;
            Some((paths, built.x86, htp_graphs))
        }
        _ => None,
    };
    // The context binaries, built by Qualcomm's backend.
    let htp = match job.qualcomm.filter(|_| !sharded) {
        Some(paths) => {
            let programs: Vec<(&str, &Program)> =
                compiled.graphs.iter().map(|g| (g.name.as_str(), &g.program)).collect();
            let htp = QualcommHtp::build(paths, &programs, &ckpt, job.target, &qnn_dir)?;
            htp.written.iter().for_each(|p| files.record(p));
            [timings.context_binary, timings.context_binary_x86] = htp.seconds;
            Some(htp)
        }
        None => None,
    };

    // 5. Per-graph ledger stages.
    let t = Instant::now();
    let store = CheckpointStore::for_config(model.dir, CpuBackend::float(), job.hf)?;
    for CompiledGraph { name, spec, program, graph } in &compiled.graphs {
        let probe = Probe::new(
            job.hf,
            &ckpt,
            spec.chunk,
            spec.context_len,
            model.probe_text,
            eager_model.as_ref(),
            &eager_backend,
            prefix.as_ref(),
        )?;
        let eager = probe.run_eager(eager_model.as_ref(), &eager_backend)?;
        let cpu = Interpreter::new(program, &store, InterpMode::FakeQuant(&ckpt))
            .run(&probe.cpu_inputs(&CpuBackend::float())?)
            .with_context(|| format!("running graph `{name}` on backend-cpu's IR interpreter"))?;
        let cpu_logits = probe.text_rows(cpu[0].as_f32().context("the interpreter's logits hold no f32 data")?);
        graph_ledger.push(LedgerEntry {
            stage: "passes_vs_eager",
            graph: Some(name.clone()),
            detail: probe
                .describe("backend-cpu's interpreter (fake-quant) on the final IR vs the eager fake-quant model"),
            comparison: Comparison::new("logits", probe.text_rows(&eager), cpu_logits, job.hf.vocab_size)?,
        });
        let chunk_index = compiled.graphs.iter().position(|g| &g.name == name).unwrap_or(0);
        let qnn = match &shard_graphs {
            Some(shards) => {
                let chain: Vec<&QnnGraph> = shards.iter().map(|s| &s[chunk_index]).collect();
                let inputs = chain_inputs(graph, probe.qnn_inputs(graph)?, chain[0], embedding.as_ref())?;
                chain_logits_on_interpreter(&chain, &inputs)?
            }
            None => probe.run_qnn(graph)?,
        };
        let label = match &shard_graphs {
            Some(_) => chain_label(&sharding.plan, spec.chunk),
            None => name.clone(),
        };
        let comparison = Comparison::new("logits", cpu_logits, probe.text_rows(&qnn), job.hf.vocab_size)?;
        let mut detail = probe.describe(if sharded {
            "backend-qnn's reference interpreter on the lowered shards, chained, vs the CPU fake-quant run"
        } else {
            "backend-qnn's reference interpreter on the lowered graph vs the CPU fake-quant run"
        });
        if job.opts.ledger_ops {
            // Where the two part ways, node by node.
            let rows = op_by_op(program, graph, &ckpt, &store, &probe)?;
            let path = job.out.join("ledger_ops").join(format!("{name}.txt"));
            std::fs::create_dir_all(job.out.join("ledger_ops"))?;
            files.write(&path, divergence_table(&rows).as_bytes())?;
            if let Some(first) = rows.iter().find(|r| r.max_steps >= 1.5) {
                let _ = write!(
                    detail,
                    "; first node off by two steps or more: `{}` ({}, {:.1} steps)",
                    first.node, first.op, first.max_steps
                );
            }
            if let Some(worst) = rows.iter().max_by(|a, b| a.own_steps.total_cmp(&b.own_steps)) {
                let _ = write!(
                    detail,
                    "; largest error of a node alone on the fake-quant inputs: {:.1} steps at `{}`",
                    worst.own_steps, worst.node
                );
            }
            let _ = write!(detail, "; every node in ledger_ops/{name}.txt");
        }
        graph_ledger.push(LedgerEntry { stage: "qnn_vs_fakequant", graph: Some(label.clone()), detail, comparison });
        if let Some((paths, binaries, htp_graphs)) = &shard_htp {
            let chain: Vec<&QnnGraph> = htp_graphs.iter().map(|s| &s[chunk_index]).collect();
            let inputs = chain_inputs(graph, probe.qnn_inputs(graph)?, chain[0], embedding.as_ref())?;
            let on_htp = {
                let _turn = crate::htp::exclusive();
                chain_logits_on_htp(paths, binaries, &chain, &inputs)?
            };
            let on_htp = probe.text_rows(&on_htp);
            let what = format!(
                "Qualcomm's x86 HTP emulation running the {} shards qnn/context_<i>_of_{}.x86.bin chained",
                sharding.plan.count(),
                sharding.plan.count()
            );
            for (stage, reference, versus) in [
                ("htp_vs_fakequant", cpu_logits, "the CPU fake-quant run of the final IR"),
                ("htp_vs_interp", probe.text_rows(&qnn), "backend-qnn's reference interpreter on the chained shards"),
            ] {
                graph_ledger.push(LedgerEntry {
                    stage,
                    graph: Some(label.clone()),
                    detail: probe.describe(&format!("{what} vs {versus}")),
                    comparison: Comparison::new("logits", reference, on_htp, job.hf.vocab_size)?,
                });
            }
        }
        if let Some(htp) = &htp {
            let on_htp = htp.run_logits(name, &probe.qnn_inputs(graph)?)?;
            let on_htp = probe.text_rows(&on_htp);
            let what = "Qualcomm's x86 HTP emulation running qnn/context.x86.bin";
            for (stage, reference, versus) in [
                ("htp_vs_fakequant", cpu_logits, "the CPU fake-quant run of the final IR"),
                ("htp_vs_interp", probe.text_rows(&qnn), "backend-qnn's reference interpreter on the lowered graph"),
            ] {
                graph_ledger.push(LedgerEntry {
                    stage,
                    graph: Some(name.clone()),
                    detail: probe.describe(&format!("{what} vs {versus}")),
                    comparison: Comparison::new("logits", reference, on_htp, job.hf.vocab_size)?,
                });
            }
        }
    }
    timings.validate += t.elapsed().as_secs_f64();

    // 6. Where the artifacts run: the compile's properties, and mllm's graph I/O contract checked
    // on the device binary as Qualcomm's system library reads it back.
    let traits = ArtifactTraits {
        sink_prefix: prefix.as_ref().map_or(0, |p| p.len()),
        shards: sharding.plan.count(),
        graphs: planned_graphs(job.family),
        eos_ids: job.hf.eos_token_ids.clone(),
        context_binary: htp.is_some() || shard_htp.is_some(),
    };
    let contract = htp.as_ref().map(|htp| {
        let shape = MllmModelShape {
            num_layers: job.hf.num_hidden_layers,
            kv_heads: job.hf.num_key_value_heads,
            head_dim: job.hf.head_dim,
            vocab_size: job.hf.vocab_size,
            context_len: job.family.contexts()[0],
        };
        crate::deploy::check_mllm_contract(&htp.device_info.graphs, &shape)
    });
    if job.opts.target_runtime == TargetRuntime::Mllm {
        if let Some(violations) = contract.as_ref().filter(|v| !v.is_empty()) {
            bail!("--target-runtime mllm: qnn/context.bin breaks mllm's graph I/O contract: {}", violations.join("; "));
        }
    }
    let deploy = crate::deploy::where_it_runs(&traits, contract.as_deref());
    Ok(GraphsDone { graphs, ledger: graph_ledger, deploy, shards: shard_lines })
}

/// The graphs a run builds, as [`crate::deploy`] sees them: `model.0.s<chunk>` at `--context-len`.
fn planned_graphs(family: &GraphFamily) -> Vec<GraphShape> {
    (family.members().into_iter())
        .map(|spec| GraphShape { name: family.name(spec, 0, 1), chunk: spec.chunk, context_len: spec.context_len })
        .collect()
}

/// `--target-runtime`'s checks before any work, and the context-binary setting that follows:
/// for mllm's runtime the binary is required (a run without Qualcomm's libraries fails now).
fn plan_for_target(opts: &AotOptions, family: &GraphFamily) -> Result<ContextBinary> {
    match opts.target_runtime {
        TargetRuntime::Any => Ok(opts.context_binary),
        TargetRuntime::Mllm => {
            let shipped = match &opts.source {
                ModelSource::Quantized(dir) => SinkPrefix::load_beside(dir)
                    .with_context(|| format!("the attention-sink prefix of {}", dir.display()))?
                    .map_or(0, |p| p.len()),
                _ => 0,
            };
            let plan = PlannedRun {
                sink_prefix: opts.sink_prefix.len().max(shipped),
                prefix_from_checkpoint: shipped > 0,
                shards: match opts.shards {
                    ShardCount::Fixed(n) => n,
                    ShardCount::Auto => 1,
                },
                graphs: planned_graphs(family),
                context_binary_off: opts.context_binary == ContextBinary::Off,
            };
            crate::deploy::refuse_for_mllm(&plan)?;
            Ok(ContextBinary::Required)
        }
    }
}

/// Sharded binaries hold one context length with mllm's names (`model.<i>.s<chunk>`).
fn check_family_shardable(family: &GraphFamily, shards: usize) -> Result<()> {
    ensure!(
        family.contexts().len() == 1 && family.naming() == GraphNaming::Mllm,
        "{shards} shards of a family with context lengths {:?} and {:?} names: sharded binaries hold one context \
         length with mllm's names (model.<i>.s<chunk>); pass one --context-len, or --shards 1",
        family.contexts(),
        family.naming()
    );
    Ok(())
}

/// The shard plan of a run: from the final IR's parameters (shapes and dtypes), `--shards`, the
/// binary limit and the memory budget.
fn plan_run_shards(opts: &AotOptions, split_graph: u32, compiled: &[CompiledGraph]) -> Result<AutoPlan> {
    let program = &compiled.first().context("no graph was compiled")?.program;
    // split_graph 1 is mllm's default (one binary): only a larger value asks for shards.
    let shards = match (opts.shards, split_graph as usize) {
        (ShardCount::Fixed(n), m) if m > 1 && n != m => bail!(
            "--shards {n} disagrees with the AOT config's split_graph {m} ({}): give one, or the same count",
            opts.aot_config.as_ref().map_or("built-in".to_string(), |p| p.display().to_string())
        ),
        (ShardCount::Auto, m) if m > 1 => ShardCount::Fixed(m),
        (shards, _) => shards,
    };
    let bytes = ModelBytes::from_program(program)?;
    let max_memory = opts.max_memory.unwrap_or_else(|| default_max_memory(available_memory(), &bytes));
    let limits = AutoLimits { max_context_bytes: opts.max_context_bytes, max_memory, factor: BUILD_MEMORY_FACTOR };
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    Ok(plan_shards(&bytes, shards, &limits, cores, opts.jobs)?)
}

impl AotOptions {
    /// The graphs these options ask for: every chunk size at every context length.
    pub fn family(&self) -> Result<GraphFamily> {
        Ok(GraphFamily::new(&self.chunks, &self.context_lens, self.graph_naming)?)
    }
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
                    .ok()
                    .with_context(|| format!("{} is outside the output directory", p.display()))?;
                Ok(r.to_string_lossy().replace('\\', "/"))
            })
            .collect::<Result<Vec<_>>>()?;
        rel.sort();
        rel.dedup();
        Ok(rel)
    }
}

/// One graph compiled: the IR after mllm's passes and the QNN graph lowered from it.
pub struct CompiledGraph {
    /// The family's name for it ([`GraphFamily::name`]; mllm's `model.0.s<chunk>` by default).
    pub name: String,
    pub spec: GraphSpec,
    pub program: Program,
    pub graph: QnnGraph,
}

/// What [`compile`] made.
pub struct CompiledModel {
    /// One per family member, in [`GraphFamily::members`] order.
    pub graphs: Vec<CompiledGraph>,
    /// The IR dumps written (with [`CompileOptions::dump_ir`]).
    pub ir_dumps: Vec<PathBuf>,
    pub timings: CompileTimings,
}

/// Wall time of [`compile`]'s steps, in seconds.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CompileTimings {
    pub trace: f64,
    pub passes: f64,
    pub lower: f64,
}

/// The graphs [`compile`] makes.
pub struct CompileOptions<'a> {
    /// The graphs to make: one per member.
    pub family: &'a GraphFamily,
    /// RoPE table rows of the checkpoint.
    pub max_positions: usize,
    /// Dump the IR before the first pass and after every pass into `<dir>/<graph>/`.
    pub dump_ir: Option<&'a Path>,
    /// Where each compiled graph is reported.
    pub progress: &'a dyn Progress,
}

/// A quantized checkpoint into QNN graphs: the model file of `hf` traced once per family member,
/// mllm's QNN AOT pass pipeline run with `ckpt`'s parameters, and every graph lowered by one
/// [`QnnLowering`] (weights shared by name, as in one context; checked with
/// [`check_weights_shared`]).
pub fn compile(
    hf: &HfConfig,
    ckpt: &SafetensorsCheckpoint,
    aot: &AotConfig,
    opts: &CompileOptions<'_>,
) -> Result<CompiledModel> {
    let mut timings = CompileTimings::default();
    let mut lowering = QnnLowering::new(ckpt, LowerOptions::default());
    let (mut graphs, mut ir_dumps) = (Vec::new(), Vec::new());
    let members = opts.family.members();
    let pb = opts.progress.start("compiling", members.len());
    for spec in members {
        let GraphSpec { chunk, context_len } = spec;
        let name = opts.family.name(spec, 0, 1);
        pb.set_message(&name);
        let t = Instant::now();
        let mut program = trace_graph(hf, opts.max_positions, chunk, context_len, ParamFormat::QnnW4A16)?;
        timings.trace += t.elapsed().as_secs_f64();
        let t = Instant::now();
        let mut pipeline = Pipeline::qnn_aot(aot, ckpt);
        if let Some(dir) = opts.dump_ir {
            pipeline = pipeline.dump_to(dir.join(&name));
        }
        let report = pipeline
            .run(&mut program)
            .with_context(|| format!("compiling graph `{name}` with the QNN AOT pass pipeline"))?;
        ir_dumps.extend(report.dumps);
        timings.passes += t.elapsed().as_secs_f64();
        let t = Instant::now();
        let mut lowered =
            lowering.lower_program(&program).with_context(|| format!("lowering graph `{name}` to QNN"))?;
        ensure!(lowered.len() == 1, "graph `{name}` lowered to {} QNN graphs, expected 1", lowered.len());
        let mut graph = lowered.remove(0);
        // The pass pipeline names every graph after its chunk (`model.0.s<chunk>`); the family's
        // name also tells members of one chunk at different context lengths apart.
        graph.name = name.clone();
        timings.lower += t.elapsed().as_secs_f64();
        graphs.push(CompiledGraph { name, spec, program, graph });
        pb.inc(1);
    }
    pb.finish();
    let lowered: Vec<QnnGraph> = graphs.iter().map(|g| g.graph.clone()).collect();
    check_weights_shared(&lowered)?;
    Ok(CompiledModel { graphs, ir_dumps, timings })
}

/// The QNN graphs of a quantized checkpoint for prefill chunk `chunk` (and decode, chunk 1) at
/// `context`, lowered together as for one context binary: `model.0.s<chunk>`, `model.0.s1`.
pub fn lower_for_context(dir: &Path, chunk: usize, context: usize) -> Result<Vec<QnnGraph>> {
    let chunks: &[usize] = if chunk == 1 { &[1] } else { &[chunk, 1] };
    let family = GraphFamily::new(chunks, &[context], GraphNaming::Mllm)?;
    lower_family(dir, &family)
}

/// [`lower_for_context`]'s compiled graphs (final IR and lowered graph).
pub fn compile_for_context(dir: &Path, chunk: usize, context: usize) -> Result<Vec<CompiledGraph>> {
    let chunks: &[usize] = if chunk == 1 { &[1] } else { &[chunk, 1] };
    compile_family(dir, &GraphFamily::new(chunks, &[context], GraphNaming::Mllm)?)
}

/// The QNN graphs of a quantized checkpoint for every member of `family`, lowered together as for
/// one context binary and named as the family names them.
pub fn lower_family(dir: &Path, family: &GraphFamily) -> Result<Vec<QnnGraph>> {
    Ok(compile_family(dir, family)?.into_iter().map(|g| g.graph).collect())
}

/// [`lower_family`]'s compiled graphs (final IR and lowered graph).
pub fn compile_family(dir: &Path, family: &GraphFamily) -> Result<Vec<CompiledGraph>> {
    let hf = HfConfig::from_dir(dir)?;
    let ckpt = SafetensorsCheckpoint::open(dir)?;
    let Some(max_positions) = rope_positions(&ckpt)? else {
        bail!("{}: not a quantized checkpoint with RoPE tables (`{ROPE_SIN_TABLE}`)", dir.display())
    };
    for &context in family.contexts() {
        ensure!(
            context <= max_positions,
            "--context {context} exceeds the checkpoint's {max_positions} RoPE positions"
        );
    }
    let (aot, _) = load_aot_config(None, &hf)?;
    let opts = CompileOptions { family, max_positions, dump_ir: None, progress: &crate::progress::Silent };
    Ok(compile(&hf, &ckpt, &aot, &opts)?.graphs)
}

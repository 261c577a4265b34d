//! The main job end to end: an HF float checkpoint (or an already quantized one) becomes QNN
//! graphs, with a per-stage accuracy ledger that says which stage lost accuracy ([`run`]).
//!
//! [`run`] calls the stages of [`crate::stages`] in order, each a function from its input to
//! its output; a library user can stop after any of them or run one on an input of their own:
//!
//! 1. [`stages::preflight`] → [`stages::Plan`]: the options checked against each other and the
//!    target runtime, Qualcomm's libraries found, before any work;
//! 2. [`stages::load`] → [`stages::Loaded`]: the model directory (or the embedded tiny Qwen3,
//!    written into the output directory), its `config.json` and the AOT config;
//! 3. [`stages::quantize`] → [`stages::Quantized`]: a float model calibrated and quantized
//!    ([`crate::quantize`]'s steps: observers over the calibration ids, LPBQ / uint16 weights, a
//!    quantized checkpoint in pymllm's format in `quantized/`), or the quantized checkpoint given;
//! 4. [`stages::trace`] → [`stages::Traced`]: one graph per family member (mllm's `model.0.s<chunk>`);
//! 5. [`stages::passes`] → [`stages::Passed`]: mllm's QNN AOT pipeline, the IR dumped after every pass;
//! 6. [`stages::lower`] → [`stages::Lowered`]: QNN graphs from one [`backend_qnn::QnnLowering`]
//!    (weights shared by name, as in one context);
//! 7. [`stages::write_qnn`] → [`stages::QnnFiles`]: the shard plan and `qnn/<graph>.{json,cpp,summary.txt}`
//!    with `qnn/weights.bin`;
//! 8. [`stages::context_binaries`] → [`stages::ContextBinaries`] ([`crate::htp`]), when Qualcomm's
//!    libraries are there: `qnn/context.bin` (weight-shared, for the device) and
//!    `qnn/context.x86.bin` (for the x86 emulation);
//! 9. [`stages::validate`] → [`stages::Validated`]: the per-graph ledger rows ([`crate::ledger`]),
//!    with `htp_*` rows from Qualcomm's emulation, and where the artifacts run;
//! 10. [`stages::evaluated`] → [`stages::Evaluated`]: the accuracy report against float
//!     (`fakequant_vs_float`), which after a calibration runs on a second thread beside steps 4-9
//!     (they only read the quantized checkpoint too);
//! 11. [`stages::report`] → [`AotReport`], written as `report.json`.
//!
//! A [`Stopwatch`] times the stages into [`crate::Timings`] (`report.json`'s `timings_s`).
//!
//! Every file is written to a temporary name and renamed. Two runs with the same inputs write
//! byte-identical files, except `report.json`'s `timings_s` and the context binaries (Qualcomm's
//! serializer does not reproduce its bytes from run to run).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::{bail, ensure, AotError, Result};
use backend_cpu::quant::{CalibrationMode, Rotation, WeightMethod};
use backend_qnn::QnnGraph;
use checkpoint::SafetensorsCheckpoint;
use compiler::aot_config::AotConfig;
use compiler::quant::act_range::ActRanges;
use mllm_dsl::Program;
use models::hf::HfConfig;

use crate::config::{load_aot_config, DEFAULT_CHUNKS, DEFAULT_CONTEXT_LEN, DEFAULT_MAX_POSITIONS};
use crate::deploy::TargetRuntime;
use crate::family::{GraphFamily, GraphNaming, GraphSpec};
use crate::htp::ContextBinary;
use crate::load::rope_positions;
use crate::progress::Progress;
use crate::report::{AotReport, Step, Stopwatch};
use crate::sequences::CalibSource;
use crate::shard::{ShardCount, DEFAULT_MAX_CONTEXT_BYTES};
use crate::stages::{self, OutputDir};
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

/// [`run`] writing straight into `out` (a fresh directory: the staging area): the stages of
/// [`crate::stages`] in order.
fn run_in(opts: &AotOptions, out: &Path) -> Result<AotReport> {
    let mut clock = Stopwatch::start();
    let mut files = OutputDir::new(out);
    let plan = stages::preflight(opts)?;
    let loaded = clock.stage(Step::Load, || stages::load(opts, plan, &mut files))?;
    let mut model = stages::quantize(opts, &loaded, &mut files, &mut clock)?;
    // After a calibration, the accuracy report runs on another thread meanwhile (both only read
    // the quantized checkpoint).
    let progress = opts.progress.as_ref();
    let compiled = (|| {
        let (hf, ckpt) = (&model.hf, &model.checkpoint);
        let traced = clock.stage(Step::Trace, || stages::trace(hf, model.max_positions, &loaded.family, progress))?;
        let dump_ir = out.join("ir");
        let passed =
            clock.stage(Step::Passes, || stages::passes(traced, &loaded.aot, ckpt, Some(&dump_ir), progress))?;
        passed.ir_dumps.iter().for_each(|p| files.record(p));
        let lowered = clock.stage(Step::Lower, || stages::lower(passed, ckpt, progress))?;
        let qnn = clock.stage(Step::Lower, || stages::write_qnn(&lowered, &model, opts, &loaded, &mut files))?;
        let binaries = stages::context_binaries(&lowered, &qnn, &model, opts, &loaded, &mut files, &mut clock)?;
        let validated =
            stages::validate(&lowered, &qnn, binaries.as_ref(), &model, opts, &loaded, &mut files, &mut clock)?;
        Ok::<_, AotError>((qnn, validated))
    })();
    // The accuracy report's error first when both failed.
    let evaluated = stages::evaluated(&mut model, &mut files, &mut clock);
    let (evaluated, (qnn, validated)) = (evaluated?, compiled?);
    stages::report(loaded, model, evaluated, qnn, validated, files, clock)
}

impl AotOptions {
    /// The graphs these options ask for: every chunk size at every context length.
    pub fn family(&self) -> Result<GraphFamily> {
        Ok(GraphFamily::new(&self.chunks, &self.context_lens, self.graph_naming)?)
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
    let mut clock = Stopwatch::start();
    let traced = clock.stage(Step::Trace, || stages::trace(hf, opts.max_positions, opts.family, opts.progress))?;
    let mut passed = clock.stage(Step::Passes, || stages::passes(traced, aot, ckpt, opts.dump_ir, opts.progress))?;
    let ir_dumps = std::mem::take(&mut passed.ir_dumps);
    let lowered = clock.stage(Step::Lower, || stages::lower(passed, ckpt, opts.progress))?;
    let t = clock.timings();
    let timings = CompileTimings { trace: t.trace, passes: t.passes, lower: t.lower };
    Ok(CompiledModel { graphs: lowered.graphs, ir_dumps, timings })
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
            "context length {context} exceeds the checkpoint's {max_positions} RoPE positions"
        );
    }
    let (aot, _) = load_aot_config(None, &hf)?;
    let opts = CompileOptions { family, max_positions, dump_ir: None, progress: &crate::progress::Silent };
    Ok(compile(&hf, &ckpt, &aot, &opts)?.graphs)
}

//! The main job ([`crate::run`]) as typed stages, each a function from its input to its output.
//! A library user can stop after any stage, or run one stage on an input built by hand.
//!
//! | stage                 | input                                  | output                 |
//! |-----------------------|----------------------------------------|------------------------|
//! | [`preflight`]         | [`AotOptions`]                         | [`Plan`]               |
//! | [`load`]              | [`Plan`]                               | [`Loaded`]             |
//! | [`quantize`]          | [`Loaded`]                             | [`Quantized`]          |
//! | [`trace`]             | config, RoPE rows, [`GraphFamily`]     | [`Traced`]             |
//! | [`passes`]            | [`Traced`], AOT config, QDQ parameters | [`Passed`]             |
//! | [`lower`]             | [`Passed`], QDQ parameters             | [`Lowered`]            |
//! | [`write_qnn`]         | [`Lowered`]                            | [`QnnFiles`]           |
//! | [`context_binaries`]  | [`Lowered`], [`QnnFiles`]              | [`ContextBinaries`]    |
//! | [`validate`]          | all of the above                       | [`Validated`]          |
//! | [`evaluated`]         | [`Quantized`]'s pending accuracy report | [`Evaluated`]         |
//! | [`report`]            | all of the above                       | [`AotReport`]          |
//!
//! The stages that write files take the run's [`OutputDir`], which lists what they wrote for the
//! report. A [`Stopwatch`] records each stage's wall time under its `report.json` `timings_s` key
//! ([`Step`]); the stages made of several timed steps take it as an argument.
//!
//! After a calibration, [`quantize`] returns with the accuracy report against float
//! (`fakequant_vs_float`) running on a second thread ([`PendingEvaluation`]); the stages after it
//! only read the quantized checkpoint, and [`evaluated`] waits for the report.
//!
//! ```no_run
//! use aot::stages;
//! // The embedded tiny Qwen3 up to its lowered QNN graphs, without context binaries or a ledger.
//! let opts = aot::AotOptions::embedded("out");
//! let mut out = stages::OutputDir::new("out");
//! let mut clock = aot::Stopwatch::start();
//! let loaded = stages::load(&opts, stages::preflight(&opts)?, &mut out)?;
//! let model = stages::quantize(&opts, &loaded, &mut out, &mut clock)?;
//! let progress = aot::progress::Silent;
//! let traced = stages::trace(&model.hf, model.max_positions, &loaded.family, &progress)?;
//! let passed = stages::passes(traced, &loaded.aot, &model.checkpoint, None, &progress)?;
//! let lowered = stages::lower(passed, &model.checkpoint, &progress)?;
//! for g in &lowered.graphs {
//!     println!("{}: {} QNN ops", g.name, g.graph.nodes.len());
//! }
//! # Ok::<(), aot::AotError>(())
//! ```

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use backend_cpu::quant::accuracy::Comparison;
use backend_cpu::quant::{is_quantized_checkpoint, SinkPrefix, Sqnr};
use backend_cpu::{CheckpointStore, CpuBackend, GridProducts, InterpMode, Interpreter};
use backend_qnn::artifacts::summary::summarize;
use backend_qnn::artifacts::write_shared_artifacts;
use backend_qnn::cost::GraphCost;
use backend_qnn::sdk::LibraryPaths;
use backend_qnn::target::HtpTarget;
use backend_qnn::{LowerOptions, QnnGraph, QnnLowering};
use checkpoint::SafetensorsCheckpoint;
use compiler::aot_config::AotConfig;
use compiler::passes::{Pipeline, QuantParamProvider};
use mllm_dsl::files::{write_atomic_bytes as write_atomic, write_json_atomic};
use mllm_dsl::{ParamFormat, Program};
use models::hf::HfConfig;
use models::keys::ROPE_SIN_TABLE;

use crate::calibrate::{write_and_evaluate, PendingEvaluation, QuantizeOptions, QuantizeOutcome};
use crate::compile::{AotOptions, CompiledGraph, ModelSource};
use crate::config::{load_aot_config, DEFAULT_CONTEXT_LEN};
use crate::cpu_embedding::{write_table, EmbeddingTable, EMBEDDING_FILE};
use crate::deploy::{ArtifactRuntimes, ArtifactTraits, GraphShape, MllmModelShape, PlannedRun, TargetRuntime};
use crate::divergence::{op_by_op, table as divergence_table};
use crate::embedded::{EMBEDDED_CALIB_IDS, EMBEDDED_MODEL, EMBEDDED_MODEL_NAME};
use crate::error::{bail, ensure, AotError, Context, Result};
use crate::family::{check_weights_shared, GraphFamily, GraphNaming, GraphSpec};
use crate::htp::{ContextBinary, QualcommHtp};
use crate::ledger::{float_vs_reference, quantized_vs_reference_float, reference_logits, LedgerEntry};
use crate::load::{fake_quant_backend, open_model, rope_positions};
use crate::probe::Probe;
pub use crate::probe::ProbeText;
use crate::progress::Progress;
use crate::report::{AotReport, GraphReport, Step, Stopwatch};
use crate::run_sizes::{available_memory, RunSizes};
use crate::sequences::CalibSource;
use crate::shard::{
    default_max_memory, plan_shards, AutoLimits, AutoPlan, ModelBytes, ShardCount, BUILD_MEMORY_FACTOR,
};
use crate::sharded_aot::{
    build_binaries, chain_inputs, chain_label, chain_logits_on_htp, chain_logits_on_interpreter, lower_shards,
    open_checkpoint,
};
use crate::sink::sink_prefix_ids;
use crate::trace::{trace_graph, trace_model};

/// A run's output directory and the files its stages wrote there (the report's `artifacts`).
#[derive(Clone, Debug)]
pub struct OutputDir {
    root: PathBuf,
    paths: Vec<PathBuf>,
}

impl OutputDir {
    pub fn new(root: impl Into<PathBuf>) -> OutputDir {
        OutputDir { root: root.into(), paths: Vec::new() }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Writes `bytes` to `path` (a temporary name, renamed) and records it.
    pub fn write(&mut self, path: &Path, bytes: &[u8]) -> Result<()> {
        write_atomic(path, bytes)?;
        self.record(path);
        Ok(())
    }

    /// Records a file written by someone else.
    pub fn record(&mut self, path: &Path) {
        self.paths.push(path.to_path_buf());
    }

    /// Records every file directly in `dir`.
    pub fn record_dir(&mut self, dir: &Path) -> Result<()> {
        for entry in std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
            let path = entry?.path();
            if path.is_file() {
                self.record(&path);
            }
        }
        Ok(())
    }

    /// The recorded files relative to the root, sorted, each once.
    pub fn relative(&self) -> Result<Vec<String>> {
        let mut rel = self
            .paths
            .iter()
            .map(|p| {
                let r = p
                    .strip_prefix(&self.root)
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

/// What the options ask for, checked before any work ([`preflight`]).
#[derive(Clone, Debug)]
pub struct Plan {
    /// The graphs to build.
    pub family: GraphFamily,
    /// Qualcomm's libraries, when the context binaries are to be built.
    pub qualcomm: Option<LibraryPaths>,
    pub warnings: Vec<String>,
}

/// Checks the options against each other and the target runtime, and finds Qualcomm's libraries
/// when they are asked for (a missing one required fails now; one merely wanted is a warning).
pub fn preflight(opts: &AotOptions) -> Result<Plan> {
    let family = opts.family()?;
    if let ShardCount::Fixed(n @ 2..) = opts.shards {
        check_family_shardable(&family, n)?;
    }
    let mut warnings = Vec::new();
    let qualcomm = match plan_for_target(opts, &family)? {
        ContextBinary::Off => None,
        ContextBinary::Required => {
            let why = match opts.target_runtime {
                TargetRuntime::Mllm => {
                    "AotOptions::target_runtime mllm needs the context binary, built by Qualcomm's QNN libraries"
                }
                TargetRuntime::Any => "AotOptions::context_binary needs Qualcomm's QNN libraries",
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
    Ok(Plan { family, qualcomm, warnings })
}

/// The model as [`load`] found it: its checkpoint directory, configs and what to calibrate it on.
pub struct Loaded {
    /// The model's name in the report.
    pub model_name: String,
    /// The checkpoint directory: float or quantized, as the source is (the embedded model is
    /// written into the output directory first).
    pub model_dir: PathBuf,
    /// What to calibrate on; `None` for a quantized checkpoint.
    pub calibration: Option<Vec<CalibSource>>,
    pub hf: HfConfig,
    pub aot: AotConfig,
    pub target: HtpTarget,
    pub family: GraphFamily,
    /// Qualcomm's libraries, when the context binaries are to be built.
    pub qualcomm: Option<LibraryPaths>,
    /// The plan's warnings and the AOT config's.
    pub warnings: Vec<String>,
}

/// The model directory (the embedded tiny Qwen3 written into `out/embedded/`), its `config.json`
/// checked with the run's sizes against the memory, and the AOT config.
pub fn load(opts: &AotOptions, plan: Plan, out: &mut OutputDir) -> Result<Loaded> {
    let Plan { family, qualcomm, mut warnings } = plan;
    let (model_name, model_dir, calibration) = match &opts.source {
        ModelSource::Embedded => {
            let dir = out.root().join("embedded/qwen3-dev-f32");
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            for (name, bytes) in EMBEDDED_MODEL {
                out.write(&dir.join(name), bytes)?;
            }
            let ids = out.root().join("embedded/calib_ids.safetensors");
            out.write(&ids, EMBEDDED_CALIB_IDS)?;
            let calib =
                if opts.calibration.is_empty() { vec![CalibSource::Ids(ids)] } else { opts.calibration.clone() };
            (EMBEDDED_MODEL_NAME.to_string(), dir, Some(calib))
        }
        ModelSource::Float(dir) => {
            if opts.calibration.is_empty() {
                bail!("ModelSource::Float {} needs calibration data: pass AotOptions::calibration", dir.display());
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
    Ok(Loaded { model_name, model_dir, calibration, hf, aot, target, family, qualcomm, warnings })
}

/// A quantized checkpoint the graphs are compiled from ([`quantize`], [`Quantized::open`]).
pub struct Quantized {
    pub dir: PathBuf,
    pub checkpoint: SafetensorsCheckpoint,
    /// The model's config.
    pub hf: HfConfig,
    /// Rows of its RoPE tables.
    pub max_positions: usize,
    /// Its model file traced once for the QDQ points (by the calibration, or for it).
    pub traced: Arc<Program>,
    /// The text the per-graph ledger probes are cut from.
    pub probe_text: ProbeText,
    /// Ledger rows measured on the way (`float_vs_reference`).
    pub ledger: Vec<LedgerEntry>,
    /// The accuracy report against float, under way after a calibration ([`evaluated`]).
    pub evaluation: Option<PendingEvaluation>,
}

impl Quantized {
    /// A quantized checkpoint directory (pymllm's export or this project's) as it is, with config
    /// `hf`: its RoPE tables fix the positions, and the probes are cut from its
    /// `reference.safetensors` `input_ids` when it has them.
    pub fn open(dir: &Path, hf: &HfConfig) -> Result<Quantized> {
        let ckpt = SafetensorsCheckpoint::open(dir)?;
        ensure!(
            is_quantized_checkpoint(&ckpt),
            "ModelSource::Quantized {} holds a float checkpoint (no `*.fake_quant.scale` / `*.scale1` tensors); \
             calibrate it with ModelSource::Float",
            dir.display()
        );
        let Some(rows) = rope_positions(&ckpt)? else {
            bail!("{}: the quantized checkpoint has no RoPE table `{ROPE_SIN_TABLE}`", dir.display())
        };
        let probe_text = match reference_logits(dir, "float_logits")? {
            Some((ids, _)) => ProbeText { ids, source: "reference.safetensors `input_ids`".into() },
            None => ProbeText::deterministic(hf.vocab_size),
        };
        let traced = trace_model(hf, rows, ParamFormat::QnnW4A16)?;
        Ok(Quantized {
            dir: dir.to_path_buf(),
            checkpoint: ckpt,
            hf: hf.clone(),
            max_positions: rows,
            traced: Arc::new(traced),
            probe_text,
            ledger: Vec::new(),
            evaluation: None,
        })
    }
}

/// The quantized checkpoint of the run: a float model (the embedded one too) calibrated and
/// quantized into `out/quantized/` ([`crate::quantize`]'s steps), its accuracy report against
/// float left running on another thread; or the quantized checkpoint given, as it is.
pub fn quantize(opts: &AotOptions, loaded: &Loaded, out: &mut OutputDir, clock: &mut Stopwatch) -> Result<Quantized> {
    let (hf, float_dir) = (&loaded.hf, &loaded.model_dir);
    let Some(calib) = &loaded.calibration else {
        ensure!(
            opts.sink_prefix.is_empty(),
            "AotOptions::sink_prefix is chosen when calibrating; the quantized checkpoint {} ships its own prefix (or \
             none)",
            float_dir.display()
        );
        return Quantized::open(float_dir, hf);
    };
    let calibration =
        clock.stage(Step::Load, || CalibSource::load_all(calib, float_dir, hf.vocab_size, opts.max_positions, 128))?;
    let probe_text = ProbeText {
        ids: calibration.iter().flatten().copied().collect(),
        source: "the calibration sequences, concatenated".into(),
    };
    let ledger = clock.stage(Step::Evaluate, || float_vs_reference(float_dir, hf, opts.max_positions))?;
    let quant_dir = out.root().join("quantized");
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
        sink_prefix: sink_prefix_ids(&opts.sink_prefix, float_dir, hf.vocab_size)?,
        weight_budget: opts.weight_budget,
    };
    // Straight into this run's staging directory, which is swapped in as a whole.
    std::fs::create_dir(&quant_dir).with_context(|| format!("creating {}", quant_dir.display()))?;
    let evaluation = write_and_evaluate(hf, &options, &quant_dir)?;
    Ok(Quantized {
        checkpoint: open_checkpoint(&quant_dir)?,
        dir: quant_dir,
        hf: hf.clone(),
        max_positions: opts.max_positions,
        traced: evaluation.traced().clone(),
        probe_text,
        ledger: ledger.into_iter().collect(),
        evaluation: Some(evaluation),
    })
}

/// One graph of a family as IR: traced ([`Traced`]) or after the passes ([`Passed`]).
#[derive(Clone, Debug)]
pub struct GraphIr {
    /// The family's name for it ([`GraphFamily::name`]; mllm's `model.0.s<chunk>` by default).
    pub name: String,
    pub spec: GraphSpec,
    pub program: Program,
}

/// Every member of a family traced from the model file, before any pass ([`trace`]).
#[derive(Clone, Debug)]
pub struct Traced {
    /// In [`GraphFamily::members`] order.
    pub graphs: Vec<GraphIr>,
}

/// The model file of `hf` traced once per member of `family` with W4A16 parameters, for RoPE
/// tables of `max_positions` rows (which must cover every context length).
pub fn trace(hf: &HfConfig, max_positions: usize, family: &GraphFamily, progress: &dyn Progress) -> Result<Traced> {
    for &context_len in family.contexts() {
        ensure!(
            context_len <= max_positions,
            "context length {context_len} exceeds the {max_positions} positions the checkpoint's RoPE tables cover"
        );
    }
    let members = family.members();
    let pb = progress.start("tracing", members.len());
    let mut graphs = Vec::with_capacity(members.len());
    for spec in members {
        let name = family.name(spec, 0, 1);
        pb.set_message(&name);
        let program = trace_graph(hf, max_positions, spec.chunk, spec.context_len, ParamFormat::QnnW4A16)?;
        graphs.push(GraphIr { name, spec, program });
        pb.inc(1);
    }
    pb.finish();
    Ok(Traced { graphs })
}

/// The traced graphs after mllm's QNN AOT pass pipeline: the final IR ([`passes`]).
#[derive(Clone, Debug)]
pub struct Passed {
    pub graphs: Vec<GraphIr>,
    /// The IR dumps written (with a dump directory).
    pub ir_dumps: Vec<PathBuf>,
}

/// mllm's QNN AOT pass pipeline over every traced graph, with `aot`'s settings and the QDQ
/// parameters `params` (the quantized checkpoint); the IR before the first pass and after every
/// pass dumped into `<dump_ir>/<graph>/` when given.
pub fn passes(
    traced: Traced,
    aot: &AotConfig,
    params: &dyn QuantParamProvider,
    dump_ir: Option<&Path>,
    progress: &dyn Progress,
) -> Result<Passed> {
    let pb = progress.start("compiling", traced.graphs.len());
    let mut ir_dumps = Vec::new();
    let mut graphs = traced.graphs;
    for GraphIr { name, program, .. } in &mut graphs {
        pb.set_message(name);
        let mut pipeline = Pipeline::qnn_aot(aot, params);
        if let Some(dir) = dump_ir {
            pipeline = pipeline.dump_to(dir.join(&*name));
        }
        let report = pipeline
            .run(program)
            .with_context(|| format!("compiling graph `{name}` with the QNN AOT pass pipeline"))?;
        ir_dumps.extend(report.dumps);
        pb.inc(1);
    }
    pb.finish();
    Ok(Passed { graphs, ir_dumps })
}

/// Every graph of a family lowered to QNN ([`lower`]).
pub struct Lowered {
    /// In [`GraphFamily::members`] order.
    pub graphs: Vec<CompiledGraph>,
}

/// The final IR of every graph lowered to QNN by one [`QnnLowering`] with the QDQ parameters
/// `params` (weights shared by name, as in one context; checked with [`check_weights_shared`]).
pub fn lower(passed: Passed, params: &dyn QuantParamProvider, progress: &dyn Progress) -> Result<Lowered> {
    let mut lowering = QnnLowering::new(params, LowerOptions::default());
    let pb = progress.start("lowering", passed.graphs.len());
    let mut graphs = Vec::with_capacity(passed.graphs.len());
    for GraphIr { name, spec, program } in passed.graphs {
        pb.set_message(&name);
        let mut lowered =
            lowering.lower_program(&program).with_context(|| format!("lowering graph `{name}` to QNN"))?;
        ensure!(lowered.len() == 1, "graph `{name}` lowered to {} QNN graphs, expected 1", lowered.len());
        let mut graph = lowered.remove(0);
        // The pass pipeline names every graph after its chunk (`model.0.s<chunk>`); the family's
        // name also tells members of one chunk at different context lengths apart.
        graph.name = name.clone();
        graphs.push(CompiledGraph { name, spec, program, graph });
        pb.inc(1);
    }
    pb.finish();
    let lowered: Vec<QnnGraph> = graphs.iter().map(|g| g.graph.clone()).collect();
    check_weights_shared(&lowered)?;
    Ok(Lowered { graphs })
}

/// The SDK-free QNN artifacts in `qnn/` and how the layers were cut ([`write_qnn`]).
pub struct QnnFiles {
    /// The graphs written: the lowered ones, or with shards every shard's.
    pub graphs: Vec<QnnGraph>,
    /// How many context binaries, and why.
    pub sharding: AutoPlan,
    /// With shards, every shard's graphs, `[shard][chunk]`.
    pub shard_graphs: Option<Vec<Vec<QnnGraph>>>,
    /// With shards, the token embedding gathered on the CPU (`qnn/embedding.safetensors`).
    pub embedding: Option<EmbeddingTable>,
    /// The report's `shards` lines.
    pub shard_lines: Vec<String>,
}

/// The shard plan (`opts.shards`, or mllm's split_graph in the AOT config), and
/// `qnn/<graph>.{json,cpp,summary.txt}` with one `model.bin` per context binary of the lowered
/// graphs, or with shards of every shard's graphs (mllm's layout) and the CPU embedding table.
pub fn write_qnn(
    lowered: &Lowered,
    model: &Quantized,
    opts: &AotOptions,
    loaded: &Loaded,
    out: &mut OutputDir,
) -> Result<QnnFiles> {
    let sharding = plan_run_shards(opts, loaded.aot.split_graph, &lowered.graphs)?;
    if sharding.plan.count() > 1 {
        check_family_shardable(&loaded.family, sharding.plan.count())?;
    }
    let mut shard_lines = sharding.reasons.clone();
    shard_lines.extend(sharding.plan.table().lines().map(str::to_string));
    let sharded = sharding.plan.count() > 1;
    if sharded && opts.target_runtime == TargetRuntime::Mllm {
        bail!(
            "AotOptions::target_runtime mllm: this model needs {} shards ({}), and mllm's runtime opens one context \
             binary",
            sharding.plan.count(),
            sharding.reasons.join("; ")
        );
    }
    let qnn_dir = out.root().join("qnn");
    std::fs::create_dir_all(&qnn_dir).with_context(|| format!("creating {}", qnn_dir.display()))?;
    let shard_graphs = match sharded {
        true => Some(lower_shards(&lowered.graphs, &sharding.plan, &model.checkpoint, LowerOptions::default())?),
        false => None,
    };
    let written_graphs: Vec<&QnnGraph> = match &shard_graphs {
        Some(s) => s.iter().flatten().collect(),
        None => lowered.graphs.iter().map(|g| &g.graph).collect(),
    };
    let embedding = match &shard_graphs {
        Some(_) => {
            let path = qnn_dir.join(EMBEDDING_FILE);
            write_table(&model.checkpoint, &path)?;
            out.record(&path);
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
                out.record(p);
            }
        }
        out.record(&written.model_bin);
    }
    let graphs = written_graphs.into_iter().cloned().collect();
    Ok(QnnFiles { graphs, sharding, shard_graphs, embedding, shard_lines })
}

/// The context binaries built by Qualcomm's backend ([`context_binaries`]).
pub enum ContextBinaries {
    /// `qnn/context.bin` (weight-shared, for the device) and `qnn/context.x86.bin` (for the x86
    /// emulation): every graph in one context.
    One(QualcommHtp),
    /// `qnn/context_<i>_of_<n>.bin` and `.x86.bin` per shard, built in child processes.
    Sharded {
        paths: LibraryPaths,
        /// Each shard's x86 binary.
        x86: Vec<Vec<u8>>,
        /// Each shard's graphs as built, `[shard][chunk]`.
        graphs: Vec<Vec<QnnGraph>>,
    },
}

/// The context binaries of the lowered graphs (or of every shard), when the plan found
/// Qualcomm's libraries; `None` otherwise.
#[allow(clippy::too_many_arguments)]
pub fn context_binaries(
    lowered: &Lowered,
    qnn: &QnnFiles,
    model: &Quantized,
    opts: &AotOptions,
    loaded: &Loaded,
    out: &mut OutputDir,
    clock: &mut Stopwatch,
) -> Result<Option<ContextBinaries>> {
    let Some(paths) = loaded.qualcomm.clone() else { return Ok(None) };
    let qnn_dir = out.root().join("qnn");
    if qnn.shard_graphs.is_some() {
        let built = clock.stage(Step::ContextBinary, || {
            let exe = match &opts.shard_exe {
                Some(exe) => exe.clone(),
                None => std::env::current_exe().context("locating this program to build the shards")?,
            };
            build_binaries(
                &exe,
                &model.dir,
                opts.aot_config.as_deref(),
                &qnn.sharding,
                loaded.family.chunks(),
                loaded.family.contexts()[0],
                &qnn_dir,
                &out.root().join(".shard-jobs"),
            )
        })?;
        built.written.iter().for_each(|p| out.record(p));
        let graphs =
            lower_shards(&lowered.graphs, &qnn.sharding.plan, &model.checkpoint, LowerOptions::qualcomm_htp())?;
        return Ok(Some(ContextBinaries::Sharded { paths, x86: built.x86, graphs }));
    }
    let programs: Vec<(&str, &Program)> = lowered.graphs.iter().map(|g| (g.name.as_str(), &g.program)).collect();
    let htp = QualcommHtp::build(paths, &programs, &model.checkpoint, &loaded.target, &qnn_dir)?;
    htp.written.iter().for_each(|p| out.record(p));
    clock.add(Step::ContextBinary, htp.seconds[0]);
    clock.add(Step::ContextBinaryX86, htp.seconds[1]);
    Ok(Some(ContextBinaries::One(htp)))
}

/// The per-graph ledger rows and where the artifacts run ([`validate`]).
pub struct Validated {
    /// `quantized_vs_reference_float` (a checkpoint with reference float logits), then per graph
    /// `passes_vs_eager`, `qnn_vs_fakequant` and with context binaries `htp_vs_*`.
    pub ledger: Vec<LedgerEntry>,
    /// Which runtime runs each artifact ([`crate::deploy::where_it_runs`]).
    pub deploy: Vec<ArtifactRuntimes>,
}

/// Every graph run on a probe of real text by the eager fake-quant model, backend-cpu's IR
/// interpreter, backend-qnn's reference interpreter (the chained shards with shards) and
/// Qualcomm's x86 emulation when there are context binaries, compared in ledger rows; then where
/// the artifacts run, with mllm's graph I/O contract checked on the device binary.
#[allow(clippy::too_many_arguments)]
pub fn validate(
    lowered: &Lowered,
    qnn: &QnnFiles,
    binaries: Option<&ContextBinaries>,
    model: &Quantized,
    opts: &AotOptions,
    loaded: &Loaded,
    out: &mut OutputDir,
    clock: &mut Stopwatch,
) -> Result<Validated> {
    let (hf, ckpt) = (&loaded.hf, &model.checkpoint);
    let mut ledger = Vec::new();
    // The eager fake-quant model, built once for the ledger. Its linears (and the IR
    // interpreter's below) sum in f32, as backend-qnn's interpreter does, so `qnn_vs_fakequant`
    // measures the lowering and not the summation order: on SmolLM2 the integer tile's exact sums
    // put the 32-row graph at 34.5 dB against the interpreter, f32 sums at 39.0.
    let (eager_backend, eager_model, prefix) = clock.stage(Step::Validate, || {
        let backend = fake_quant_backend(ckpt, &model.traced, GridProducts::F32)?;
        let (eager, _) = open_model(&model.dir, hf, model.max_positions, &backend)?;
        let prefix = SinkPrefix::load_beside(&model.dir)
            .with_context(|| format!("the attention-sink prefix of {}", model.dir.display()))?;
        Ok::<_, AotError>((backend, eager, prefix))
    })?;
    let reference_float = clock
        .stage(Step::Evaluate, || quantized_vs_reference_float(&model.dir, hf, eager_model.as_ref(), &eager_backend))?;
    ledger.extend(reference_float);

    clock.stage(Step::Validate, || {
        let store = CheckpointStore::for_config(&model.dir, CpuBackend::float(), hf)?;
        let sharded = qnn.shard_graphs.is_some();
        for CompiledGraph { name, spec, program, graph } in &lowered.graphs {
            let probe = Probe::new(
                hf,
                ckpt,
                spec.chunk,
                spec.context_len,
                &model.probe_text,
                eager_model.as_ref(),
                &eager_backend,
                prefix.as_ref(),
            )?;
            let eager = probe.run_eager(eager_model.as_ref(), &eager_backend)?;
            let cpu = Interpreter::new(program, &store, InterpMode::FakeQuant(ckpt))
                .with_grid_products(GridProducts::F32)
                .run(&probe.cpu_inputs(&CpuBackend::float())?)
                .with_context(|| format!("running graph `{name}` on backend-cpu's IR interpreter"))?;
            let cpu_logits = probe.text_rows(cpu[0].as_f32().context("the interpreter's logits hold no f32 data")?);
            ledger.push(LedgerEntry {
                stage: "passes_vs_eager",
                graph: Some(name.clone()),
                detail: probe
                    .describe("backend-cpu's interpreter (fake-quant) on the final IR vs the eager fake-quant model"),
                comparison: Comparison::new("logits", probe.text_rows(&eager), cpu_logits, hf.vocab_size)?,
            });
            let chunk_index = lowered.graphs.iter().position(|g| &g.name == name).unwrap_or(0);
            let qnn_logits = match &qnn.shard_graphs {
                Some(shards) => {
                    let chain: Vec<&QnnGraph> = shards.iter().map(|s| &s[chunk_index]).collect();
                    let inputs = chain_inputs(graph, probe.qnn_inputs(graph)?, chain[0], qnn.embedding.as_ref())?;
                    chain_logits_on_interpreter(&chain, &inputs)?
                }
                None => probe.run_qnn(graph)?,
            };
            let label = match sharded {
                true => chain_label(&qnn.sharding.plan, spec.chunk),
                false => name.clone(),
            };
            let comparison = Comparison::new("logits", cpu_logits, probe.text_rows(&qnn_logits), hf.vocab_size)?;
            let mut detail = probe.describe(if sharded {
                "backend-qnn's reference interpreter on the lowered shards, chained, vs the CPU fake-quant run"
            } else {
                "backend-qnn's reference interpreter on the lowered graph vs the CPU fake-quant run"
            });
            if opts.ledger_ops {
                // Where the two part ways, node by node.
                let rows = op_by_op(program, graph, ckpt, &store, &probe)?;
                let dir = out.root().join("ledger_ops");
                std::fs::create_dir_all(&dir)?;
                out.write(&dir.join(format!("{name}.txt")), divergence_table(&rows).as_bytes())?;
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
            ledger.push(LedgerEntry { stage: "qnn_vs_fakequant", graph: Some(label.clone()), detail, comparison });
            let qnn_rows = probe.text_rows(&qnn_logits);
            let (on_htp, what, graph_label, interp) = match binaries {
                Some(ContextBinaries::Sharded { paths, x86, graphs }) => {
                    let chain: Vec<&QnnGraph> = graphs.iter().map(|s| &s[chunk_index]).collect();
                    let inputs = chain_inputs(graph, probe.qnn_inputs(graph)?, chain[0], qnn.embedding.as_ref())?;
                    let on_htp = {
                        let _turn = crate::htp::exclusive();
                        chain_logits_on_htp(paths, x86, &chain, &inputs)?
                    };
                    let n = qnn.sharding.plan.count();
                    let what = format!(
                        "Qualcomm's x86 HTP emulation running the {n} shards qnn/context_<i>_of_{n}.x86.bin chained"
                    );
                    (on_htp, what, label, "backend-qnn's reference interpreter on the chained shards")
                }
                Some(ContextBinaries::One(htp)) => {
                    let on_htp = htp.run_logits(name, &probe.qnn_inputs(graph)?)?;
                    let what = "Qualcomm's x86 HTP emulation running qnn/context.x86.bin".to_string();
                    (on_htp, what, name.clone(), "backend-qnn's reference interpreter on the lowered graph")
                }
                None => continue,
            };
            let on_htp = probe.text_rows(&on_htp);
            for (stage, reference, versus) in [
                ("htp_vs_fakequant", cpu_logits, "the CPU fake-quant run of the final IR"),
                ("htp_vs_interp", qnn_rows, interp),
            ] {
                ledger.push(LedgerEntry {
                    stage,
                    graph: Some(graph_label.clone()),
                    detail: probe.describe(&format!("{what} vs {versus}")),
                    comparison: Comparison::new("logits", reference, on_htp, hf.vocab_size)?,
                });
            }
        }
        Ok::<_, AotError>(())
    })?;

    // Where the artifacts run: the compile's properties, and mllm's graph I/O contract checked
    // on the device binary as Qualcomm's system library reads it back.
    let htp = match binaries {
        Some(ContextBinaries::One(htp)) => Some(htp),
        _ => None,
    };
    let traits = ArtifactTraits {
        sink_prefix: prefix.as_ref().map_or(0, |p| p.len()),
        shards: qnn.sharding.plan.count(),
        graphs: planned_graphs(&loaded.family),
        eos_ids: hf.eos_token_ids.clone(),
        context_binary: binaries.is_some(),
    };
    let contract = htp.map(|htp| {
        let shape = MllmModelShape {
            num_layers: hf.num_hidden_layers,
            kv_heads: hf.num_key_value_heads,
            head_dim: hf.head_dim,
            vocab_size: hf.vocab_size,
            context_len: loaded.family.contexts()[0],
        };
        crate::deploy::check_mllm_contract(&htp.device_info.graphs, &shape)
    });
    if opts.target_runtime == TargetRuntime::Mllm {
        if let Some(violations) = contract.as_ref().filter(|v| !v.is_empty()) {
            bail!(
                "AotOptions::target_runtime mllm: qnn/context.bin breaks mllm's graph I/O contract: {}",
                violations.join("; ")
            );
        }
    }
    let deploy = crate::deploy::where_it_runs(&traits, contract.as_deref());
    Ok(Validated { ledger, deploy })
}

/// The accuracy report against float of a calibration, once done ([`evaluated`]).
#[derive(Default)]
pub struct Evaluated {
    /// `fakequant_vs_float`.
    pub ledger: Option<LedgerEntry>,
    /// What the quantization did (`None` for a quantized checkpoint given as it is).
    pub outcome: Option<QuantizeOutcome>,
}

/// Waits for `model`'s accuracy report (nothing to wait for with a quantized checkpoint given as
/// it is), which writes the quantized checkpoint's `report.json`; records the calibration's step
/// times and the checkpoint's files.
pub fn evaluated(model: &mut Quantized, out: &mut OutputDir, clock: &mut Stopwatch) -> Result<Evaluated> {
    let Some(pending) = model.evaluation.take() else { return Ok(Evaluated::default()) };
    let outcome = pending.finish()?;
    for (step, seconds) in [
        (Step::Rotate, outcome.rotate_seconds),
        (Step::InputStats, outcome.input_stats_seconds),
        (Step::Calibrate, outcome.calibration_seconds),
        (Step::Quantize, outcome.weight_seconds),
        (Step::Sensitivity, outcome.sensitivity_seconds),
        (Step::Evaluate, outcome.evaluate_seconds),
    ] {
        clock.add(step, seconds);
    }
    let logits = outcome.report.rows.last().context("the quantization report has no logits row")?;
    let entry = LedgerEntry {
        stage: "fakequant_vs_float",
        graph: None,
        detail: format!(
            "eager fake-quant of the quantized checkpoint vs float, prefill of the {} calibration sequences ({} tokens)",
            outcome.report.sequences, outcome.report.tokens
        ),
        comparison: logits.clone(),
    };
    out.record_dir(&model.dir)?;
    Ok(Evaluated { ledger: Some(entry), outcome: Some(outcome) })
}

/// The whole run's report, written as `report.json`: the ledger in stage order, the written
/// graphs' sizes and costs, the files, the warnings (a non-finite ledger row named) and the times.
pub fn report(
    loaded: Loaded,
    model: Quantized,
    evaluated: Evaluated,
    qnn: QnnFiles,
    validated: Validated,
    mut out: OutputDir,
    clock: Stopwatch,
) -> Result<AotReport> {
    let mut ledger = model.ledger;
    ledger.extend(evaluated.ledger);
    ledger.extend(validated.ledger);
    let mut warnings = loaded.warnings;
    if let Some(outcome) = &evaluated.outcome {
        let new: Vec<String> = outcome.warnings.iter().filter(|w| !warnings.contains(w)).cloned().collect();
        warnings.extend(new);
    }
    // A NaN or infinity in a stage's logits is named, never read as a figure.
    for e in ledger.iter().filter(|e| e.comparison.sqnr() == Sqnr::NonFinite) {
        let graph = e.graph.as_deref().map_or_else(String::new, |g| format!(" ({g})"));
        warnings.push(format!("ledger row {}{graph}: SQNR is non-finite (a NaN or infinity in the logits)", e.stage));
    }
    let graph_reports = (qnn.graphs.iter())
        .map(|g| GraphReport {
            name: g.name.clone(),
            ops: summarize(g).ops_by_type,
            tensors: g.tensors.len(),
            static_bytes: g.static_bytes(),
            cost: GraphCost::of(g),
        })
        .collect();
    let (shared_static_bytes, unshared_static_bytes) = check_weights_shared(&qnn.graphs)?;
    let path = out.root().join("report.json");
    out.record(&path);
    let report = AotReport {
        model: loaded.model_name,
        ledger,
        timings: clock.finish(),
        graphs: graph_reports,
        deploy: validated.deploy,
        shared_static_bytes,
        unshared_static_bytes,
        artifacts: out.relative()?,
        warnings,
        shards: qnn.shard_lines,
    };
    write_json_atomic(&path, &report.to_json())?;
    Ok(report)
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
         length with mllm's names (model.<i>.s<chunk>); pass one AotOptions::context_lens, or AotOptions::shards 1",
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
            "AotOptions::shards {n} disagrees with the AOT config's split_graph {m} ({}): give one, or the same count",
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

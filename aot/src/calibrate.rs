//! Calibration and quantization beside the CPU executor: an HF float checkpoint becomes a
//! quantized checkpoint in pymllm's format, without Python. Trace the model file to learn its QDQ
//! points and parameters, round the weights (with input statistics from a float pass when the
//! weight method wants them), calibrate on token sequences with the rounded weights, write the
//! checkpoint, then compare fake-quant against float ([`quantize`], [`evaluate`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use crate::error::{ensure, Context, Result};
use backend_cpu::quant::accuracy::Comparison;
use backend_cpu::quant::export::quantize_rope_tables;
use backend_cpu::quant::export::QuantizedWeights as ExportedWeights;
use backend_cpu::quant::ExportPlan;
use backend_cpu::quant::{
    is_quantized_checkpoint, plan_export, prefill_logits, quantize_weights_with, write_quantized_checkpoint,
    AccuracyReport, Calibration, CalibrationMode, CalibrationWeights, FakeQuantHook, InputStatsHook, LinearQuantizer,
    ObserverHook, QdqParams, RecordingHook, SinkPrefix, WeightMethod,
};
use backend_cpu::quant::{rotate_checkpoint, Rotation, RotationSummary};
use backend_cpu::{CheckpointStore, CpuBackend, QdqHook};
use checkpoint::SafetensorsCheckpoint;
use compiler::aot_config::AotConfig;
use compiler::quant::act_range::ActRanges;
use compiler::quant::points::{concat_groups, layer_output_points, linear_inputs, qdq_points, ConcatGroup};
use mllm_dsl::files::{write_atomic_bytes as write_atomic, write_json_atomic};
use mllm_dsl::module::ParamSource;
use mllm_dsl::{BackendRef, CausalLm};
use mllm_dsl::{ParamFormat, Program, QdqAttr};
use models::hf::HfConfig;

use crate::config::load_aot_config;
use crate::load::{build_model, open_model};
use crate::mixed::{
    choose_eight_bit, measure_sensitivities, MixedChoice, SensitivityRun, WeightBudget, SENSITIVITY_TOKENS,
    WEIGHT_BITS_FILE,
};
use crate::progress::Progress;
use crate::report::{Step, Stopwatch};
use crate::sink::{float_prefix, on_kv_grid};
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
    /// Token ids of the attention-sink prefix every run starts from ([`SinkPrefix`]; deployed
    /// mode only): its float K/V are computed once, calibration never sees the sink, and the
    /// checkpoint ships them on its K/V grid.
    pub sink_prefix: Option<Vec<i64>>,
    /// Mixed 4/8-bit linears: the most sensitive raised to per-channel int8 within this budget
    /// ([`crate::mixed`]; deployed mode only). None: every linear LPBQ int4.
    pub weight_budget: Option<WeightBudget>,
}

impl QuantizeOptions {
    /// Plain W4A16KV8 in the deployed mode: the built-in AOT config, round-to-nearest weights,
    /// the default activation ranges, no rotation, sink prefix or 8-bit weight budget, RoPE
    /// tables of mllm's 1024 rows, the report scored on the calibration sequences, no progress
    /// bars. Change what differs with struct update syntax:
    /// `QuantizeOptions { weight_method, ..QuantizeOptions::new(model, calibration, out) }`.
    pub fn new(model: impl Into<PathBuf>, calibration: Vec<Vec<i64>>, out: impl Into<PathBuf>) -> Self {
        QuantizeOptions {
            model: model.into(),
            aot_config: None,
            calibration,
            evaluation: None,
            mode: CalibrationMode::Deployed,
            out: out.into(),
            max_positions: 1024,
            progress: crate::progress::silent(),
            weight_method: WeightMethod::Rtn,
            act_ranges: ActRanges::default(),
            rotation: Rotation::None,
            sink_prefix: None,
            weight_budget: None,
        }
    }
}

/// What `quantize` did.
pub struct QuantizeOutcome {
    pub calibration: Calibration,
    pub report: AccuracyReport,
    pub block_size: usize,
    pub weight_input_bytes: u64,
    /// Rounding the weights (the weight method, in parallel over the linears) and writing the
    /// quantized checkpoint.
    pub weight_seconds: f64,
    /// The observers' pass over the calibration sequences (on the rounded weights).
    pub calibration_seconds: f64,
    /// The input statistics pass of the weight method (0 for pymllm's rounding).
    pub input_stats_seconds: f64,
    /// The accuracy report: the fake-quant run over the evaluation sequences and the float one
    /// (unless the input statistics pass recorded it), on its own thread beside the caller's work.
    pub evaluate_seconds: f64,
    /// Folding the rotation into a float copy of the checkpoint (0 without a rotation).
    pub rotate_seconds: f64,
    pub warnings: Vec<String>,
    /// The model file traced once in decode shape with W4A16 parameters: what it quantizes (its
    /// QDQ points), for whoever runs the quantized checkpoint next (shared, not copied).
    pub traced: Arc<Program>,
    /// What the rotation folded in, when there was one.
    pub rotation: Option<RotationSummary>,
    /// The attention-sink prefix the checkpoint ships, when there is one.
    pub sink_prefix: Option<SinkSummary>,
    /// The linears raised to 8 bits and why, with `--weight-budget`.
    pub mixed: Option<MixedChoice>,
    /// Measuring the linears' sensitivities (0 without a budget).
    pub sensitivity_seconds: f64,
}

/// What `--sink-prefix` produced.
#[derive(Clone, Debug)]
pub struct SinkSummary {
    pub ids: Vec<i64>,
    /// K/V values outside their layer's u8 K/V grid, clamped when the prefix was rounded onto it.
    pub clamped: usize,
    /// K/V values in all.
    pub values: usize,
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
pub(crate) fn quantize_to(hf: &HfConfig, opts: &QuantizeOptions, out: &Path) -> Result<QuantizeOutcome> {
    write_and_evaluate(hf, opts, out)?.finish()
}

/// [`quantize_to`] up to the accuracy report: the quantized checkpoint written into `out` (every
/// file but `report.json`), and its evaluation against float started on another thread (run
/// here first with `--threads 1`). Whoever holds the [`PendingEvaluation`] may read every file
/// of the checkpoint meanwhile; [`PendingEvaluation::finish`] waits for the report and writes
/// `report.json`.
///
/// With a rotation, the float checkpoint is rotated first into `out/rotated-float/` and everything
/// after (statistics, calibration, weights, the accuracy report) runs on that; it is deleted once
/// the evaluation is done.
pub(crate) fn write_and_evaluate(hf: &HfConfig, opts: &QuantizeOptions, out: &Path) -> Result<PendingEvaluation> {
    ensure!(
        opts.sink_prefix.is_none() || opts.mode != CalibrationMode::MllmCompatible,
        "QuantizeOptions::sink_prefix is not part of pymllm's recipe (its runtime starts every sequence with an empty \
         K/V cache); CalibrationMode::MllmCompatible reproduces that recipe exactly, so drop \
         QuantizeOptions::sink_prefix with it"
    );
    if opts.rotation == Rotation::None {
        let calibrated = calibrate_and_write(hf, &opts.model, opts, out)?;
        return PendingEvaluation::start(hf, &opts.model, opts, out, calibrated, None);
    }
    ensure!(
        opts.mode != CalibrationMode::MllmCompatible,
        "QuantizeOptions::rotation {} is not part of pymllm's recipe; CalibrationMode::MllmCompatible reproduces \
         that recipe exactly, so use QuantizeOptions::rotation none with it",
        opts.rotation.name()
    );
    let rotated = out.join(ROTATED_DIR);
    let start = Instant::now();
    let summary = rotate_checkpoint(&opts.model, hf, &rotated)
        .with_context(|| format!("rotating {} into {}", opts.model.display(), rotated.display()))?;
    let rotated_hf = HfConfig::from_dir(&rotated)?;
    let rotate_seconds = start.elapsed().as_secs_f64();
    let calibrated = calibrate_and_write(&rotated_hf, &rotated, opts, out)?;
    let rotation = Rotated { summary, seconds: rotate_seconds, dir: rotated.clone() };
    PendingEvaluation::start(&rotated_hf, &rotated, opts, out, calibrated, Some(rotation))
}

/// The rotated float copy a calibration ran on.
struct Rotated {
    summary: RotationSummary,
    seconds: f64,
    /// `out/rotated-float/`, deleted once the evaluation is done.
    dir: PathBuf,
}

/// What [`calibrate_and_write`] leaves for the accuracy report.
struct Calibrated {
    calibration: Calibration,
    weight_method: WeightMethod,
    act_ranges: ActRanges,
    block_size: usize,
    weight_input_bytes: u64,
    input_stats_seconds: f64,
    calibration_seconds: f64,
    weight_seconds: f64,
    warnings: Vec<String>,
    traced: Arc<Program>,
    /// The float model on the evaluation sequences, when the input-statistics pass ran it already.
    float_run: Option<RecordedRun>,
    /// The float model's attention-sink prefix (its own K/V), when there is one.
    float_prefix: Option<SinkPrefix>,
    sink_summary: Option<SinkSummary>,
    mixed: Option<MixedChoice>,
    sensitivity_seconds: f64,
}

/// Steps 1-5 of [`quantize`] from the float checkpoint `model_dir` (config `hf`): `opts.model`
/// itself or its rotated copy. Writes the quantized checkpoint (all but `report.json`) into `out`.
fn calibrate_and_write(hf: &HfConfig, model_dir: &Path, opts: &QuantizeOptions, out: &Path) -> Result<Calibrated> {
    let (run, warnings) = Calibrating::new(hf, model_dir, opts)?;
    let mut clock = Stopwatch::start();
    let weight_method =
        if opts.mode == CalibrationMode::MllmCompatible { WeightMethod::Rtn } else { opts.weight_method };
    let (mut linears, float_run) = match weight_method.input_stats() {
        Some(depth) => clock.stage(Step::InputStats, || run.input_stats(weight_method, depth))?,
        None => (LinearQuantizer::new(weight_method, None)?, None),
    };
    let mixed = match opts.weight_budget {
        Some(budget) => Some(clock.stage(Step::Sensitivity, || run.mixed(budget, &mut linears))?),
        None => None,
    };
    let mut weights = clock.stage(Step::Quantize, || run.round_weights(&linears))?;
    let act_ranges = if opts.mode == CalibrationMode::MllmCompatible { ActRanges::default() } else { opts.act_ranges };
    let calibration = clock.stage(Step::Calibrate, || run.calibrate(&linears, act_ranges))?;
    // The rounding and the writing: the weights' share of the run.
    let sink_summary = clock.stage(Step::Quantize, || run.write(out, &mut weights, &calibration, mixed.as_ref()))?;
    drop(weights);
    let t = clock.finish();
    Ok(Calibrated {
        calibration,
        weight_method,
        act_ranges,
        block_size: run.plan.block_size,
        weight_input_bytes: weights_input_bytes(&run.source, &run.plan),
        input_stats_seconds: t.input_stats,
        calibration_seconds: t.calibrate,
        weight_seconds: t.quantize,
        warnings,
        traced: Arc::new(run.traced),
        float_run,
        float_prefix: run.float_prefix,
        sink_summary,
        mixed,
        sensitivity_seconds: t.sensitivity,
    })
}

/// What the calibration's steps share: the float checkpoint, the AOT config, what the model file
/// quantizes and the attention-sink prefix's float K/V.
struct Calibrating<'a> {
    hf: &'a HfConfig,
    model_dir: &'a Path,
    opts: &'a QuantizeOptions,
    aot: AotConfig,
    source: SafetensorsCheckpoint,
    /// The model file traced once in decode shape with W4A16 parameters.
    traced: Program,
    plan: ExportPlan,
    points: Vec<QdqAttr>,
    groups: Vec<ConcatGroup>,
    /// The float model's attention-sink prefix (its own K/V), when there is one.
    float_prefix: Option<SinkPrefix>,
}

impl<'a> Calibrating<'a> {
    /// Step 1: the options checked, and what the model file quantizes (QDQ points,
    /// concatenations, parameters); 1b: the attention-sink prefix's K/V, computed once by the
    /// float model: every pass below starts from them, so no observer ever sees the sink's massive
    /// activation. With the AOT config's warnings.
    fn new(hf: &'a HfConfig, model_dir: &'a Path, opts: &'a QuantizeOptions) -> Result<(Self, Vec<String>)> {
        ensure!(!opts.calibration.is_empty(), "no calibration sequences");
        let prefix_len = opts.sink_prefix.as_ref().map_or(0, Vec::len);
        for (i, seq) in opts.calibration.iter().enumerate() {
            ensure!(
                prefix_len + seq.len() <= opts.max_positions,
                "calibration sequence {i} has {} tokens (after {prefix_len} prefix tokens); the RoPE tables cover {}",
                seq.len(),
                opts.max_positions
            );
        }
        let (aot, warnings) = load_aot_config(opts.aot_config.as_deref(), hf)?;
        let source = SafetensorsCheckpoint::open(model_dir)?;
        ensure!(
            !is_quantized_checkpoint(&source),
            "{} already holds a quantized checkpoint; calibrate from the float one",
            model_dir.display()
        );
        let traced = trace_model(hf, opts.max_positions, ParamFormat::QnnW4A16)?;
        let aot_name = match &opts.aot_config {
            Some(p) => format!("AOT config {}", p.display()),
            None => "the built-in W4A16KV8 AOT config".to_string(),
        };
        let plan = plan_export(&traced, &aot, hf.linear_block_size)
            .with_context(|| format!("checking {} against {aot_name}", hf.source.display()))?;
        let points = qdq_points(&traced)?;
        let groups = concat_groups(&traced);
        let float_prefix = match &opts.sink_prefix {
            Some(ids) => Some(float_prefix(model_dir, hf, opts.max_positions, ids)?),
            None => None,
        };
        let run = Calibrating { hf, model_dir, opts, aot, source, traced, plan, points, groups, float_prefix };
        Ok((run, warnings))
    }

    /// Step 2: the linears' input statistics (float model) at `depth` for `weight_method`, and
    /// its quantizer (with GPTQ this factorizes the input Hessians). When the accuracy report
    /// evaluates the calibration sequences, this pass also records what it needs of the float
    /// model (logits, layer outputs): the same model on the same ids.
    fn input_stats(
        &self,
        weight_method: WeightMethod,
        depth: backend_cpu::quant::StatsDepth,
    ) -> Result<(LinearQuantizer, Option<RecordedRun>)> {
        let (hf, opts, prefix) = (self.hf, self.opts, self.float_prefix.as_ref());
        let hook = Arc::new(InputStatsHook::new(&linear_inputs(&self.traced), depth));
        let float_run = if opts.evaluation.is_none() {
            let on_calibration = Evaluation {
                hf,
                traced: &self.traced,
                max_positions: opts.max_positions,
                sequences: &opts.calibration,
                progress: opts.progress.as_ref(),
            };
            Some(on_calibration.run_recorded(self.model_dir, Some(hook.clone()), prefix, "input stats")?)
        } else {
            let backend = CpuBackend::with_qdq(hook.clone());
            let (model, _store) = open_model(self.model_dir, hf, opts.max_positions, &backend)?;
            let label = "input stats";
            run_sequences(model.as_ref(), &backend, prefix, &opts.calibration, label, opts.progress.as_ref(), |_| {})?;
            None
        };
        let linears = LinearQuantizer::new(weight_method, Some(Arc::new(hook.finish()?)))?;
        Ok((linears, float_run))
    }

    /// Step 2b: each linear's sensitivity on the calibration text, and the most sensitive per
    /// byte within `budget` raised to 8 bits in `linears` ([`crate::mixed`]).
    fn mixed(&self, budget: WeightBudget, linears: &mut LinearQuantizer) -> Result<MixedChoice> {
        let opts = self.opts;
        ensure!(
            opts.mode != CalibrationMode::MllmCompatible,
            "QuantizeOptions::weight_budget is not part of pymllm's recipe (every linear LPBQ int4); \
             CalibrationMode::MllmCompatible reproduces that recipe exactly, so drop QuantizeOptions::weight_budget \
             with it"
        );
        let ids: Vec<i64> = opts.calibration.iter().flatten().copied().take(SENSITIVITY_TOKENS).collect();
        let run = SensitivityRun {
            hf: self.hf,
            model_dir: self.model_dir,
            aot: &self.aot,
            max_positions: opts.max_positions,
            prefix: self.float_prefix.as_ref(),
            ids: &ids,
            progress: opts.progress.as_ref(),
        };
        let candidates = measure_sensitivities(&run, &self.plan, linears)?;
        let choice = choose_eight_bit(&candidates, budget);
        linears.set_eight_bit(choice.eight_bit_set());
        Ok(choice)
    }

    /// Step 3: the weights, rounded once and in parallel over the linears (each export is cached
    /// in `linears`, so the calibration model sees exactly these codes).
    fn round_weights(&self, linears: &LinearQuantizer) -> Result<ExportedWeights> {
        let pb = self.opts.progress.start("quantizing", self.plan.params.len());
        let tied = self.hf.tie_word_embeddings;
        let weights = quantize_weights_with(&self.plan, &self.source, tied, linears, &|done, total, key| {
            pb.set_position(done, total);
            pb.set_message(key);
        })?;
        pb.set_message("done");
        pb.finish();
        Ok(weights)
    }

    /// Step 4: the observers' pass over the calibration sequences, on the rounded weights.
    fn calibrate(&self, linears: &LinearQuantizer, act_ranges: ActRanges) -> Result<Calibration> {
        let (hf, opts) = (self.hf, self.opts);
        let hook = Arc::new(ObserverHook::with_ranges(&self.points, &self.groups, opts.mode, act_ranges));
        let backend = CpuBackend::with_qdq(hook.clone());
        let store = CheckpointStore::for_config(self.model_dir, backend.clone(), hf)?;
        let weights = CalibrationWeights::new(&store, &self.aot, opts.mode).with_linears(linears);
        let model = build_model(hf, opts.max_positions, &ParamSource::Store(&weights), self.model_dir)?;
        let (label, prefix) = ("calibrating", self.float_prefix.as_ref());
        run_sequences(model.as_ref(), &backend, prefix, &opts.calibration, label, opts.progress.as_ref(), |_| {})?;
        Ok(hook.finish()?)
    }

    /// Step 5: the RoPE tables and QDQ parameters added to `weights`, the checkpoint written into
    /// `out` (with the tokenizer files, the mixed choice and the prefix on the checkpoint's K/V
    /// grid, what every quantized run attends to).
    fn write(
        &self,
        out: &Path,
        weights: &mut ExportedWeights,
        calibration: &Calibration,
        mixed: Option<&MixedChoice>,
    ) -> Result<Option<SinkSummary>> {
        let plan = &self.plan;
        weights.tensors.extend(quantize_rope_tables(plan, &calibration.params, &calibration.rope_tables)?);
        write_quantized_checkpoint(out, &self.hf.source, plan.block_size, &weights.tensors, &calibration.params)?;
        copy_tokenizer_files(&self.opts.model, out)?;
        if let Some(choice) = mixed {
            write_json_atomic(&out.join(WEIGHT_BITS_FILE), &choice.to_json())?;
        }
        let Some(prefix) = &self.float_prefix else { return Ok(None) };
        let (on_grid, clamped) = on_kv_grid(prefix, &calibration.params)?;
        on_grid.save(out)?;
        let values = prefix.keys.iter().chain(&prefix.values).map(Vec::len).sum();
        Ok(Some(SinkSummary { ids: prefix.ids.clone(), clamped, values }))
    }
}

/// Step 6 of [`quantize`], the accuracy of what [`calibrate_and_write`] wrote, under way: on a
/// second thread, or done already when the kernels may use one thread only.
/// [`PendingEvaluation::finish`] takes its report and writes the quantized checkpoint's
/// `report.json`; dropping it unfinished waits for the thread.
pub struct PendingEvaluation {
    state: Option<EvaluationState>,
    calibrated: Calibrated,
    rotation: Option<Rotated>,
    out: PathBuf,
    /// What `report.json` says of the options.
    model: PathBuf,
    mode: CalibrationMode,
    rotation_name: &'static str,
    calibration_sequences: usize,
}

type Evaluated = Result<(AccuracyReport, f64)>;

enum EvaluationState {
    Done(Evaluated),
    Running(std::thread::JoinHandle<Evaluated>),
}

/// What the evaluation thread owns: the float side and where the quantized checkpoint is.
struct EvaluationJob {
    hf: HfConfig,
    traced: Arc<Program>,
    max_positions: usize,
    sequences: Vec<Vec<i64>>,
    what: &'static str,
    progress: Arc<dyn Progress>,
    float_dir: PathBuf,
    float_run: Option<RecordedRun>,
    float_prefix: Option<SinkPrefix>,
    quant_dir: PathBuf,
}

impl EvaluationJob {
    /// The accuracy report and its wall time.
    fn run(self) -> Evaluated {
        let start = Instant::now();
        let evaluation = Evaluation {
            hf: &self.hf,
            traced: &self.traced,
            max_positions: self.max_positions,
            sequences: &self.sequences,
            progress: self.progress.as_ref(),
        };
        let float = match self.float_run {
            Some(run) => run,
            None => evaluation.run_recorded(&self.float_dir, None, self.float_prefix.as_ref(), "eval float")?,
        };
        let report = evaluation.against_float(&float, &self.quant_dir, self.what)?;
        Ok((report, start.elapsed().as_secs_f64()))
    }
}

impl PendingEvaluation {
    /// Starts evaluating what [`calibrate_and_write`] wrote into `out` from the float checkpoint
    /// `float_dir` (config `hf`).
    fn start(
        hf: &HfConfig,
        float_dir: &Path,
        opts: &QuantizeOptions,
        out: &Path,
        mut calibrated: Calibrated,
        rotation: Option<Rotated>,
    ) -> Result<PendingEvaluation> {
        let job = EvaluationJob {
            hf: hf.clone(),
            traced: calibrated.traced.clone(),
            max_positions: opts.max_positions,
            sequences: opts.evaluation.as_ref().unwrap_or(&opts.calibration).clone(),
            what: if opts.evaluation.is_some() { "evaluation ids" } else { "the calibration sequences" },
            progress: opts.progress.clone(),
            float_dir: float_dir.to_path_buf(),
            float_run: calibrated.float_run.take(),
            float_prefix: calibrated.float_prefix.take(),
            quant_dir: out.to_path_buf(),
        };
        // `--threads 1` means one core: then the evaluation runs first, the caller's work after.
        let state = if backend_cpu::kernels::num_threads() <= 1 {
            EvaluationState::Done(job.run())
        } else {
            let handle = std::thread::Builder::new()
                .name("evaluate".into())
                .spawn(move || job.run())
                .context("starting the evaluation thread")?;
            EvaluationState::Running(handle)
        };
        Ok(PendingEvaluation {
            state: Some(state),
            calibrated,
            rotation,
            out: out.to_path_buf(),
            model: opts.model.clone(),
            mode: opts.mode,
            rotation_name: opts.rotation.name(),
            calibration_sequences: opts.calibration.len(),
        })
    }

    /// The model file traced once in decode shape with W4A16 parameters (its QDQ points).
    pub fn traced(&self) -> &Arc<Program> {
        &self.calibrated.traced
    }

    /// Waits for the accuracy report, writes the quantized checkpoint's `report.json` (and
    /// deletes the rotated float copy), and says what the quantization did.
    pub fn finish(mut self) -> Result<QuantizeOutcome> {
        let (report, evaluate_seconds) = match self.state.take().context("the evaluation was taken already")? {
            EvaluationState::Done(evaluated) => evaluated,
            EvaluationState::Running(handle) => handle.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
        }?;
        let out = &self.out;
        let Calibrated { calibration, weight_method, act_ranges, warnings, .. } = &self.calibrated;
        // Relative to the output's directory when the model sits next to it (the AOT run's embedded
        // model), so the report does not embed a per-run staging path.
        let model_name = out
            .parent()
            .and_then(|p| self.model.strip_prefix(p).ok())
            .map_or_else(|| self.model.display().to_string(), |r| r.display().to_string());
        let json = serde_json::json!({
            "model": model_name,
            "calibration_mode": self.mode.name(),
            "weight_method": weight_method.name(),
            "act_range": act_ranges.to_string(),
            "rotation": self.rotation_name,
            "sink_prefix": self.calibrated.sink_summary.as_ref().map(|s| serde_json::json!({
                "ids": s.ids, "file": backend_cpu::quant::SINK_PREFIX_FILE, "clamped_values": s.clamped, "values": s.values,
            })),
            "largest_residual_range": largest_residual_range(calibration).map(|(point, range)| serde_json::json!({
                "point": point, "range": range, "u16_step": range / 65535.0,
            })),
            "calibration_sequences": self.calibration_sequences,
            "linear_block_size": self.calibrated.block_size,
            "weight_bits": self.calibrated.mixed.as_ref().map(|m| serde_json::json!({
                "budget_fraction": m.budget.fraction(), "eight_bit": m.eight_bit, "file": WEIGHT_BITS_FILE,
                "sensitivity_seconds": self.calibrated.sensitivity_seconds,
            })),
            "qdq_points": calibration.params.len(),
            "accuracy": report.to_json(),
            "warnings": warnings,
        });
        write_json_atomic(&out.join("report.json"), &json)?;
        if let Some(rotated) = &self.rotation {
            std::fs::remove_dir_all(&rotated.dir).with_context(|| format!("removing {}", rotated.dir.display()))?;
        }
        let calibrated = &self.calibrated;
        Ok(QuantizeOutcome {
            report,
            block_size: calibrated.block_size,
            weight_input_bytes: calibrated.weight_input_bytes,
            weight_seconds: calibrated.weight_seconds,
            calibration_seconds: calibrated.calibration_seconds,
            input_stats_seconds: calibrated.input_stats_seconds,
            evaluate_seconds,
            rotate_seconds: self.rotation.as_ref().map_or(0.0, |r| r.seconds),
            warnings: calibrated.warnings.clone(),
            traced: calibrated.traced.clone(),
            calibration: calibrated.calibration.clone(),
            rotation: self.rotation.as_ref().map(|r| r.summary.clone()),
            sink_prefix: calibrated.sink_summary.clone(),
            mixed: calibrated.mixed.clone(),
            sensitivity_seconds: calibrated.sensitivity_seconds,
        })
    }
}

impl Drop for PendingEvaluation {
    /// An evaluation left unfinished (the caller's work failed) still ends before its checkpoint
    /// can be removed.
    fn drop(&mut self) {
        if let Some(EvaluationState::Running(handle)) = self.state.take() {
            let _ = handle.join();
        }
    }
}

/// The residual-stream QDQ point with the widest calibrated range (`max - min`), which sets the
/// u16 step of the stream there: a massive activation stretches it, a rotation spreads it.
pub fn largest_residual_range(calibration: &Calibration) -> Option<(String, f32)> {
    let residual = models::keys::is_residual_qdq;
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

/// Runs `sequences` through `model` one prefill at a time (each after `prefix`, when given;
/// progress as `label`), handing each sequence's logits (`[len, vocab]`) to `logits`.
fn run_sequences(
    model: &dyn CausalLm,
    backend: &BackendRef,
    prefix: Option<&SinkPrefix>,
    sequences: &[Vec<i64>],
    label: &str,
    progress: &dyn Progress,
    mut logits: impl FnMut(Vec<f32>),
) -> Result<()> {
    let pb = progress.start(label, sequences.len());
    for (i, seq) in sequences.iter().enumerate() {
        logits(prefill_logits(model, backend, prefix, seq).with_context(|| format!("sequence {i} of {label}"))?);
        pb.inc(1);
    }
    pb.finish();
    Ok(())
}

/// What the accuracy report compares of one model's run over the evaluation sequences: all
/// logits, and each decoder layer's output, concatenated over the sequences.
struct RecordedRun {
    logits: Vec<f32>,
    layers: Vec<Vec<f32>>,
}

/// The decoder layers' output QDQ points of the model file `traced` (symbol, point).
fn layer_points(traced: &Program) -> Vec<(String, QdqAttr)> {
    layer_output_points(traced).into_iter().filter_map(|(s, p)| p.map(|p| (s, p))).collect()
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
    let evaluation = Evaluation { hf, traced, max_positions, sequences, progress };
    // The quantized checkpoint's prefix tokens, with the float model's own K/V of them.
    let float_prefix = match SinkPrefix::load_beside(quant_dir)? {
        Some(shipped) => Some(float_prefix(float_dir, hf, max_positions, &shipped.ids)?),
        None => None,
    };
    let float = evaluation.run_recorded(float_dir, None, float_prefix.as_ref(), "eval float")?;
    evaluation.against_float(&float, quant_dir, what)
}

/// One model's runs over the evaluation sequences, as the accuracy report makes them.
struct Evaluation<'a> {
    hf: &'a HfConfig,
    /// The model file traced once ([`trace_model`]): its QDQ points, which of them are layer outputs.
    traced: &'a Program,
    max_positions: usize,
    sequences: &'a [Vec<i64>],
    progress: &'a dyn Progress,
}

impl Evaluation<'_> {
    /// The checkpoint `dir` run over the sequences (after `prefix`) with `hook` at its QDQ points,
    /// recording what [`RecordedRun`] holds (the layer outputs as they reach `hook`).
    fn run_recorded(
        &self,
        dir: &Path,
        hook: Option<Arc<dyn QdqHook>>,
        prefix: Option<&SinkPrefix>,
        label: &str,
    ) -> Result<RecordedRun> {
        let keys: Vec<String> = layer_points(self.traced).into_iter().map(|(_, p)| p.key).collect();
        let recorder = Arc::new(RecordingHook::new(hook, keys.clone()));
        let backend = CpuBackend::with_qdq(recorder.clone());
        let (model, _store) = open_model(dir, self.hf, self.max_positions, &backend)?;
        let mut logits = Vec::new();
        run_sequences(model.as_ref(), &backend, prefix, self.sequences, label, self.progress, |l| logits.extend(l))?;
        let layers = keys.iter().map(|k| recorder.take(k).concat()).collect();
        Ok(RecordedRun { logits, layers })
    }

    /// The fake-quant run of the quantized checkpoint `quant_dir` compared with `float` (the
    /// float model's run over the same sequences, described as `what`).
    fn against_float(&self, float: &RecordedRun, quant_dir: &Path, what: &str) -> Result<AccuracyReport> {
        let (hf, traced, sequences) = (self.hf, self.traced, self.sequences);
        let quant_ckpt = SafetensorsCheckpoint::open(quant_dir)?;
        let params = QdqParams::from_checkpoint(&quant_ckpt, &qdq_points(traced)?)?;
        drop(quant_ckpt);
        let fake_quant: Arc<dyn QdqHook> = Arc::new(FakeQuantHook::new(&params));
        let prefix = SinkPrefix::load_beside(quant_dir)?;
        let quant = self.run_recorded(quant_dir, Some(fake_quant), prefix.as_ref(), "eval quant")?;

        let mut rows = Vec::new();
        for ((symbol, point), (f, q)) in layer_points(traced).iter().zip(float.layers.iter().zip(&quant.layers)) {
            let name = format!("{symbol} (at {})", point.key);
            rows.push(Comparison::new(name, f, q, hf.hidden_size)?);
        }
        rows.push(Comparison::new("logits", &float.logits, &quant.logits, hf.vocab_size)?);
        Ok(AccuracyReport {
            // No paths: the report is the same wherever the run writes (its `model` names the input).
            description: format!("fake-quant of the quantized checkpoint vs the float model on {what}"),
            sequences: sequences.len(),
            tokens: sequences.iter().map(Vec::len).sum(),
            rows,
        })
    }
}

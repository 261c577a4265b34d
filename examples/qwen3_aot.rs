//! The main job: an LLM checkpoint to QNN graphs ahead of time, with a per-stage accuracy ledger.
//!
//! ```text
//! cargo run --example qwen3_aot                       # the embedded tiny Qwen3, nothing to download
//! cargo run --release --example qwen3_aot -- --model HF_DIR --calib-ids calib.safetensors --out DIR
//! cargo run --release --example qwen3_aot -- --quantized PYMLLM_DIR --out DIR
//! ```
//!
//! `--help` documents every argument and the files written; the work is [`aot::run`]'s.

use std::path::PathBuf;

use anyhow::Result;
use aot::shard::{ShardCount, DEFAULT_MAX_CONTEXT_BYTES};
use aot::{
    default_out_dir, run, AotOptions, AotReport, CalibSource, Chosen, ContextBinary, GraphNaming, ModelSource, Recipe,
    TargetRuntime, DEFAULT_CHUNKS, DEFAULT_CONTEXT_LEN, DEFAULT_MAX_POSITIONS,
};
use backend_cpu::quant::{CalibrationMode, Rotation, WeightMethod};
use clap::Parser;
use compiler::quant::act_range::ActRanges;
use mllm_examples::RecipeFlags;
use models::hf::HfConfig;

fn main() -> Result<()> {
    // A shard build child (`--build-shard JOB`, started by --shards) runs its job and exits here.
    aot::shard_build::child_main_if_requested();
    let args = AotArgs::parse();
    print!("{}", run_aot(&args)?.summary());
    println!("report: {}", args.out_dir().join("report.json").display());
    Ok(())
}

const AFTER_HELP: &str = "\
Recipes (--recipe; docs/quantization.md): mllm (pymllm's, bit for bit), rtn (pymllm's rounding and ranges, calibrated
as deployed), recommended (gptq weights, hadamard rotation, sink prefix <|endoftext|>). With --model the default is the
best recipe of the model's family (recommended for qwen3, qwen2, llama); the embedded model's default is rtn. The recipe
is printed on standard error at the start. --weight-method, --act-range, --rotation and --sink-prefix each replace that
one setting of the recipe; with --recipe mllm a setting that differs from pymllm's is an error.

With no arguments, compiles an embedded tiny Qwen3 (fixtures/qwen3-dev-f32, random weights, 2 layers) calibrated on
embedded token ids, so the whole flow runs without a download.

Steps: load -> calibrate + quantize (W4A16 LPBQ weights, u16 activations, u8 K/V) -> trace one graph per --chunk
and --context-len (mllm's model.0.s<chunk>) -> mllm's QNN AOT pass pipeline -> lower to QNN (every graph sharing one
set of weights) -> validate -> accuracy ledger, and each graph's modelled cost per call on SM8650 / SM8750.

A family: --chunk 128 --chunk 32 --chunk 1 --context-len 1024 --context-len 4096 builds six graphs in one context
binary: model.0.s128, model.0.s32, model.0.s1 at 1024 and model.0.s128_cl4096, ... at 4096 (--graph-names genie:
ar128_cl1024, ...). `generate --qnn-context` then picks the graph per step (docs/graph-families.md).

Files written into --out (default: <cargo target dir>/qwen3_aot):
  embedded/                 the embedded checkpoint and calibration ids (default run only)
  quantized/                the quantized checkpoint in pymllm's format (model.safetensors, config.json, report.json)
  ir/<graph>/NN-<stage>.mir the IR before the first pass (00-trace) and after every pass (01..09)
  qnn/<graph>.json          the QNN graph in QNN Netron's net.json schema
  qnn/<graph>.cpp           model.cpp for qnn-model-lib-generator
  qnn/weights.bin           its model.bin: every graph's static buffers, once (weights_<i>_of_<n>.bin per shard)
  qnn/<graph>.summary.txt   ops by type, tensors by dtype, static bytes
  qnn/context.bin, .x86.bin by Qualcomm's HTP backend (if found): all graphs weight-shared; unshared for x86 emulation
  qnn/context_<i>_of_<n>.bin, .x86.bin  the same per shard with --shards n > 1 (graphs model.<i-1>.s<chunk>, built in
                            child processes); qnn/model.<i>.s<chunk>.* are then the shards' graphs
  report.json               model, accuracy ledger, timings, graphs, deploy, artifacts (paths relative to --out)

report.json's \"deploy\" says, per artifact (qnn/context.bin, qnn/context.x86.bin), which runtime can run it: this
project's (mllm-dsl: generate --qnn-context), mllm's QnnAOTRuntime (mllm), or neither, with each blocker (sink prefix,
shards, graph names, a broken graph I/O contract: the device binary is read back through libQnnSystem.so and checked
against mllm's runtime) and what its user must know (docs/deploy.md). --target-runtime mllm refuses up front every
option that would leave mllm's runtime unable to run the result (--sink-prefix, no --chunk 1, --context-binary off).

report.json's ledger compares each stage with the previous one on the same inputs (logits):
  float_vs_reference  CPU float vs the checkpoint dir's reference.safetensors (when present)
  fakequant_vs_float  eager fake-quant vs float (calibration sequences; for --quantized, reference float_logits)
  passes_vs_eager     backend-cpu's interpreter on the final IR vs the eager fake-quant model, per graph
  qnn_vs_fakequant    backend-qnn's reference interpreter on the lowered graph vs the CPU fake-quant run, per graph
  htp_vs_fakequant    Qualcomm's x86 HTP emulation vs the CPU fake-quant run (htp_vs_interp: vs backend-qnn's interpreter)
Each row has sqnr_db (dB; \"identical\" when test equals reference, \"non-finite\" when a NaN or infinity reached the
logits, which also adds a warning), top1_agreement (fraction of positions whose argmax agrees) and max_abs_err;
--ledger-ops adds ledger_ops/<graph>.txt, each node of the graph vs the fake-quant run (docs/ledger.md).

The output is built in a fresh .<out>.staging-* directory next to --out and replaces --out whole only when the run
succeeded: a failed or interrupted run leaves the previous --out as it was. --out may not be or contain an input. Two runs with the same inputs write byte-identical files
except report.json's \"timings_s\" (wall times) and qnn/context*.bin (Qualcomm's serializer is not byte-deterministic).";

#[derive(Parser, Debug, Clone)]
#[command(
    name = "qwen3_aot",
    about = "Compile an LLM checkpoint for Qualcomm QNN (HTP) ahead of time, with a per-stage accuracy ledger",
    after_help = AFTER_HELP
)]
pub struct AotArgs {
    /// HF float checkpoint directory (config.json + safetensors) or a GGUF file (converted once into the cache) to calibrate; its model_type picks the model file.
    #[arg(long, value_name = "HF_DIR|GGUF", conflicts_with = "quantized")]
    pub model: Option<PathBuf>,
    /// Quantized checkpoint directory (pymllm's export or this project's `quantize`): no calibration.
    #[arg(long, value_name = "DIR", conflicts_with_all = ["calib_ids", "calib_text"])]
    pub quantized: Option<PathBuf>,
    /// mllm's QNN AOT config JSON; default: the built-in W4A16KV8 one (SM8650/V75, LPBQ block 16).
    #[arg(long, value_name = "JSON")]
    pub aot_config: Option<PathBuf>,
    /// Calibration token ids: safetensors with `calib_ids`, int64 [N, L]. Default run: embedded ids.
    #[arg(long, value_name = "FILE", conflicts_with = "calib_text")]
    pub calib_ids: Option<PathBuf>,
    /// Calibration text: paragraphs separated by blank lines, tokenized with the model dir's tokenizer.json; repeatable.
    #[arg(long, value_name = "FILE")]
    pub calib_text: Vec<PathBuf>,
    /// With --calib-text: each paragraph as a user turn through the model's own chat template, as pymllm does.
    #[arg(long, requires = "calib_text")]
    pub chat: bool,
    /// Context length of the graphs: the mask width, K/V cache = context - chunk positions; repeat to build every
    /// chunk at every context length (a graph family). Default: 1024.
    #[arg(long = "context-len", value_name = "N")]
    pub context_lens: Vec<usize>,
    /// Chunk size (new tokens per call); repeat to build one graph per size (model.0.s<N>). Default: 32 and 1.
    #[arg(long = "chunk", value_name = "N")]
    pub chunks: Vec<usize>,
    /// Graph names: mllm (model.0.s<chunk>; model.0.s<chunk>_cl<context> above the smallest context) or genie
    /// (ar<chunk>_cl<context>).
    #[arg(long, value_name = "SCHEME", default_value = "mllm")]
    pub graph_names: GraphNaming,
    #[arg(long, value_name = "N", default_value_t = DEFAULT_MAX_POSITIONS, help = "RoPE table rows when calibrating.")]
    pub max_positions: usize,
    #[arg(long, value_name = "DIR", help = "Output directory. Default: <cargo target dir>/qwen3_aot.")]
    pub out: Option<PathBuf>,
    /// qnn/context.bin by Qualcomm's backend: auto (if its libraries are found, else a warning), on, off.
    #[arg(long, value_name = "WHEN", default_value = "auto", num_args = 0..=1, default_missing_value = "on")]
    pub context_binary: ContextBinary,
    /// The quantization recipe when calibrating (a named recipe, refined by the individual flags).
    #[command(flatten)]
    pub recipe: RecipeFlags,
    /// CPU threads (0: all cores; more than the machine has are capped with a warning).
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub threads: usize,
    #[arg(long, help = "No progress bars.")]
    pub quiet: bool,
    #[arg(long, help = "Also compare every node of each graph with the fake-quant run (ledger_ops/).")]
    pub ledger_ops: bool,
    /// The runtime the result must run on: any (report.json's \"deploy\" says which runs what), or mllm
    /// (mllm's QnnAOTRuntime: options it cannot run are refused before any work; docs/deploy.md).
    #[arg(long, value_name = "RUNTIME", default_value = "any")]
    pub target_runtime: TargetRuntime,
    /// Context binaries: the decoder layers cut into N contiguous shards balanced by static bytes,
    /// each built in its own child process (qnn/context_<i>_of_<N>.bin; graphs model.<i>.s<chunk>),
    /// or auto: the smallest N whose binaries fit --max-context-bytes and whose builds fit --max-memory.
    #[arg(long, value_name = "N|auto", default_value = "auto")]
    pub shards: ShardCount,
    /// Shard builds at once (default: what --max-memory allows, at most the cores).
    #[arg(long, value_name = "J")]
    pub jobs: Option<usize>,
    /// Static bytes one context binary may hold (default 2 GiB, Qualcomm Genie's per-binary limit).
    #[arg(long, value_name = "BYTES", default_value_t = DEFAULT_MAX_CONTEXT_BYTES)]
    pub max_context_bytes: u64,
    /// Memory budget of the shard builds in bytes; Qualcomm's backend holds ~7x a shard's static bytes while
    /// building it. Default: the available RAM, at most twice the model's static bytes but at least 4 GiB.
    #[arg(long, value_name = "BYTES")]
    pub max_memory: Option<u64>,
    /// The program that builds one shard (`PROGRAM --build-shard JOB`); default this one.
    #[arg(long, value_name = "PROGRAM", hide = true)]
    pub shard_exe: Option<PathBuf>,
}

impl AotArgs {
    /// Where the run writes.
    pub fn out_dir(&self) -> PathBuf {
        self.out.clone().unwrap_or_else(|| default_out_dir("qwen3_aot"))
    }

    /// The recipe a calibrating run uses (`None` for a `--quantized` checkpoint, which brings its
    /// own): `--recipe`, else with `--model` the best recipe of its family, else (the embedded
    /// model) `rtn`; refined by the individual flags.
    pub fn recipe(&self) -> Result<Option<Chosen>> {
        if self.quantized.is_some() {
            let r = &self.recipe;
            anyhow::ensure!(
                r.recipe.is_none() && r.weight_method.is_none() && r.act_range.is_none() && r.rotation.is_none(),
                "--recipe, --weight-method, --act-range and --rotation are chosen when calibrating; the quantized \
                 checkpoint {} was quantized already",
                self.quantized.as_ref().map_or_else(String::new, |d| d.display().to_string())
            );
            return Ok(None);
        }
        let hf = match &self.model {
            Some(dir) => Some(HfConfig::from_dir(dir)?),
            None => None,
        };
        let model = self.model.as_deref().zip(hf.as_ref());
        Ok(Some(self.recipe.choose(model)?.for_runtime(self.target_runtime)))
    }

    /// The run these arguments ask for, with the recipe [`AotArgs::recipe`] chose.
    pub fn options(&self) -> Result<AotOptions> {
        let recipe = self.recipe()?;
        Ok(self.options_with(recipe.as_ref().map(|c| &c.recipe)))
    }

    /// The run these arguments ask for with `recipe` (for a calibrating run); a `--quantized`
    /// run keeps only `--sink-prefix`, which it refuses.
    fn options_with(&self, recipe: Option<&Recipe>) -> AotOptions {
        let source = match (&self.model, &self.quantized) {
            (Some(dir), _) => ModelSource::Float(dir.clone()),
            (None, Some(dir)) => ModelSource::Quantized(dir.clone()),
            (None, None) => ModelSource::Embedded,
        };
        let calibration = match &self.calib_ids {
            Some(path) => vec![CalibSource::Ids(path.clone())],
            None => self.calib_text.iter().map(|p| CalibSource::Text { path: p.clone(), chat: self.chat }).collect(),
        };
        let chunks = if self.chunks.is_empty() { DEFAULT_CHUNKS.to_vec() } else { self.chunks.clone() };
        AotOptions {
            source,
            aot_config: self.aot_config.clone(),
            calibration,
            context_lens: if self.context_lens.is_empty() {
                vec![DEFAULT_CONTEXT_LEN]
            } else {
                self.context_lens.clone()
            },
            chunks,
            graph_naming: self.graph_names,
            out: self.out_dir(),
            context_binary: self.context_binary,
            max_positions: self.max_positions,
            progress: aot::progress::bars(!self.quiet),
            mode: recipe.map_or(CalibrationMode::Deployed, |r| r.mode),
            weight_method: recipe.map_or(WeightMethod::Rtn, |r| r.weight_method),
            act_ranges: recipe.map_or_else(ActRanges::default, |r| r.act_ranges),
            rotation: recipe.map_or(Rotation::None, |r| r.rotation),
            ledger_ops: self.ledger_ops,
            sink_prefix: recipe.map_or_else(|| self.recipe.sink_prefix.clone(), |r| r.sink_prefix.clone()),
            weight_budget: recipe.and_then(|r| r.weight_budget),
            target_runtime: self.target_runtime,
            shards: self.shards,
            jobs: self.jobs,
            max_context_bytes: self.max_context_bytes,
            max_memory: self.max_memory,
            shard_exe: self.shard_exe.clone(),
        }
    }
}

/// Runs the command: sets the thread count, prints the recipe (standard error), then the whole
/// flow (see [`aot::run`]).
pub fn run_aot(args: &AotArgs) -> Result<AotReport> {
    backend_cpu::kernels::set_num_threads(args.threads)?;
    // `--model` as a checkpoint directory (a GGUF file converted) before the recipe reads its config.
    let mut args = args.clone();
    if let Some(model) = &mut args.model {
        *model = aot::resolve_model(model)?;
    }
    let recipe = args.recipe()?;
    if let Some(chosen) = &recipe {
        eprintln!("{}", chosen.line());
    }
    run(&args.options_with(recipe.as_ref().map(|c| &c.recipe))).map_err(mllm_examples::with_flag_names)
}

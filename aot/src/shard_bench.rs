//! The sharded compile bench: a synthetic Qwen3-shaped quantized checkpoint (random weights,
//! [`crate::context_bench::prepare_checkpoint`]) planned into shards from a weight-free trace
//! and built shard by shard in child processes ([`crate::shard_build::run_jobs`]), with each
//! child's steps (wall, CPU, peak RSS), the whole run's wall and CPU time (parent + children)
//! and the peak of the parent's and its children's resident sets summed.

use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::run_sizes::available_memory;
use mllm_dsl::ParamFormat;
use models::hf::HfConfig;

use crate::context_bench::{prepare_checkpoint, BenchOptions};
use crate::error::{Context, Result};
use crate::load::rope_positions;
use crate::shard::{
    default_max_memory, plan_shards, AutoLimits, AutoPlan, ModelBytes, ShardCount, BUILD_MEMORY_FACTOR,
    DEFAULT_MAX_CONTEXT_BYTES,
};
use crate::shard_build::{children_cpu_seconds, run_jobs, JobsOutcome, ShardJob};
use crate::trace::trace_graph;

/// What to build.
#[derive(Clone, Debug)]
pub struct ShardBenchOptions {
    pub bench: BenchOptions,
    pub shards: ShardCount,
    /// Builds at once (default: what the memory budget allows, at most the cores).
    pub jobs: Option<usize>,
    pub max_context_bytes: u64,
    /// The memory budget (default [`default_max_memory`]).
    pub max_memory: Option<u64>,
}

impl ShardBenchOptions {
    pub fn new(bench: BenchOptions) -> ShardBenchOptions {
        ShardBenchOptions {
            bench,
            shards: ShardCount::Auto,
            jobs: None,
            max_context_bytes: DEFAULT_MAX_CONTEXT_BYTES,
            max_memory: None,
        }
    }
}

/// The plan from a weight-free trace of the checkpoint's config: the model's static bytes by part.
pub fn model_bytes(dir: &Path, context: usize) -> Result<ModelBytes> {
    let hf = HfConfig::from_dir(dir)?;
    let ckpt = checkpoint::SafetensorsCheckpoint::open(dir)?;
    let max_positions = rope_positions(&ckpt)?.context("the quantized checkpoint has no RoPE tables")?;
    drop(ckpt);
    let program = trace_graph(&hf, max_positions, 1, context.min(max_positions), ParamFormat::QnnW4A16)?;
    Ok(ModelBytes::from_program(&program)?)
}

/// The figures.
#[derive(Clone, Debug)]
pub struct ShardBench {
    pub model: String,
    pub layers: usize,
    pub bytes: ModelBytes,
    pub memory_budget: u64,
    pub max_context_bytes: u64,
    pub available: u64,
    pub auto: AutoPlan,
    pub plan_seconds: f64,
    pub plan_cpu_seconds: f64,
    pub jobs: JobsOutcome,
    pub wall_seconds: f64,
    pub dir: PathBuf,
}

impl ShardBench {
    pub fn summary(&self) -> String {
        let mb = |b: u64| b as f64 / 1e6;
        let mut out = format!(
            "{}, {} layers: {:.0} MB static weights (embedding {:.0}, layers {:.0}, norm + lm_head {:.0}, RoPE tables \
             {:.1} per shard)\n",
            self.model,
            self.layers,
            mb(self.bytes.total()),
            mb(self.bytes.embedding),
            mb(self.bytes.layers.iter().sum()),
            mb(self.bytes.head),
            mb(self.bytes.shared)
        );
        out += &format!(
            "memory budget {:.0} MB (available {:.0} MB); per-binary limit {:.0} MB\n",
            mb(self.memory_budget),
            mb(self.available),
            mb(self.max_context_bytes)
        );
        for r in &self.auto.reasons {
            out += &format!("  {r}\n");
        }
        out += &self.auto.plan.table();
        out += &format!(
            "{:<7} {:>7} {:>11} {:>11} {:>9} {:>9} {:>8} {:>12} {:>8}\n",
            "shard", "layers", "static MB", "binary MB", "wall s", "CPU s", "ours %", "peak RSS MB", "x static"
        );
        for o in &self.jobs.shards {
            let spec = &self.auto.plan.shards[o.shard];
            let cpu: f64 = o.steps.iter().map(|s| s.cpu_seconds).sum();
            let ours: f64 = o.steps.iter().filter(|s| s.ours).map(|s| s.cpu_seconds).sum();
            out += &format!(
                "{:<7} {:>7} {:>11.1} {:>11.1} {:>9.1} {:>9.1} {:>8.1} {:>12.0} {:>8.2}\n",
                format!("{}/{}", spec.index + 1, spec.count),
                format!("{}..={}", spec.layers.start, spec.layers.end - 1),
                mb(o.static_bytes),
                mb(o.binary_bytes),
                o.wall_seconds,
                cpu,
                100.0 * ours / cpu.max(f64::MIN_POSITIVE),
                mb(o.peak_rss),
                o.peak_rss as f64 / o.static_bytes.max(1) as f64
            );
        }
        out += "steps summed over the shards: wall s / CPU s / largest peak RSS MB\n";
        let mut names: Vec<(&str, bool)> = Vec::new();
        for o in &self.jobs.shards {
            for s in &o.steps {
                if !names.iter().any(|(n, _)| *n == s.name) {
                    names.push((&s.name, s.ours));
                }
            }
        }
        for (name, ours) in names {
            let steps = self.jobs.shards.iter().flat_map(|o| o.steps.iter().filter(move |s| s.name == name));
            let (w, c, p) =
                steps.fold((0.0, 0.0, 0u64), |(w, c, p), s| (w + s.seconds, c + s.cpu_seconds, p.max(s.peak_rss)));
            out += &format!("  {name:<24} {:>5} {w:>9.2} {c:>9.2} {:>9.0}\n", if ours { "ours" } else { "QNN" }, mb(p));
        }
        let child_cpu: f64 = self.jobs.shards.iter().flat_map(|o| &o.steps).map(|s| s.cpu_seconds).sum();
        let child_ours: f64 =
            self.jobs.shards.iter().flat_map(|o| &o.steps).filter(|s| s.ours).map(|s| s.cpu_seconds).sum();
        let total_cpu = self.plan_cpu_seconds + self.jobs.children_cpu_seconds;
        let ours = self.plan_cpu_seconds + child_ours;
        out += &format!(
            "whole run: {:.1} s wall ({} build(s) at once), {:.1} CPU s (parent's planning {:.2}, children {:.1}; \
             measured steps {:.1}); our share {:.1} % of the CPU time\n",
            self.wall_seconds,
            self.auto.jobs,
            total_cpu,
            self.plan_cpu_seconds,
            self.jobs.children_cpu_seconds,
            child_cpu,
            100.0 * ours / total_cpu.max(f64::MIN_POSITIVE)
        );
        let static_total = self.bytes.total();
        let peak = self.jobs.peak_rss;
        out += &format!(
            "peak RSS, parent + children (sampled sum every 50 ms): {:.0} MB = {:.2}x the {:.0} MB of static weights \
             (target <= 2.0x)\n",
            mb(peak),
            peak as f64 / static_total as f64,
            mb(static_total)
        );
        let largest = self.jobs.shards.iter().map(|o| o.binary_bytes).max().unwrap_or(0);
        out += &format!(
            "largest binary {:.0} MB (limit 2 GiB = {:.0} MB: {}); binaries in {}\n",
            mb(largest),
            mb(DEFAULT_MAX_CONTEXT_BYTES),
            if largest <= DEFAULT_MAX_CONTEXT_BYTES { "ok" } else { "OVER" },
            self.dir.display()
        );
        out
    }
}

/// Plans (printing why through `log`) and builds the shards of the bench's checkpoint with
/// `exe` as the child program.
pub fn run_sharded(opts: &ShardBenchOptions, exe: &Path, log: &mut dyn FnMut(&str)) -> Result<ShardBench> {
    let checkpoint = prepare_checkpoint(&opts.bench)?;
    let start = Instant::now();
    let cpu_start = mllm_dsl::memory::cpu_seconds().unwrap_or(0.0);
    let children_before = children_cpu_seconds();
    let bytes = model_bytes(&checkpoint, opts.bench.context)?;
    let available = available_memory();
    let memory_budget = opts.max_memory.unwrap_or_else(|| default_max_memory(available, &bytes));
    let limits = AutoLimits {
        max_context_bytes: opts.max_context_bytes,
        max_memory: memory_budget,
        factor: BUILD_MEMORY_FACTOR,
    };
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let auto = plan_shards(&bytes, opts.shards, &limits, cores, opts.jobs)?;
    for r in &auto.reasons {
        log(r);
    }
    log(auto.plan.table().trim_end());
    let plan_seconds = start.elapsed().as_secs_f64();
    let plan_cpu_seconds = mllm_dsl::memory::cpu_seconds().unwrap_or(0.0) - cpu_start;
    let dir = opts.bench.dir.join(format!("qnn-{}l-{}shards", opts.bench.layers, auto.plan.count()));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let jobs: Vec<ShardJob> = auto
        .plan
        .shards
        .iter()
        .map(|s| ShardJob {
            checkpoint: checkpoint.clone(),
            aot_config: None,
            plan: auto.plan.clone(),
            shard: s.index,
            chunks: opts.bench.chunks.clone(),
            context: opts.bench.context,
            weight_sharing: opts.bench.weight_sharing,
            optimization_level: opts.bench.optimization_level,
            out: dir.join(if opts.bench.weight_sharing { s.binary_name() } else { s.x86_binary_name() }),
        })
        .collect();
    // As qwen3_aot does: a set of shards gathers the token embedding on the CPU, from its table.
    if auto.plan.count() > 1 {
        let ckpt = checkpoint::SafetensorsCheckpoint::open(&checkpoint)?;
        crate::cpu_embedding::write_table(&ckpt, &dir.join(crate::cpu_embedding::EMBEDDING_FILE))?;
    }
    let outcome = run_jobs(exe, jobs, auto.jobs, &dir.join("jobs"), &mut |o| {
        log(&format!(
            "built {} ({:.0} MB, {:.0} s, child peak {:.0} MB)",
            o.out.display(),
            o.binary_bytes as f64 / 1e6,
            o.wall_seconds,
            o.peak_rss as f64 / 1e6
        ))
    })?;
    let _ = children_before;
    let hf = HfConfig::from_dir(&checkpoint)?;
    Ok(ShardBench {
        model: opts.bench.shape.name.to_string(),
        layers: hf.num_hidden_layers,
        bytes,
        memory_budget,
        max_context_bytes: opts.max_context_bytes,
        available,
        auto,
        plan_seconds,
        plan_cpu_seconds,
        jobs: outcome,
        wall_seconds: start.elapsed().as_secs_f64(),
        dir,
    })
}

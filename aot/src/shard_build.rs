//! Each shard's context binary built in its own child process, at most `jobs` at once.
//!
//! Qualcomm's HTP backend is a process-wide singleton that keeps what it allocates (QAIRT 2.51
//! holds ~6.8× a context's static bytes while serializing and does not return it), so a build
//! per process bounds the memory to one shard's build, and the parent holds no weights.
//!
//! The child is the calling program itself: [`run_jobs`] starts `current_exe --build-shard
//! <job.json>`, and every program that builds shards calls [`child_main_if_requested`] first in
//! its `main`. The child traces the model once per chunk size, runs mllm's pass pipeline, cuts
//! the shard out ([`crate::shard::shard_program`]), lowers it for Qualcomm's backend, builds the
//! binary and writes it atomically, then prints its figures as one JSON line on stdout. A failing
//! or killed child is a [`ShardBuildError`] naming the shard and its binary, with the child's
//! last stderr lines (its error chain and the backend's log).
//!
//! While children run, a sampler adds the resident sets of the parent and its live children every
//! 50 ms: the peak of the whole build ([`JobsOutcome::peak_rss`]).

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use backend_qnn::sdk::{self, BuildPhase};
use backend_qnn::target::HtpTarget;
use backend_qnn::{validate, LowerOptions, QnnGraph, QnnLowering, TensorType};
use checkpoint::SafetensorsCheckpoint;
use compiler::passes::Pipeline;
use mllm_dsl::files::write_atomic_bytes;
use mllm_dsl::memory::{cpu_seconds, peak_rss_bytes, reset_peak_rss, rss_bytes};
use mllm_dsl::ParamFormat;
use models::hf::HfConfig;
use serde_json::{json, Value};

use crate::config::load_aot_config;
use crate::error::{Context, Result};
use crate::load::rope_positions;
use crate::shard::{shard_program, ShardPlan, ShardSpec};
use crate::trace::trace_graph;

/// The hidden argument that makes a program a shard build child.
pub const CHILD_FLAG: &str = "--build-shard";

/// Set to a shard number (1-based) to make that shard's child abort with SIGABRT before it
/// builds: how the tests check that a killed child's build is reported and leaves no output.
pub const ABORT_ENV: &str = "MLLM_DSL_SHARD_BUILD_ABORT";

/// One binary to build: shard `shard` of `plan` from the quantized checkpoint.
#[derive(Clone, Debug, PartialEq)]
pub struct ShardJob {
    pub checkpoint: PathBuf,
    /// mllm's AOT config (the built-in one when `None`).
    pub aot_config: Option<PathBuf>,
    pub plan: ShardPlan,
    pub shard: usize,
    pub chunks: Vec<usize>,
    pub context: usize,
    /// The weight-shared device binary, or the unshared one the x86 emulation loads.
    pub weight_sharing: bool,
    pub optimization_level: Option<u32>,
    /// Where the binary goes (written atomically).
    pub out: PathBuf,
}

impl ShardJob {
    fn spec(&self) -> &ShardSpec {
        &self.plan.shards[self.shard]
    }

    fn to_json(&self) -> Value {
        json!({
            "checkpoint": self.checkpoint,
            "aot_config": self.aot_config,
            "plan": self.plan.shards.iter().map(|s| json!({
                "layers": [s.layers.start, s.layers.end], "static_bytes": s.static_bytes
            })).collect::<Vec<_>>(),
            "shard": self.shard,
            "chunks": self.chunks,
            "context": self.context,
            "weight_sharing": self.weight_sharing,
            "optimization_level": self.optimization_level,
            "out": self.out,
        })
    }

    fn from_json(v: &Value) -> Result<ShardJob> {
        let field = |k: &str| v.get(k).with_context(|| format!("the shard job has no `{k}`"));
        let path = |k: &str| -> Result<PathBuf> {
            Ok(PathBuf::from(field(k)?.as_str().with_context(|| format!("`{k}` is not a path"))?))
        };
        let usize_of = |x: &Value, what: &str| -> Result<usize> {
            x.as_u64().map(|n| n as usize).with_context(|| format!("`{what}` is not a count"))
        };
        let plan_json = field("plan")?.as_array().context("`plan` is not a list")?;
        let count = plan_json.len();
        let mut shards = Vec::with_capacity(count);
        for (index, s) in plan_json.iter().enumerate() {
            let layers = s.get("layers").and_then(Value::as_array).context("a shard has no `layers`")?;
            let [a, b] = &layers[..] else { crate::error::bail!("a shard's `layers` is not [start, end]") };
            shards.push(ShardSpec {
                index,
                count,
                layers: usize_of(a, "layers")?..usize_of(b, "layers")?,
                embedding: crate::shard::embedding_in_graph(index, count),
                head: index + 1 == count,
                static_bytes: s.get("static_bytes").and_then(Value::as_u64).unwrap_or(0),
            });
        }
        Ok(ShardJob {
            checkpoint: path("checkpoint")?,
            aot_config: v.get("aot_config").and_then(Value::as_str).map(PathBuf::from),
            plan: ShardPlan { shards },
            shard: usize_of(field("shard")?, "shard")?,
            chunks: field("chunks")?
                .as_array()
                .context("`chunks` is not a list")?
                .iter()
                .map(|c| usize_of(c, "chunks"))
                .collect::<Result<_>>()?,
            context: usize_of(field("context")?, "context")?,
            weight_sharing: field("weight_sharing")?.as_bool().context("`weight_sharing` is not a bool")?,
            optimization_level: v.get("optimization_level").and_then(Value::as_u64).map(|o| o as u32),
            out: path("out")?,
        })
    }

    /// `context_2_of_4.bin (shard 2/4, layers 7..=13)`, for messages.
    pub fn describe(&self) -> String {
        let s = self.spec();
        format!(
            "{} (shard {}/{}, layers {}..={})",
            self.out.display(),
            s.index + 1,
            s.count,
            s.layers.start,
            s.layers.end - 1
        )
    }
}

/// Why a shard's child build failed.
#[derive(Debug, thiserror::Error)]
pub enum ShardBuildError {
    #[error("building {job}: the child process {status}; its last output:\n{stderr}")]
    Failed { job: String, status: String, stderr: String },
    #[error("building {job}: could not start {exe}: {source}")]
    Spawn {
        job: String,
        exe: String,
        #[source]
        source: std::io::Error,
    },
    #[error("building {job}: the child's report `{line}` is not valid: {detail}")]
    Report { job: String, line: String, detail: String },
}

/// One step of a child's build.
#[derive(Clone, Debug, PartialEq)]
pub struct ChildStep {
    pub name: String,
    pub ours: bool,
    pub seconds: f64,
    pub cpu_seconds: f64,
    pub peak_rss: u64,
}

/// What a child reported.
#[derive(Clone, Debug, PartialEq)]
pub struct ShardOutcome {
    pub shard: usize,
    pub weight_sharing: bool,
    pub out: PathBuf,
    pub binary_bytes: u64,
    /// Distinct STATIC bytes of the shard's graphs as handed to the backend.
    pub static_bytes: u64,
    pub graphs: Vec<String>,
    pub steps: Vec<ChildStep>,
    /// The child's own peak (`VmHWM` at its end, not reset).
    pub peak_rss: u64,
    pub wall_seconds: f64,
}

/// What [`run_jobs`] measured.
#[derive(Clone, Debug, PartialEq)]
pub struct JobsOutcome {
    pub shards: Vec<ShardOutcome>,
    /// Largest sampled sum of the parent's and its live children's resident sets.
    pub peak_rss: u64,
    pub wall_seconds: f64,
    /// CPU seconds of the children (user + system, reaped).
    pub children_cpu_seconds: f64,
}

/// If this process was started as a shard build child (`<exe> --build-shard <job.json>`):
/// builds the shard, prints its report and exits (code 1 with the error on stderr when it fails).
/// Call it first in `main` of every program that builds shards.
pub fn child_main_if_requested() {
    let args: Vec<String> = std::env::args().collect();
    let Some(pos) = args.iter().position(|a| a == CHILD_FLAG) else { return };
    let code = match args.get(pos + 1) {
        None => {
            eprintln!("{CHILD_FLAG} needs the path of a shard job file");
            2
        }
        Some(path) => match child_main(Path::new(path)) {
            Ok(report) => {
                println!("{report}");
                0
            }
            Err(e) => {
                eprintln!("error: {e}");
                1
            }
        },
    };
    std::process::exit(code);
}

fn child_main(job_path: &Path) -> Result<Value> {
    let text = std::fs::read_to_string(job_path).with_context(|| format!("reading {}", job_path.display()))?;
    let job = ShardJob::from_json(&serde_json::from_str(&text)?)?;
    if std::env::var(ABORT_ENV).ok().and_then(|v| v.parse::<usize>().ok()) == Some(job.shard + 1) {
        eprintln!("{ABORT_ENV}={}: aborting before the build", job.shard + 1);
        std::process::abort();
    }
    let outcome = build_in_this_process(&job)?;
    Ok(json!({
        "shard": outcome.shard,
        "binary_bytes": outcome.binary_bytes,
        "static_bytes": outcome.static_bytes,
        "graphs": outcome.graphs,
        "peak_rss": outcome.peak_rss,
        "wall_seconds": outcome.wall_seconds,
        "steps": outcome.steps.iter().map(|s| json!({
            "name": s.name, "ours": s.ours, "seconds": s.seconds, "cpu_seconds": s.cpu_seconds, "peak_rss": s.peak_rss
        })).collect::<Vec<_>>(),
    }))
}

/// Wall time, CPU time and peak RSS of consecutive steps of one process.
struct Meter {
    steps: Vec<ChildStep>,
    open: Option<(usize, Instant, f64)>,
}

impl Meter {
    fn start(&mut self, name: &str, ours: bool) {
        self.stop();
        let _ = reset_peak_rss();
        let i = match self.steps.iter().position(|s| s.name == name) {
            Some(i) => i,
            None => {
                self.steps.push(ChildStep { name: name.into(), ours, seconds: 0.0, cpu_seconds: 0.0, peak_rss: 0 });
                self.steps.len() - 1
            }
        };
        self.open = Some((i, Instant::now(), cpu_seconds().unwrap_or(0.0)));
    }

    fn stop(&mut self) {
        if let Some((i, t, cpu)) = self.open.take() {
            let s = &mut self.steps[i];
            s.seconds += t.elapsed().as_secs_f64();
            s.cpu_seconds += cpu_seconds().unwrap_or(cpu) - cpu;
            s.peak_rss = s.peak_rss.max(peak_rss_bytes().unwrap_or(0));
        }
    }
}

/// The graphs of shard `job.shard`, one per chunk size, lowered for Qualcomm's backend from the
/// quantized checkpoint (traced, mllm's passes, cut).
pub fn lower_shard(
    job: &ShardJob,
    ckpt: &SafetensorsCheckpoint,
    meter: Option<&mut dyn FnMut(&str)>,
) -> Result<Vec<QnnGraph>> {
    let mut noop = |_: &str| {};
    let step: &mut dyn FnMut(&str) = match meter {
        Some(m) => m,
        None => &mut noop,
    };
    let hf = HfConfig::from_dir(&job.checkpoint)?;
    let max_positions = rope_positions(ckpt)?.context("the quantized checkpoint has no RoPE tables")?;
    let (aot, _) = load_aot_config(job.aot_config.as_deref(), &hf)?;
    let mut lowering = QnnLowering::new(ckpt, LowerOptions::qualcomm_htp());
    let mut graphs = Vec::new();
    for &chunk in &job.chunks {
        step("trace");
        let mut program = trace_graph(&hf, max_positions, chunk, job.context, ParamFormat::QnnW4A16)?;
        step("passes");
        Pipeline::qnn_aot(&aot, ckpt).run(&mut program).with_context(|| format!("passes of chunk {chunk}"))?;
        step("cut shard");
        let program = shard_program(&program, &job.plan, job.shard)?;
        step("lower");
        let name = job.spec().graph_name(chunk);
        let mut lowered = lowering.lower_graph(&program, &name).with_context(|| format!("lowering `{name}`"))?;
        validate(&lowered).with_context(|| format!("validating `{name}`"))?;
        lowered.name = name;
        graphs.push(lowered);
    }
    Ok(graphs)
}

/// The child's work: [`lower_shard`], the backend's build, the binary written.
pub fn build_in_this_process(job: &ShardJob) -> Result<ShardOutcome> {
    let start = Instant::now();
    let mut meter = Meter { steps: Vec::new(), open: None };
    let ckpt = SafetensorsCheckpoint::open(&job.checkpoint)
        .with_context(|| format!("opening the quantized checkpoint {}", job.checkpoint.display()))?;
    let hf = HfConfig::from_dir(&job.checkpoint)?;
    let (aot, _) = load_aot_config(job.aot_config.as_deref(), &hf)?;
    let target = HtpTarget::new(&aot.target_machine);
    let graphs = {
        let mut step = |name: &str| meter.start(name, true);
        lower_shard(job, &ckpt, Some(&mut step))?
    };
    meter.start("HTP options", true);
    let mut options = target.htp_options(job.weight_sharing && graphs.len() > 1)?;
    if let Some(level) = job.optimization_level {
        options.graph.optimization_level = Some(level);
    }
    let names: Vec<String> = graphs.iter().map(|g| g.name.clone()).collect();
    // The graphs are the only owners of the static bytes, freed once the backend has copied them.
    drop(ckpt);
    let static_bytes = static_bytes(&graphs);
    let binary = sdk::build_context_binary_with_sdk_observed(graphs, &options, &mut |phase: BuildPhase| {
        meter.start(phase.name(), false)
    })
    .with_context(|| format!("building {} with Qualcomm's HTP backend", job.describe()))?;
    meter.start("write binary", true);
    write_atomic_bytes(&job.out, &binary)?;
    meter.stop();
    let peak_rss = meter.steps.iter().map(|s| s.peak_rss).max().unwrap_or(0);
    Ok(ShardOutcome {
        shard: job.shard,
        weight_sharing: job.weight_sharing,
        out: job.out.clone(),
        binary_bytes: binary.len() as u64,
        static_bytes,
        graphs: names,
        steps: meter.steps,
        peak_rss,
        wall_seconds: start.elapsed().as_secs_f64(),
    })
}

/// Bytes of the distinct STATIC tensors of `graphs` (shared weights counted once).
pub fn static_bytes(graphs: &[QnnGraph]) -> u64 {
    let mut seen = std::collections::HashSet::new();
    let tensors = graphs.iter().flat_map(QnnGraph::tensors_and_params);
    tensors
        .filter(|t| t.tensor_type == TensorType::Static && seen.insert(t.name.as_str()))
        .filter_map(|t| t.data.as_ref())
        .map(|d| d.len() as u64)
        .sum()
}

/// Resident set of process `pid` in bytes (0 once it is gone).
fn rss_of(pid: u32) -> u64 {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else { return 0 };
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// CPU seconds of this process's reaped children (`cutime + cstime` of `/proc/self/stat`).
pub fn children_cpu_seconds() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else { return 0.0 };
    let Some(after) = stat.rfind(')').map(|i| &stat[i + 1..]) else { return 0.0 };
    // Fields after the command: state(3) ... utime(14) stime(15) cutime(16) cstime(17).
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|x| x.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(13) + ticks(14)) / 100.0
}

/// Samples the sum of the parent's and the registered children's resident sets.
struct Sampler {
    children: Arc<Mutex<Vec<u32>>>,
    peak: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Sampler {
    fn start() -> Sampler {
        let children: Arc<Mutex<Vec<u32>>> = Arc::default();
        let peak = Arc::new(AtomicU64::new(rss_bytes().unwrap_or(0)));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (children, peak, stop) = (children.clone(), peak.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let pids = children.lock().map(|c| c.clone()).unwrap_or_default();
                    let sum = rss_bytes().unwrap_or(0) + pids.iter().map(|&p| rss_of(p)).sum::<u64>();
                    peak.fetch_max(sum, Ordering::Relaxed);
                    std::thread::sleep(Duration::from_millis(50));
                }
            })
        };
        Sampler { children, peak, stop, thread: Some(thread) }
    }

    fn finish(mut self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.peak.load(Ordering::Relaxed)
    }
}

/// Keeps the last `max` lines of a child's stderr.
fn tail(text: &str, max: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(max)..].join("\n")
}

/// A running child and the threads reading its output.
struct Running {
    job: ShardJob,
    child: Child,
    stdout: std::thread::JoinHandle<String>,
    stderr: std::thread::JoinHandle<String>,
    /// The job file, removed when the child ends.
    job_file: PathBuf,
}

fn read_all(mut r: impl Read + Send + 'static) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut s = String::new();
        let _ = r.read_to_string(&mut s);
        s
    })
}

/// Builds every job in a child process of `exe` (the calling program: it must call
/// [`child_main_if_requested`]), at most `jobs` at once, job files in `work_dir`. `on_done` is
/// called as each shard finishes. The first failure stops starting new children, waits for the
/// running ones and is returned.
pub fn run_jobs(
    exe: &Path,
    all: Vec<ShardJob>,
    jobs: usize,
    work_dir: &Path,
    on_done: &mut dyn FnMut(&ShardOutcome),
) -> Result<JobsOutcome> {
    let start = Instant::now();
    let cpu_before = children_cpu_seconds();
    let sampler = Sampler::start();
    let mut pending: std::collections::VecDeque<ShardJob> = all.into();
    let mut running: Vec<Running> = Vec::new();
    let mut done: Vec<ShardOutcome> = Vec::new();
    let mut failure: Option<crate::error::AotError> = None;
    std::fs::create_dir_all(work_dir).with_context(|| format!("creating {}", work_dir.display()))?;
    loop {
        while failure.is_none() && running.len() < jobs.max(1) {
            let Some(job) = pending.pop_front() else { break };
            let job_file = work_dir.join(format!(
                "shard_{}_of_{}{}.json",
                job.shard + 1,
                job.plan.count(),
                if job.weight_sharing { "" } else { ".x86" }
            ));
            write_atomic_bytes(&job_file, job.to_json().to_string().as_bytes())?;
            let spawned = Command::new(exe)
                .arg(CHILD_FLAG)
                .arg(&job_file)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn();
            let mut child = match spawned {
                Ok(c) => c,
                Err(source) => {
                    failure = Some(
                        ShardBuildError::Spawn { job: job.describe(), exe: exe.display().to_string(), source }.into(),
                    );
                    break;
                }
            };
            sampler.children.lock().map(|mut c| c.push(child.id())).ok();
            let stdout = read_all(child.stdout.take().expect("piped"));
            let stderr = read_all(child.stderr.take().expect("piped"));
            running.push(Running { job, child, stdout, stderr, job_file });
        }
        if running.is_empty() {
            break;
        }
        // Reap whichever child ended.
        let mut ended = None;
        for (i, r) in running.iter_mut().enumerate() {
            if let Some(status) = r.child.try_wait()? {
                ended = Some((i, status));
                break;
            }
        }
        let Some((i, status)) = ended else {
            std::thread::sleep(Duration::from_millis(20));
            continue;
        };
        let r = running.remove(i);
        sampler.children.lock().map(|mut c| c.retain(|&p| p != r.child.id())).ok();
        let stdout = r.stdout.join().unwrap_or_default();
        let stderr = r.stderr.join().unwrap_or_default();
        let _ = std::fs::remove_file(&r.job_file);
        if !status.success() {
            let status = describe_status(status);
            failure.get_or_insert(
                ShardBuildError::Failed { job: r.job.describe(), status, stderr: tail(&stderr, 40) }.into(),
            );
            continue;
        }
        match parse_report(&r.job, &stdout) {
            Ok(outcome) => {
                on_done(&outcome);
                done.push(outcome);
            }
            Err(e) => {
                failure.get_or_insert(e);
            }
        }
    }
    let peak_rss = sampler.finish();
    if let Some(e) = failure {
        return Err(e);
    }
    done.sort_by_key(|o| (o.shard, !o.weight_sharing));
    Ok(JobsOutcome {
        shards: done,
        peak_rss,
        wall_seconds: start.elapsed().as_secs_f64(),
        children_cpu_seconds: children_cpu_seconds() - cpu_before,
    })
}

fn describe_status(status: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with code {code}"),
        (None, Some(9)) => "was killed by SIGKILL (signal 9; out of memory?)".into(),
        (None, Some(sig)) => format!("was killed by signal {sig}"),
        _ => status.to_string(),
    }
}

fn parse_report(job: &ShardJob, stdout: &str) -> Result<ShardOutcome> {
    let line = stdout.lines().rev().find(|l| l.starts_with('{')).unwrap_or("");
    let bad = |detail: String| ShardBuildError::Report { job: job.describe(), line: line.to_string(), detail };
    let v: Value = serde_json::from_str(line).map_err(|e| bad(e.to_string()))?;
    let num = |k: &str| v.get(k).and_then(Value::as_f64).ok_or_else(|| bad(format!("no number `{k}`")));
    let steps = v
        .get("steps")
        .and_then(Value::as_array)
        .ok_or_else(|| bad("no `steps`".into()))?
        .iter()
        .map(|s| ChildStep {
            name: s.get("name").and_then(Value::as_str).unwrap_or("?").to_string(),
            ours: s.get("ours").and_then(Value::as_bool).unwrap_or(false),
            seconds: s.get("seconds").and_then(Value::as_f64).unwrap_or(0.0),
            cpu_seconds: s.get("cpu_seconds").and_then(Value::as_f64).unwrap_or(0.0),
            peak_rss: s.get("peak_rss").and_then(Value::as_u64).unwrap_or(0),
        })
        .collect();
    Ok(ShardOutcome {
        shard: job.shard,
        weight_sharing: job.weight_sharing,
        out: job.out.clone(),
        binary_bytes: num("binary_bytes")? as u64,
        static_bytes: num("static_bytes")? as u64,
        graphs: v
            .get("graphs")
            .and_then(Value::as_array)
            .map(|g| g.iter().filter_map(Value::as_str).map(str::to_string).collect())
            .unwrap_or_default(),
        steps,
        peak_rss: num("peak_rss")? as u64,
        wall_seconds: num("wall_seconds")?,
    })
}

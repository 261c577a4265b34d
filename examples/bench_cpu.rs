//! CPU speed bench: Qwen3-0.6B's shapes (vocab 151936, hidden 1024, 28 layers, 16 heads, 8 KV heads,
//! head_dim 128, intermediate 3072, tied embeddings) with random bf16 weights, run through the real
//! path (`load_model_with` → `CpuChunkModel` → `Generator` running `models::qwen3::Qwen3ForCausalLM`),
//! as bf16, as its W4A16KV8 export with int4 weights in memory, and as that export with its weights
//! decoded to f32; optionally against llama.cpp's `llama-bench` on a GGUF of the same model.
//!
//! ```text
//! cargo run --release --example bench_cpu [-- --threads 1,2 --runs 3 --variants bf16,int4,f32]
//! cargo run --release --example bench_cpu -- --threads 2 --variants int4 --quantized DIR \
//!     --llama-bench PATH/llama-bench --gguf FILE.gguf --rounds 3
//! ```
//!
//! The synthetic checkpoint (~1.2 GB, `aot::synthetic::QWEN3_0_6B`) is written into
//! `target/bench-qwen3-0.6b/`, and its W4A16KV8 export (`aot::quantize`: RTN weights, activation
//! ranges from one random 64-token sequence; the values do not matter for speed) into
//! `target/bench-qwen3-0.6b-w4a16/`; both are reused when present. `--model` / `--quantized` name
//! other checkpoints (a float one and a quantized one, e.g. SmolLM2-135M-Instruct and its
//! `quantize` export).
//!
//! Each variant and thread count runs in a fresh child process (this executable re-run with
//! `MLLM_BENCH_CPU_CHILD` set), so load time, peak RSS (`VmHWM`) and the memory on huge pages
//! (`AnonHugePages`) belong to one configuration:
//! - `bf16`: the float checkpoint, bf16 weights packed as bf16 and widened to f32 in registers
//!   (f32 products, the float references' arithmetic);
//! - `bf16-products`: the same weights with each linear's input rounded to bf16 and the products
//!   run on AMX tiles or by `vdpbf16ps` where the CPU has them (`Bf16Products::Bf16`; not in the
//!   default `--variants`);
//! - `int4`: the quantized checkpoint in fake-quant mode, LPBQ weights kept 4-bit (W4A16 kernels),
//!   the uint16 embedding kept as its codes;
//! - `f32`: the same checkpoint with those weights decoded to f32 at load.
//!
//! Before the models of a thread count, a child of its own measures the memory read bandwidth on
//! that many threads (best of 7 passes over a 1 GiB buffer, far larger than the caches). A model
//! child loads the model, then generates `--new` tokens after a
//! `--prompt`-token random prompt (greedy, no EOS), `--warmup` times untimed (1: the first
//! generation of a process decoded 3-5 % slower than the next ones on a Xeon VM, and llama-bench
//! warms up too), then `--runs` times timed. Prefill tok/s is prompt tokens
//! / prefill time (chunks of `--chunk`); decode tok/s is decode steps / decode time (the first new
//! token comes from the prefill logits, so `new - 1` steps). The roofline is bandwidth / the bytes
//! of weight matrices a decode step reads (KV cache and activations are not counted), and each
//! decode figure is also printed as a fraction of it: per run against its round's bandwidth, and in
//! the summary the median against the best bandwidth of the whole run and the median of the
//! per-round fractions.
//!
//! With `--llama-bench`, every round runs each of our variants and then `llama-bench` on `--gguf`
//! (`-p PROMPT -n NEW -t THREADS`, one repetition), alternating, and the summary prints medians and
//! our / llama.cpp ratios: of the medians, and per round (the two ran back to back) with their
//! median, which the host's drift between rounds does not move. With `--candle` (the
//! `scripts/candle-peer` executable: candle-transformers' Qwen3, f32 compute, `RAYON_NUM_THREADS`
//! = the thread count) every round also runs candle on the float checkpoint, and the summary
//! prints the bf16 / candle ratios the same two ways. With `MLLM_CPU_PROFILE=1` each child also
//! prints its time per op kind; with `--step-profile` it also times one more generation op by op
//! and prints where a decode step's time went (one-row linears and the rate they stream the
//! weights at, attention, QDQ points, other ops, the framework around the ops), and the summary
//! prints the medians. Timing every op costs a little of the step.
//!
//! With `--with-env NAME=VALUE` (repeatable) every variant also runs with that environment
//! variable set, each setting in a child of its own beside the variant as it is, the first of a
//! round's runs turning with the round, and the summary prints each setting against the variant
//! alone: the ratios of the medians, per round, and in how many rounds it decoded faster. That
//! is how a machine's best CPU hints are found (`MLLM_CPU_READ_AHEAD`, `MLLM_CPU_DECODE_PREFETCH`,
//! `MLLM_CPU_SIBLINGS`). Separate processes drift apart on a shared host, so for a setting the
//! backend changes at run time (`backend_cpu::knobs`) `--paired NAME=VALUE` makes each timed run
//! of a model child a pair of generations, as it is and with the setting, back to back in that
//! one process, and the summary prints the setting's decode over the other's per pair.

mod membw;

use anyhow::{bail, ensure, Context, Result};
use aot::synthetic::{write_qwen3, QWEN3_0_6B};
use aot::{load_float_with, load_model_with, RunMode};
use backend_cpu::executor::profile;
use backend_cpu::rng::SplitMix64;
use backend_cpu::{Bf16Products, QuantizedWeights};
use clap::Parser;
use mllm_dsl::memory::{anon_huge_page_bytes, peak_rss_bytes, rss_bytes};
use mllm_examples as _; // the allocator every main runs with (lib.rs)
use runtime::{ChunkModel, GenerationConfig, GenerationTimings, Generator, Sampling};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

/// Set in a child process to `VARIANT:THREADS` (or `membw:THREADS`).
const CHILD_ENV: &str = "MLLM_BENCH_CPU_CHILD";
/// The child that measures the read bandwidth.
const BANDWIDTH_CHILD: &str = "membw";
/// The bandwidth (GB/s) a model child divides by, measured by the parent's `membw` child.
const BANDWIDTH_ENV: &str = "MLLM_BENCH_CPU_READ_GB_S";

#[derive(Parser, Debug, Clone)]
#[command(about = "Prefill/decode speed, roofline, load time and peak RSS of Qwen3-0.6B shapes on the CPU")]
struct Args {
    /// Float checkpoint directory or a GGUF file (converted once into the cache); without it, the
    /// synthetic checkpoint (written when it holds no config.json yet).
    #[arg(long, value_name = "HF_DIR|GGUF")]
    model: Option<PathBuf>,
    /// Quantized checkpoint directory (written from --model's checkpoint by `aot::quantize` when it
    /// holds no config.json yet).
    #[arg(long)]
    quantized: Option<PathBuf>,
    /// Variants to measure: bf16 (the float checkpoint), int4 and f32 (the quantized one, weights
    /// kept 4-bit or decoded to f32).
    #[arg(long, value_delimiter = ',', default_value = "bf16,int4,f32")]
    variants: Vec<String>,
    /// Thread counts to measure, each in its own process.
    #[arg(long, value_delimiter = ',', default_value = "1,2")]
    threads: Vec<usize>,
    /// Prompt length in tokens.
    #[arg(long, default_value_t = 128)]
    prompt: usize,
    /// New tokens to generate.
    #[arg(long, default_value_t = 128)]
    new: usize,
    /// Prefill chunk size.
    #[arg(long, default_value_t = 32)]
    chunk: usize,
    /// Context length (KV cache capacity; the CPU model only computes on the valid past).
    #[arg(long, default_value_t = 1024)]
    context: usize,
    /// Generations per process (after loading once); every run is printed.
    #[arg(long, default_value_t = 1)]
    runs: usize,
    /// Untimed generations each model child runs after loading, before the timed ones (the same
    /// prompt and length): llama-bench warms up alike (a prompt run and one generated token), and
    /// candle-peer runs its sequence once untimed.
    #[arg(long, default_value_t = 1)]
    warmup: usize,
    /// Rounds: every variant (and llama.cpp) once per round, alternating.
    #[arg(long, default_value_t = 1)]
    rounds: usize,
    /// Rewrite the synthetic checkpoints even if present.
    #[arg(long)]
    regenerate: bool,
    /// llama.cpp's `llama-bench` executable, run on --gguf between our runs.
    #[arg(long, requires = "gguf")]
    llama_bench: Option<PathBuf>,
    /// The GGUF llama.cpp runs (the same model as --model / --quantized).
    #[arg(long, requires = "llama_bench")]
    gguf: Option<PathBuf>,
    /// The int4 variant's KV cache: `u8`, the codes of its KV8 QDQ points, or `f32`, their values.
    #[arg(long, default_value = "u8", value_parser = ["u8", "f32"])]
    int4_kv: String,
    /// The `candle-peer` executable (`scripts/candle-peer`: candle-transformers' Qwen3, f32
    /// compute), run on the float checkpoint between our runs.
    #[arg(long)]
    candle: Option<PathBuf>,
    /// After its timed runs, each model child times its ops over one more generation and prints
    /// where a decode step's time went: the one-row linears (and the rate they read the weights
    /// at), attention, QDQ points, the other ops, the framework around them; the summary prints
    /// the medians.
    #[arg(long)]
    step_profile: bool,
    /// Also runs every variant with an environment variable set, `NAME=VALUE` (repeat the flag
    /// for more settings, each run on its own), alternating with the variant as it is; the
    /// summary prints each against it, per round too. For the CPU backend's hints on this
    /// machine: `MLLM_CPU_READ_AHEAD`, `MLLM_CPU_DECODE_PREFETCH`, `MLLM_CPU_SIBLINGS` (docs/cpu.md).
    #[arg(long = "with-env", value_name = "NAME=VALUE", value_parser = Setting::parse)]
    with_env: Vec<Setting>,
    /// Every timed run of a model child is a pair: one generation as it is and one with this CPU
    /// backend setting (`backend_cpu::knobs`: `MLLM_CPU_INT4_TILE`, `MLLM_CPU_READ_AHEAD`,
    /// `MLLM_CPU_DECODE_PREFETCH`, `MLLM_CPU_SIBLINGS`), back to back in one process, the first of
    /// the two turning with the run; the summary prints the ratio per pair, its median and in how
    /// many pairs the setting decoded faster. Unlike --with-env, the host's drift between
    /// processes does not enter the ratios.
    #[arg(long, value_name = "NAME=VALUE", value_parser = Setting::parse_runtime)]
    paired: Option<Setting>,
}

/// An environment variable set for some runs of a variant (`--with-env`).
#[derive(Clone, Debug)]
struct Setting {
    name: String,
    value: String,
}

impl Setting {
    fn parse(s: &str) -> Result<Setting, String> {
        let (name, value) = s.split_once('=').ok_or_else(|| format!("`{s}` is not NAME=VALUE"))?;
        if name.is_empty() || name.contains(char::is_whitespace) {
            return Err(format!("`{s}`: the variable's name must be non-empty and without spaces"));
        }
        if [CHILD_ENV, BANDWIDTH_ENV].contains(&name) {
            return Err(format!("`{name}` is the bench's own variable"));
        }
        Ok(Setting { name: name.into(), value: value.into() })
    }

    /// [`Setting::parse`] of a setting the CPU backend changes at run time (`--paired`).
    fn parse_runtime(s: &str) -> Result<Setting, String> {
        let setting = Setting::parse(s)?;
        backend_cpu::knobs::runtime_setting(&setting.name).map_err(|e| e.to_string())?;
        Ok(setting)
    }

    /// The results' name of `variant` run with this setting (`None`: as it is).
    fn run_name(setting: Option<&Setting>, variant: Variant) -> String {
        match setting {
            None => variant.name().into(),
            Some(s) => format!("{}[{}={}]", variant.name(), s.name, s.value),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Variant {
    Bf16,
    Bf16Products,
    Int4,
    F32,
}

impl Variant {
    fn parse(s: &str) -> Result<Self> {
        Ok(match s {
            "bf16" => Variant::Bf16,
            "bf16-products" => Variant::Bf16Products,
            "int4" => Variant::Int4,
            "f32" => Variant::F32,
            other => bail!("--variants: `{other}` is not one of bf16, bf16-products, int4, f32"),
        })
    }

    /// Whether it runs the float checkpoint.
    fn float(self) -> bool {
        matches!(self, Variant::Bf16 | Variant::Bf16Products)
    }

    fn name(self) -> &'static str {
        match self {
            Variant::Bf16 => "bf16",
            Variant::Bf16Products => "bf16-products",
            Variant::Int4 => "int4",
            Variant::F32 => "f32",
        }
    }
}

fn main() -> Result<()> {
    let args = Args::parse();
    let synthetic = args.model.is_none();
    let model = match &args.model {
        Some(model) => aot::resolve_model(model)?,
        None => aot::default_out_dir("bench-qwen3-0.6b"),
    };
    let quantized = args.quantized.clone().unwrap_or_else(|| aot::default_out_dir("bench-qwen3-0.6b-w4a16"));
    let variants = args.variants.iter().map(|v| Variant::parse(v)).collect::<Result<Vec<_>>>()?;
    if let Ok(child_spec) = std::env::var(CHILD_ENV) {
        let (variant, threads) = child_spec.split_once(':').context("child spec is VARIANT:THREADS")?;
        let threads: usize = threads.parse().with_context(|| format!("{CHILD_ENV}={child_spec}: bad thread count"))?;
        if variant == BANDWIDTH_CHILD {
            println!("read_gb_s={:.2}", membw::read_bandwidth(threads, 7) / 1e9);
            return Ok(());
        }
        let variant = Variant::parse(variant)?;
        let dir = if variant.float() { &model } else { &quantized };
        return child(&args, dir, variant, threads);
    }
    let needs_float = variants.iter().any(|v| v.float()) || !quantized.join("config.json").is_file();
    if synthetic && needs_float && (args.regenerate || !model.join("config.json").is_file()) {
        let start = Instant::now();
        write_qwen3(&model, &QWEN3_0_6B, QWEN3_0_6B.layers)?;
        println!("wrote {} in {:.1} s", model.display(), start.elapsed().as_secs_f64());
    }
    let wants_quantized = variants.iter().any(|v| !v.float());
    if wants_quantized && (!quantized.join("config.json").is_file() || (synthetic && args.regenerate)) {
        let start = Instant::now();
        quantize(&model, &quantized, args.context)?;
        println!("quantized into {} in {:.1} s", quantized.display(), start.elapsed().as_secs_f64());
    }
    println!(
        "float {} / quantized {}; prompt {} (chunk {}), {} new tokens, context {}",
        model.display(),
        quantized.display(),
        args.prompt,
        args.chunk,
        args.new,
        args.context
    );
    println!("(figures from a shared machine: other jobs may run at the same time; compare rounds)");
    let exe = std::env::current_exe().context("locating this executable")?;
    // (name, threads) -> (round, prefill, decode) per run.
    let mut results: Results = BTreeMap::new();
    // threads -> the read bandwidths measured (GB/s); (name, threads) -> weights_mb.
    let mut bandwidths: BTreeMap<usize, Vec<f64>> = BTreeMap::new();
    let mut weights_mb: BTreeMap<(String, usize), f64> = BTreeMap::new();
    // (name, threads) -> the STEP_FIELDS of each run's step profile.
    let mut step_profiles: BTreeMap<(String, usize), Vec<Vec<f64>>> = BTreeMap::new();
    // (name, threads) -> (decode as it is, decode with --paired's setting) of every pair.
    let mut pairs: BTreeMap<(String, usize), Vec<(f64, f64)>> = BTreeMap::new();
    for round in 1..=args.rounds {
        for &threads in &args.threads {
            // In its own process, so its buffer does not count in a model's peak RSS.
            let out = Command::new(&exe)
                .args(std::env::args_os().skip(1))
                .env(CHILD_ENV, format!("{BANDWIDTH_CHILD}:{threads}"))
                .output()
                .with_context(|| format!("running {}", exe.display()))?;
            let text = String::from_utf8_lossy(&out.stdout);
            let bandwidth = text.lines().find_map(|l| field(l, "read_gb_s")).with_context(|| {
                format!("the bandwidth run printed no read_gb_s: {text}{}", String::from_utf8_lossy(&out.stderr))
            })?;
            println!("round={round} threads={threads} read_gb_s={bandwidth:.2} (best of 7 passes over 1 GiB)");
            bandwidths.entry(threads).or_default().push(bandwidth);
            // Each variant as it is and with each --with-env setting, the first of them turning
            // with the round: on a shared host the first run of a round tends to differ.
            let settings: Vec<Option<&Setting>> = std::iter::once(None).chain(args.with_env.iter().map(Some)).collect();
            for &variant in &variants {
                for i in 0..settings.len() {
                    let setting = settings[(i + round) % settings.len()];
                    let name = Setting::run_name(setting, variant);
                    let out = Command::new(&exe)
                        .args(std::env::args_os().skip(1))
                        .env(CHILD_ENV, format!("{}:{threads}", variant.name()))
                        .env(BANDWIDTH_ENV, bandwidth.to_string())
                        .envs(setting.map(|s| (&s.name, &s.value)))
                        .output()
                        .with_context(|| format!("running {}", exe.display()))?;
                    let text = String::from_utf8_lossy(&out.stdout);
                    match setting {
                        None => print!("round={round} {text}"),
                        Some(s) => print!("round={round} with {}={} {text}", s.name, s.value),
                    }
                    if !out.status.success() {
                        bail!("the {name} {threads}-thread run failed: {}", String::from_utf8_lossy(&out.stderr));
                    }
                    for line in text.lines() {
                        if line.starts_with("paired ") {
                            if let (Some(base), Some(with)) =
                                (field(line, "base_decode_tok_s"), field(line, "decode_tok_s"))
                            {
                                pairs.entry((name.clone(), threads)).or_default().push((base, with));
                            }
                            continue;
                        }
                        if line.starts_with("step_profile ") {
                            let values = STEP_FIELDS.iter().map(|&key| field(line, key).unwrap_or(f64::NAN)).collect();
                            step_profiles.entry((name.clone(), threads)).or_default().push(values);
                            continue;
                        }
                        if let (Some(p), Some(d)) = (field(line, "prefill_tok_s"), field(line, "decode_tok_s")) {
                            results.entry((name.clone(), threads)).or_default().push((round, p, d));
                        }
                        if let Some(mb) = field(line, "weights_mb") {
                            weights_mb.insert((name.clone(), threads), mb);
                        }
                    }
                }
            }
            if let (Some(bench), Some(gguf)) = (&args.llama_bench, &args.gguf) {
                let (p, d) = llama_bench(bench, gguf, &args, threads)?;
                println!("round={round} variant=llama.cpp threads={threads} prefill_tok_s={p:.2} decode_tok_s={d:.2}");
                results.entry(("llama.cpp".into(), threads)).or_default().push((round, p, d));
            }
            if let Some(candle) = &args.candle {
                let (p, d) = candle_peer(candle, &model, &args, threads)?;
                println!("round={round} variant=candle threads={threads} prefill_tok_s={p:.2} decode_tok_s={d:.2}");
                results.entry(("candle".into(), threads)).or_default().push((round, p, d));
            }
        }
    }
    summarize(&results, &args.threads);
    compare_settings(&results, &args.threads, &variants, &args.with_env);
    if let Some(setting) = &args.paired {
        paired_summary(&pairs, setting)?;
    }
    roofline_summary(&results, &bandwidths, &weights_mb);
    step_profile_summary(&step_profiles)
}

/// The fields of a `step_profile` line the summary reads.
const STEP_FIELDS: [&str; 8] = [
    "step_ms",
    "linears_ms",
    "linears_gb_s",
    "attention_ms",
    "qdq_points_ms",
    "other_ops_ms",
    "framework_ms",
    "chunk_io_ms",
];

/// The median of each field of the step profiles, per variant and thread count.
fn step_profile_summary(profiles: &BTreeMap<(String, usize), Vec<Vec<f64>>>) -> Result<()> {
    for ((name, t), runs) in profiles {
        let medians: Vec<f64> = (0..STEP_FIELDS.len()).map(|i| median(runs.iter().map(|r| r[i]).collect())).collect();
        if let Some(bad) = medians.iter().position(|v| !v.is_finite()) {
            bail!("the {name} {t}-thread step profile has no finite {}", STEP_FIELDS[bad]);
        }
        let [step, linears, gb_s, attention, qdq, other, framework, io] = medians[..] else { unreachable!() };
        // The runtime's share per run (the step less every part of it), then its median: the
        // medians of the parts come from different runs and need not sum to the median step.
        let rest = |r: &Vec<f64>| match r[..] {
            // STEP_FIELDS: the step, the linears, their GB/s (not a time), then the other parts.
            [step, linears, _gb_s, ref parts @ ..] => step - linears - parts.iter().sum::<f64>(),
            _ => f64::NAN,
        };
        let runtime = median(runs.iter().map(rest).collect());
        if !runtime.is_finite() {
            bail!("the {name} {t}-thread step profile has no finite runtime share");
        }
        println!(
            "  threads={t} {name:>9}: decode step {step:.2} ms (profiled, median of {}): linears {linears:.2} ms \
             ({gb_s:.1} GB/s), attention {attention:.2}, QDQ points {qdq:.2}, other ops {other:.2}, framework \
             {framework:.2}, chunk I/O {io:.2}; the rest ({:.2}) is the runtime's",
            runs.len(),
            runtime,
        );
    }
    Ok(())
}

/// `key=value` of a printed line, as a number.
fn field(line: &str, key: &str) -> Option<f64> {
    line.split_whitespace().find_map(|kv| kv.strip_prefix(key)?.strip_prefix('=')?.trim_end_matches('%').parse().ok())
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// (variant or peer, threads) -> (round, prefill tok/s, decode tok/s) of every run.
type Results = BTreeMap<(String, usize), Vec<(usize, f64, f64)>>;

/// The (prefill, decode) medians of `runs`.
fn medians<'a>(runs: impl Iterator<Item = &'a (usize, f64, f64)> + Clone) -> (f64, f64) {
    (median(runs.clone().map(|r| r.1).collect()), median(runs.map(|r| r.2).collect()))
}

/// Per round in which both ran, `ours`' medians over `peer`'s (prefill, decode). The two ran
/// back to back in that round, so a ratio is not moved by the host's drift between rounds.
fn round_ratios(ours: &[(usize, f64, f64)], peer: &[(usize, f64, f64)]) -> Vec<(f64, f64)> {
    let rounds: std::collections::BTreeSet<usize> = ours.iter().map(|r| r.0).collect();
    rounds
        .into_iter()
        .filter_map(|round| {
            let of = |runs: &[(usize, f64, f64)]| {
                let mut runs = runs.iter().filter(move |r| r.0 == round).peekable();
                runs.peek().is_some().then(|| medians(runs))
            };
            let ((op, od), (pp, pd)) = (of(ours)?, of(peer)?);
            Some((op / pp, od / pd))
        })
        .collect()
}

/// Medians per variant and thread count, and the ratios the issue's targets name: of the medians,
/// and the median of the per-round ratios with each round's ratio.
fn summarize(results: &Results, threads: &[usize]) {
    println!("summary (medians over runs and rounds):");
    for &t in threads {
        let runs = |name: &str| results.get(&(name.to_string(), t));
        for name in ["bf16", "bf16-products", "int4", "f32", "llama.cpp", "candle"] {
            if let Some(r) = runs(name) {
                let (p, d) = medians(r.iter());
                println!("  threads={t} {name:>13}: prefill {p:8.2} tok/s, decode {d:7.2} tok/s");
            }
        }
        let pairs = [
            ("int4", "f32", "f32-decoded weights"),
            ("int4", "llama.cpp", "llama.cpp"),
            ("bf16", "llama.cpp", "llama.cpp"),
            ("bf16", "candle", "candle"),
            ("bf16-products", "candle", "candle"),
        ];
        for (ours, peer, label) in pairs {
            if let (Some(o), Some(p)) = (runs(ours), runs(peer)) {
                print_ratios(t, ours, label, o, p);
            }
        }
    }
}

/// `ours` over `peer`: the ratios of the medians, and per round (the two ran back to back) with
/// their median.
fn print_ratios(t: usize, ours: &str, label: &str, o: &[(usize, f64, f64)], p: &[(usize, f64, f64)]) {
    let ((op, od), (pp, pd)) = (medians(o.iter()), medians(p.iter()));
    let per_round = round_ratios(o, p);
    if per_round.is_empty() {
        println!("  threads={t} {ours} / {label}: prefill {:.2}x, decode {:.2}x", op / pp, od / pd);
        return;
    }
    let list = |f: fn(&(f64, f64)) -> f64| per_round.iter().map(|r| format!("{:.2}", f(r))).collect::<Vec<_>>();
    println!(
        "  threads={t} {ours} / {label}: prefill {:.2}x, decode {:.2}x; per round: prefill {:.2}x ({}), decode \
         {:.2}x ({}); decode higher in {} of {} rounds",
        op / pp,
        od / pd,
        median(per_round.iter().map(|r| r.0).collect()),
        list(|r| r.0).join(", "),
        median(per_round.iter().map(|r| r.1).collect()),
        list(|r| r.1).join(", "),
        per_round.iter().filter(|r| r.1 > 1.0).count(),
        per_round.len(),
    );
}

/// Each variant run with a --with-env setting against the variant as it is.
fn compare_settings(results: &Results, threads: &[usize], variants: &[Variant], settings: &[Setting]) {
    for &t in threads {
        for &variant in variants {
            let Some(base) = results.get(&(variant.name().to_string(), t)) else { continue };
            for setting in settings {
                let name = Setting::run_name(Some(setting), variant);
                let Some(runs) = results.get(&(name.clone(), t)) else { continue };
                let (p, d) = medians(runs.iter());
                println!("  threads={t} {name}: prefill {p:8.2} tok/s, decode {d:7.2} tok/s");
                print_ratios(t, &name, variant.name(), runs, base);
            }
        }
    }
}

/// `--paired`: per variant and thread count, the setting's decode over the decode as it is, pair
/// by pair (the two generations ran back to back in one process).
fn paired_summary(pairs: &BTreeMap<(String, usize), Vec<(f64, f64)>>, setting: &Setting) -> Result<()> {
    ensure!(!pairs.is_empty(), "--paired {}={}: no model child printed a pair", setting.name, setting.value);
    for ((name, t), runs) in pairs {
        let ratios: Vec<f64> = runs.iter().map(|&(base, with)| with / base).collect();
        if let Some(bad) = runs.iter().find(|(base, with)| !(base.is_finite() && with.is_finite() && *base > 0.0)) {
            bail!("--paired {}: a {name} {t}-thread pair decoded at {bad:?} tok/s", setting.name);
        }
        println!(
            "  threads={t} {name}[{}={}] / {name}, paired in one process: decode {:.3}x per pair (median of {}), \
             faster in {} of {} pairs; medians {:.2} against {:.2} tok/s",
            setting.name,
            setting.value,
            median(ratios.clone()),
            ratios.len(),
            ratios.iter().filter(|&&r| r > 1.0).count(),
            ratios.len(),
            median(runs.iter().map(|r| r.1).collect()),
            median(runs.iter().map(|r| r.0).collect()),
        );
    }
    Ok(())
}

/// Median decode as a fraction of the roofline at the best bandwidth any round measured. On a
/// shared host a round's own measurement can catch a moment of contention and put a decode above
/// its roofline; the best one is what the machine can do, so this fraction is not inflated by it.
/// Then the median of the per-round fractions (each against its round's own bandwidth), which a
/// single fast bandwidth pass does not lower.
fn roofline_summary(
    results: &Results,
    bandwidths: &BTreeMap<usize, Vec<f64>>,
    weights_mb: &BTreeMap<(String, usize), f64>,
) {
    for ((name, t), mb) in weights_mb {
        let (Some(runs), Some(rounds)) = (results.get(&(name.clone(), *t)), bandwidths.get(t)) else { continue };
        let best = rounds.iter().copied().fold(0.0, f64::max);
        let roofline = best * 1e3 / mb.max(f64::MIN_POSITIVE);
        let decode = median(runs.iter().map(|r| r.2).collect());
        let per_round: Vec<f64> = runs
            .iter()
            .filter_map(|&(round, _, d)| rounds.get(round - 1).map(|bw| 100.0 * d * mb / (bw * 1e3)))
            .collect();
        println!(
            "  threads={t} {name:>9}: decode {decode:.2} tok/s = {:.0}% of the roofline at the run's best read bandwidth \
             ({best:.2} GB/s / {mb:.0} MB = {roofline:.2} tok/s); per round {:.0}% ({})",
            100.0 * decode / roofline,
            median(per_round.clone()),
            per_round.iter().map(|f| format!("{f:.0}%")).collect::<Vec<_>>().join(", ")
        );
    }
}

/// The W4A16KV8 export of `model` (RTN weights; activation ranges from one random sequence).
fn quantize(model: &Path, out: &Path, context: usize) -> Result<()> {
    let hf = models::hf::HfConfig::from_dir(model)?;
    let mut rng = SplitMix64::new(11);
    let ids: Vec<i64> = (0..64).map(|_| (rng.next() % hf.vocab_size as u64) as i64).collect();
    aot::quantize(&aot::QuantizeOptions {
        max_positions: context.max(1024),
        ..aot::QuantizeOptions::new(model, vec![ids], out)
    })?;
    Ok(())
}

/// llama.cpp's prefill and decode tok/s on `gguf` (one `llama-bench` repetition).
fn llama_bench(bench: &Path, gguf: &Path, args: &Args, threads: usize) -> Result<(f64, f64)> {
    let out = Command::new(bench)
        .args(["-m", &gguf.to_string_lossy(), "-p", &args.prompt.to_string(), "-n", &args.new.to_string()])
        .args(["-t", &threads.to_string(), "-r", "1", "-o", "json"])
        .output()
        .with_context(|| format!("running {}", bench.display()))?;
    ensure!(out.status.success(), "{} failed: {}", bench.display(), String::from_utf8_lossy(&out.stderr));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout)
        .with_context(|| format!("{} printed no JSON: {}", bench.display(), String::from_utf8_lossy(&out.stdout)))?;
    let rows = json.as_array().context("llama-bench JSON is not an array")?;
    let rate = |prompt: bool| -> Result<f64> {
        rows.iter()
            .find(|r| (r["n_prompt"].as_u64().unwrap_or(0) > 0) == prompt)
            .and_then(|r| r["avg_ts"].as_f64())
            .with_context(|| {
                format!("llama-bench JSON has no {} row with avg_ts", if prompt { "prompt" } else { "generation" })
            })
    };
    Ok((rate(true)?, rate(false)?))
}

/// candle's prefill and decode tok/s on the float checkpoint `model` (one `candle-peer` run, its
/// rayon pool sized to `threads`).
fn candle_peer(exe: &Path, model: &Path, args: &Args, threads: usize) -> Result<(f64, f64)> {
    let out = Command::new(exe)
        .arg(model)
        .args([args.prompt.to_string(), args.new.to_string()])
        .env("RAYON_NUM_THREADS", threads.to_string())
        .output()
        .with_context(|| format!("running {}", exe.display()))?;
    ensure!(out.status.success(), "{} failed: {}", exe.display(), String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().find(|l| l.contains("prefill_tok_s=")).unwrap_or_default();
    match (field(line, "prefill_tok_s"), field(line, "decode_tok_s")) {
        (Some(p), Some(d)) => Ok((p, d)),
        _ => bail!("{} printed no prefill_tok_s=.. decode_tok_s=.. line: {text}", exe.display()),
    }
}

/// One configuration, measured in this process.
fn child(args: &Args, dir: &Path, variant: Variant, threads: usize) -> Result<()> {
    backend_cpu::kernels::set_num_threads(threads)?;
    let bandwidth: f64 = std::env::var(BANDWIDTH_ENV)
        .ok()
        .and_then(|v| v.parse().ok())
        .with_context(|| format!("{BANDWIDTH_ENV} (GB/s) is not set"))?;
    let bandwidth = bandwidth * 1e9;
    let start = Instant::now();
    let weights = if variant == Variant::F32 { QuantizedWeights::F32 } else { QuantizedWeights::Packed };
    let loaded = match variant {
        Variant::Bf16Products => load_float_with(dir, args.context, Bf16Products::Bf16)?,
        _ => load_model_with(dir, args.context, RunMode::Auto, weights)?,
    };
    ensure!(
        loaded.fake_quant != variant.float(),
        "{}: variant {} needs a {} checkpoint",
        dir.display(),
        variant.name(),
        if variant.float() { "float" } else { "quantized" }
    );
    let load_s = start.elapsed().as_secs_f64();
    let rss_loaded = rss_bytes()?;
    let matrix_bytes = loaded.matrix_bytes;
    let vocab = loaded.config.vocab_size;
    let config = GenerationConfig {
        max_new_tokens: args.new,
        prefill_chunk: args.chunk,
        sampling: Sampling::Greedy,
        eos_ids: Vec::new(),
        collect_prompt_logits: false,
    };
    let mut rng = SplitMix64::new(7);
    let prompt: Vec<u32> = (0..args.prompt).map(|_| (rng.next() % vocab as u64) as u32).collect();
    let run = Run { args, variant, threads, bandwidth, matrix_bytes, load_s, rss_loaded, prompt, config };
    match (variant, args.int4_kv.as_str(), loaded.kv8_grids) {
        (Variant::Int4, "u8", Some(grids)) => run.measure(loaded.model.into_kv8(grids)?),
        (Variant::Int4, "u8", None) => bail!("{}: no 8-bit K/V QDQ points for an 8-bit KV cache", dir.display()),
        _ => run.measure(loaded.model),
    }
}

/// One model child's measurement: the generations after loading.
struct Run<'a> {
    args: &'a Args,
    variant: Variant,
    threads: usize,
    /// Read bandwidth, bytes/s.
    bandwidth: f64,
    matrix_bytes: usize,
    load_s: f64,
    rss_loaded: u64,
    prompt: Vec<u32>,
    config: GenerationConfig,
}

impl Run<'_> {
    fn measure<M: ChunkModel>(self, model: M) -> Result<()> {
        let Run { args, variant, threads, bandwidth, matrix_bytes, load_s, rss_loaded, prompt, config } = self;
        let mut generator = Generator::new(model)?;
        let roofline = bandwidth / matrix_bytes.max(1) as f64;
        // Decimal megabytes, as the bandwidth's GB/s: the parent divides one by the other.
        let mb = |b: f64| b / 1e6;
        for _ in 0..args.warmup {
            generator.generate(&prompt, &config)?;
        }
        // With --paired, a generation with the setting (`None` without the flag).
        let with_setting = |generator: &mut Generator<M>| -> Result<Option<GenerationTimings>> {
            let Some(s) = &args.paired else { return Ok(None) };
            backend_cpu::knobs::set(&s.name, Some(&s.value))?;
            let out = generator.generate(&prompt, &config);
            backend_cpu::knobs::set(&s.name, None)?;
            Ok(Some(out?.timings))
        };
        for run in 1..=args.runs {
            // The setting's generation goes first in even runs, second in odd ones.
            let first = if run % 2 == 0 { with_setting(&mut generator)? } else { None };
            let out = generator.generate(&prompt, &config)?;
            let paired = match first {
                Some(timings) => Some(timings),
                None => with_setting(&mut generator)?,
            };
            let t = &out.timings;
            let decode = t.decode_tokens_per_sec();
            println!(
                "variant={} threads={threads} run={run} prefill_tok_s={:.2} decode_tok_s={decode:.2} read_gb_s={:.1} \
                 weights_mb={:.1} roofline_tok_s={roofline:.2} of_roofline={:.0}% load_s={load_s:.2} \
                 rss_after_load_mb={:.0} peak_rss_mb={:.0} huge_pages_mb={:.0}",
                variant.name(),
                t.prefill_tokens_per_sec(),
                bandwidth / 1e9,
                mb(matrix_bytes as f64),
                100.0 * decode / roofline,
                mb(rss_loaded as f64),
                mb(peak_rss_bytes()? as f64),
                mb(anon_huge_page_bytes()? as f64),
            );
            if let (Some(s), Some(p)) = (&args.paired, paired) {
                println!(
                    "paired {}={} variant={} threads={threads} run={run} prefill_tok_s={:.2} decode_tok_s={:.2} \
                     base_prefill_tok_s={:.2} base_decode_tok_s={decode:.2}",
                    s.name,
                    s.value,
                    variant.name(),
                    p.prefill_tokens_per_sec(),
                    p.decode_tokens_per_sec(),
                    t.prefill_tokens_per_sec(),
                );
            }
        }
        if profile::enabled() {
            print!("{}", profile::report());
        }
        if args.step_profile {
            let (step, p) = step_profile(&mut generator, &prompt, &config)?;
            println!(
                "step_profile variant={} threads={threads} step_ms={step:.3} forward_ms={:.3} linears_ms={:.3} \
                 linears_gb_s={:.1} attention_ms={:.3} qdq_points_ms={:.3} other_ops_ms={:.3} framework_ms={:.3} \
                 chunk_io_ms={:.3}",
                variant.name(),
                p.forward_ms,
                p.linears_ms,
                matrix_bytes as f64 / (p.linears_ms * 1e6),
                p.attention_ms,
                p.qdq_points_ms,
                p.other_ops_ms,
                p.framework_ms(),
                p.chunk_io_ms,
            );
        }
        Ok(())
    }
}

/// A decode step's time (ms, from the generation's decode rate) and where it went, over one more
/// generation of `config`, its ops timed.
fn step_profile<M: ChunkModel>(
    generator: &mut Generator<M>,
    prompt: &[u32],
    config: &GenerationConfig,
) -> Result<(f64, profile::StepProfile)> {
    ensure!(config.max_new_tokens >= 2, "--step-profile needs --new 2 or more (a decode step to time)");
    let was = profile::enabled();
    profile::reset();
    profile::set_enabled(true);
    let out = generator.generate(prompt, config);
    profile::set_enabled(was);
    let decode = out?.timings.decode_tokens_per_sec();
    let steps =
        profile::StepProfile::of(&profile::decode_table()).context("the profiled generation ran no decode step")?;
    Ok((1e3 / decode, steps))
}

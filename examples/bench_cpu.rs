//! CPU speed bench: Qwen3-0.6B's shapes (vocab 151936, hidden 1024, 28 layers, 16 heads, 8 KV heads,
//! head_dim 128, intermediate 3072, tied embeddings) with random bf16 weights, run through the real
//! path (`load_float` → `CpuChunkModel` → `Generator` running `models::qwen3::Qwen3ForCausalLM`).
//!
//! ```text
//! cargo run --release --example bench_cpu [-- --threads 1,2 --runs 3]
//! ```
//!
//! The synthetic checkpoint (~1.2 GB, `aot::synthetic::QWEN3_0_6B`) is written into
//! `target/bench-qwen3-0.6b/` and reused when present. Each
//! thread count then runs in a fresh child process (this executable re-run with
//! `MLLM_BENCH_CPU_CHILD` set), so load time and peak RSS (`VmHWM`) belong to one configuration.
//! A child loads the model, then generates `--new` tokens after a `--prompt`-token random prompt
//! (greedy, no EOS), `--runs` times. Prefill tok/s is prompt tokens / prefill time (chunks of
//! `--chunk`); decode tok/s is decode steps / decode time (the first new token comes from the
//! prefill logits, so `new - 1` steps), both as the runtime's `GenerationTimings` report them.
//! With `MLLM_CPU_PROFILE=1` each child also prints its time per op kind.

use anyhow::{bail, Context, Result};
use aot::load_float;
use aot::synthetic::{write_qwen3, QWEN3_0_6B};
use backend_cpu::rng::SplitMix64;
use clap::Parser;
use mllm_dsl::memory::{peak_rss_bytes, rss_bytes};
use runtime::{GenerationConfig, Generator, Sampling};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

/// Set in a child process to the thread count it measures.
const CHILD_ENV: &str = "MLLM_BENCH_CPU_CHILD";

#[derive(Parser, Debug, Clone)]
#[command(about = "Prefill/decode speed, load time and peak RSS of Qwen3-0.6B shapes on the CPU")]
struct Args {
    /// Checkpoint directory (written when it holds no config.json yet).
    #[arg(long)]
    dir: Option<PathBuf>,
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
    /// Rewrite the checkpoint even if present.
    #[arg(long)]
    regenerate: bool,
}

fn main() -> Result<()> {
    let args = Args::parse();
    let dir = args.dir.clone().unwrap_or_else(|| aot::default_out_dir("bench-qwen3-0.6b"));
    if let Ok(threads) = std::env::var(CHILD_ENV) {
        let threads: usize = threads.parse().with_context(|| format!("{CHILD_ENV}={threads} is not a number"))?;
        return child(&args, &dir, threads);
    }
    if args.regenerate || !dir.join("config.json").is_file() {
        let start = Instant::now();
        write_qwen3(&dir, &QWEN3_0_6B, QWEN3_0_6B.layers)?;
        println!("wrote {} in {:.1} s", dir.display(), start.elapsed().as_secs_f64());
    }
    println!(
        "Qwen3-0.6B shapes, random bf16 weights; prompt {} (chunk {}), {} new tokens, context {}",
        args.prompt, args.chunk, args.new, args.context
    );
    let exe = std::env::current_exe().context("locating this executable")?;
    for &threads in &args.threads {
        let out = Command::new(&exe)
            .args(std::env::args_os().skip(1))
            .env(CHILD_ENV, threads.to_string())
            .output()
            .with_context(|| format!("running {}", exe.display()))?;
        print!("{}", String::from_utf8_lossy(&out.stdout));
        if !out.status.success() {
            bail!("the {threads}-thread run failed: {}", String::from_utf8_lossy(&out.stderr));
        }
    }
    Ok(())
}

/// One configuration, measured in this process.
fn child(args: &Args, dir: &Path, threads: usize) -> Result<()> {
    backend_cpu::kernels::set_num_threads(threads)?;
    let start = Instant::now();
    let loaded = load_float(dir, args.context)?;
    let load_s = start.elapsed().as_secs_f64();
    let rss_loaded = rss_bytes()?;
    let config = GenerationConfig {
        max_new_tokens: args.new,
        prefill_chunk: args.chunk,
        sampling: Sampling::Greedy,
        eos_ids: Vec::new(),
        collect_prompt_logits: false,
    };
    let mut rng = SplitMix64::new(7);
    let prompt: Vec<u32> = (0..args.prompt).map(|_| (rng.next() % QWEN3_0_6B.vocab as u64) as u32).collect();
    let mut generator = Generator::new(loaded.model)?;
    for run in 1..=args.runs {
        let out = generator.generate(&prompt, &config)?;
        let t = &out.timings;
        println!(
            "threads={threads} run={run} prefill_tok_s={:.2} decode_tok_s={:.2} load_s={load_s:.2} \
             rss_after_load_mb={:.0} peak_rss_mb={:.0}",
            t.prefill_tokens_per_sec(),
            t.decode_tokens_per_sec(),
            rss_loaded as f64 / (1 << 20) as f64,
            peak_rss_bytes()? as f64 / (1 << 20) as f64,
        );
    }
    if backend_cpu::executor::profile::enabled() {
        print!("{}", backend_cpu::executor::profile::report());
    }
    Ok(())
}

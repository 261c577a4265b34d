//! QNN compile bench: a Qwen3-1.7B-shaped checkpoint (random weights, tied embeddings, 28
//! layers, hidden 2048, intermediate 6144, 16/8 heads, head_dim 128, vocab 151936) compiled for
//! SM8650 / V75 into one real HTP context binary with graphs `model.0.s32` and `model.0.s1`
//! (context 1024), printing wall time and peak RSS of every step (trace, passes, lower,
//! validate, conversion, the backend's add-nodes / finalize / serialize, writing the binary),
//! our share of the total (target <= 10 %) and peak RSS against the static weight bytes
//! (target <= 2x).
//!
//! ```text
//! scripts/fetch-qnn-sdk && cargo run --release -p mllm-examples --example bench_context [-- --layers 28] [--dir DIR]
//! ```
//! The synthetic checkpoint and its quantized form are made once into `--dir` (default
//! `target/bench-context`) and reused; `--layers N` compiles fewer layers where memory is short.
//! The work is `aot::context_bench`'s.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{ensure, Context, Result};
use aot::context_bench::{is_prepared, prepare_checkpoint, run, BenchOptions};
use aot::shard::{ShardCount, DEFAULT_MAX_CONTEXT_BYTES};
use aot::shard_bench::{run_sharded, ShardBenchOptions};
use aot::synthetic::shape_by_name;
use clap::Parser;

#[derive(Parser, Debug)]
struct Args {
    /// Work directory (synthetic checkpoints, kept for the next run, and context.bin).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// The model's shapes: 0.6b, 1.7b, 4b or 8b (Qwen3).
    #[arg(long, default_value = "1.7b")]
    shape: String,
    /// Decoder layers to compile (default: the shape's own count).
    #[arg(long)]
    layers: Option<usize>,
    /// Sharded context binaries, each built in a child process: a count or auto (the smallest
    /// count within --max-context-bytes and the memory budget). Without it: one binary built in
    /// this process, step by step.
    #[arg(long)]
    shards: Option<ShardCount>,
    /// Shard builds at once (default: what the memory budget allows, at most the cores).
    #[arg(long)]
    jobs: Option<usize>,
    /// Static bytes one shard's binary may hold.
    #[arg(long, default_value_t = DEFAULT_MAX_CONTEXT_BYTES)]
    max_context_bytes: u64,
    /// Memory budget of all shard builds at once, bytes (default: the available RAM, at most
    /// twice the model's static bytes).
    #[arg(long)]
    max_memory: Option<u64>,
    /// Build the unshared binary (the one the x86 emulation loads) instead of the weight-shared one.
    #[arg(long)]
    no_weight_sharing: bool,
    /// The graphs' FINALIZE_OPTIMIZATION_FLAG (default: mllm's 3).
    #[arg(long)]
    optimization_level: Option<u32>,
    /// CPU threads for the setup's calibration (0: all cores).
    #[arg(long, default_value_t = 0)]
    threads: usize,
    /// Only make the synthetic checkpoints (the bench runs this in a child process, so that the
    /// setup's memory stays out of the figures).
    #[arg(long, hide = true)]
    prepare_only: bool,
}

fn main() -> Result<()> {
    // A shard build child (`--build-shard JOB`) runs its job and exits here.
    aot::shard_build::child_main_if_requested();
    bench(Args::parse()).map_err(mllm_examples::with_flag_names)
}

fn bench(args: Args) -> Result<()> {
    let shape =
        shape_by_name(&args.shape).with_context(|| format!("--shape {}: expected 0.6b, 1.7b, 4b or 8b", args.shape))?;
    let layers = args.layers.unwrap_or(shape.layers);
    backend_cpu::kernels::set_num_threads(args.threads)?;
    let dir = args.dir.clone().unwrap_or_else(|| aot::default_out_dir("bench-context"));
    let opts = BenchOptions {
        weight_sharing: !args.no_weight_sharing,
        optimization_level: args.optimization_level,
        shape,
        ..BenchOptions::new(&dir, layers)
    };
    if args.prepare_only {
        prepare_checkpoint(&opts)?;
        return Ok(());
    }
    if !is_prepared(&opts) {
        println!("preparing the synthetic checkpoint in {} (once) ...", dir.display());
        let status = Command::new(std::env::current_exe()?)
            .args(["--prepare-only", "--shape", &args.shape, "--layers", &layers.to_string()])
            .args(["--threads", &args.threads.to_string()])
            .arg("--dir")
            .arg(&dir)
            .status()?;
        ensure!(status.success(), "preparing the synthetic checkpoint failed ({status})");
    }
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load = load.split_whitespace().take(3).collect::<Vec<_>>().join(" ");
    if let Some(shards) = args.shards {
        let sharded = ShardBenchOptions {
            shards,
            jobs: args.jobs,
            max_context_bytes: args.max_context_bytes,
            max_memory: args.max_memory,
            ..ShardBenchOptions::new(opts.clone())
        };
        let exe = std::env::current_exe()?;
        let bench = run_sharded(&sharded, &exe, &mut |line| println!("{line}"))?;
        println!(
            "graphs model.<i>.s32 + model.<i>.s1 per shard, context 1024, weight sharing {}; load average at start {load}",
            if opts.weight_sharing { "on" } else { "off" }
        );
        print!("{}", bench.summary());
        return Ok(());
    }
    let bench = run(&opts)?;
    println!(
        "{} shapes, {} of {} layers, graphs model.0.s32 + model.0.s1, context 1024, weight sharing {}, O={}",
        shape.name,
        bench.layers,
        shape.layers,
        if opts.weight_sharing { "on" } else { "off" },
        opts.optimization_level.map_or("3 (default)".to_string(), |o| o.to_string())
    );
    println!("machine load average: {load}");
    print!("{}", bench.summary());
    Ok(())
}

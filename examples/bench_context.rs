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

use anyhow::{ensure, Result};
use aot::context_bench::{is_prepared, prepare_checkpoint, run, BenchOptions};
use aot::synthetic::QWEN3_1_7B;
use clap::Parser;

#[derive(Parser, Debug)]
struct Args {
    /// Work directory (synthetic checkpoints, kept for the next run, and context.bin).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Decoder layers to compile.
    #[arg(long, default_value_t = QWEN3_1_7B.layers)]
    layers: usize,
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
    let args = Args::parse();
    backend_cpu::kernels::set_num_threads(args.threads)?;
    let dir = args.dir.clone().unwrap_or_else(|| aot::default_out_dir("bench-context"));
    let opts = BenchOptions {
        weight_sharing: !args.no_weight_sharing,
        optimization_level: args.optimization_level,
        ..BenchOptions::new(&dir, args.layers)
    };
    if args.prepare_only {
        prepare_checkpoint(&opts)?;
        return Ok(());
    }
    if !is_prepared(&opts) {
        println!("preparing the synthetic checkpoint in {} (once) ...", dir.display());
        let status = Command::new(std::env::current_exe()?)
            .args(["--prepare-only", "--layers", &args.layers.to_string(), "--threads", &args.threads.to_string()])
            .arg("--dir")
            .arg(&dir)
            .status()?;
        ensure!(status.success(), "preparing the synthetic checkpoint failed ({status})");
    }
    let bench = run(&opts)?;
    println!(
        "{} shapes, {} of {} layers, graphs model.0.s32 + model.0.s1, context 1024, weight sharing {}, O={}",
        QWEN3_1_7B.name,
        bench.layers,
        QWEN3_1_7B.layers,
        if opts.weight_sharing { "on" } else { "off" },
        opts.optimization_level.map_or("3 (default)".to_string(), |o| o.to_string())
    );
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!("machine load average: {}", load.split_whitespace().take(3).collect::<Vec<_>>().join(" "));
    print!("{}", bench.summary());
    Ok(())
}

//! Weight quantization bench: a synthetic checkpoint shaped like Qwen3-1.7B (bf16, as the HF
//! release ships, tied embeddings, 28 layers) quantized to pymllm's W4A16 format — every linear
//! to LPBQ (block 16), norms and embedding to uint16 — and written, on 2 threads.
//!
//! ```text
//! cargo run --release --example bench_quantize [-- --dir DIR] [--threads 2] [--keep]
//! ```
//! The checkpoint is generated once by project code (`aot::synthetic`) into `DIR` (default
//! `bench-quantize` in the target directory). Prints MB/s of input
//! weights (bf16 bytes read) for quantization alone and including the write, and the peak RSS
//! (`VmHWM` of `/proc/self/status`, reset after generation) against the checkpoint size. Targets:
//! >= 200 MB/s, peak RSS <= 1.5x the checkpoint.

use mllm_examples as _; // the allocator every main runs with (lib.rs)
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result};
use aot::synthetic::QWEN3_1_7B;
use aot::trace_model;
use backend_cpu::quant::{plan_export, quantize_weights, write_quantized_checkpoint, QdqParams};
use checkpoint::SafetensorsCheckpoint;
use clap::Parser;
use compiler::aot_config::AotConfig;
use mllm_dsl::memory::{peak_rss_bytes, reset_peak_rss};
use mllm_dsl::ParamFormat;
use models::hf::HfConfig;

#[derive(Parser, Debug)]
struct Args {
    /// Where the synthetic checkpoint and the quantized output go.
    #[arg(long)]
    dir: Option<PathBuf>,
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Keep the quantized output (it is deleted by default; the synthetic input is always kept).
    #[arg(long)]
    keep: bool,
}

fn main() -> Result<()> {
    let args = Args::parse();
    let base = args.dir.clone().unwrap_or_else(|| aot::default_out_dir("bench-quantize"));
    let input = base.join("qwen3-1.7b-synthetic-bf16");
    let output = base.join("qwen3-1.7b-synthetic-w4a16");
    if !input.join("config.json").is_file() {
        let start = Instant::now();
        println!("generating the synthetic checkpoint in {} ...", input.display());
        aot::synthetic::write_qwen3(&input, &QWEN3_1_7B, QWEN3_1_7B.layers)?;
        println!("generated in {:.1} s", start.elapsed().as_secs_f64());
    }
    // Generation (or nothing) so far; measure the quantization from here.
    let reset = reset_peak_rss().is_ok();
    backend_cpu::kernels::set_num_threads(args.threads)?;

    let hf = HfConfig::from_dir(&input)?;
    let source = SafetensorsCheckpoint::open(&input)?;
    let checkpoint_bytes: u64 = source.files().map(|f| std::fs::metadata(f).map(|m| m.len()).unwrap_or(0)).sum();
    let program = trace_model(&hf, 1024, ParamFormat::QnnW4A16)?;
    let plan = plan_export(&program, &AotConfig::w4a16_kv8(), hf.linear_block_size)?;

    let (start, cpu_start) = (Instant::now(), cpu_seconds());
    let weights = quantize_weights(&plan, &source, hf.tie_word_embeddings, &|_, _, _| {})
        .context("quantizing the synthetic checkpoint")?;
    let (quant_s, quant_cpu) = (start.elapsed().as_secs_f64(), cpu_seconds() - cpu_start);
    write_quantized_checkpoint(&output, &hf.source, plan.block_size, &weights.tensors, &QdqParams::new())?;
    let (total_s, total_cpu) = (start.elapsed().as_secs_f64(), cpu_seconds() - cpu_start);
    let out_bytes: usize = weights.tensors.iter().map(|t| t.data.bytes().len()).sum();
    let (read_thread_s, quant_thread_s) = (weights.read_seconds, weights.quantize_seconds);
    drop(weights);

    let mb = |b: u64| b as f64 / 1e6;
    let hwm = peak_rss_bytes()?;
    println!(
        "input: {:.1} MB of bf16 weights ({} tensors read), checkpoint {:.1} MB; output {:.1} MB; {} threads",
        mb(source_bytes(&source)),
        plan.params.len(),
        mb(checkpoint_bytes),
        mb(out_bytes as u64),
        args.threads
    );
    let input_mb = mb(source_bytes(&source));
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!("machine load average: {}", load.split_whitespace().take(3).collect::<Vec<_>>().join(" "));
    println!(
        "quantize: {quant_s:.2} s wall = {:.0} MB/s of input weights; CPU {quant_cpu:.2} s (read+convert {:.2} s, \
         quantize {:.2} s thread time) = {:.0} MB/s with {} busy cores",
        input_mb / quant_s,
        read_thread_s,
        quant_thread_s,
        input_mb / (quant_cpu / args.threads as f64),
        args.threads
    );
    println!(
        "quantize + write: {total_s:.2} s wall = {:.0} MB/s of input weights; CPU {total_cpu:.2} s = {:.0} MB/s with {} \
         busy cores",
        input_mb / total_s,
        input_mb / (total_cpu / args.threads as f64),
        args.threads
    );
    println!(
        "peak RSS (VmHWM{}): {:.1} MB = {:.2}x the checkpoint",
        if reset { ", reset after generation" } else { ", NOT reset: includes generation" },
        mb(hwm),
        hwm as f64 / checkpoint_bytes as f64
    );
    if !args.keep {
        let _ = std::fs::remove_dir_all(&output);
    }
    Ok(())
}

/// User + system CPU time of this process (`/proc/self/stat` fields 14 and 15, in USER_HZ = 100).
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the parenthesised command name, which may contain spaces.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    // Field 14 (utime) is index 11 after the state field (field 3 = index 0).
    (ticks(11) + ticks(12)) as f64 / 100.0
}

fn source_bytes(source: &SafetensorsCheckpoint) -> u64 {
    source
        .keys()
        .iter()
        .filter_map(|k| source.info(k).ok())
        .map(|(d, s)| (s.iter().product::<usize>() * d.bitsize() / 8) as u64)
        .sum()
}

//! Pass-pipeline bench: mllm's whole QNN AOT pipeline (MarkQnnGraph … TensorRenaming) on the full
//! Qwen3-1.7B config (28 layers), for both graphs mllm compiles (prefill chunk 32 and decode chunk
//! 1, context 1024), with synthetic QDQ parameters. Target: under 5 s for both, in release.
//!
//! Weights are referenced, never copied: specs keep checkpoint keys, the parameter provider only
//! describes weights. To show that memory does not follow weight size, the bench runs twice, each
//! in a fresh process (peak RSS only grows within a process): once with the real config and once
//! with twice the MLP width (1.5x the weights). Peak RSS is `VmHWM` from `/proc/self/status`.
//!
//! `cargo run --release --example bench_passes`

use compiler::aot_config::AotConfig;
use compiler::passes::{Pipeline, SyntheticParams};
use mllm_dsl::memory::peak_rss_bytes;
use mllm_dsl::prelude::*;
use mllm_dsl::{CausalLm, Program};
use mllm_examples as _; // the allocator every main runs with (lib.rs)
use models::io::trace_inputs;
use models::qwen3::Qwen3ForCausalLM;
use models::TransformerConfig;
use std::process::Command;
use std::time::Instant;

const CONTEXT: usize = 1024;
const CHUNKS: [usize; 2] = [32, 1];

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--mlp-scale") {
        let scale: usize = args.get(i + 1).and_then(|s| s.parse().ok()).unwrap_or(1);
        return run(scale);
    }
    // Each variant in its own process, so each peak RSS is its own.
    let me = std::env::current_exe()?;
    let mut peaks = Vec::new();
    for scale in [1, 2] {
        let out = Command::new(&me).args(["--mlp-scale", &scale.to_string()]).output()?;
        let text = String::from_utf8_lossy(&out.stdout);
        print!("{text}");
        if !out.status.success() {
            anyhow::bail!("variant with MLP x{scale} failed: {}", String::from_utf8_lossy(&out.stderr));
        }
        let peak = text.lines().find_map(|l| l.strip_prefix("peak RSS (VmHWM): ")).unwrap_or("?").to_string();
        let weights = text.lines().find_map(|l| l.strip_prefix("weights referenced: ")).unwrap_or("?").to_string();
        peaks.push((scale, weights, peak));
    }
    println!("\nmemory vs weight size:");
    for (scale, weights, peak) in peaks {
        println!("  MLP x{scale}: weights {weights:<32} peak RSS {peak}");
    }
    Ok(())
}

fn run(mlp_scale: usize) -> anyhow::Result<()> {
    let mut cfg = TransformerConfig::qwen3_1_7b();
    cfg.intermediate_size *= mlp_scale;
    let aot = AotConfig::w4a16_kv8();
    println!(
        "== Qwen3-1.7B config, {} layers, hidden {}, MLP {} (x{mlp_scale}), vocab {}, context {CONTEXT}",
        cfg.num_hidden_layers, cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
    );
    let mut model = Qwen3ForCausalLM::new(&cfg);
    model.declare(ParamFormat::QnnW4A16)?;
    let mut total_passes = 0.0;
    for chunk in CHUNKS {
        let start = Instant::now();
        let mut program = trace_chunk(&model, &cfg, chunk)?;
        let trace_ms = ms(start);
        let start = Instant::now();
        let params = SyntheticParams::for_program(&program, 16);
        let params_ms = ms(start);
        let report = Pipeline::qnn_aot(&aot, &params).run(&mut program)?;
        let pipeline_ms = report.total().as_secs_f64() * 1e3;
        total_passes += pipeline_ms;
        println!(
            "chunk {chunk:>2}: trace {trace_ms:.1} ms, synthetic params {params_ms:.1} ms, pipeline {pipeline_ms:.1} ms \
             ({} ops, {} values, {} specs)",
            program.linalg_ops().len(),
            program.values.len(),
            program.specs.len()
        );
        for t in &report.timings {
            println!("    {:<28} {:>8.2} ms", t.pass, t.elapsed.as_secs_f64() * 1e3);
        }
        if chunk == CHUNKS[0] {
            println!("weights referenced: {}", weight_bytes(&program));
        }
    }
    println!("all passes, both graphs: {total_passes:.1} ms (target <= 5000 ms)");
    println!("peak RSS (VmHWM): {} kB", peak_rss_bytes()? / 1024);
    Ok(())
}

fn trace_chunk(model: &Qwen3ForCausalLM, cfg: &TransformerConfig, chunk: usize) -> Result<Program> {
    let inputs = trace_inputs(cfg, chunk, CONTEXT, ParamFormat::QnnW4A16);
    trace(&inputs, |t| model.forward_graph(t))
}

/// Size of the parameters the program registers, as deployed (int4 LPBQ codes at half a byte,
/// u16 weights at two bytes), with their count.
fn weight_bytes(p: &Program) -> String {
    let (mut bytes, mut count) = (0.0f64, 0usize);
    for def in p.values.iter().filter(|d| d.symbol.is_some()) {
        let n = def.ty.numel() as f64;
        bytes += match def.ty.dtype {
            DType::I4Lpbq => n / 2.0,
            DType::U16Asym | DType::U16 => n * 2.0,
            _ => n * 4.0,
        };
        count += 1;
    }
    format!("{:.2} GB in {count} tensors", bytes / 1e9)
}

fn ms(start: Instant) -> f64 {
    start.elapsed().as_secs_f64() * 1e3
}

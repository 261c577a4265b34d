//! Trace bench: how long tracing Qwen3-1.7B (28 layers, QnnW4A16 parameters) takes, and how large the
//! recorded program is, for the two graphs mllm's QNN AOT flow compiles: prefill chunk 32 and decode
//! chunk 1, both at context 1024. Tracing needs no weights. Target: under 2 s per trace in release.
//!
//! `cargo run --release --example bench_trace`

use mllm_dsl::prelude::*;
use mllm_dsl::{CausalLm, Program};
use mllm_examples as _; // the allocator every main runs with (lib.rs)
use models::io::trace_inputs;
use models::qwen3::Qwen3ForCausalLM;
use models::TransformerConfig;
use std::time::Instant;

const CONTEXT: usize = 1024;

fn trace_chunk(model: &Qwen3ForCausalLM, cfg: &TransformerConfig, chunk: usize) -> Result<Program> {
    let inputs = trace_inputs(cfg, chunk, CONTEXT, ParamFormat::QnnW4A16);
    trace(&inputs, |t| model.forward_graph(t))
}

fn main() -> anyhow::Result<()> {
    let cfg = TransformerConfig::qwen3_1_7b();
    let start = Instant::now();
    let mut model = Qwen3ForCausalLM::new(&cfg);
    model.declare(ParamFormat::QnnW4A16)?;
    println!("build + declare Qwen3-1.7B ({} layers): {:.1} ms", cfg.num_hidden_layers, ms(start));

    for chunk in [32, 1] {
        let start = Instant::now();
        let program = trace_chunk(&model, &cfg, chunk)?;
        let trace_ms = ms(start);
        let start = Instant::now();
        let text = program.to_string();
        let print_ms = ms(start);
        println!(
            "chunk {chunk:>2} @ context {CONTEXT}: trace {trace_ms:.1} ms, {} ops, {} values, {} subgraphs; \
             print {print_ms:.1} ms, {} bytes, {} lines",
            program.linalg_ops().len(),
            program.values.len(),
            program.subgraphs().count(),
            text.len(),
            text.lines().count(),
        );
    }
    Ok(())
}

fn ms(start: Instant) -> f64 {
    start.elapsed().as_secs_f64() * 1e3
}

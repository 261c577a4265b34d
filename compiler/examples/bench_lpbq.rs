//! Throughput of LPBQ weight quantization on a Qwen3-1.7B-sized MLP weight.
//!
//! Quantizes a synthetic `[6144 x 2048]` f32 matrix (the 1.7B `up_proj` / `gate_proj` shape) with
//! block size 16, all the way to the exported HWIO nibbles and two-level scales, on rayon pools
//! of 1 and 2 threads, and prints MB/s of f32 input. Run with
//! `cargo run --release -p mllm-dsl --example bench_lpbq`.

use std::time::Instant;

use compiler::quant::lpbq::{lpbq_block_quantize, LpbqShape};

const OUT: usize = 6144;
const IN: usize = 2048;
const BLOCK: usize = 16;
const REPEATS: usize = 5;

/// Weights resembling a trained layer: small values with some larger outliers.
fn synthetic_weight() -> Vec<f32> {
    let mut state = 0x9E37_79B9u32;
    (0..OUT * IN)
        .map(|i| {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            let u = (state >> 8) as f32 / (1u32 << 24) as f32 - 0.5;
            let outlier = if i % 997 == 0 { 8.0 } else { 1.0 };
            u * 0.04 * outlier
        })
        .collect()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let weight = synthetic_weight();
    let shape = LpbqShape::new(OUT, IN, BLOCK)?;
    let megabytes = (weight.len() * std::mem::size_of::<f32>()) as f64 / 1e6;
    println!("LPBQ quantize [{OUT} x {IN}] f32 ({megabytes:.1} MB), block {BLOCK}, best of {REPEATS}");

    let mut reference = None;
    for threads in [1, 2] {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build()?;
        // Best total, and the two stages (block scales + int4 codes; scale quantization + HWIO).
        let (mut best, mut best_codes, mut best_export) = (f64::INFINITY, 0.0, 0.0);
        for _ in 0..REPEATS {
            let start = Instant::now();
            let (export, split) = pool.install(|| {
                let blocks = lpbq_block_quantize(&weight, shape)?;
                let split = start.elapsed().as_secs_f64();
                Ok::<_, compiler::quant::QuantError>((blocks.to_export(), split))
            })?;
            let total = start.elapsed().as_secs_f64();
            if total < best {
                (best, best_codes, best_export) = (total, split, total - split);
            }
            // Same output whatever the thread count.
            match &reference {
                None => reference = Some(export),
                Some(r) => assert!(*r == export, "output depends on the thread count"),
            }
        }
        println!(
            "  {threads} thread(s): {:8.1} ms  {:8.1} MB/s   (codes {:.1} ms, export {:.1} ms)",
            best * 1e3,
            megabytes / best,
            best_codes * 1e3,
            best_export * 1e3
        );
    }
    Ok(())
}

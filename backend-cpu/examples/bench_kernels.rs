//! Throughput of the linear kernels, for choosing the threading strategy and tracking regressions.
//!
//! Prints GFLOP/s (2*M*N*K per call) and the weight-streaming rate in GB/s for `linear_kn` (and
//! `linear_nk` at M = 1) with M in {1, 32, 128} and (K, N) in {(1024, 3072), (3072, 1024),
//! (1024, 2048)}, on 1 thread and on 2 threads with each strategy. Each figure is the best of
//! several timed rounds, which filters out interference from other processes.
//!
//! Calls cycle through enough copies of the weight to exceed [`STREAM_BYTES`], so the weights come
//! from DRAM as in a real decode step instead of staying in a large last-level cache.
//!
//! A second table times `linear_packed` (the path float checkpoints take: weights packed in panels,
//! bf16 kept as bf16) with the same shapes, M and thread counts; GB/s there counts the weight bytes
//! as stored (2 per bf16 value), the figure that bounds a decode step.
//!
//! A third table times the other kernels at attention / MLP sizes of a 1-2B model (prefill of
//! 128 tokens, 16 heads of 128) in GB/s of data read and written.
//!
//! Run: `cargo run --release -p backend-cpu --example bench_kernels`

use std::hint::black_box;
use std::time::{Duration, Instant};

use backend_cpu::kernels::{self, LinearStrategy, WeightLayout};

const ROUNDS: usize = 15;
/// Total size of the weight copies cycled through (larger than any last-level cache).
const STREAM_BYTES: usize = 512 << 20;
const ROUND_TIME: Duration = Duration::from_millis(30);

fn main() -> Result<(), kernels::KernelError> {
    println!(
        "{:<6} {:>4} {:>5} {:>5} {:>3} {:<12} {:>10} {:>9} {:>8}",
        "layout", "M", "K", "N", "thr", "strategy", "us/call", "GFLOP/s", "GB/s"
    );
    for &(k, n) in &[(1024usize, 3072usize), (3072, 1024), (1024, 2048)] {
        let copies = STREAM_BYTES.div_ceil(4 * k * n);
        let weights: Vec<Vec<f32>> = (0..copies).map(|c| pseudo_random(k * n, 1 + c as u64)).collect();
        let bias = pseudo_random(n, 1000);
        for &m in &[1usize, 32, 128] {
            let x = pseudo_random(m * k, 1001);
            let layouts: &[WeightLayout] =
                if m == 1 { &[WeightLayout::KN, WeightLayout::NK] } else { &[WeightLayout::KN] };
            for &layout in layouts {
                let configs = [
                    (1, LinearStrategy::Auto),
                    (2, LinearStrategy::GemmThreads),
                    (2, LinearStrategy::SplitN),
                    (2, LinearStrategy::Auto),
                ];
                for (threads, strategy) in configs {
                    kernels::set_num_threads(threads)?;
                    let mut next = 0;
                    let secs = best_time(|| {
                        next = (next + 1) % copies;
                        let w = &weights[next];
                        kernels::linear_with(layout, &x, m, k, w, n, Some(&bias), strategy)
                            .map(|out| black_box(out).len())
                    })?;
                    let flops = 2.0 * (m * n * k) as f64;
                    let bytes = 4.0 * (k * n + m * k + m * n) as f64;
                    println!(
                        "{:<6} {:>4} {:>5} {:>5} {:>3} {:<12} {:>10.1} {:>9.2} {:>8.2}",
                        format!("{layout:?}"),
                        m,
                        k,
                        n,
                        threads,
                        format!("{strategy:?}"),
                        secs * 1e6,
                        flops / secs / 1e9,
                        bytes / secs / 1e9
                    );
                }
            }
        }
    }
    bench_packed()?;
    bench_other()
}

/// Times `linear_packed` on bf16 and f32 panels, 1 and 2 threads.
fn bench_packed() -> Result<(), kernels::KernelError> {
    println!(
        "\n{:<6} {:>4} {:>5} {:>5} {:>3} {:>10} {:>9} {:>8}",
        "packed", "M", "K", "N", "thr", "us/call", "GFLOP/s", "GB/s"
    );
    for &(k, n) in &[(1024usize, 3072usize), (3072, 1024), (1024, 2048)] {
        for bf16 in [true, false] {
            let elem_bytes = if bf16 { 2 } else { 4 };
            let copies = STREAM_BYTES.div_ceil(elem_bytes * k * n);
            let weights = (0..copies)
                .map(|c| {
                    let rows = pseudo_random(k * n, 1 + c as u64);
                    if bf16 {
                        // Truncation to bf16 bit patterns: any bf16 value will do for timing.
                        let bits: Vec<u16> = rows.iter().map(|v| (v.to_bits() >> 16) as u16).collect();
                        kernels::PackedMatrix::from_rows_bf16(n, k, &bits)
                    } else {
                        kernels::PackedMatrix::from_rows_f32(n, k, &rows)
                    }
                })
                .collect::<Result<Vec<_>, _>>()?;
            let bias = pseudo_random(n, 1000);
            for &m in &[1usize, 32, 128] {
                let x = pseudo_random(m * k, 1001);
                for threads in [1, 2] {
                    kernels::set_num_threads(threads)?;
                    let mut next = 0;
                    let secs = best_time(|| {
                        next = (next + 1) % copies;
                        kernels::linear_packed(&x, m, &weights[next], Some(&bias)).map(|out| black_box(out).len())
                    })?;
                    let flops = 2.0 * (m * n * k) as f64;
                    let bytes = (elem_bytes * k * n + 4 * (m * k + m * n)) as f64;
                    println!(
                        "{:<6} {:>4} {:>5} {:>5} {:>3} {:>10.1} {:>9.2} {:>8.2}",
                        if bf16 { "bf16" } else { "f32" },
                        m,
                        k,
                        n,
                        threads,
                        secs * 1e6,
                        flops / secs / 1e9,
                        bytes / secs / 1e9
                    );
                }
            }
        }
    }
    Ok(())
}

/// One timed kernel call; returns the output length so the work cannot be optimised away.
type Case<'a> = Box<dyn Fn() -> Result<usize, kernels::KernelError> + 'a>;

/// Times the non-matmul kernels on 1 and 2 threads.
fn bench_other() -> Result<(), kernels::KernelError> {
    use kernels::{ReduceKind, UnaryOp};
    let x = pseudo_random(16 * 128 * 128, 7);
    let mlp = pseudo_random(128 * 6144, 8);
    let weight = pseudo_random(2048, 9);
    let bytes = |floats: usize| 4 * floats;
    println!();
    println!("{:<42} {:>3} {:>10} {:>8}", "kernel", "thr", "us/call", "GB/s");
    for threads in [1, 2] {
        kernels::set_num_threads(threads)?;
        let cases: Vec<(&str, usize, Case)> = vec![
            (
                "softmax [16,128,128] dim -1",
                bytes(2 * x.len()),
                Box::new(|| kernels::softmax(&x, &[16, 128, 128], -1).map(|o| o.len())),
            ),
            ("silu [128,6144]", bytes(2 * mlp.len()), Box::new(|| Ok(kernels::unary(UnaryOp::Silu, &mlp).len()))),
            (
                "mul [128,6144] x [128,6144]",
                bytes(3 * mlp.len()),
                Box::new(|| kernels::mul(&mlp, &[128, 6144], &mlp, &[128, 6144]).map(|o| o.0.len())),
            ),
            (
                "rms_norm [128,2048]",
                bytes(2 * 128 * 2048),
                Box::new(|| kernels::rms_norm(&x[..128 * 2048], &[128, 2048], &weight, 1e-6).map(|o| o.len())),
            ),
            (
                "permute [1,128,16,128] -> [1,16,128,128]",
                bytes(2 * x.len()),
                Box::new(|| kernels::permute(&x, &[1, 128, 16, 128], &[0, 2, 1, 3]).map(|o| o.0.len())),
            ),
            (
                "transpose [16,128,128] last two dims",
                bytes(2 * x.len()),
                Box::new(|| kernels::transpose(&x, &[16, 128, 128], -1, -2).map(|o| o.0.len())),
            ),
            (
                "repeat_interleave [1,8,128,128] x2 dim 1",
                bytes(3 * x.len() / 2),
                Box::new(|| {
                    kernels::repeat_interleave(&x[..8 * 128 * 128], &[1, 8, 128, 128], 1, 2).map(|o| o.0.len())
                }),
            ),
            (
                "reduce max [2048,128] dim -1",
                bytes(x.len() / 2),
                Box::new(|| {
                    kernels::reduce(&x[..2048 * 128], &[2048, 128], -1, false, ReduceKind::Max).map(|o| o.0.len())
                }),
            ),
            (
                "matmul [1,16,128,128] x [1,16,128,128]",
                bytes(3 * x.len()),
                Box::new(|| kernels::matmul(&x, &[1, 16, 128, 128], &x, &[1, 16, 128, 128]).map(|o| o.0.len())),
            ),
        ];
        for (name, moved, run) in &cases {
            let secs = best_time(|| run().map(black_box))?;
            println!("{name:<42} {threads:>3} {:>10.1} {:>8.2}", secs * 1e6, *moved as f64 / secs / 1e9);
        }
    }
    Ok(())
}

/// Seconds per call: the best mean over `ROUNDS` rounds of at least `ROUND_TIME` each.
fn best_time<T>(mut call: impl FnMut() -> Result<T, kernels::KernelError>) -> Result<f64, kernels::KernelError> {
    call()?; // warm-up: pages in the buffers and builds gemm's caches
    let mut best = f64::INFINITY;
    for _ in 0..ROUNDS {
        let start = Instant::now();
        let mut calls = 0u32;
        while start.elapsed() < ROUND_TIME {
            call()?;
            calls += 1;
        }
        best = best.min(start.elapsed().as_secs_f64() / f64::from(calls));
    }
    Ok(best)
}

/// Deterministic values in [-1, 1) (an LCG), so runs are comparable.
fn pseudo_random(len: usize, seed: u64) -> Vec<f32> {
    let mut state = seed;
    (0..len)
        .map(|_| {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

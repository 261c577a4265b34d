//! Throughput of the linear kernels, for choosing the threading strategy and tracking regressions.
//!
//! Prints GFLOP/s (2*M*N*K per call) and the weight-streaming rate in GB/s for `linear_kn` (and
//! `linear_nk` at M = 1) with M in {1, 32, 128} and (K, N) in {(1024, 3072), (3072, 1024),
//! (1024, 2048)}, on 1 thread and on 2 threads with each strategy. Each figure is the best of
//! several timed rounds, which filters out interference from other processes.
//!
//! Run: `cargo run --release -p backend-cpu --example bench_kernels`

use std::hint::black_box;
use std::time::{Duration, Instant};

use backend_cpu::kernels::{self, LinearStrategy, WeightLayout};

const ROUNDS: usize = 15;
const ROUND_TIME: Duration = Duration::from_millis(30);

fn main() -> Result<(), kernels::KernelError> {
    println!(
        "{:<6} {:>4} {:>5} {:>5} {:>3} {:<12} {:>10} {:>9} {:>8}",
        "layout", "M", "K", "N", "thr", "strategy", "us/call", "GFLOP/s", "GB/s"
    );
    for &(k, n) in &[(1024usize, 3072usize), (3072, 1024), (1024, 2048)] {
        let w = pseudo_random(k * n, 1);
        let bias = pseudo_random(n, 2);
        for &m in &[1usize, 32, 128] {
            let x = pseudo_random(m * k, 3);
            let layouts: &[WeightLayout] = if m == 1 {
                &[WeightLayout::KN, WeightLayout::NK]
            } else {
                &[WeightLayout::KN]
            };
            for &layout in layouts {
                let configs = [
                    (1, LinearStrategy::Auto),
                    (2, LinearStrategy::GemmThreads),
                    (2, LinearStrategy::SplitN),
                    (2, LinearStrategy::Auto),
                ];
                for (threads, strategy) in configs {
                    kernels::set_num_threads(threads)?;
                    let secs = best_time(|| {
                        kernels::linear_with(layout, &x, m, k, &w, n, Some(&bias), strategy)
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
    Ok(())
}

/// Seconds per call: the best mean over `ROUNDS` rounds of at least `ROUND_TIME` each.
fn best_time<T>(
    mut call: impl FnMut() -> Result<T, kernels::KernelError>,
) -> Result<f64, kernels::KernelError> {
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
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

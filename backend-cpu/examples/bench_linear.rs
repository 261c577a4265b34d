//! Throughput of the packed bf16 linear kernels alone: f32 products (`linear_packed`: weights
//! widened, activations f32) against bf16 products (`linear_packed_bf16`: activations rounded to
//! bf16, `vdpbf16ps` where the CPU has AVX-512 BF16), on Qwen3-0.6B's `gate_proj` shape
//! (`[1024 -> 3072]`) for a prefill chunk of 32 rows and a decode row, on 1 and 2 threads.
//!
//! ```text
//! cargo run --release -p backend-cpu --example bench_linear [-- --rows 32 --repeats 200 --matrices 1]
//! ```
//!
//! Each figure is the best of `--repeats` rounds, in G multiply-adds/s. A round multiplies by each
//! of `--matrices` weights in turn: with one (6 MB) the weights stay warm in the caches after the
//! first call, the kernel's own rate; with 48 (302 MB, far beyond the caches) every call fetches
//! its weights from DRAM, as a model's prefill chunk does.

use backend_cpu::kernels::{self, PackedMatrix};
use backend_cpu::rng::SplitMix64;
use std::time::Instant;

const K: usize = 1024;
const N: usize = 3072;

fn arg(name: &str, default: usize) -> Result<usize, String> {
    let args: Vec<String> = std::env::args().collect();
    match args.iter().position(|a| a == name) {
        None => Ok(default),
        Some(i) => args
            .get(i + 1)
            .and_then(|v| v.parse().ok())
            .filter(|&v| v > 0)
            .ok_or_else(|| format!("{name} needs a positive integer")),
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let rows = arg("--rows", 32)?;
    let repeats = arg("--repeats", 200)?;
    let matrices = arg("--matrices", 1)?;
    let mut rng = SplitMix64::new(0x2545_F491);
    let mut next = move || 0.5 * rng.uniform_pm1();
    let bits: Vec<u16> = (0..N * K).map(|_| (next().to_bits() >> 16) as u16).collect();
    let ws = (0..matrices).map(|_| PackedMatrix::from_rows_bf16(N, K, &bits)).collect::<Result<Vec<_>, _>>()?;
    println!("{matrices} bf16 weight(s) [{K} -> {N}], best of {repeats} rounds, G multiply-adds/s");
    for m in [rows, 1] {
        let x: Vec<f32> = (0..m * K).map(|_| next()).collect();
        for threads in [1, 2] {
            kernels::set_num_threads(threads)?;
            let rate = |bf16: bool| -> Result<f64, kernels::KernelError> {
                let mut best = f64::MAX;
                for _ in 0..repeats {
                    let start = Instant::now();
                    for w in &ws {
                        let y = if bf16 {
                            kernels::linear_packed_bf16(&x, m, w, None)?
                        } else {
                            kernels::linear_packed(&x, m, w, None)?
                        };
                        std::hint::black_box(y);
                    }
                    best = best.min(start.elapsed().as_secs_f64());
                }
                Ok((matrices * m * K * N) as f64 / best / 1e9)
            };
            let (f32_rate, bf16_rate) = (rate(false)?, rate(true)?);
            println!(
                "rows={m} threads={threads} f32_products={f32_rate:.1} bf16_products={bf16_rate:.1} ratio={:.2}",
                bf16_rate / f32_rate
            );
        }
    }
    Ok(())
}

//! Throughput of the int4 linear kernel alone against the machine's read bandwidth: LPBQ W4A16
//! weights (4-bit codes, a u8 scale per block of 16 rows and an f32 scale per column) times
//! activations on a 16-bit grid (a QDQ point's output), the product a quantized model's linears
//! run (`kernels::linear_packed_on_grid`), on Qwen3-0.6B's `gate_proj` shape (`[1024 -> 3072]`).
//! `--weights bf16` measures the float model's kernel instead: bf16 weights times f32 activations
//! with f32 products (`kernels::linear_packed`, the `bf16` variant of `bench_cpu`).
//!
//! ```text
//! cargo run --release --example bench_int4 [-- --matrices 200 --repeats 5 --threads 1,2 --weights bf16]
//! ```
//!
//! A round multiplies one decode row by each of `--matrices` weights in turn (200: 359 MB, far
//! beyond the caches, so every call streams its weights from DRAM, as a decode step does), then a
//! prefill chunk of 32 rows by each. Before each round a read-bandwidth pass of the same threads
//! runs ([`membw`]), so each kernel figure has its roofline from the same moment; the best of
//! `--repeats` rounds is printed: the decode row as GB/s of weight bytes and as a fraction of the
//! bandwidth, the chunk in G multiply-adds/s. Each round's pair is printed too: the host's
//! bandwidth can move between rounds, and a round's kernel figure goes with its own pass.
//!
//! `--layers N` times a decode step's linears of SmolLM2-135M's shapes over N layers instead,
//! each linear a job of its own against the linears that share an input run as one job
//! (`kernels::linears_packed_on_grid`, what the executor does for q/k/v and gate/up), the two
//! forms alternating each round; it prints the median step of each and their ratio per round.

mod membw;

use anyhow::{ensure, Result};
use backend_cpu::kernels::{self, Grid, Int4Packer, PackedMatrix};
use backend_cpu::rng::SplitMix64;
use clap::Parser;
use mllm_examples as _; // the allocator every main runs with (lib.rs)
use std::time::Instant;

const K: usize = 1024;
const BLOCK: usize = 16;

#[derive(Parser, Debug)]
#[command(about = "Int4 (W4A16 LPBQ) or bf16 linear kernel throughput against the read bandwidth")]
struct Args {
    /// Weight matrices multiplied in turn per round (each 1.79 MB of int4, 6.29 MB of bf16).
    #[arg(long, default_value_t = 200)]
    matrices: usize,
    /// Rounds; the best is printed.
    #[arg(long, default_value_t = 5)]
    repeats: usize,
    /// Thread counts to measure.
    #[arg(long, value_delimiter = ',', default_value = "1,2")]
    threads: Vec<usize>,
    /// Rows of the prefill chunk.
    #[arg(long, default_value_t = 32)]
    rows: usize,
    /// Output columns of each matrix (3072: `gate_proj`; 151936: Qwen3's `lm_head`).
    #[arg(long, default_value_t = 3072)]
    cols: usize,
    /// The weights' format: int4 (LPBQ, activations on a grid) or bf16 (f32 products).
    #[arg(long, value_enum, default_value_t = Weights::Int4)]
    weights: Weights,
    /// Instead: this many decoder layers of SmolLM2-135M's int4 linears, a decode row through
    /// each, as separate products and with the linears that share an input as one job
    /// (`linears_packed_on_grid`: q/k/v, gate/up), alternating `--repeats` times.
    #[arg(long)]
    layers: Option<usize>,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq)]
enum Weights {
    Int4,
    Bf16,
}

impl Weights {
    /// The format as the header line names it.
    fn label(self) -> String {
        match self {
            Weights::Int4 => format!("int4 (block {BLOCK})"),
            Weights::Bf16 => "bf16".to_string(),
        }
    }
}

fn main() -> Result<()> {
    let args = Args::parse();
    ensure!(
        args.matrices > 0 && args.repeats > 0 && args.rows > 0 && args.cols > 0 && args.cols % 32 == 0,
        "--matrices, --repeats and --rows must be positive, --cols a positive multiple of 32"
    );
    let mut rng = SplitMix64::new(0x2545_F491);
    let mut next = move || rng.next();
    if let Some(layers) = args.layers {
        return sibling_jobs(layers, &args, &mut next);
    }
    let n = args.cols;
    let matrices = (0..args.matrices)
        .map(|_| {
            if args.weights == Weights::Bf16 {
                // bf16 values in [1, 2): random mantissas, the exponent of 1.0.
                let rows: Vec<u16> = (0..K * n).map(|_| 0x3F80 | (next() & 0x7F) as u16).collect();
                return PackedMatrix::from_rows_bf16(n, K, &rows);
            }
            int4(K, n, &mut next)
        })
        .collect::<Result<Vec<PackedMatrix>, _>>()?;
    // What a decode row reads: every matrix's panels (int4: codes, block scales, column scales and
    // code sums), counted as `bench_cpu`'s roofline counts a model's matrices.
    let weight_bytes: usize = matrices.iter().map(PackedMatrix::bytes).sum();
    let (row, chunk) = (on_grid(K, &mut next), on_grid(args.rows * K, &mut next));
    println!(
        "{} {} weights [{K} -> {n}] ({:.0} MB in all), best of {} rounds",
        args.matrices,
        args.weights.label(),
        weight_bytes as f64 / 1e6,
        args.repeats
    );
    for &threads in &args.threads {
        kernels::set_num_threads(threads)?;
        let (mut decode, mut prefill, mut bandwidth) = (0.0f64, 0.0f64, 0.0f64);
        let mut fractions = Vec::new();
        for _ in 0..args.repeats {
            let read = membw::read_bandwidth(threads, 1);
            let time = |x: &[f32], m: usize| -> Result<f64> {
                let start = Instant::now();
                for w in &matrices {
                    std::hint::black_box(match args.weights {
                        Weights::Int4 => kernels::linear_packed_on_grid(x, m, w, None, Some(GRID))?,
                        Weights::Bf16 => kernels::linear_packed(x, m, w, None)?,
                    });
                }
                Ok(start.elapsed().as_secs_f64())
            };
            let row_rate = weight_bytes as f64 / time(&row, 1)?;
            let chunk_rate = (args.matrices * args.rows * K * n) as f64 / time(&chunk, args.rows)?;
            fractions.push(row_rate / read);
            println!(
                "  threads={threads} read_gb_s={:.1} decode_row_gb_s={:.1} ({:.0}%)",
                read / 1e9,
                row_rate / 1e9,
                100.0 * row_rate / read
            );
            (decode, prefill, bandwidth) = (decode.max(row_rate), prefill.max(chunk_rate), bandwidth.max(read));
        }
        fractions.sort_by(f64::total_cmp);
        println!(
            "threads={threads} decode_row_gb_s={:.1} read_gb_s={:.1} decode_of_bandwidth={:.0}% \
             (per round, median {:.0}%) chunk{}_gmac_s={:.1}",
            decode / 1e9,
            bandwidth / 1e9,
            100.0 * decode / bandwidth,
            100.0 * fractions[fractions.len() / 2],
            args.rows,
            prefill / 1e9
        );
    }
    Ok(())
}

/// Activations on a u16 grid whose values round-trip exactly (a power-of-two scale).
const GRID: Grid = Grid { scale: 1.0 / 1024.0, zero_point: 32768 };

/// `len` random activations on [`GRID`].
fn on_grid(len: usize, next: &mut dyn FnMut() -> u64) -> Vec<f32> {
    (0..len).map(|_| ((next() >> 48) as i32 - GRID.zero_point) as f32 * GRID.scale).collect()
}

/// A random LPBQ int4 `[k -> n]` matrix, blocks of [`BLOCK`] rows.
fn int4(k: usize, n: usize, next: &mut dyn FnMut() -> u64) -> Result<PackedMatrix, kernels::KernelError> {
    let mut packer = Int4Packer::new(k, n, BLOCK)?;
    let codes: Vec<u8> = (0..k * n).map(|_| (next() & 15) as u8).collect();
    packer.push(&codes)?;
    let scale1: Vec<u8> = (0..n * k / BLOCK).map(|_| 1 + (next() % 15) as u8).collect();
    let scale2: Vec<f32> = (0..n).map(|_| 1e-3 * (1 + next() % 7) as f32).collect();
    packer.finish(&scale1, &scale2)
}

/// `--layers`: a decode step's linears of SmolLM2-135M (hidden 576, 3 KV heads of 64, MLP 1536)
/// over `layers` layers, each step once as seven separate products a layer and once with q/k/v
/// and gate/up as one job each, alternating; prints each form's median step and their ratio.
fn sibling_jobs(layers: usize, args: &Args, next: &mut dyn FnMut() -> u64) -> Result<()> {
    const STEPS: usize = 20;
    let (h, kv, mlp) = (576, 192, 1536);
    let shapes = [(h, h), (h, kv), (h, kv), (h, h), (h, mlp), (h, mlp), (mlp, h)];
    let model = (0..layers)
        .map(|_| shapes.iter().map(|&(k, n)| int4(k, n, next)).collect::<Result<Vec<_>, _>>())
        .collect::<Result<Vec<_>, _>>()?;
    let bytes: usize = model.iter().flatten().map(PackedMatrix::bytes).sum();
    let (x, hidden) = (on_grid(h, next), on_grid(mlp, next));
    let input = |w: &PackedMatrix| if w.k() == h { &x } else { &hidden };
    println!(
        "{layers} layers of SmolLM2-135M's int4 linears ({:.1} MB), {STEPS} decode steps a form, {} rounds",
        bytes as f64 / 1e6,
        args.repeats
    );
    for &threads in &args.threads {
        kernels::set_num_threads(threads)?;
        let alone = || -> Result<()> {
            for w in model.iter().flatten() {
                std::hint::black_box(kernels::linear_packed_on_grid(input(w), 1, w, None, Some(GRID))?);
            }
            Ok(())
        };
        let grouped = || -> Result<()> {
            for l in &model {
                for group in [&l[0..3], &l[3..4], &l[4..6], &l[6..7]] {
                    let products: Vec<_> = group.iter().map(|w| (w, None)).collect();
                    std::hint::black_box(kernels::linears_packed_on_grid(input(&group[0]), 1, &products, Some(GRID))?);
                }
            }
            Ok(())
        };
        let (mut t_alone, mut t_grouped, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..args.repeats {
            let time = |f: &dyn Fn() -> Result<()>| -> Result<f64> {
                f()?; // warm: the read-ahead learns the order
                let start = Instant::now();
                for _ in 0..STEPS {
                    f()?;
                }
                Ok(start.elapsed().as_secs_f64() * 1e3 / STEPS as f64)
            };
            let (a, g) = (time(&alone)?, time(&grouped)?);
            t_alone.push(a);
            t_grouped.push(g);
            ratios.push(a / g);
        }
        let median = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let (a, g, r) = (median(&mut t_alone), median(&mut t_grouped), median(&mut ratios));
        println!(
            "threads={threads} step_ms separate={a:.3} ({:.1} GB/s) sibling_jobs={g:.3} ({:.1} GB/s); \
             separate / sibling jobs {r:.3}x per round (median), faster in {} of {} rounds",
            bytes as f64 / a / 1e6,
            bytes as f64 / g / 1e6,
            ratios.iter().filter(|&&q| q > 1.0).count(),
            ratios.len()
        );
    }
    Ok(())
}

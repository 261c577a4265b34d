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
    let n = args.cols;
    let mut rng = SplitMix64::new(0x2545_F491);
    let mut next = move || rng.next();
    let matrices = (0..args.matrices)
        .map(|_| {
            if args.weights == Weights::Bf16 {
                // bf16 values in [1, 2): random mantissas, the exponent of 1.0.
                let rows: Vec<u16> = (0..K * n).map(|_| 0x3F80 | (next() & 0x7F) as u16).collect();
                return PackedMatrix::from_rows_bf16(n, K, &rows);
            }
            let mut packer = Int4Packer::new(K, n, BLOCK)?;
            let codes: Vec<u8> = (0..K * n).map(|_| (next() & 15) as u8).collect();
            packer.push(&codes)?;
            let scale1: Vec<u8> = (0..n * K / BLOCK).map(|_| 1 + (next() % 15) as u8).collect();
            let scale2: Vec<f32> = (0..n).map(|_| 1e-3 * (1 + next() % 7) as f32).collect();
            packer.finish(&scale1, &scale2)
        })
        .collect::<Result<Vec<PackedMatrix>, _>>()?;
    // What a decode row reads: every matrix's panels (int4: codes, block scales, column scales and
    // code sums), counted as `bench_cpu`'s roofline counts a model's matrices.
    let weight_bytes: usize = matrices.iter().map(PackedMatrix::bytes).sum();
    // Activations on a u16 grid whose values round-trip exactly (a power-of-two scale).
    let grid = Grid { scale: 1.0 / 1024.0, zero_point: 32768 };
    let on_grid = |m: usize, next: &mut dyn FnMut() -> u64| -> Vec<f32> {
        (0..m * K).map(|_| ((next() >> 48) as i32 - grid.zero_point) as f32 * grid.scale).collect()
    };
    let (row, chunk) = (on_grid(1, &mut next), on_grid(args.rows, &mut next));
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
                        Weights::Int4 => kernels::linear_packed_on_grid(x, m, w, None, Some(grid))?,
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

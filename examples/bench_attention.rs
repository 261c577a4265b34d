//! Time of a decode step's attention products over an 8-bit KV cache, the `MatMul (1 row)` of an
//! int4 model's profile: scores `q @ K^T` and outputs `p @ V` (`kernels::matmul_parts`: the
//! cache's codes as the past part, the new token's K/V as an f32 part, query heads grouped by
//! their KV head), on Qwen3-0.6B's attention shapes by default (8 KV heads, 2 query heads each,
//! head dim 128, rows `context - 1` apart as the cache holds them).
//!
//! ```text
//! cargo run --release --example bench_attention [-- --threads 1,2 --past 31,159,511 --layers 1,28]
//! ```
//!
//! `--layers 1` multiplies the same cache every call, so it stays in the caches and the figure is
//! the arithmetic's; `--layers 28` cycles through one cache per layer, as a step does. The past
//! holds codes (`u8`, how the CPU keeps a quantized model's cache) or, with `--values`, their f32
//! values. Each line gives microseconds per product and its multiply-adds per second.

use anyhow::{ensure, Result};
use backend_cpu::kernels::{self, BatchRepeat, Grid, JoinAxis, PartData, RhsPart, RhsParts};
use backend_cpu::rng::SplitMix64;
use clap::Parser;
use mllm_examples as _; // the allocator every main runs with (lib.rs)
use std::time::Instant;

#[derive(Parser, Debug)]
#[command(about = "Decode-step attention products over an 8-bit KV cache")]
struct Args {
    /// Thread counts to measure.
    #[arg(long, value_delimiter = ',', default_value = "1,2")]
    threads: Vec<usize>,
    /// Past positions (the cache's filled columns).
    #[arg(long, value_delimiter = ',', default_value = "31,159,511")]
    past: Vec<usize>,
    /// Distinct caches cycled through (1: one cache, kept in the CPU caches).
    #[arg(long, value_delimiter = ',', default_value = "1,28")]
    layers: Vec<usize>,
    /// KV heads.
    #[arg(long, default_value_t = 8)]
    kv_heads: usize,
    /// Query heads per KV head.
    #[arg(long, default_value_t = 2)]
    group: usize,
    /// Head dim.
    #[arg(long, default_value_t = 128)]
    head_dim: usize,
    /// Context the cache is laid out for (rows are `context - 1` positions apart).
    #[arg(long, default_value_t = 1024)]
    context: usize,
    /// Products per figure.
    #[arg(long, default_value_t = 2000)]
    calls: usize,
    /// Keep the past as f32 values instead of codes.
    #[arg(long)]
    values: bool,
}

/// One layer's past K `[Hkv, D, stride]` or V `[Hkv, stride, D]`: codes, or their values.
enum Past {
    Codes(Vec<u8>),
    Values(Vec<f32>),
}

impl Past {
    fn data(&self) -> PartData<'_> {
        match self {
            Past::Codes(codes) => PartData::U8 { codes, grid: GRID },
            Past::Values(values) => PartData::F32(values),
        }
    }
}

const GRID: Grid = Grid { scale: 0.02, zero_point: 128 };

fn main() -> Result<()> {
    let a = Args::parse();
    let (h, g, d) = (a.kv_heads, a.group, a.head_dim);
    let stride = a.context.saturating_sub(1);
    ensure!(h > 0 && g > 0 && d > 0 && a.calls > 0, "--kv-heads, --group, --head-dim and --calls must be positive");
    ensure!(a.past.iter().all(|&p| p < stride), "every --past must be below --context - 1 ({stride})");
    ensure!(a.layers.iter().all(|&l| l > 0), "--layers must be positive");
    let mut rng = SplitMix64::new(0x5EED);
    let mut codes = |n: usize| -> Vec<u8> { (0..n).map(|_| (rng.next() >> 56) as u8).collect() };
    let mut past = |n: usize| -> Past {
        let codes = codes(n);
        match a.values {
            false => Past::Codes(codes),
            true => Past::Values(codes.iter().map(|&u| kernels::decode_u8(u, GRID)).collect()),
        }
    };
    let most = a.layers.iter().copied().max().unwrap_or(1);
    // Each layer's (K, V).
    let layers: Vec<(Past, Past)> = (0..most).map(|_| (past(h * d * stride), past(h * stride * d))).collect();
    let mut rng = SplitMix64::new(0xA77E);
    let mut floats =
        |n: usize| -> Vec<f32> { (0..n).map(|_| (rng.next() >> 40) as f32 / (1u64 << 24) as f32 - 0.5).collect() };
    let (new_k, new_v, query) = (floats(h * d), floats(h * d), floats(h * g * d));
    let batches = BatchRepeat { outer: 1, size: h, times: g, inner: 1 };
    println!(
        "{h} KV heads x {g} query heads, head dim {d}, rows {stride} apart; past as {}",
        if a.values { "f32 values" } else { "u8 codes" }
    );
    for &threads in &a.threads {
        kernels::set_num_threads(threads)?;
        for &past in &a.past {
            let probs = floats(h * g * (past + 1));
            for &cycled in &a.layers {
                let mut figures = Vec::new();
                for axis in [JoinAxis::N, JoinAxis::K] {
                    let start = Instant::now();
                    for call in 0..a.calls {
                        let (keys, values) = &layers[call % cycled];
                        // Scores: K^T `[D, past + 1]` joined along N; outputs: V `[past + 1, D]`
                        // joined along K.
                        let (lhs, k, n, row_stride, batch_stride, new_row_stride) = match axis {
                            JoinAxis::N => (&query, d, past + 1, stride, d * stride, 1),
                            JoinAxis::K => (&probs, past + 1, d, d, stride * d, d),
                        };
                        let (data, new) =
                            if axis == JoinAxis::N { (keys.data(), &new_k) } else { (values.data(), &new_v) };
                        let parts = vec![
                            RhsPart { data, extent: past, batch_stride, row_stride },
                            RhsPart {
                                data: PartData::F32(new),
                                extent: 1,
                                batch_stride: d,
                                row_stride: new_row_stride,
                            },
                        ];
                        let out = kernels::matmul_parts(lhs, 1, &RhsParts { parts, axis, k, n, batches })?;
                        std::hint::black_box(out);
                    }
                    let us = start.elapsed().as_secs_f64() * 1e6 / a.calls as f64;
                    let macs = (h * g * d * (past + 1)) as f64;
                    figures.push(format!(
                        "{} {us:7.2} us ({:5.1} G multiply-adds/s)",
                        axis_name(axis),
                        macs / us / 1e3
                    ));
                }
                println!("threads={threads} past={past:<4} layers={cycled:<3} {}", figures.join("  "));
            }
        }
    }
    Ok(())
}

fn axis_name(axis: JoinAxis) -> &'static str {
    match axis {
        JoinAxis::N => "scores q@K^T",
        JoinAxis::K => "outputs p@V",
    }
}

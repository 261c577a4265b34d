//! Reductions over one dim (`sum`, `mean`, `max`, `min`) and the f32 summation they share with
//! softmax and RMSNorm.
//!
//! Summation order: contiguous runs are summed in f32 with eight interleaved partial sums that are
//! combined pairwise at the end, the order of torch's AVX2 `vec::reduce_all` on CPU, which keeps
//! results within an ulp or two of torch and lets the loop vectorise. Reductions over a non-last dim
//! accumulate whole rows elementwise in order. `max`/`min` propagate NaN like torch.

use super::shape::{check_len, normalize_dim, split_at_dim};
use super::threads::par_fill_rows;
use super::KernelError;

/// Below this many input elements the calling thread does the work.
const MIN_PARALLEL_LEN: usize = 1 << 16;

/// Which reduction [`reduce`] computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReduceKind {
    Min,
    Max,
    Mean,
    Sum,
}

/// Sum of `f(v)` over `x` in f32 with eight interleaved partial sums (see the module docs).
#[inline(always)]
pub(crate) fn lane_sum(x: &[f32], f: impl Fn(f32) -> f32) -> f32 {
    let mut acc = [0.0f32; 8];
    let chunks = x.chunks_exact(8);
    let tail = chunks.remainder();
    for c in chunks {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a += f(v);
        }
    }
    let mut total = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for &v in tail {
        total += f(v);
    }
    total
}

/// Maximum of `x` (NaN if any element is NaN; -inf for an empty slice), with sixteen interleaved
/// running maxima so the loop vectorises instead of waiting on one compare chain.
#[inline(always)]
pub(crate) fn lane_max(x: &[f32]) -> f32 {
    lane_fold(x, f32::NEG_INFINITY, max_nan)
}

/// Minimum of `x`, NaN-propagating like [`lane_max`]; +inf for an empty slice.
#[inline(always)]
pub(crate) fn lane_min(x: &[f32]) -> f32 {
    lane_fold(x, f32::INFINITY, min_nan)
}

#[inline(always)]
fn lane_fold(x: &[f32], init: f32, f: impl Fn(f32, f32) -> f32) -> f32 {
    let mut acc = [init; 16];
    let chunks = x.chunks_exact(16);
    let tail = chunks.remainder();
    for c in chunks {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a = f(*a, v);
        }
    }
    let folded = acc.iter().copied().fold(init, &f);
    tail.iter().copied().fold(folded, f)
}

/// NaN-propagating maximum (torch.max semantics).
#[inline(always)]
pub(crate) fn max_nan(a: f32, b: f32) -> f32 {
    if a.is_nan() || a > b {
        a
    } else {
        b
    }
}

/// NaN-propagating minimum (torch.min semantics).
#[inline(always)]
fn min_nan(a: f32, b: f32) -> f32 {
    if a.is_nan() || a < b {
        a
    } else {
        b
    }
}

/// Reduces `x` of `shape` over `dim` (negative counts from the end). With `keepdim` the reduced dim
/// stays as size 1, otherwise it is removed. `min`/`max` over an empty dim is an error; `sum` gives
/// 0 and `mean` NaN there, as in torch.
pub fn reduce(
    x: &[f32],
    shape: &[usize],
    dim: isize,
    keepdim: bool,
    kind: ReduceKind,
) -> Result<(Vec<f32>, Vec<usize>), KernelError> {
    const OP: &str = "reduce";
    check_len(OP, "x", x, shape)?;
    let d = normalize_dim(OP, dim, shape.len())?;
    let (outer, n, inner) = split_at_dim(shape, d);
    if n == 0 && matches!(kind, ReduceKind::Min | ReduceKind::Max) {
        return Err(KernelError::InvalidArgument {
            op: OP,
            reason: format!("{kind:?} over dim {d} of size 0 in shape {shape:?} has no identity"),
        });
    }
    let mut out_shape = shape.to_vec();
    if keepdim {
        out_shape[d] = 1;
    } else {
        out_shape.remove(d);
    }
    let mut out = vec![0.0f32; outer * inner];
    par_fill_rows(&mut out, inner, MIN_PARALLEL_LEN / n.max(1), |first, chunk| {
        for (r, row) in chunk.chunks_exact_mut(inner).enumerate() {
            let o = first + r;
            let block = &x[o * n * inner..(o + 1) * n * inner];
            reduce_block(block, n, inner, kind, row);
        }
    });
    Ok((out, out_shape))
}

/// Reduces one `[n, inner]` block over its first axis into `out[inner]`.
fn reduce_block(block: &[f32], n: usize, inner: usize, kind: ReduceKind, out: &mut [f32]) {
    if inner == 1 {
        out[0] = match kind {
            ReduceKind::Sum => lane_sum(block, |v| v),
            ReduceKind::Mean => lane_sum(block, |v| v) / n as f32,
            ReduceKind::Max => lane_max(block),
            ReduceKind::Min => lane_min(block),
        };
        return;
    }
    if n == 0 {
        out.fill(if kind == ReduceKind::Mean { f32::NAN } else { 0.0 });
        return;
    }
    out.copy_from_slice(&block[..inner]);
    for row in block.chunks_exact(inner).skip(1) {
        match kind {
            ReduceKind::Sum | ReduceKind::Mean => {
                for (o, &v) in out.iter_mut().zip(row) {
                    *o += v;
                }
            }
            ReduceKind::Max => {
                for (o, &v) in out.iter_mut().zip(row) {
                    *o = max_nan(*o, v);
                }
            }
            ReduceKind::Min => {
                for (o, &v) in out.iter_mut().zip(row) {
                    *o = min_nan(*o, v);
                }
            }
        }
    }
    if kind == ReduceKind::Mean {
        let scale = n as f32;
        for o in out.iter_mut() {
            *o /= scale;
        }
    }
}

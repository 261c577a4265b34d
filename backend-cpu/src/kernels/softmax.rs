//! Numerically stable softmax over one dim.
//!
//! Per slice: subtract the maximum, exponentiate (vectorised [`exp_f32`], < 1 ulp), sum in f32
//! (eight interleaved partial sums, see [`super::reduce`]) and multiply by the reciprocal of the
//! sum, which is the order torch's CPU kernel uses, so float32 results agree with torch to a few
//! ulp.

use super::math::{exp_f32, map_inplace, map_into};
use super::reduce::{lane_max, lane_sum, max_nan};
use super::shape::{check_len, normalize_dim, split_at_dim};
use super::threads::par_fill_rows;
use super::KernelError;

/// Below this many elements the calling thread does the work.
const MIN_PARALLEL_LEN: usize = 1 << 14;

/// `softmax(x, dim)`: `exp(x - max) / sum(exp(x - max))` along `dim` (negative counts from the end).
pub fn softmax(x: &[f32], shape: &[usize], dim: isize) -> Result<Vec<f32>, KernelError> {
    const OP: &str = "softmax";
    check_len(OP, "x", x, shape)?;
    let d = normalize_dim(OP, dim, shape.len())?;
    let (_, n, inner) = split_at_dim(shape, d);
    let mut out = vec![0.0f32; x.len()];
    let block = n * inner;
    par_fill_rows(&mut out, block, MIN_PARALLEL_LEN, |first, chunk| {
        for (r, dst) in chunk.chunks_exact_mut(block).enumerate() {
            let src = &x[(first + r) * block..(first + r + 1) * block];
            if inner == 1 {
                softmax_row(src, dst);
            } else {
                softmax_strided(src, n, inner, dst);
            }
        }
    });
    Ok(out)
}

/// Softmax of one contiguous row.
fn softmax_row(src: &[f32], dst: &mut [f32]) {
    let max = lane_max(src);
    map_into(dst, src, |v| exp_f32(v - max));
    let scale = 1.0 / lane_sum(dst, |v| v);
    for o in dst.iter_mut() {
        *o *= scale;
    }
}

/// Softmax over the first axis of a `[n, inner]` block, vectorised along `inner`.
fn softmax_strided(src: &[f32], n: usize, inner: usize, dst: &mut [f32]) {
    let mut max = src[..inner].to_vec();
    for row in src.chunks_exact(inner).skip(1) {
        for (m, &v) in max.iter_mut().zip(row) {
            *m = max_nan(*m, v);
        }
    }
    for (drow, srow) in dst.chunks_exact_mut(inner).zip(src.chunks_exact(inner)) {
        for ((o, &v), &m) in drow.iter_mut().zip(srow).zip(&max) {
            *o = v - m;
        }
    }
    map_inplace(dst, exp_f32);
    let mut sum = vec![0.0f32; inner];
    for drow in dst.chunks_exact(inner) {
        for (s, &e) in sum.iter_mut().zip(drow) {
            *s += e;
        }
    }
    for s in sum.iter_mut() {
        *s = 1.0 / *s;
    }
    debug_assert_eq!(dst.len(), n * inner);
    for drow in dst.chunks_exact_mut(inner) {
        for (o, &s) in drow.iter_mut().zip(&sum) {
            *o *= s;
        }
    }
}

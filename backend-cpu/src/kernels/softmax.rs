//! Numerically stable softmax over one dim.
//!
//! Per slice: subtract the maximum, exponentiate (vectorised [`exp_f32`], < 1 ulp), sum in f32
//! (eight interleaved partial sums, see [`super::reduce`]) and multiply by the reciprocal of the
//! sum, which is the order torch's CPU kernel uses, so float32 results agree with torch to a few
//! ulp.

use super::math::{exp_f32, map_inplace, map_into};
use super::qdq_points::{fake, fake_in_place, QdqPoints};
use super::reduce::{lane_max, lane_min, lane_sum, max_nan};
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
        // The rows' loops compiled again for the widest vectors (the default target has only
        // SSE2); the same operations in the same order, so the same values.
        mllm_dsl::simd::widest(
            #[inline(always)]
            || {
                for (r, dst) in chunk.chunks_exact_mut(block).enumerate() {
                    let src = &x[(first + r) * block..(first + r + 1) * block];
                    if inner == 1 {
                        softmax_row(src, dst);
                    } else {
                        softmax_strided(src, n, inner, dst);
                    }
                }
            },
        )
    });
    Ok(out)
}

/// The points of mllm's masked attention softmax, in the model's order: the scaled scores
/// (mul_0), their row minimum (reduce_min), the minimum less 20 (minus_0), the masked scores
/// (where_attn) and the probabilities (softmax_output).
pub type MaskedSoftmaxPoints<'a> = QdqPoints<'a, 5>;

/// The constants of [`masked_softmax`]: the scores' scale, the `-20` below the row minimum that
/// masked scores get, and the mask value that lets a position attend (each as its QDQ left it).
#[derive(Clone, Copy, Debug)]
pub struct MaskedSoftmaxConstants {
    pub scale: f32,
    pub below_min: f32,
    pub attend: f32,
}

/// mllm's masked softmax over rows of `t` scores, with its QDQ points `q0..q4`, in one pass per
/// row: `a = q0(scores * scale)`, `w = q3(mask == attend ? a : q2(q1(min(a)) + below_min))`,
/// `q4(softmax(w))`. Row `r` reads mask row `r % (mask.len() / t)` (scores `[.., S, T]`, mask
/// `[S, T]`). Each step is the op's own arithmetic (the same minimum, softmax and quantizers), so
/// the values equal the ops' bit for bit.
pub fn masked_softmax(
    scores: &[f32],
    t: usize,
    mask: &[f32],
    c: MaskedSoftmaxConstants,
    points: &MaskedSoftmaxPoints<'_>,
) -> Result<Vec<f32>, KernelError> {
    let mask_rows = mask.len() / t.max(1);
    if t == 0
        || !scores.len().is_multiple_of(t)
        || mask_rows == 0
        || mask.len() != mask_rows * t
        || !(scores.len() / t).is_multiple_of(mask_rows)
    {
        return Err(KernelError::InvalidArgument {
            op: "masked softmax",
            reason: format!(
                "{} scores in rows of {t} against a mask of {} values (whole rows, a row count dividing the scores')",
                scores.len(),
                mask.len()
            ),
        });
    }
    let mut out = vec![0.0f32; scores.len()];
    par_fill_rows(&mut out, t, MIN_PARALLEL_LEN, |first, chunk| {
        let mut w = vec![0.0f32; t];
        for (r, dst) in chunk.chunks_exact_mut(t).enumerate() {
            let r = first + r;
            let (src, mask) = (&scores[r * t..(r + 1) * t], &mask[(r % mask_rows) * t..(r % mask_rows + 1) * t]);
            masked_row(src, mask, c, points, &mut w, dst);
        }
    });
    Ok(out)
}

/// One row of [`masked_softmax`]: the scores `src` with their `mask` row into `dst`, `w` a
/// scratch row of the same length.
pub(super) fn masked_row(
    src: &[f32],
    mask: &[f32],
    c: MaskedSoftmaxConstants,
    points: &MaskedSoftmaxPoints<'_>,
    w: &mut [f32],
    dst: &mut [f32],
) {
    // The QDQ points' loops widened as the fake quantizer widens them; the softmax as the op runs it.
    mllm_dsl::simd::widest(
        #[inline(always)]
        || {
            w.iter_mut().zip(src).for_each(|(w, s)| *w = s * c.scale);
            fake_in_place(points[0], w);
            let masked = fake(points[2], fake(points[1], lane_min(w)) + c.below_min);
            w.iter_mut().zip(mask).for_each(|(w, &m)| *w = if m == c.attend { *w } else { masked });
            fake_in_place(points[3], w);
        },
    );
    mllm_dsl::simd::widest(
        #[inline(always)]
        || {
            softmax_row(w, dst);
            fake_in_place(points[4], dst)
        },
    );
}

/// Softmax of one contiguous row (inlined, so a caller's `simd::widest` widens its loops).
#[inline(always)]
fn softmax_row(src: &[f32], dst: &mut [f32]) {
    let max = lane_max(src);
    map_into(dst, src, |v| exp_f32(v - max));
    let scale = 1.0 / lane_sum(dst, |v| v);
    for o in dst.iter_mut() {
        *o *= scale;
    }
}

/// Softmax over the first axis of a `[n, inner]` block, vectorised along `inner`.
#[inline(always)]
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::{binary, equal, reduce, where_, BinaryOp, ReduceKind};
    use compiler::quant::{FakeQuantizer, QuantParams};

    /// The model file's ops, one kernel each, every point applied to a whole intermediate.
    fn ops(
        scores: &[f32],
        shape: &[usize],
        mask: &[f32],
        mask_shape: &[usize],
        c: MaskedSoftmaxConstants,
        q: &MaskedSoftmaxPoints<'_>,
    ) -> Vec<f32> {
        let apply = |p, v: Vec<f32>| -> Vec<f32> { v.into_iter().map(|v| fake(p, v)).collect() };
        let a = apply(q[0], binary(BinaryOp::Mul, scores, shape, &[c.scale], &[1]).unwrap().0);
        let (min, min_shape) = reduce(&a, shape, -1, true, ReduceKind::Min).unwrap();
        let vv = apply(q[2], binary(BinaryOp::Add, &apply(q[1], min), &min_shape, &[c.below_min], &[1]).unwrap().0);
        let cond = equal(mask, mask_shape, &[c.attend], &[1]).unwrap().0;
        let w = apply(q[3], where_(&cond, mask_shape, &a, shape, &vv, &min_shape).unwrap().0);
        apply(q[4], softmax(&w, shape, -1).unwrap())
    }

    #[test]
    fn masked_softmax_equals_the_ops_bit_for_bit() {
        let mut rng = crate::rng::SplitMix64::new(11);
        let quantizer =
            |scale: f32, zp: i32| FakeQuantizer::new(&QuantParams { scale, zero_point: zp, qmin: 0, qmax: 65535 });
        let qs = [
            quantizer(6e-4, 30000),
            quantizer(6e-4, 30000),
            quantizer(7e-4, 50000),
            quantizer(8e-4, 40000),
            quantizer(1.0 / 65536.0, 0),
        ];
        let c = MaskedSoftmaxConstants { scale: 0.088388, below_min: -20.0, attend: 0.0 };
        // [1, H, S, T] scores against a [1, 1, S, T] causal mask: a decode step (S = 1), a chunk,
        // and rows enough for the team.
        for (heads, s, t) in [(16, 1, 37), (4, 8, 40), (16, 32, 160)] {
            let scores: Vec<f32> = (0..heads * s * t).map(|_| rng.uniform_pm1() * 12.0).collect();
            let mask: Vec<f32> = (0..s * t).map(|i| if i % t <= t - s + i / t { 0.0 } else { -0.001 }).collect();
            let (shape, mask_shape) = ([1, heads, s, t], [1, 1, s, t]);
            // The last set leaves the probabilities unquantized, so the masked ones (about e^-20,
            // zero on the 1/65536 grid) show the points before them.
            let all = [Some(&qs[0]), Some(&qs[1]), Some(&qs[2]), Some(&qs[3]), Some(&qs[4])];
            for points in [[None; 5], all, [all[0], all[1], all[2], all[3], None]] {
                let got = masked_softmax(&scores, t, &mask, c, &points).unwrap();
                let want = ops(&scores, &shape, &mask, &mask_shape, c, &points);
                let bits = |v: &[f32]| v.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&got), bits(&want), "{heads} heads, {s} rows, {t} positions");
            }
        }
    }

    #[test]
    fn masked_softmax_shapes_that_do_not_fit_are_errors() {
        let c = MaskedSoftmaxConstants { scale: 1.0, below_min: -20.0, attend: 0.0 };
        assert!(masked_softmax(&[0.0; 12], 4, &[0.0; 6], c, &[None; 5]).is_err(), "a mask of 1.5 rows");
        assert!(masked_softmax(&[0.0; 12], 4, &[0.0; 8], c, &[None; 5]).is_err(), "3 rows against 2 mask rows");
        assert!(masked_softmax(&[0.0; 12], 0, &[], c, &[None; 5]).is_err(), "rows of nothing");
        assert!(masked_softmax(&[0.0; 12], 4, &[0.0; 4], c, &[None; 5]).is_ok());
    }
}

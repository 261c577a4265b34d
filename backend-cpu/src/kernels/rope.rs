//! RoPE's rotation with its QDQ points in one pass ([`mllm_dsl::fused::Fused::RotateHalfRope`]).
//!
//! The model file writes it as two slices, a negation, a concatenation, two products and a sum,
//! four of them quantized: in a one-token decode step that is a dozen ops on a few hundred values
//! for each of q and k in every layer. Here each output element is computed where it is written,
//! with the same f32 operations in the same order and the same fake quantizer at each point, so
//! the values are the ops' values bit for bit.

use super::qdq_points::{fake_in_place, QdqPoints};
use super::KernelError;
use std::mem::MaybeUninit;

/// The four points, in the model's order: neg_half (`-x2`), mul_0 (`x * cos`), mul_1
/// (`rotate_half(x) * sin`), add_0 (the sum).
pub type RopePoints<'a> = QdqPoints<'a, 4>;

/// Values in a block of rows (8 KiB of f32: the block's three intermediates stay in L1).
const BLOCK_VALUES: usize = 2048;

/// Inputs from this many values run on the team (a prefill chunk's q; a decode step's q and k,
/// a few thousand values, run inline).
const PARALLEL_VALUES: usize = 1 << 13;

/// `out = q3(q1(x * cos) + q2(cat(q0(-x2), x1) * sin))` per row of `d` values: `x` holds rows of
/// `d` (`x1`, `x2` their halves), `cos` and `sin` hold `s` rows that row `r` of `x` takes in turn
/// (row `r % s`: `x` is `[.., S, D]`, the tables `[S, D]`).
pub fn rotate_half(
    x: &[f32],
    cos: &[f32],
    sin: &[f32],
    d: usize,
    points: &RopePoints<'_>,
    out: &mut [MaybeUninit<f32>],
) -> Result<(), KernelError> {
    let s = cos.len() / d.max(1);
    if d == 0
        || !d.is_multiple_of(2)
        || !x.len().is_multiple_of(d)
        || cos.len() != s * d
        || sin.len() != cos.len()
        || s == 0
    {
        return Err(KernelError::InvalidArgument {
            op: "rope",
            reason: format!(
                "{} values in rows of {d} (an even width expected) with cos and sin tables of {} and {} \
                 values (equal, whole rows expected)",
                x.len(),
                cos.len(),
                sin.len()
            ),
        });
    }
    if !(x.len() / d).is_multiple_of(s) || out.len() != x.len() {
        return Err(KernelError::InvalidArgument {
            op: "rope",
            reason: format!(
                "{} rows against {s} table rows (a multiple expected), an output of {} for {} values",
                x.len() / d,
                out.len(),
                x.len()
            ),
        });
    }
    // Rows in blocks whose intermediates stay in L1, each point applied to a whole block in a
    // loop that vectorizes (one quantizer per loop, as the ops apply them); a prefill chunk's
    // blocks are shared out to the team.
    let block_rows = (BLOCK_VALUES / d).max(1);
    let block = |i: usize, out: &mut [MaybeUninit<f32>]| {
        let first = i * block_rows;
        mllm_dsl::simd::widest(
            #[inline(always)]
            || rotate_block(&x[first * d..first * d + out.len()], first, cos, sin, d, points, out),
        )
    };
    super::threads::for_blocks(out, block_rows * d, PARALLEL_VALUES, block);
    Ok(())
}

/// [`rotate_half`] of the rows of `x` (row `first` of the whole input onwards) into `out`.
#[inline(always)]
fn rotate_block(
    x: &[f32],
    first: usize,
    cos: &[f32],
    sin: &[f32],
    d: usize,
    points: &RopePoints<'_>,
    out: &mut [MaybeUninit<f32>],
) {
    let (h, s, rows) = (d / 2, cos.len() / d, x.len() / d);
    let (mut neg, mut b) = (vec![0f32; rows * h], vec![0f32; rows * d]);
    // 1. q0(-x2)
    for (n, x) in neg.chunks_exact_mut(h).zip(x.chunks_exact(d)) {
        n.iter_mut().zip(&x[h..]).for_each(|(n, x)| *n = -x);
    }
    fake_in_place(points[0], &mut neg);
    // 2. x * cos into the output, cat(q0(-x2), x1) * sin beside it
    for (i, ((x, out), (b, n))) in
        x.chunks_exact(d).zip(out.chunks_exact_mut(d)).zip(b.chunks_exact_mut(d).zip(neg.chunks_exact(h))).enumerate()
    {
        let t = ((first + i) % s) * d;
        let (cos, sin) = (&cos[t..t + d], &sin[t..t + d]);
        out.iter_mut().zip(x.iter().zip(cos)).for_each(|(o, (x, c))| _ = o.write(x * c));
        let (b1, b2) = b.split_at_mut(h);
        b1.iter_mut().zip(n.iter().zip(&sin[..h])).for_each(|(b, (n, s))| *b = n * s);
        b2.iter_mut().zip(x[..h].iter().zip(&sin[h..])).for_each(|(b, (x, s))| *b = x * s);
    }
    // SAFETY: every element of `out` was written just above (rows * d of them).
    let out = unsafe { &mut *(out as *mut [MaybeUninit<f32>] as *mut [f32]) };
    // 3. q1 and q2 of the products, then q3(a + b)
    fake_in_place(points[1], out);
    fake_in_place(points[2], &mut b);
    out.iter_mut().zip(&b).for_each(|(a, b)| *a += b);
    fake_in_place(points[3], out);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::qdq_points::fake;
    use compiler::quant::{FakeQuantizer, QuantParams};

    /// The ops written out, each point applied to a whole intermediate as the model file does.
    fn reference(x: &[f32], cos: &[f32], sin: &[f32], d: usize, q: &RopePoints<'_>) -> Vec<f32> {
        let apply = |p, v: Vec<f32>| -> Vec<f32> { v.into_iter().map(|v| fake(p, v)).collect() };
        let (s, h) = (cos.len() / d, d / 2);
        let rows = x.len() / d;
        let tab = |t: &[f32], r: usize, j: usize| t[(r % s) * d + j];
        let neg: Vec<f32> = (0..rows * h).map(|i| -x[(i / h) * d + h + i % h]).collect();
        let neg = apply(q[0], neg);
        let rotated: Vec<f32> =
            (0..rows * d).map(|i| if i % d < h { neg[(i / d) * h + i % d] } else { x[i - h] }).collect();
        let a = apply(q[1], (0..rows * d).map(|i| x[i] * tab(cos, i / d, i % d)).collect());
        let b = apply(q[2], (0..rows * d).map(|i| rotated[i] * tab(sin, i / d, i % d)).collect());
        apply(q[3], a.iter().zip(&b).map(|(a, b)| a + b).collect())
    }

    fn run(x: &[f32], cos: &[f32], sin: &[f32], d: usize, q: &RopePoints<'_>) -> Result<Vec<f32>, KernelError> {
        // SAFETY: `rotate_half` writes every element on success.
        unsafe { crate::kernels::threads::try_fill_new(x.len(), |out| rotate_half(x, cos, sin, d, q, out)) }
    }

    #[test]
    fn equals_the_ops_bit_for_bit() {
        let mut rng = crate::rng::SplitMix64::new(7);
        let quantizer =
            |scale: f32, zp: i32| FakeQuantizer::new(&QuantParams { scale, zero_point: zp, qmin: 0, qmax: 65535 });
        let qs = [quantizer(1e-4, 30000), quantizer(9e-5, 32768), quantizer(1.1e-4, 31000), quantizer(2e-4, 32000)];
        // (D, table rows, rows): one block; several blocks (32 rows of 64 each) and a last short
        // one, the table rows wrapping inside blocks; a decode step's heads of 128; a prefill
        // chunk's blocks on the team.
        for (d, s, rows) in [(64, 3, 12), (64, 5, 100), (128, 1, 16), (64, 6, 300)] {
            let x: Vec<f32> = (0..rows * d).map(|_| rng.uniform_pm1() * 3.0).collect();
            let cos: Vec<f32> = (0..s * d).map(|i| (i as f32 * 0.37).cos()).collect();
            let sin: Vec<f32> = (0..s * d).map(|i| (i as f32 * 0.37).sin()).collect();
            for points in [[None; 4], [Some(&qs[0]), Some(&qs[1]), Some(&qs[2]), Some(&qs[3])]] {
                let got = run(&x, &cos, &sin, d, &points).unwrap();
                let want = reference(&x, &cos, &sin, d, &points);
                let bits = |v: &[f32]| v.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&got), bits(&want), "D {d}, {s} table rows, {rows} rows");
            }
            // The float rotation itself, against f64: x*cos + rotate_half(x)*sin.
            let got = run(&x, &cos, &sin, d, &[None; 4]).unwrap();
            for (i, g) in got.iter().enumerate() {
                let (r, j) = (i / d, i % d);
                let t = (r % s) * d + j;
                let rot = if j < d / 2 { -f64::from(x[i + d / 2]) } else { f64::from(x[i - d / 2]) };
                let want = f64::from(x[i]) * f64::from(cos[t]) + rot * f64::from(sin[t]);
                assert!((f64::from(*g) - want).abs() < 1e-5, "element {i}: {g} vs {want}");
            }
        }
    }

    #[test]
    fn shapes_that_do_not_fit_are_errors() {
        let q = [None; 4];
        assert!(run(&[0.0; 6], &[0.0; 3], &[0.0; 3], 3, &q).is_err(), "odd width");
        assert!(run(&[0.0; 8], &[0.0; 8], &[0.0; 4], 4, &q).is_err(), "tables differ");
        assert!(run(&[0.0; 12], &[0.0; 8], &[0.0; 8], 4, &q).is_err(), "3 rows against 2 table rows");
        assert!(run(&[0.0; 16], &[0.0; 8], &[0.0; 8], 4, &q).is_ok());
    }
}

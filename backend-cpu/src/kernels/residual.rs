//! A residual connection with its QDQ points in one pass ([`mllm_dsl::fused::Fused::ResidualAdd`]).
//!
//! The model file writes `q1(x + q0(y))` as a point, an add and a point over the hidden width,
//! twice in every layer of a decode step (the second without `q1`). Here each block of the output
//! goes through the three steps in place while it stays in L1, with the add's own f32 arithmetic
//! and each point's fake quantizer, so the values are the ops' bit for bit.

use super::qdq_points::{fake_in_place, zip_blocks, QdqPoints};
use super::KernelError;
use std::mem::MaybeUninit;

/// The points in the model's order: the branch's (`y`), the sum's (`None` where the model has
/// none, as in float mode).
pub type ResidualPoints<'a> = QdqPoints<'a, 2>;

/// `out = q1(x + q0(y))` elementwise (`x`, `y` and `out` of one length).
pub fn residual_add(
    x: &[f32],
    y: &[f32],
    points: &ResidualPoints<'_>,
    out: &mut [MaybeUninit<f32>],
) -> Result<(), KernelError> {
    zip_blocks(
        "residual add",
        ["x", "y"],
        (x, y),
        out,
        #[inline(always)]
        |x, y, out| add_block(x, y, points, out),
    )
}

/// [`residual_add`] of one block, each step in place in `out`.
#[inline(always)]
fn add_block(x: &[f32], y: &[f32], points: &ResidualPoints<'_>, out: &mut [MaybeUninit<f32>]) {
    // 1. q0(y)
    out.iter_mut().zip(y).for_each(|(o, &v)| _ = o.write(v));
    // SAFETY: every element of `out` was written just above.
    let out = unsafe { &mut *(out as *mut [MaybeUninit<f32>] as *mut [f32]) };
    fake_in_place(points[0], out);
    // 2. q1(x + ..): the add op's `x[i] + y[i]` (an f32 sum is the same either way round)
    out.iter_mut().zip(x).for_each(|(o, &v)| *o += v);
    fake_in_place(points[1], out);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::{binary, BinaryOp};
    use compiler::quant::{FakeQuantizer, QuantParams};

    /// The ops written out: each point applied to a whole tensor through the quantizer's slice
    /// loop, as the QDQ hook applies it, and the add kernel between them.
    fn reference(x: &[f32], y: &[f32], q: &ResidualPoints<'_>) -> Vec<f32> {
        let point = |p: Option<&FakeQuantizer>, mut v: Vec<f32>| {
            if let Some(p) = p {
                p.apply_in_place(&mut v);
            }
            v
        };
        let shape = [x.len()];
        let y = point(q[0], y.to_vec());
        point(q[1], binary(BinaryOp::Add, x, &shape, &y, &shape).unwrap().0)
    }

    fn run(x: &[f32], y: &[f32], q: &ResidualPoints<'_>) -> Result<Vec<f32>, KernelError> {
        // SAFETY: `residual_add` writes every element on success.
        unsafe { crate::kernels::threads::try_fill_new(x.len(), |out| residual_add(x, y, q, out)) }
    }

    #[test]
    fn equals_the_ops_bit_for_bit() {
        let mut rng = crate::rng::SplitMix64::new(12);
        let quantizer =
            |scale: f32, zp: i32| FakeQuantizer::new(&QuantParams { scale, zero_point: zp, qmin: 0, qmax: 65535 });
        // Two activation grids that clip part of the values.
        let (q0, q1) = (quantizer(1.1e-4, 30000), quantizer(2.5e-4, 33000));
        // A short tail; a decode step's hidden width (one block and a short last one); a prefill
        // chunk's values on the team.
        for n in [7, 2048 + 5, 32 * 1024] {
            let x: Vec<f32> = (0..n).map(|_| rng.uniform_pm1() * 6.0).collect();
            let y: Vec<f32> = (0..n).map(|_| rng.uniform_pm1() * 5.0).collect();
            for points in [[None, None], [Some(&q0), None], [Some(&q0), Some(&q1)]] {
                let got = run(&x, &y, &points).unwrap();
                let want = reference(&x, &y, &points);
                let bits = |v: &[f32]| v.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&got), bits(&want), "{n} values, points {:?}", points.map(|p| p.is_some()));
            }
            // The points do something: a clipped branch changes the sum.
            assert_ne!(run(&x, &y, &[Some(&q0), None]).unwrap(), run(&x, &y, &[None, None]).unwrap());
            // Float mode is the plain sum.
            let sum = run(&x, &y, &[None, None]).unwrap();
            assert!(sum.iter().zip(x.iter().zip(&y)).all(|(s, (a, b))| *s == a + b));
        }
    }

    #[test]
    fn lengths_that_differ_are_errors() {
        let q = [None; 2];
        assert!(run(&[0.0; 4], &[0.0; 3], &q).is_err());
        let mut out = [MaybeUninit::uninit(); 2];
        assert!(residual_add(&[0.0; 3], &[0.0; 3], &q, &mut out).is_err());
    }
}

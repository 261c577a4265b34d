//! The SiLU-gated product of a gated MLP with its QDQ points in one pass
//! ([`mllm_dsl::fused::Fused::SiluGate`]).
//!
//! The model file writes `q2(q1(gate * q0(sigmoid(gate))) * up)` as three ops and three points
//! over the MLP's intermediate width, in every layer of a decode step. Here each block of the
//! output goes through the three steps in place while it stays in L1, each step with the op's own
//! arithmetic (the sigmoid op's formula, f32 products) and each point's fake quantizer, so the
//! values are the ops' bit for bit.

use super::qdq_points::{fake_in_place, zip_blocks, QdqPoints};
use super::unary::sigmoid_f32;
use super::KernelError;
use std::mem::MaybeUninit;

/// The three points, in the model's order: the sigmoid's output (its fixed grid), the activation
/// `gate * sigmoid(gate)`, the product with `up`.
pub type SiluGatePoints<'a> = QdqPoints<'a, 3>;

/// `out = q2(q1(gate * q0(sigmoid(gate))) * up)` elementwise (`gate`, `up` and `out` of one length).
pub fn silu_gate(
    gate: &[f32],
    up: &[f32],
    points: &SiluGatePoints<'_>,
    out: &mut [MaybeUninit<f32>],
) -> Result<(), KernelError> {
    zip_blocks(
        "silu gate",
        ["gate", "up"],
        (gate, up),
        out,
        #[inline(always)]
        |gate, up, out| gate_block(gate, up, points, out),
    )
}

/// [`silu_gate`] of one block, each step in place in `out`.
#[inline(always)]
fn gate_block(gate: &[f32], up: &[f32], points: &SiluGatePoints<'_>, out: &mut [MaybeUninit<f32>]) {
    // 1. q0(sigmoid(gate))
    out.iter_mut().zip(gate).for_each(|(o, &g)| _ = o.write(sigmoid_f32(g)));
    // SAFETY: every element of `out` was written just above.
    let out = unsafe { &mut *(out as *mut [MaybeUninit<f32>] as *mut [f32]) };
    fake_in_place(points[0], out);
    // 2. q1(gate * sig)
    out.iter_mut().zip(gate).for_each(|(s, g)| *s *= g);
    fake_in_place(points[1], out);
    // 3. q2(act * up)
    out.iter_mut().zip(up).for_each(|(a, u)| *a *= u);
    fake_in_place(points[2], out);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::{binary, unary, BinaryOp, UnaryOp};
    use compiler::quant::{FakeQuantizer, QuantParams};

    /// The ops written out, one kernel each, each point applied to a whole intermediate through the
    /// quantizer's slice loop, as the QDQ hook applies it.
    fn reference(gate: &[f32], up: &[f32], q: &SiluGatePoints<'_>) -> Vec<f32> {
        let point = |p: Option<&FakeQuantizer>, mut v: Vec<f32>| {
            if let Some(p) = p {
                p.apply_in_place(&mut v);
            }
            v
        };
        let shape = [gate.len()];
        let sig = point(q[0], unary(UnaryOp::Sigmoid, gate));
        let act = point(q[1], binary(BinaryOp::Mul, gate, &shape, &sig, &shape).unwrap().0);
        point(q[2], binary(BinaryOp::Mul, &act, &shape, up, &shape).unwrap().0)
    }

    fn run(gate: &[f32], up: &[f32], q: &SiluGatePoints<'_>) -> Result<Vec<f32>, KernelError> {
        // SAFETY: `silu_gate` writes every element on success.
        unsafe { crate::kernels::threads::try_fill_new(gate.len(), |out| silu_gate(gate, up, q, out)) }
    }

    #[test]
    fn equals_the_ops_bit_for_bit() {
        let mut rng = crate::rng::SplitMix64::new(11);
        let quantizer =
            |scale: f32, zp: i32| FakeQuantizer::new(&QuantParams { scale, zero_point: zp, qmin: 0, qmax: 65535 });
        // The sigmoid's fixed grid, and two activation grids that clip part of the values.
        let qs = [quantizer(1.0 / 65536.0, 0), quantizer(1.2e-4, 30000), quantizer(3e-5, 33000)];
        // A short tail; a decode step's intermediate width (several blocks and a short last one);
        // a prefill chunk's values on the team.
        for n in [7, 3072 + 5, 32 * 1536] {
            let gate: Vec<f32> = (0..n).map(|_| rng.uniform_pm1() * 8.0).collect();
            let up: Vec<f32> = (0..n).map(|_| rng.uniform_pm1() * 4.0).collect();
            for points in [[None; 3], [Some(&qs[0]), Some(&qs[1]), Some(&qs[2])]] {
                let got = run(&gate, &up, &points).unwrap();
                let want = reference(&gate, &up, &points);
                let bits = |v: &[f32]| v.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&got), bits(&want), "{n} values, points {}", points[0].is_some());
            }
            // The float step itself, against f64: silu(gate) * up.
            let got = run(&gate, &up, &[None; 3]).unwrap();
            for (i, g) in got.iter().enumerate() {
                let x = f64::from(gate[i]);
                let want = x / (1.0 + (-x).exp()) * f64::from(up[i]);
                assert!((f64::from(*g) - want).abs() <= 1e-5 * want.abs().max(1.0), "element {i}: {g} vs {want}");
            }
        }
    }

    #[test]
    fn lengths_that_differ_are_errors() {
        let q = [None; 3];
        assert!(run(&[0.0; 4], &[0.0; 3], &q).is_err());
        let mut out = [MaybeUninit::uninit(); 2];
        assert!(silu_gate(&[0.0; 3], &[0.0; 3], &q, &mut out).is_err());
    }
}

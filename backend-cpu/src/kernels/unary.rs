//! Elementwise unary kernels: `neg`, `sigmoid`, `silu`, `exp`.
//!
//! The formulas follow torch's CPU kernels so results agree to rounding: sigmoid is
//! `1 / (1 + exp(-x))` and silu is `x / (1 + exp(-x))`, with the vectorised [`exp_f32`] (< 1 ulp).
//! Shapes are unchanged, so these take only the data.

use super::math::{exp_f32, map_inplace};
use super::threads::par_fill;

/// Below this many elements the calling thread does the work (a rayon dispatch costs a few
/// microseconds).
const MIN_PARALLEL_LEN: usize = 1 << 14;

/// A unary elementwise operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnaryOp {
    Neg,
    Sigmoid,
    Silu,
    Exp,
}

/// `op(x)` elementwise into a new vector.
pub fn unary(op: UnaryOp, x: &[f32]) -> Vec<f32> {
    let mut out = x.to_vec();
    unary_inplace(op, &mut out);
    out
}

/// `op(x)` elementwise, overwriting `x` (saves an allocation when the input is dead afterwards).
pub fn unary_inplace(op: UnaryOp, x: &mut [f32]) {
    match op {
        UnaryOp::Neg => par_map(x, |v| -v),
        UnaryOp::Sigmoid => par_map(x, sigmoid_f32),
        UnaryOp::Silu => par_map(x, |v| v / (1.0 + exp_f32(-v))),
        UnaryOp::Exp => par_map(x, exp_f32),
    }
}

/// `1 / (1 + exp(-v))`, the sigmoid op's arithmetic (also [`super::silu_gate`]'s).
#[inline(always)]
pub(crate) fn sigmoid_f32(v: f32) -> f32 {
    1.0 / (1.0 + exp_f32(-v))
}

/// `-x`.
pub fn neg(x: &[f32]) -> Vec<f32> {
    unary(UnaryOp::Neg, x)
}

/// `1 / (1 + exp(-x))`.
pub fn sigmoid(x: &[f32]) -> Vec<f32> {
    unary(UnaryOp::Sigmoid, x)
}

/// `x * sigmoid(x)`, computed as `x / (1 + exp(-x))` like torch.
pub fn silu(x: &[f32]) -> Vec<f32> {
    unary(UnaryOp::Silu, x)
}

/// `exp(x)`.
pub fn exp(x: &[f32]) -> Vec<f32> {
    unary(UnaryOp::Exp, x)
}

fn par_map(x: &mut [f32], f: impl Fn(f32) -> f32 + Copy + Sync + Send) {
    par_fill(x, MIN_PARALLEL_LEN, |_, chunk| map_inplace(chunk, f));
}

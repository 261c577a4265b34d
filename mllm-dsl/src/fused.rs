//! Fused steps: a short chain of ops and QDQ points in a model file that an eager backend may run
//! in one pass.
//!
//! A model file spells each step out as the NPU graph has it (RoPE is eight ops and four QDQ
//! points per tensor). Traced, that is the graph; run eagerly, a one-token decode step pays each
//! op's dispatch, allocation and QDQ lookup for a few hundred values. [`fused`] wraps such a chain:
//! a backend that knows the step ([`Backend::fused`]) computes it directly, with the same QDQ
//! points applied at the same places; anywhere else (tracing, other backends, a calibration run
//! that must observe every point) the chain runs as written. The model file stays the one
//! description of the step.
//!
//! ```
//! use mllm_dsl::fused::{fused, Fused};
//! use mllm_dsl::prelude::*;
//!
//! /// `x*cos + rotate_half(x)*sin`, each step with its QDQ point.
//! fn rotate(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
//!     let names = ["neg_half_qdq", "mul_0_qdq", "mul_1_qdq", "add_0_qdq"];
//!     fused(Fused::RotateHalfRope, &[x, cos, sin], &names, || {
//!         let d = x.dim(-1)?;
//!         let (x1, x2) = (x.slice(-1, 0, d / 2)?, x.slice(-1, d / 2, d)?);
//!         let rotated = Tensor::cat(&[&qdq!(x2.neg()?, names[0])?, &x1], -1)?;
//!         let a = qdq!(x.mul(cos)?, names[1])?;
//!         let b = qdq!(rotated.mul(sin)?, names[2])?;
//!         qdq!(a.add(&b)?, names[3])
//!     })
//! }
//! # let _ = rotate;
//! ```

use crate::backend::Backend;
use crate::error::{CallSite, Error, Result};
use crate::qdq::{QdqAttr, QdqKind};
use crate::{scope, trace, Tensor};

/// The steps a backend may fuse. Each names its inputs and its QDQ points in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fused {
    /// RoPE's rotation of `x [.., S, D]` by `cos`, `sin` (`[S, D]` rows, any leading dims of size one):
    /// `q3(q1(x * cos) + q2(cat(q0(-x[.., D/2..]), x[.., ..D/2]) * sin))`, with `q0..q3` the four
    /// QDQ points (neg_half, mul_0, mul_1, add_0).
    RotateHalfRope,
    /// mllm's masked attention softmax of `scores [.., S, T]` with a `mask [S, T]` (any leading
    /// dims of size one) and three scalar constants `scale`, `below_min` and `attend`:
    /// `a = q0(scores * scale)`, `w = q3(where(mask == attend, a, q2(q1(rowmin(a)) + below_min)))`,
    /// `q4(softmax(w))`, with `q0..q4` the five QDQ points (mul_0, reduce_min, minus_0, where,
    /// softmax).
    MaskedSoftmax,
    /// The SiLU-gated product of a gated MLP, `gate` and `up` of one shape:
    /// `q2(q1(gate * q0(sigmoid(gate))) * up)`, with `q0` the sigmoid's fixed point and `q1`, `q2`
    /// the activation's and the product's points.
    SiluGate,
    /// Attention of `q [.., H, S, D]` over the past ++ new keys and values, GQA's repeat
    /// included: inputs `q`, the new `k [.., Hkv, D, S]` and `v [.., Hkv, S, D]`, the past
    /// `past_k [.., Hkv, D, P]` and `past_v [.., Hkv, P, D]`, then [`Fused::MaskedSoftmax`]'s
    /// `mask` and three constants; `q6(masked_softmax(q0(q @ repeat(cat(past_k, k)))) @
    /// repeat(cat(past_v, v)))` `[.., H, S, D]`, with `q0` the scores' point, `q1..q5` the masked
    /// softmax's five and `q6` the output's.
    Attention,
    /// A residual connection `x + q0(y)` (`x`, `y` of one shape), then `q1(..)` when a second
    /// point is given: the add with its input's point and, optionally, its output's.
    ResidualAdd,
}

/// A fused step's QDQ point: its name in the calling module, as `qdq!` takes it, and its kind. A
/// plain name is an activation point.
#[derive(Clone, Debug, PartialEq)]
pub struct Point<'a> {
    pub name: &'a str,
    pub kind: QdqKind,
}

impl<'a> From<&'a str> for Point<'a> {
    fn from(name: &'a str) -> Self {
        Point { name, kind: QdqKind::Activation }
    }
}

/// Runs the step `kind` on `inputs` with its QDQ points (names resolved in the calling module, as
/// `qdq!` resolves them; plain names are activation points, see [`Point`]): fused by the inputs'
/// backend if it offers to, else `decomposed()`, the same step written out, which is also what a
/// trace records.
#[track_caller]
pub fn fused<'a, P: Clone + Into<Point<'a>>>(
    kind: Fused,
    inputs: &[&Tensor],
    points: &[P],
    decomposed: impl FnOnce() -> Result<Tensor>,
) -> Result<Tensor> {
    let site = CallSite::here();
    let backend = match inputs.first().and_then(|x| x.backend()) {
        Some(backend) if !trace::is_tracing() && backend.fuses(kind) => backend.clone(),
        _ => return decomposed(),
    };
    // Constants (`qdq!(const ..)`) as the ops would read them: materialized through their QDQ.
    let inputs = inputs
        .iter()
        .map(|t| crate::tensor::materialize(t, &backend, site, "fused step"))
        .collect::<Result<Vec<Tensor>>>()?;
    let inputs: Vec<&Tensor> = inputs.iter().collect();
    let named: Vec<Point<'a>> = points.iter().map(|p| p.clone().into()).collect();
    let points: Vec<QdqAttr> = scope::with_current_path(|path| {
        named.iter().map(|p| QdqAttr { kind: p.kind.clone(), key: crate::qdq::qdq_key(path, p.name) }).collect()
    });
    let Some(result) = Backend::fused(&*backend, kind, &inputs, &points) else { return decomposed() };
    let output = result.map_err(|e| Error::Backend {
        op: format!("{kind:?}"),
        module_path: scope::current_path(),
        message: e.to_string(),
    })?;
    // The points count as used in this module call, as the written-out step would claim them.
    for Point { name, .. } in named {
        if !scope::claim_qdq_name(name) {
            let message = "this QDQ name is already used in this module call; each QDQ point needs its own name";
            let module_path = scope::current_path();
            return Err(Error::Qdq { name: name.to_string(), module_path, site, message: message.into() });
        }
    }
    Ok(output)
}

//! [`FakeQuantHook`]: each QDQ point quantizes, clamps and dequantizes its tensor with torch's
//! `fake_quantize_per_tensor_affine` ([`FakeQuantizer`]), using the point's parameters.
//!
//! Together with a [`CheckpointStore`](crate::CheckpointStore) that decodes the stored weights,
//! this is mllm's "deployed simulation" (`deployedsim_logits` of the pymllm oracle):
//! - decoded from the file: LPBQ linears `signext4(q) * scale1 * scale2` (the two-level scales the
//!   NPU uses, not pymllm's fp32 block scales), uint16 norms, embedding and RoPE tables
//!   `(q - zp) * scale`;
//! - applied: every activation QDQ (u16, 0..=65535), the KV QDQs (u8, 0..=255, zero point 128),
//!   the fixed sigmoid QDQ (1/65536) and the constants' QDQs (`scaling_qdq`, `neg_20_qdq`).
//!
//! Remaining differences, none visible on the oracle (the logits match bit for bit for prefill
//! chunks of 8, 32 and 1):
//! - the model file applies the RoPE QDQ to the decoded tables at every forward, where pymllm
//!   applied it once when building them; on decoded values it is the identity;
//! - the mask is the dequantized u16 input (0.0 attends, -0.001 masked) compared with a
//!   `constant_zero` QDQ'd with the mask encoding (0.0 stays 0.0), where pymllm compares an int8
//!   `1 - tril` with 0: the same selection;
//! - chunked prefill and decode see the valid past plus the chunk, where the oracle's single
//!   prefill row also spans the future columns: `reduce_min` over a row, and so the value of
//!   *masked* scores, can differ, and masked scores weigh ~e^-20 in the softmax;
//! - float summation order of the CPU kernels (absorbed by the next QDQ's rounding, mostly);
//! - not simulated at all: what the NPU does beyond QDQ semantics (integer kernels, constants
//!   quantized by mllm's compiler with C rounding: see `quant::fake_quant::quantize_constant`).

use std::collections::HashMap;

use compiler::quant::{FakeQuantizer, QuantParams};
use mllm_dsl::{QdqAttr, Tensor};

use super::params::QdqParams;
use crate::executor::{qdq_input, QdqHook, QdqHookError, Quantized};
use crate::kernels::Grid;
use crate::on_grid::grid_of;

/// Elements per parallel task.
const PAR_CHUNK: usize = 1 << 13;

pub struct FakeQuantHook {
    /// Per point: its traced attribute, its quantizer and its 16-bit grid (if it has one), worked
    /// out once: the executor asks for the grid at every call.
    quantizers: HashMap<String, (QdqAttr, FakeQuantizer, Option<Grid>)>,
}

impl FakeQuantHook {
    pub fn new(params: &QdqParams) -> Self {
        let quantizers = params
            .iter()
            .map(|(point, p)| {
                let grid = crate::on_grid::u16_grid(p.scale, p.zero_point, p.qmin, p.qmax);
                (point.key.clone(), (point.clone(), FakeQuantizer::new(p), grid))
            })
            .collect();
        FakeQuantHook { quantizers }
    }

    /// The parameters this hook applies at `key`.
    pub fn params(&self, key: &str) -> Option<&QuantParams> {
        self.quantizers.get(key).map(|(_, fq, _)| fq.params())
    }
}

impl QdqHook for FakeQuantHook {
    fn apply(&self, point: &QdqAttr, x: &[f32], _shape: &[usize]) -> Result<Option<Vec<f32>>, QdqHookError> {
        let (known, fq, _) = self.lookup(point)?;
        Ok(Some(fake_quantize(point, known, fq, x)?))
    }

    fn grid(&self, point: &QdqAttr) -> Option<Grid> {
        self.quantizers.get(&point.key)?.2
    }

    fn apply_to(&self, point: &QdqAttr, x: &Tensor) -> Result<Option<Quantized>, QdqHookError> {
        let (known, fq, grid) = self.lookup(point)?;
        if grid.is_some() && *grid == grid_of(x) {
            return Ok(None);
        }
        let values = fake_quantize(point, known, fq, &qdq_input(point, x)?)?;
        Ok(Some(Quantized { values, grid: *grid }))
    }
}

impl FakeQuantHook {
    fn lookup(&self, point: &QdqAttr) -> Result<&(QdqAttr, FakeQuantizer, Option<Grid>), QdqHookError> {
        self.quantizers.get(&point.key).ok_or_else(|| QdqHookError::NoParameters { key: point.key.clone() })
    }
}

/// `x` through `fq`, the quantizer of `point` (traced as `known`).
fn fake_quantize(point: &QdqAttr, known: &QdqAttr, fq: &FakeQuantizer, x: &[f32]) -> Result<Vec<f32>, QdqHookError> {
    if known.kind != point.kind {
        return Err(QdqHookError::KindMismatch {
            key: point.key.clone(),
            here: point.to_string(),
            traced: known.to_string(),
        });
    }
    let n = x.len();
    // Fresh memory, not zeroed first: every element is written below.
    let mut out: Vec<f32> = Vec::with_capacity(n);
    let shape_error =
        |e: compiler::quant::QuantError| QdqHookError::Shape { key: point.key.clone(), problem: e.to_string() };
    let ctx = crate::kernels::threads::current();
    if ctx.for_work(n, PAR_CHUNK) <= 1 {
        // One task (most decode QDQs are a few hundred values).
        mllm_dsl::simd::widest(
            #[inline(always)]
            || fq.apply_uninit(x, &mut out.spare_capacity_mut()[..n]),
        )
        .map_err(shape_error)?;
    } else {
        // On the kernels' team, whose helpers are awake between ops: a prefill chunk has a
        // thousand QDQ points of 20-100 µs each, and waking a sleeping pool costs as much.
        ctx.for_each_chunk_mut(&mut out.spare_capacity_mut()[..n], PAR_CHUNK, |i, o| {
            let input = &x[i * PAR_CHUNK..i * PAR_CHUNK + o.len()];
            // Equal lengths by construction, so this cannot fail.
            let _ = mllm_dsl::simd::widest(
                #[inline(always)]
                || fq.apply_uninit(input, o),
            );
        });
    }
    // SAFETY: the capacity is n and `apply_uninit` wrote all n elements (the chunks above
    // cover 0..n, each with its input's length).
    unsafe { out.set_len(n) };
    Ok(out)
}

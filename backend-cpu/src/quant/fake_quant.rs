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
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicUsize, Ordering};

use compiler::quant::{FakeQuantizer, QuantParams};
use mllm_dsl::{QdqAttr, Tensor};

use super::params::QdqParams;
use crate::executor::{qdq_input, QdqHook, QdqHookError, Quantized};
use crate::kernels::{prefetch_all, prefetch_bytes, Grid};
use crate::on_grid::grid_of;

/// Elements per parallel task.
const PAR_CHUNK: usize = 1 << 13;

pub struct FakeQuantHook {
    /// Index of each point's entry in `points`.
    index: HashMap<String, usize>,
    points: Vec<Point>,
    /// The entry looked up last (`usize::MAX` before the first).
    last: AtomicUsize,
}

/// A QDQ point's traced attribute, its quantizer and its 16-bit grid (if it has one), worked out
/// once; and the entry looked up after it last time.
struct Point {
    attr: QdqAttr,
    fq: FakeQuantizer,
    grid: Option<Grid>,
    next: AtomicUsize,
    /// Address and length of the key bytes of the entry at `next`: prefetching them must not
    /// read that entry, which is what is still on its way from memory.
    next_key: (AtomicUsize, AtomicUsize),
}

impl FakeQuantHook {
    pub fn new(params: &QdqParams) -> Self {
        let points: Vec<Point> = params
            .iter()
            .map(|(point, p)| Point {
                attr: point.clone(),
                fq: FakeQuantizer::new(p),
                grid: crate::on_grid::u16_grid(p.scale, p.zero_point, p.qmin, p.qmax),
                next: AtomicUsize::new(usize::MAX),
                next_key: (AtomicUsize::new(0), AtomicUsize::new(0)),
            })
            .collect();
        let index = points.iter().enumerate().map(|(i, p)| (p.attr.key.clone(), i)).collect();
        FakeQuantHook { index, points, last: AtomicUsize::new(usize::MAX) }
    }

    /// The parameters this hook applies at `key`.
    pub fn params(&self, key: &str) -> Option<&QuantParams> {
        self.index.get(key).map(|&i| self.points[i].fq.params())
    }

    /// `point`'s entry. A model visits its points in the same order at every forward, and a decode
    /// step's weight streaming evicts the table between two points: so the entry that followed
    /// the last one last time is tried first (its key compared, no hashing), and the one
    /// expected after this is asked into the caches now, while the step's next op runs. A wrong
    /// guess (another model, another thread) costs the usual lookup.
    fn lookup(&self, point: &QdqAttr) -> Result<&Point, QdqHookError> {
        let last = self.last.load(Ordering::Relaxed);
        let guess = self.points.get(last).map(|p| p.next.load(Ordering::Relaxed));
        let i = match guess.filter(|&g| self.points.get(g).is_some_and(|p| p.attr.key == point.key)) {
            Some(g) => g,
            None => {
                let i =
                    *self.index.get(&point.key).ok_or_else(|| QdqHookError::NoParameters { key: point.key.clone() })?;
                if let Some(p) = self.points.get(last) {
                    let key = self.points[i].attr.key.as_bytes();
                    p.next.store(i, Ordering::Relaxed);
                    p.next_key.0.store(key.as_ptr() as usize, Ordering::Relaxed);
                    p.next_key.1.store(key.len(), Ordering::Relaxed);
                }
                i
            }
        };
        self.last.store(i, Ordering::Relaxed);
        let found = &self.points[i];
        // The next entry and its key, from addresses alone: reading the entry for its key's
        // address would wait for the very miss the prefetch is there to hide (perf: that load
        // was two thirds of the lookup's samples).
        let next = found.next.load(Ordering::Relaxed);
        if let Some(entry) = self.points.get(next..=next) {
            prefetch_all(entry);
            prefetch_bytes(found.next_key.0.load(Ordering::Relaxed), found.next_key.1.load(Ordering::Relaxed));
        }
        Ok(found)
    }
}

impl QdqHook for FakeQuantHook {
    fn apply(&self, point: &QdqAttr, x: &[f32], _shape: &[usize]) -> Result<Option<Vec<f32>>, QdqHookError> {
        let found = self.lookup(point)?;
        Ok(Some(fake_quantize(point, &found.attr, &found.fq, x)?))
    }

    fn grid(&self, point: &QdqAttr) -> Option<Grid> {
        self.index.get(&point.key).and_then(|&i| self.points[i].grid)
    }

    fn has_quantizers(&self) -> bool {
        true
    }

    fn quantizer(&self, point: &QdqAttr) -> Option<Result<(&FakeQuantizer, Option<Grid>), QdqHookError>> {
        Some(self.lookup(point).and_then(|found| {
            check_kind(point, &found.attr)?;
            Ok((&found.fq, found.grid))
        }))
    }

    fn apply_to(&self, point: &QdqAttr, x: &Tensor) -> Result<Option<Quantized>, QdqHookError> {
        let found = self.lookup(point)?;
        if found.grid.is_some() && found.grid == grid_of(x) {
            return Ok(None);
        }
        let values = fake_quantize(point, &found.attr, &found.fq, &qdq_input(point, x)?)?;
        Ok(Some(Quantized { values, grid: found.grid }))
    }
}

/// `x` through `fq`, the quantizer of `point` (traced as `known`).
/// `point` as applied here must be of the kind traced (`known`).
fn check_kind(point: &QdqAttr, known: &QdqAttr) -> Result<(), QdqHookError> {
    if known.kind != point.kind {
        return Err(QdqHookError::KindMismatch {
            key: point.key.clone(),
            here: point.to_string(),
            traced: known.to_string(),
        });
    }
    Ok(())
}

fn fake_quantize(point: &QdqAttr, known: &QdqAttr, fq: &FakeQuantizer, x: &[f32]) -> Result<Vec<f32>, QdqHookError> {
    check_kind(point, known)?;
    let n = x.len();
    let shape_error =
        |e: compiler::quant::QuantError| QdqHookError::Shape { key: point.key.clone(), problem: e.to_string() };
    let fill = |out: &mut [MaybeUninit<f32>]| {
        let Some(ctx) = crate::kernels::threads::parallel_ctx(n, PAR_CHUNK) else {
            // One task (most decode QDQs are a few hundred values).
            return mllm_dsl::simd::widest(
                #[inline(always)]
                || fq.apply_uninit(x, out),
            );
        };
        // On the kernels' team, whose helpers are awake between ops: a prefill chunk has a
        // thousand QDQ points of 20-100 µs each, and waking a sleeping pool costs as much.
        ctx.for_each_chunk_mut(out, PAR_CHUNK, |i, o| {
            let input = &x[i * PAR_CHUNK..i * PAR_CHUNK + o.len()];
            // Equal lengths by construction, so this cannot fail.
            let _ = mllm_dsl::simd::widest(
                #[inline(always)]
                || fq.apply_uninit(input, o),
            );
        });
        Ok(())
    };
    // SAFETY: on Ok, `apply_uninit` wrote all n elements (the chunks cover 0..n, each with its
    // input's length).
    unsafe { crate::kernels::threads::try_fill_new(n, fill) }.map_err(shape_error)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::CpuBackend;
    use mllm_dsl::QdqKind;
    use std::sync::Arc;

    /// The guessed entry is only a guess: points in any order, repeated, interleaved with unknown
    /// keys and with a second model, each get their own parameters.
    #[test]
    fn each_point_gets_its_own_parameters_whatever_the_order() {
        let mut params = QdqParams::new();
        let points: Vec<QdqAttr> =
            (0..4).map(|i| QdqAttr { kind: QdqKind::Activation, key: format!("model.layers.{i}.input_qdq") }).collect();
        for (i, point) in points.iter().enumerate() {
            let p = QuantParams { scale: 0.01 * (i + 1) as f32, zero_point: 1000 * i as i32, qmin: 0, qmax: 65535 };
            params.insert(point.clone(), p);
        }
        let hook = FakeQuantHook::new(&params);
        let backend = CpuBackend::with_qdq(Arc::new(FakeQuantHook::new(&params)));
        let x = [0.123f32, -1.0, 7.777, 3.3];
        let order = [0, 1, 2, 3, 0, 1, 2, 3, 0, 2, 1, 3, 3, 3, 1, 0, 2];
        for (step, &i) in order.iter().enumerate() {
            let want: Vec<f32> =
                x.iter().map(|&v| FakeQuantizer::new(params.get(&points[i].key).unwrap()).fake(v)).collect();
            assert_eq!(hook.apply(&points[i], &x, &[4]).unwrap().unwrap(), want, "step {step}, point {i}");
            let t = Tensor::from_f32(x.to_vec(), vec![4], backend.clone()).unwrap();
            assert_eq!(backend.qdq(&t, &points[i]).unwrap().as_f32().unwrap(), &want[..], "step {step}, point {i}");
            if step % 5 == 4 {
                let unknown = QdqAttr { kind: QdqKind::Activation, key: "model.layers.9.input_qdq".into() };
                assert!(matches!(hook.apply(&unknown, &x, &[4]), Err(QdqHookError::NoParameters { .. })));
            }
        }
    }
}

//! [`CpuChunkModel`]: runs a [`CausalLm`] model file eagerly as the runtime's [`ChunkModel`].
//!
//! The compiled NPU graphs read the whole static cache (`ctx - ar` past columns) and a `[ar, ctx]`
//! mask. Eager shapes are free, so each chunk here receives only the `n_past` valid past columns and
//! the matching mask columns: the same computation without the work on columns the mask excludes.
//! The past is not copied: each layer's keys and values are [`Strided`] views of the runtime's
//! cache buffers, whose rows are `ctx - ar` positions wide, and the attention products read them
//! there (see [`crate::lazy`]).
//!
//! In fake-quant mode every cached K and V comes out of an 8-bit QDQ point, so the cache can hold
//! the points' codes instead of their values ([`CpuChunkModel::into_kv8`]): a quarter of the
//! memory, and of the bytes each decode step's attention products read, with the same results
//! (the products decode each code with the fake quantizer's operations, in registers).

use crate::executor::{profile, real_values};
use crate::kernels::{decode_u8, run_in_pool, Grid, KernelError};
use crate::lazy::{Strided, StridedData};
use mllm_dsl::{BackendRef, CausalLm, DType, F32Buffer, Storage, Tensor, TensorType};
use runtime::{ChunkInputs, ChunkModel, ChunkOutputs, ModelError, ModelLayout};
use std::borrow::Cow;
use std::sync::Arc;

/// Value of a masked mask entry (uint16 0 dequantized with mllm's mask encoding); 0.0 attends.
const MASKED: f32 = -0.001;

/// A model file run eagerly as the runtime's chunk model, its KV cache held as `K`: `f32` values,
/// or `u8` codes of the KV QDQ points' 8-bit grids ([`CpuChunkModel::into_kv8`]).
pub struct CpuChunkModel<K = f32> {
    model: Box<dyn CausalLm>,
    backend: BackendRef,
    context_len: usize,
    /// Per layer, the grids of K and V (`u8` caches only).
    kv_grids: Vec<[Grid; 2]>,
    _kv: std::marker::PhantomData<K>,
}

/// The element a [`CpuChunkModel`] keeps its KV cache in.
pub trait CpuKv: Copy + Default + Send + Sync + 'static {
    /// A layer's past as a view's data; `grid` is the layer's K or V grid (`u8` caches).
    fn past(buffer: &Arc<Vec<Self>>, grid: Option<Grid>) -> Result<StridedData, PresentError>;
    /// Writes a present K or V, given as the model's f32 values, into the chunk's output.
    fn present(dst: &mut [Self], values: &[f32], grid: Option<Grid>) -> Result<(), PresentError>;
}

impl CpuKv for f32 {
    fn past(buffer: &Arc<Vec<f32>>, _: Option<Grid>) -> Result<StridedData, PresentError> {
        Ok(StridedData::F32(buffer.clone().into()))
    }

    fn present(dst: &mut [f32], values: &[f32], _: Option<Grid>) -> Result<(), PresentError> {
        dst.copy_from_slice(values);
        Ok(())
    }
}

impl CpuKv for u8 {
    fn past(buffer: &Arc<Vec<u8>>, grid: Option<Grid>) -> Result<StridedData, PresentError> {
        Ok(StridedData::U8 { codes: buffer.clone(), grid: grid.ok_or(PresentError::NoGrid)? })
    }

    /// The code of each value, checked to stand for the value exactly: a model whose K/V do not
    /// come out of the grid's QDQ point is an error, not a silently different cache.
    fn present(dst: &mut [u8], values: &[f32], grid: Option<Grid>) -> Result<(), PresentError> {
        let grid = grid.ok_or(PresentError::NoGrid)?;
        // `v / scale` is within rounding of the integer `u - zero_point`: adding `zero_point + 0.5`
        // and truncating finds `u` without a call to `round` (NaN truncates to 0 and fails the
        // check below).
        let half_up = grid.zero_point as f32 + 0.5;
        // Branch-free, so it vectorizes (a decode step codes 2 × layers × heads × head_dim values).
        let on_grid = mllm_dsl::simd::widest(
            #[inline(always)]
            || {
                let mut on_grid = true;
                for (d, &v) in dst.iter_mut().zip(values) {
                    let code = (v / grid.scale + half_up) as i32;
                    let u = code.clamp(0, 255) as u8;
                    on_grid &= (code == i32::from(u)) & (decode_u8(u, grid) == v);
                    *d = u;
                }
                on_grid
            },
        );
        if on_grid {
            return Ok(());
        }
        let off = |(_, &v): &(usize, &f32)| {
            let code = (v / grid.scale + half_up) as i32;
            !(0..=255).contains(&code) || decode_u8(code as u8, grid) != v
        };
        let (index, &value) = values.iter().enumerate().find(off).unwrap_or((0, &f32::NAN));
        Err(PresentError::OffGrid { index, value, grid })
    }
}

/// A K or V that a `u8` cache cannot hold or read.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum PresentError {
    #[error("no 8-bit grid is known for it")]
    NoGrid,
    #[error("element {index} is {value}, not a code of the grid (u - {}) * {}", grid.zero_point, grid.scale)]
    OffGrid { index: usize, value: f32, grid: Grid },
}

impl CpuChunkModel {
    /// `model` must be bound to weights on `backend`'s store.
    pub fn new(model: Box<dyn CausalLm>, backend: BackendRef, context_len: usize) -> Self {
        CpuChunkModel { model, backend, context_len, kv_grids: Vec::new(), _kv: std::marker::PhantomData }
    }

    /// The same model with its KV cache kept as 8-bit codes: `grids[layer]` are the grids of the
    /// layer's K and V QDQ points, onto which the model puts every K and V it caches. The values
    /// read back are the same f32 numbers (decoded as the fake quantizer computes them), so the
    /// outputs do not change; the cache is a quarter of the bytes, and so is what each decode
    /// step's attention reads.
    pub fn into_kv8(self, grids: Vec<[Grid; 2]>) -> Result<CpuChunkModel<u8>, ModelOutputError> {
        let layers = self.model.shape().num_layers;
        if grids.len() != layers {
            return Err(ModelOutputError::KvGrids { found: grids.len(), layers });
        }
        let CpuChunkModel { model, backend, context_len, .. } = self;
        Ok(CpuChunkModel { model, backend, context_len, kv_grids: grids, _kv: std::marker::PhantomData })
    }
}

impl<K: CpuKv> CpuChunkModel<K> {
    /// The grid of layer `l`'s K (`which` 0) or V (1), for `u8` caches.
    fn grid(&self, l: usize, which: usize) -> Option<Grid> {
        self.kv_grids.get(l).map(|g| g[which])
    }

    fn tensor(&self, data: Vec<f32>, shape: Vec<usize>, dtype: DType) -> mllm_dsl::Result<Tensor> {
        self.tensor_arc(data.into(), shape, dtype)
    }

    fn tensor_arc(&self, data: F32Buffer, shape: Vec<usize>, dtype: DType) -> mllm_dsl::Result<Tensor> {
        Tensor::from_storage(TensorType::new(shape, dtype), Storage::F32(data), self.backend.clone())
    }

    /// A past K or V tensor read in place from the runtime's cache.
    fn past_tensor(&self, view: Strided) -> mllm_dsl::Result<Tensor> {
        let ty = TensorType::new(view.shape.clone(), DType::U8Sym);
        Tensor::from_storage(ty, Storage::Native(std::sync::Arc::new(view)), self.backend.clone())
    }
}

/// A model output the chunk model cannot hand back to the runtime.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum ModelOutputError {
    #[error("model output {what} has no real data")]
    NotReal { what: &'static str },
    #[error("model output logits has {found} values; expected {ar} or {rows} rows of {vocab}")]
    LogitsLength { found: usize, ar: usize, rows: usize, vocab: usize },
    #[error("layer {layer}: past {what} of the KV cache: {source}")]
    PastLayout { layer: usize, what: &'static str, source: KernelError },
    #[error("layer {layer}: {what} of the 8-bit KV cache: {source}")]
    Present { layer: usize, what: &'static str, source: PresentError },
    #[error("{found} pairs of KV grids for a model of {layers} layers")]
    KvGrids { found: usize, layers: usize },
}

impl<K: CpuKv> ChunkModel for CpuChunkModel<K> {
    type Kv = K;

    fn layout(&self) -> ModelLayout {
        let s = self.model.shape();
        ModelLayout {
            num_layers: s.num_layers,
            num_kv_heads: s.num_kv_heads,
            head_dim: s.head_dim,
            vocab_size: s.vocab_size,
            context_len: self.context_len,
            sliding_window: s.sliding_window,
        }
    }

    fn supports_chunk_len(&self, ar: usize) -> bool {
        ar >= 1 && ar < self.context_len
    }

    /// Any chunk at any context up to the one it was built for: the CPU reads only the stored
    /// positions, whatever the mask's width.
    fn supports_graph(&self, ar: usize, context_len: usize) -> bool {
        ar >= 1 && ar < context_len && context_len <= self.context_len
    }

    fn run_chunk(&mut self, inputs: &ChunkInputs<'_, K>, outputs: &mut ChunkOutputs<K>) -> Result<(), ModelError> {
        let t0 = profile::start();
        profile::set_decode_step(inputs.ar() == 1);
        let shape = self.model.shape();
        // The graph's context is the mask's width (a smaller member of a family, or the model's own).
        let (ar, n_past, ctx) = (inputs.ar(), inputs.n_past(), inputs.mask().context_len());
        let (kvh, d) = (shape.num_kv_heads, shape.head_dim);
        let stride = ctx - ar;
        let ids: Vec<i64> = inputs.ids().iter().map(|&i| i as i64).collect();
        let pos: Vec<i64> = inputs.positions().iter().map(|&p| p as i64).collect();
        let ids = Tensor::from_i64(ids, vec![1, ar], DType::I32, self.backend.clone())?;
        let pos = Tensor::from_i64(pos, vec![ar], DType::I32, self.backend.clone())?;
        // Mask [1, P, ar, n_past + ar]: the valid past columns, then the chunk's own columns, for
        // each plane (full causal, and the sliding window's when the model has one).
        let m = inputs.mask();
        let planes = m.planes();
        let mut mask = Vec::with_capacity(planes * ar * (n_past + ar));
        for (plane, row) in (0..planes).flat_map(|p| (0..ar).map(move |r| (p, r))) {
            let cols = (0..n_past).chain(stride..stride + ar);
            mask.extend(cols.map(|c| if m.attends_in(plane, row, c) { 0.0 } else { MASKED }));
        }
        let mask = self.tensor(mask, vec![1, planes, ar, n_past + ar], DType::F32)?;
        // Past K `[1, Hkv, D, n_past]`: rows of `stride` positions; past V `[1, Hkv, n_past, D]`:
        // heads of `stride` rows of D.
        let (mut keys, mut values) = (Vec::new(), Vec::new());
        for l in 0..shape.num_layers {
            let layout = |what, source| ModelOutputError::PastLayout { layer: l, what, source };
            let codes = |what, source| ModelOutputError::Present { layer: l, what, source };
            let k = K::past(inputs.key_buffer(l), self.grid(l, 0)).map_err(|e| codes("past key", e))?;
            let v = K::past(inputs.value_buffer(l), self.grid(l, 1)).map_err(|e| codes("past value", e))?;
            let k = Strided::new(k, vec![1, kvh, d, n_past], stride, d * stride).map_err(|e| layout("keys", e))?;
            let v = Strided::new(v, vec![1, kvh, n_past, d], d, stride * d).map_err(|e| layout("values", e))?;
            keys.push(self.past_tensor(k)?);
            values.push(self.past_tensor(v)?);
        }
        let t1 = profile::lap(t0, profile::CHUNK_INPUTS);
        let rows = inputs.logit_rows();
        let model = &self.model;
        let forward = || model.forward_rows(&ids, &pos, &mask, &keys, &values, rows.clone());
        // A decode step's kernels run on the team (helpers that stay awake), so it runs on the
        // calling thread: handing it to a pool thread woke a sleeping worker each step and moved
        // the step between cores, away from the caches the last one warmed. SmolLM2 int4 on a
        // 2-core Xeon VM: a decode step 4.27-4.42 ms against 4.46-4.73 through the pool (4
        // alternating pairs), decode 5 % faster (6 of 6). Prefill chunks go to the pool, where
        // gemm's rayon tasks run.
        let (logits, new_k, new_v) = if ar == 1 { forward()? } else { run_in_pool(forward)? };
        let t2 = profile::lap(t1, profile::FORWARD);
        fn read<'a>(t: &'a Tensor, what: &'static str) -> Result<Cow<'a, [f32]>, ModelOutputError> {
            real_values(t).ok_or(ModelOutputError::NotReal { what })
        }
        // All `ar` rows, or only the rows asked for when the model file honours them.
        let logits = read(&logits, "logits")?;
        let vocab = shape.vocab_size;
        let dst = outputs.logits_mut();
        if logits.len() == dst.len() {
            dst.copy_from_slice(&logits);
        } else if logits.len() == rows.len() * vocab {
            dst[rows.start * vocab..rows.end * vocab].copy_from_slice(&logits);
        } else {
            return Err(ModelOutputError::LogitsLength { found: logits.len(), ar, rows: rows.len(), vocab }.into());
        }
        for l in 0..shape.num_layers {
            let present = |what, source| ModelOutputError::Present { layer: l, what, source };
            let (k, v) = outputs.present_kv_mut(l);
            K::present(k, &read(&new_k[l], "present key")?, self.grid(l, 0)).map_err(|e| present("present key", e))?;
            K::present(v, &read(&new_v[l], "present value")?, self.grid(l, 1))
                .map_err(|e| present("present value", e))?;
        }
        profile::lap(t2, profile::CHUNK_OUTPUTS);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn present_values_become_their_codes_and_values_off_the_grid_are_refused() {
        let grid = Grid { scale: 0.0173, zero_point: 128 };
        let values: Vec<f32> = [0u8, 1, 127, 128, 200, 255].iter().map(|&u| decode_u8(u, grid)).collect();
        let mut codes = vec![0u8; values.len()];
        u8::present(&mut codes, &values, Some(grid)).unwrap();
        assert_eq!(codes, [0, 1, 127, 128, 200, 255]);
        for (bad, index) in [(values[2] + 0.001, 2), (f32::NAN, 4), (decode_u8(255, grid) + grid.scale, 5)] {
            let mut off = values.clone();
            off[index] = bad;
            let err = u8::present(&mut codes, &off, Some(grid)).unwrap_err();
            assert!(matches!(err, PresentError::OffGrid { index: i, .. } if i == index), "{bad}: {err}");
        }
        assert_eq!(u8::present(&mut codes, &values, None), Err(PresentError::NoGrid));
        assert!(matches!(u8::past(&Arc::new(codes), None), Err(PresentError::NoGrid)));
    }
}

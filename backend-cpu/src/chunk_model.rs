//! [`CpuChunkModel`]: runs a [`CausalLm`] model file eagerly as the runtime's [`ChunkModel`].
//!
//! The compiled NPU graphs read the whole static cache (`ctx - ar` past columns) and a `[ar, ctx]`
//! mask. Eager shapes are free, so each chunk here receives only the `n_past` valid past columns and
//! the matching mask columns: the same computation without the work on columns the mask excludes.
//! The past is not copied: each layer's keys and values are [`Strided`] views of the runtime's
//! cache buffers, whose rows are `ctx - ar` positions wide, and the attention products read them
//! there (see [`crate::lazy`]).

use crate::executor::{profile, real_values};
use crate::kernels::{run_in_pool, KernelError};
use crate::lazy::Strided;
use mllm_dsl::{BackendRef, CausalLm, DType, F32Buffer, Storage, Tensor, TensorType};
use runtime::{ChunkInputs, ChunkModel, ChunkOutputs, ModelError, ModelLayout};
use std::borrow::Cow;

/// Value of a masked mask entry (uint16 0 dequantized with mllm's mask encoding); 0.0 attends.
const MASKED: f32 = -0.001;

pub struct CpuChunkModel {
    model: Box<dyn CausalLm>,
    backend: BackendRef,
    context_len: usize,
}

impl CpuChunkModel {
    /// `model` must be bound to weights on `backend`'s store.
    pub fn new(model: Box<dyn CausalLm>, backend: BackendRef, context_len: usize) -> Self {
        CpuChunkModel { model, backend, context_len }
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
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ModelOutputError {
    #[error("model output {what} has no real data")]
    NotReal { what: &'static str },
    #[error("model output logits has {found} values; expected {ar} or {rows} rows of {vocab}")]
    LogitsLength { found: usize, ar: usize, rows: usize, vocab: usize },
    #[error("layer {layer}: past {what} of the KV cache: {source}")]
    PastLayout { layer: usize, what: &'static str, source: KernelError },
}

impl ChunkModel for CpuChunkModel {
    type Kv = f32;

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

    fn run_chunk(&mut self, inputs: &ChunkInputs<'_, f32>, outputs: &mut ChunkOutputs<f32>) -> Result<(), ModelError> {
        let t0 = profile::start();
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
            let k = Strided::new(inputs.key_buffer(l).clone().into(), vec![1, kvh, d, n_past], stride, d * stride)
                .map_err(|e| layout("keys", e))?;
            let v = Strided::new(inputs.value_buffer(l).clone().into(), vec![1, kvh, n_past, d], d, stride * d)
                .map_err(|e| layout("values", e))?;
            keys.push(self.past_tensor(k)?);
            values.push(self.past_tensor(v)?);
        }
        let t1 = profile::lap(t0, "chunk: inputs");
        let rows = inputs.logit_rows();
        let model = &self.model;
        let (logits, new_k, new_v) =
            run_in_pool(|| model.forward_rows(&ids, &pos, &mask, &keys, &values, rows.clone()))?;
        let t2 = profile::lap(t1, "(chunk: model forward, ops included)");
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
            let (k, v) = outputs.present_kv_mut(l);
            k.copy_from_slice(&read(&new_k[l], "present key")?);
            v.copy_from_slice(&read(&new_v[l], "present value")?);
        }
        profile::lap(t2, "chunk: outputs");
        Ok(())
    }
}

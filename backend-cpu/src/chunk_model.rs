//! [`CpuChunkModel`]: runs a [`CausalLm`] model file eagerly as the runtime's [`ChunkModel`].
//!
//! The compiled NPU graphs read the whole static cache (`ctx - ar` past columns) and a `[ar, ctx]`
//! mask. Eager shapes are free, so each chunk here receives only the `n_past` valid past columns and
//! the matching mask columns: the same computation without the work on columns the mask excludes.

use mllm_dsl::runtime::{ChunkInputs, ChunkModel, ChunkOutputs, ModelError, ModelLayout};
use mllm_dsl::{BackendRef, CausalLm, DType, Storage, Tensor, TensorType};

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
        Tensor::from_storage(TensorType::new(shape, dtype), Storage::F32(data.into()), self.backend.clone())
    }
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
        }
    }

    fn supports_chunk_len(&self, ar: usize) -> bool {
        ar >= 1 && ar < self.context_len
    }

    fn run_chunk(&mut self, inputs: &ChunkInputs<'_, f32>, outputs: &mut ChunkOutputs<f32>) -> Result<(), ModelError> {
        let shape = self.model.shape();
        let (ar, n_past, ctx) = (inputs.ar(), inputs.n_past(), self.context_len);
        let (kvh, d) = (shape.num_kv_heads, shape.head_dim);
        let stride = ctx - ar;
        let ids: Vec<i64> = inputs.ids().iter().map(|&i| i as i64).collect();
        let pos: Vec<i64> = inputs.positions().iter().map(|&p| p as i64).collect();
        let ids = Tensor::from_i64(ids, vec![1, ar], DType::I32, self.backend.clone())?;
        let pos = Tensor::from_i64(pos, vec![ar], DType::I32, self.backend.clone())?;
        // Mask [1, 1, ar, n_past + ar]: the valid past columns, then the chunk's own columns.
        let m = inputs.mask();
        let mut mask = Vec::with_capacity(ar * (n_past + ar));
        for row in 0..ar {
            let cols = (0..n_past).chain(stride..stride + ar);
            mask.extend(cols.map(|c| if m.attends(row, c) { 0.0 } else { MASKED }));
        }
        let mask = self.tensor(mask, vec![1, 1, ar, n_past + ar], DType::F32)?;
        let (mut keys, mut values) = (Vec::new(), Vec::new());
        for l in 0..shape.num_layers {
            let (pk, pv) = (inputs.past_key(l), inputs.past_value(l));
            // K rows (kv head, dim) hold one column per position; V heads hold one row per position.
            let k: Vec<f32> = (0..kvh * d).flat_map(|r| pk[r * stride..r * stride + n_past].iter().copied()).collect();
            let v: Vec<f32> =
                (0..kvh).flat_map(|h| pv[h * stride * d..(h * stride + n_past) * d].iter().copied()).collect();
            keys.push(self.tensor(k, vec![1, kvh, d, n_past], DType::U8Sym)?);
            values.push(self.tensor(v, vec![1, kvh, n_past, d], DType::U8Sym)?);
        }
        let (logits, new_k, new_v) = self.model.forward(&ids, &pos, &mask, &keys, &values)?;
        let read = |t: &Tensor, what: &str| -> Result<Vec<f32>, ModelError> {
            t.as_f32().map(|s| s.to_vec()).ok_or_else(|| format!("model output {what} has no f32 data").into())
        };
        outputs.logits_mut().copy_from_slice(&read(&logits, "logits")?);
        for l in 0..shape.num_layers {
            let (k, v) = outputs.present_kv_mut(l);
            k.copy_from_slice(new_k[l].as_f32().ok_or("present key has no f32 data")?);
            v.copy_from_slice(new_v[l].as_f32().ok_or("present value has no f32 data")?);
        }
        Ok(())
    }
}

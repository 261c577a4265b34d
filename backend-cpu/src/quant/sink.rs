//! The attention-sink prefix: a few fixed tokens (SmolLM2's `<|endoftext|>`) whose K/V every
//! run starts from, computed once by the float model at positions `0..P`.
//!
//! Why: a trained Llama puts a massive activation (SmolLM2: |x| ≈ 26,000 from layer 11 on, 100×
//! every other token) on whatever token sits at position 0 — the attention sink. Per-tensor u16
//! ranges calibrated over it leave every other token a few bits. With the sink's K/V given as
//! past, text starts at position `P` and no quantized activation ever holds the sink, so the
//! ranges shrink ~50× (PrefixQuant, Chen et al. 2024; measured in docs/ledger.md).
//!
//! A quantized checkpoint ships its prefix beside it, in [`SINK_PREFIX_FILE`] (pymllm's
//! `model.safetensors` stays as it was), with the K/V already rounded to the checkpoint's K/V QDQ
//! grid ([`SinkPrefix::on_kv_grid`]): the fake-quant model, the reference interpreter and the
//! NPU's u8 cache then hold the same values. Float models compute their own
//! ([`SinkPrefix::compute`]).

use std::collections::BTreeMap;
use std::path::Path;

use checkpoint::{write_safetensors_atomic, SafetensorsCheckpoint, StDtype};
use compiler::quant::{dequantize, FakeQuantizer, QuantParams};
use mllm_dsl::{BackendRef, CausalLm, DType, Storage, Tensor, TensorType};
use runtime::KvPrefix;

use super::error::QuantizationError;
use crate::executor::real_values;

/// The prefix's file inside a quantized checkpoint directory.
pub const SINK_PREFIX_FILE: &str = "sink_prefix.safetensors";

/// K/V of the prefix tokens, per layer: K `[Hkv, D, P]`, V `[Hkv, P, D]` (the cache layout).
#[derive(Clone, Debug, PartialEq)]
pub struct SinkPrefix {
    /// The prefix's token ids, at positions `0..P`.
    pub ids: Vec<i64>,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub keys: Vec<Vec<f32>>,
    pub values: Vec<Vec<f32>>,
}

fn bad(what: impl Into<String>) -> QuantizationError {
    QuantizationError::Report(what.into())
}

impl SinkPrefix {
    /// `ids` run through `model` (float: its activations must not be quantized, or the sink's
    /// massive activation is clipped) from position 0 with no past; the K/V it leaves.
    pub fn compute(model: &dyn CausalLm, backend: &BackendRef, ids: &[i64]) -> Result<SinkPrefix, QuantizationError> {
        if ids.is_empty() {
            return Err(bad("an attention-sink prefix needs at least one token"));
        }
        let n = ids.len();
        let (_, (keys, values)) = super::prefill::prefill(model, backend, None, ids, n..n)?;
        let read = |t: &Tensor, what: &str| {
            real_values(t).map(|v| v.into_owned()).ok_or_else(|| bad(format!("the prefix's {what} holds no real data")))
        };
        let shape = model.shape();
        Ok(SinkPrefix {
            ids: ids.to_vec(),
            kv_heads: shape.num_kv_heads,
            head_dim: shape.head_dim,
            keys: keys.iter().map(|k| read(k, "present key")).collect::<Result<_, _>>()?,
            values: values.iter().map(|v| read(v, "present value")).collect::<Result<_, _>>()?,
        })
    }

    /// Prefix tokens (`P`): the text starts at position `P`.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// Always false: a prefix has at least one token.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    pub fn num_layers(&self) -> usize {
        self.keys.len()
    }

    /// The same prefix with every K and V value fake-quantized by its layer's K/V QDQ parameters
    /// (u8, zero point 128: what the fake-quant model's cache holds and the NPU's cache stores);
    /// values beyond the grid's range are clamped, and how many were is returned beside it.
    pub fn on_kv_grid(
        &self,
        key_params: &[QuantParams],
        value_params: &[QuantParams],
    ) -> Result<(SinkPrefix, usize), QuantizationError> {
        let layers = self.num_layers();
        if key_params.len() != layers || value_params.len() != layers {
            return Err(bad(format!(
                "the prefix has {layers} layers, the K/V QDQ parameters {} and {}",
                key_params.len(),
                value_params.len()
            )));
        }
        let mut clamped = 0;
        let mut round = |data: &[f32], params: &QuantParams| -> Vec<f32> {
            let fq = FakeQuantizer::new(params);
            let half = params.scale / 2.0;
            let (lo, hi) = (dequantize(params.qmin, params) - half, dequantize(params.qmax, params) + half);
            clamped += data.iter().filter(|&&v| v < lo || v > hi).count();
            data.iter().map(|&v| fq.fake(v)).collect()
        };
        let keys = self.keys.iter().zip(key_params).map(|(k, p)| round(k, p)).collect();
        let values = self.values.iter().zip(value_params).map(|(v, p)| round(v, p)).collect();
        Ok((SinkPrefix { keys, values, ..self.clone() }, clamped))
    }

    /// The prefix in the runtime's form, to start every sequence of a CPU generator from.
    pub fn into_kv_prefix(self) -> KvPrefix<f32> {
        KvPrefix { len: self.len(), keys: self.keys, values: self.values }
    }

    /// The past K and V tensors a model's `forward` takes: `[1, Hkv, D, P]` and `[1, Hkv, P, D]`
    /// per layer, f32 values of the K/V cache's type.
    pub fn past_tensors(&self, backend: &BackendRef) -> Result<(Vec<Tensor>, Vec<Tensor>), QuantizationError> {
        let (h, d, p) = (self.kv_heads, self.head_dim, self.len());
        let t = |data: &[f32], dims: Vec<usize>| {
            Tensor::from_storage(
                TensorType::new(dims, DType::U8Sym),
                Storage::F32(data.to_vec().into()),
                backend.clone(),
            )
        };
        let keys = self.keys.iter().map(|k| t(k, vec![1, h, d, p])).collect::<Result<Vec<_>, _>>()?;
        let values = self.values.iter().map(|v| t(v, vec![1, h, p, d])).collect::<Result<Vec<_>, _>>()?;
        Ok((keys, values))
    }

    /// Checks the prefix fits a model of this shape.
    pub fn check_fits(&self, model: &dyn CausalLm) -> Result<(), QuantizationError> {
        let s = model.shape();
        if (self.num_layers(), self.kv_heads, self.head_dim) != (s.num_layers, s.num_kv_heads, s.head_dim) {
            return Err(bad(format!(
                "the attention-sink prefix holds K/V of {} layers x {} heads x {} dims, the model has {} x {} x {}",
                self.num_layers(),
                self.kv_heads,
                self.head_dim,
                s.num_layers,
                s.num_kv_heads,
                s.head_dim
            )));
        }
        Ok(())
    }

    /// Writes the prefix as `dir/`[`SINK_PREFIX_FILE`] (atomically).
    pub fn save(&self, dir: &Path) -> Result<(), QuantizationError> {
        let (h, d, p) = (self.kv_heads, self.head_dim, self.len());
        let names: Vec<(String, String)> =
            (0..self.num_layers()).map(|l| (format!("layers.{l}.key"), format!("layers.{l}.value"))).collect();
        let ids: Vec<u8> = self.ids.iter().flat_map(|i| i.to_le_bytes()).collect();
        let bytes = |v: &[f32]| -> Vec<u8> { v.iter().flat_map(|x| x.to_le_bytes()).collect() };
        let kv: Vec<(Vec<u8>, Vec<u8>)> =
            self.keys.iter().zip(&self.values).map(|(k, v)| (bytes(k), bytes(v))).collect();
        let (id_shape, k_shape, v_shape) = ([p], [h, d, p], [h, p, d]);
        let mut tensors = vec![("ids", StDtype::I64, &id_shape[..], &ids[..])];
        for ((kn, vn), (k, v)) in names.iter().zip(&kv) {
            tensors.push((kn, StDtype::F32, &k_shape[..], k));
            tensors.push((vn, StDtype::F32, &v_shape[..], v));
        }
        let metadata = BTreeMap::from([(
            "description".to_string(),
            "attention-sink prefix: K/V of `ids` at positions 0..P per layer, K [Hkv, D, P], V [Hkv, P, D]".to_string(),
        )]);
        Ok(write_safetensors_atomic(dir.join(SINK_PREFIX_FILE), &tensors, &metadata)?)
    }

    /// The prefix a quantized checkpoint directory ships, if it has one. Every problem with the
    /// file is an error naming it.
    pub fn load_beside(dir: &Path) -> Result<Option<SinkPrefix>, QuantizationError> {
        let path = dir.join(SINK_PREFIX_FILE);
        if !path.exists() {
            return Ok(None);
        }
        Self::read(&path).map(Some).map_err(|e| bad(format!("{}: {e}", path.display())))
    }

    fn read(path: &Path) -> Result<SinkPrefix, QuantizationError> {
        let file = SafetensorsCheckpoint::open_file(path)?;
        let shape = |key: &str| -> Result<Vec<usize>, QuantizationError> { Ok(file.info(key)?.1.to_vec()) };
        let id_shape = shape("ids")?;
        let ids: Vec<i64> = file.read_i64("ids")?;
        if id_shape.len() != 1 || ids.is_empty() {
            return Err(bad(format!("`ids` must be a non-empty vector, found shape {id_shape:?}")));
        }
        let p = ids.len();
        let (mut keys, mut values, mut dims) = (Vec::new(), Vec::new(), None);
        while file.contains(&format!("layers.{}.key", keys.len())) {
            let l = keys.len();
            let (kn, vn) = (format!("layers.{l}.key"), format!("layers.{l}.value"));
            let (ks, vs) = (shape(&kn)?, shape(&vn)?);
            let [h, d, kp] = ks[..] else {
                return Err(bad(format!("`{kn}` must be [Hkv, D, P], found {ks:?}")));
            };
            if kp != p || vs != [h, p, d] || dims.is_some_and(|hd| hd != (h, d)) {
                return Err(bad(format!("`{kn}` {ks:?} and `{vn}` {vs:?} do not fit {p} prefix tokens")));
            }
            dims = Some((h, d));
            keys.push(file.read_float_param(&kn)?);
            values.push(file.read_float_param(&vn)?);
        }
        let Some((kv_heads, head_dim)) = dims else {
            return Err(bad("holds no `layers.0.key`"));
        };
        if let Some(extra) = file.unused_keys().first() {
            return Err(bad(format!("unexpected tensor `{extra}`")));
        }
        Ok(SinkPrefix { ids, kv_heads, head_dim, keys, values })
    }
}

//! Fixed graph inputs for the per-graph ledger stages, and the three runs that consume them: the
//! eager fake-quant model, backend-cpu's IR interpreter and backend-qnn's reference interpreter.

use crate::error::{ensure, Context, Result};
use backend_qnn::interp::TensorValue;
use backend_qnn::QnnGraph;
use mllm_dsl::config::hf::HfConfig;
use mllm_dsl::passes::QuantParamProvider;
use mllm_dsl::runtime::{dequantize_mask_value, MASK_ATTEND, MASK_MASKED};
use mllm_dsl::{BackendRef, CausalLm, DType, Storage, Tensor, TensorType};
use models::io::{kv_qdq, KvCache};
use models::TransformerConfig;

/// Valid past tokens in the K/V cache of the ledger's probe inputs (fewer when the graph has less).
pub const PROBE_PAST: usize = 8;

/// Fixed graph inputs for the per-graph ledger stages, on the quantization grid of the graph
/// inputs: deterministic token ids, positions after `past` valid cache entries, the causal mask
/// over them (u16 codes: 65535 attends, 0 is masked) and past K/V u8 codes near the middle of the
/// range (as real K/V are), for every layer.
pub(crate) struct Probe {
    chunk: usize,
    context: usize,
    past: usize,
    ids: Vec<i64>,
    positions: Vec<i64>,
    mask_codes: Vec<u16>,
    /// `past_key_0.., past_value_0..` codes; K `[1, Hkv, D, context - chunk]`, V `[1, Hkv, context - chunk, D]`.
    kv_codes: Vec<Vec<u8>>,
    /// The scale of each K/V input's codes (zero point 128).
    kv_scales: Vec<f32>,
    kv_heads: usize,
    head_dim: usize,
}

impl Probe {
    pub(crate) fn new(hf: &HfConfig, params: &dyn QuantParamProvider, chunk: usize, context: usize) -> Result<Probe> {
        let cfg = TransformerConfig::from_hf(hf, context);
        let cache = context - chunk;
        let past = PROBE_PAST.min(cache);
        let mut seed = 0x2545_f491u32;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 17;
            seed ^= seed << 5;
            seed
        };
        // Ids from 3 up: the tiny vocabularies' 0..2 are special tokens.
        let low = 3.min(hf.vocab_size as u32 - 1);
        let ids = (0..chunk).map(|_| i64::from(low + next() % (hf.vocab_size as u32 - low))).collect();
        let positions = (past..past + chunk).map(|p| p as i64).collect();
        let mut mask_codes = Vec::with_capacity(chunk * context);
        for row in 0..chunk {
            for col in 0..context {
                let attend = col < past || (col >= cache && col - cache <= row);
                mask_codes.push(if attend { MASK_ATTEND } else { MASK_MASKED });
            }
        }
        let (kvh, d, l) = (cfg.num_key_value_heads, cfg.head_dim, cfg.num_hidden_layers);
        let mut kv_codes = Vec::with_capacity(2 * l);
        let mut kv_scales = Vec::with_capacity(2 * l);
        for which in [KvCache::Key, KvCache::Value] {
            for layer in 0..l {
                kv_scales.push(params.scalar_f32(&kv_qdq(layer, which).scale_key())?);
                kv_codes.push((0..kvh * d * cache).map(|_| (96 + next() % 64) as u8).collect());
            }
        }
        Ok(Probe { chunk, context, past, ids, positions, mask_codes, kv_codes, kv_scales, kv_heads: kvh, head_dim: d })
    }

    pub(crate) fn describe(&self, what: &str) -> String {
        format!(
            "{what}; {} deterministic ids at positions {}.., {} valid past K/V entries of {}",
            self.chunk,
            self.past,
            self.past,
            self.context - self.chunk
        )
    }

    /// The inputs as real-valued tensors on `backend` (what the codes mean).
    pub(crate) fn cpu_inputs(&self, backend: &BackendRef) -> Result<Vec<Tensor>> {
        let (chunk, cache, kvh, d) = (self.chunk, self.context - self.chunk, self.kv_heads, self.head_dim);
        let t = |data: Vec<f32>, shape: Vec<usize>, dtype: DType| {
            Tensor::from_storage(TensorType::new(shape, dtype), Storage::F32(data.into()), backend.clone())
        };
        let mask = self.mask_codes.iter().map(|&c| dequantize_mask_value(c)).collect();
        let mut inputs = vec![
            Tensor::from_i64(self.ids.clone(), vec![1, chunk], DType::I32, backend.clone())?,
            Tensor::from_i64(self.positions.clone(), vec![chunk], DType::I32, backend.clone())?,
            t(mask, vec![1, 1, chunk, self.context], DType::F32)?,
        ];
        let layers = self.kv_codes.len() / 2;
        for (i, (codes, &scale)) in self.kv_codes.iter().zip(&self.kv_scales).enumerate() {
            let data = codes.iter().map(|&c| (i32::from(c) - 128) as f32 * scale).collect();
            let shape = if i < layers { vec![1, kvh, d, cache] } else { vec![1, kvh, cache, d] };
            inputs.push(t(data, shape, DType::U8Sym)?);
        }
        Ok(inputs)
    }

    /// The eager model in fake-quant mode (`model` on its fake-quant `backend`) on these inputs:
    /// its logits.
    pub(crate) fn run_eager(&self, model: &dyn CausalLm, backend: &BackendRef) -> Result<Vec<f32>> {
        let x = self.cpu_inputs(backend)?;
        let (logits, _, _) = model.forward_graph(&x).context("eager fake-quant run")?;
        Ok(logits.as_f32().context("eager logits hold no f32 data")?.to_vec())
    }

    /// The graph inputs as values of `graph`'s input tensors (codes in their encodings).
    pub(crate) fn qnn_inputs(&self, graph: &QnnGraph) -> Result<Vec<TensorValue>> {
        let mut codes: Vec<Vec<i64>> =
            vec![self.ids.clone(), self.positions.clone(), self.mask_codes.iter().map(|&c| i64::from(c)).collect()];
        codes.extend(self.kv_codes.iter().map(|c| c.iter().map(|&v| i64::from(v)).collect()));
        ensure!(
            codes.len() == graph.inputs.len(),
            "graph `{}` has {} inputs, the probe has {}",
            graph.name,
            graph.inputs.len(),
            codes.len()
        );
        graph
            .inputs
            .iter()
            .zip(codes)
            .map(|(name, codes)| {
                let meta = graph.tensor(name).with_context(|| format!("graph input `{name}` has no tensor"))?;
                TensorValue::from_codes(meta, codes).with_context(|| format!("graph input `{name}`"))
            })
            .collect()
    }

    /// backend-qnn's reference interpreter on the lowered graph: its logits (graph output 0).
    pub(crate) fn run_qnn(&self, graph: &QnnGraph) -> Result<Vec<f32>> {
        let interp = backend_qnn::interp::Interpreter::new(graph)
            .with_context(|| format!("preparing graph `{}` for the reference interpreter", graph.name))?;
        let outputs =
            interp.run(&self.qnn_inputs(graph)?).with_context(|| format!("running graph `{}`", graph.name))?;
        let logits = outputs.first().context("the graph has no outputs")?;
        Ok(logits.to_real()?)
    }
}

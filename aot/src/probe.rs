//! Real graph inputs for the per-graph ledger stages, and the three runs that consume them: the
//! eager fake-quant model, backend-cpu's IR interpreter and backend-qnn's reference interpreter.
//!
//! A probe is one chunk of real text as a compiled graph sees it in the middle of a prompt: the
//! chunk's token ids at their positions, the runtime's attention mask, and a K/V cache holding
//! what the eager fake-quant model's own prefill of the preceding text produced, as u8 codes of
//! the graph's K/V input encodings — after the checkpoint's attention-sink prefix in the first
//! columns, when it ships one.

use crate::error::{ensure, Context, Result};
use backend_cpu::executor::real_values;
use backend_cpu::quant::{prefill, QuantizationError, SinkPrefix};
use backend_qnn::interp::TensorValue;
use backend_qnn::QnnGraph;
use compiler::passes::QuantParamProvider;
use compiler::quant::{FakeQuantizer, QuantParams};
use mllm_dsl::{BackendRef, CausalLm, DType, Storage, Tensor, TensorType};
use models::hf::HfConfig;
use models::io::{kv_qdq, KvCache};
use models::TransformerConfig;
use runtime::{dequantize_mask_value, AttentionMask};

/// Tokens of the probe text a probe uses at most: the chunk and the past before it.
pub const PROBE_WINDOW: usize = 128;

/// Token ids the probes are cut from, and where they came from (for the ledger's details).
#[derive(Clone, Debug)]
pub struct ProbeText {
    pub ids: Vec<i64>,
    pub source: String,
}

impl ProbeText {
    /// Deterministic ids from 3 up (the tiny vocabularies' 0..2 are special tokens), when no text
    /// is at hand (a quantized checkpoint without reference inputs).
    pub fn deterministic(vocab_size: usize) -> ProbeText {
        let mut seed = 0x2545_f491u32;
        let low = 3.min(vocab_size as u32 - 1);
        let ids = (0..PROBE_WINDOW)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 17;
                seed ^= seed << 5;
                i64::from(low + seed % (vocab_size as u32 - low))
            })
            .collect();
        ProbeText { ids, source: "deterministic pseudo-random ids (no text given)".into() }
    }
}

/// One chunk's graph inputs, on the quantization grid of the graph inputs.
pub(crate) struct Probe {
    chunk: usize,
    context: usize,
    /// Valid past tokens in the cache (columns `0..past`, the prefix's first); the chunk starts
    /// at position `past`.
    past: usize,
    /// Attention-sink prefix tokens in the first cache columns (0 without a prefix).
    prefix: usize,
    /// Rows of the chunk holding text (the rest is zero padding, as the runtime pads).
    rows: usize,
    source: String,
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
    /// The probe of a `chunk`-token graph at `context`: the chunk is text tokens `t..t + rows`
    /// of the first [`PROBE_WINDOW`] tokens of `text` (the last `chunk` of them, or all but the
    /// first when the text is shorter), and the cache holds `prefix` (the checkpoint's
    /// attention-sink prefix, `P` columns) then the K/V `model` (the eager fake-quant model on
    /// `backend`) computes when it prefills text tokens `0..t` after it.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        hf: &HfConfig,
        params: &dyn QuantParamProvider,
        chunk: usize,
        context: usize,
        text: &ProbeText,
        model: &dyn CausalLm,
        backend: &BackendRef,
        prefix: Option<&SinkPrefix>,
    ) -> Result<Probe> {
        ensure!(!text.ids.is_empty(), "the probe text ({}) has no tokens", text.source);
        let cfg = TransformerConfig::from_hf(hf, context);
        let cache = context - chunk;
        let n_prefix = prefix.map_or(0, SinkPrefix::len);
        ensure!(
            n_prefix < cache,
            "the attention-sink prefix's {n_prefix} tokens leave no cache column for text in a {chunk}-token graph \
             at context {context}"
        );
        let window = text.ids.len().min(PROBE_WINDOW);
        // At least one token before the chunk when the text has two, so the chunk attends a past.
        let rows = chunk.min(window.saturating_sub(1)).max(1);
        let text_past = (window - rows).min(cache - n_prefix);
        let past = n_prefix + text_past;
        let mut ids = text.ids[text_past..text_past + rows].to_vec();
        ids.resize(chunk, 0);
        let positions = (past..past + chunk).map(|p| p as i64).collect();
        let mut mask = AttentionMask::with_sliding_window(context, cfg.sliding_window).context("probe mask")?;
        mask.init(chunk, past).context("probe mask")?;

        let (kvh, d, l) = (cfg.num_key_value_heads, cfg.head_dim, cfg.num_hidden_layers);
        let (keys, values) = prefill_kv(model, backend, prefix, &text.ids[..text_past])?;
        let mut kv_codes = Vec::with_capacity(2 * l);
        let mut kv_scales = Vec::with_capacity(2 * l);
        for (which, text_kv) in [(KvCache::Key, &keys), (KvCache::Value, &values)] {
            for layer in 0..l {
                let key = kv_qdq(layer, which).scale_key();
                let scale = params.scalar_f32(&key)?;
                let kv = QuantParams::kv_u8(scale).map_err(|source| QuantizationError::Quant { key, source })?;
                let fq = FakeQuantizer::new(&kv);
                let prefix_kv = prefix.map(|p| match which {
                    KvCache::Key => p.keys[layer].as_slice(),
                    KvCache::Value => p.values[layer].as_slice(),
                });
                let text_kv = text_kv.get(layer).map(Vec::as_slice);
                // Unused cache columns hold real zero (masked anyway). K `[Hkv, D, cols]` goes into
                // rows of `cache` columns, V `[Hkv, cols, D]` into heads of `cache` rows of `D`: the
                // prefix's columns first, then the text's.
                let width = if which == KvCache::Key { 1 } else { d };
                let mut codes = vec![128u8; kvh * d * cache];
                let mut at = 0;
                for (src, cols) in [(prefix_kv, n_prefix), (text_kv, text_past)] {
                    let Some(src) = src.filter(|_| cols > 0) else { continue };
                    let (row, stride) = (cols * width, cache * width);
                    for (dst, src) in codes.chunks_exact_mut(stride).zip(src.chunks_exact(row)) {
                        let dst = &mut dst[at * width..at * width + row];
                        dst.iter_mut().zip(src).for_each(|(q, &v)| *q = fq.code(v) as u8);
                    }
                    at += cols;
                }
                kv_scales.push(scale);
                kv_codes.push(codes);
            }
        }
        Ok(Probe {
            chunk,
            context,
            past,
            rows,
            source: text.source.clone(),
            prefix: n_prefix,
            ids,
            positions,
            mask_codes: mask.to_u16(),
            kv_codes,
            kv_scales,
            kv_heads: kvh,
            head_dim: d,
        })
    }

    pub(crate) fn describe(&self, what: &str) -> String {
        let text_past = self.past - self.prefix;
        let prefix = match self.prefix {
            0 => String::new(),
            p => format!(" after the {p}-token attention-sink prefix,"),
        };
        format!(
            "{what}; tokens {}..{} of {} ({} of {} rows), after the eager fake-quant prefill of the {} tokens before \
             them as past K/V ({} cache columns;{prefix} positions from {})",
            text_past,
            text_past + self.rows,
            self.source,
            self.rows,
            self.chunk,
            text_past,
            self.context - self.chunk,
            self.past
        )
    }

    /// The logits of the text rows (padding rows dropped) of a `[.., chunk, vocab]` output.
    pub(crate) fn text_rows<'a>(&self, logits: &'a [f32]) -> &'a [f32] {
        let vocab = logits.len() / self.chunk;
        &logits[..self.rows * vocab]
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
            t(mask, vec![1, self.mask_codes.len() / (chunk * self.context), chunk, self.context], DType::F32)?,
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

/// Per layer, real K or V values.
type LayerValues = Vec<Vec<f32>>;

/// Per layer, the K `[Hkv, D, n]` and V `[Hkv, n, D]` the model computes when it prefills `ids`
/// after `prefix` (from position 0 with an empty cache without one, as the CPU runtime's first
/// chunk does); none for no ids.
fn prefill_kv(
    model: &dyn CausalLm,
    backend: &BackendRef,
    prefix: Option<&SinkPrefix>,
    ids: &[i64],
) -> Result<(LayerValues, LayerValues)> {
    let n = ids.len();
    if n == 0 {
        return Ok((Vec::new(), Vec::new()));
    }
    let (_, (keys, values)) = prefill(model, backend, prefix, ids, n..n)
        .with_context(|| format!("eager fake-quant prefill of the {n} probe tokens before the chunk"))?;
    let read = |t: &Tensor, what: &str| -> Result<Vec<f32>> {
        Ok(real_values(t).with_context(|| format!("the prefill's {what} holds no real data"))?.into_owned())
    };
    let keys = keys.iter().map(|k| read(k, "present key")).collect::<Result<Vec<_>>>()?;
    let values = values.iter().map(|v| read(v, "present value")).collect::<Result<Vec<_>>>()?;
    Ok((keys, values))
}

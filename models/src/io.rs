//! The graph I/O contract shared by the decoder models (mllm's MarkTensorIOPass), positional:
//! inputs `ids i32 [1, S]`, `positions i32 [S]`, `mask [1, P, S, ctx]` (P = 2 planes, full and
//! sliding window, for a model with sliding-window layers, else 1), `past_key_0..L-1
//! [1, Hkv, D, ctx-S]`, `past_value_0..L-1 [1, Hkv, ctx-S, D]`; outputs `logits [1, 1, S, V]`,
//! `present_key_l [1, Hkv, D, S]`, `present_value_l [1, Hkv, S, D]`.

use crate::config::TransformerConfig;
use mllm_dsl::causal_lm::{MASK_SCALE, MASK_ZERO_POINT};
use mllm_dsl::{DType, ParamFormat, QdqAttr, QdqKind, TraceInput};

/// Trace inputs for one chunk size. In the QNN form the mask is uint16 with its compile-time QDQ,
/// and each past K/V carries its layer's KV QDQ, as mllm's `makeTraceInputs` attaches them.
pub fn trace_inputs(cfg: &TransformerConfig, chunk: usize, context: usize, format: ParamFormat) -> Vec<TraceInput> {
    let (kvh, d, past) = (cfg.num_key_value_heads, cfg.head_dim, context - chunk);
    let mask_dtype = match format {
        ParamFormat::Float => DType::F32,
        ParamFormat::QnnW4A16 => DType::U16Asym,
    };
    let mut inputs = vec![
        TraceInput::new("input_ids", [1, chunk], DType::I32),
        TraceInput::new("position_ids", [chunk], DType::I32),
        TraceInput::new("causal_mask", [1, cfg.decoder_shape().mask_planes(), chunk, context], mask_dtype).with_qdq(
            QdqAttr {
                kind: QdqKind::Global { scale: MASK_SCALE, zero_point: MASK_ZERO_POINT },
                key: "causal_mask".into(),
            },
        ),
    ];
    for l in 0..cfg.num_hidden_layers {
        let input = TraceInput::new(format!("past_key_{l}"), [1, kvh, d, past], DType::U8Sym);
        inputs.push(input.with_qdq(kv_qdq(l, KvCache::Key)));
    }
    for l in 0..cfg.num_hidden_layers {
        let input = TraceInput::new(format!("past_value_{l}"), [1, kvh, past, d], DType::U8Sym);
        inputs.push(input.with_qdq(kv_qdq(l, KvCache::Value)));
    }
    inputs
}

/// The K or the V cache of a layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvCache {
    Key,
    Value,
}

/// The QDQ point of layer `layer`'s K or V cache, keyed as mllm names it (the uint8 cast in the
/// attention block, `model.layers.<l>.self_attn.{k,v}_cast_to_int8_qdq`); its parameters are
/// `<key>.fake_quant.scale` / `.zero_point` ([`QdqAttr::scale_key`]).
pub fn kv_qdq(layer: usize, which: KvCache) -> QdqAttr {
    let which = match which {
        KvCache::Key => "k",
        KvCache::Value => "v",
    };
    QdqAttr { kind: QdqKind::KvCache, key: format!("model.layers.{layer}.self_attn.{which}_cast_to_int8_qdq") }
}

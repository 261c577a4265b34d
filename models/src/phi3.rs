//! Phi-3 (`Phi3ForCausalLM`): Llama's layer with fused projections, `qkv_proj` (q | k | v along
//! the output features) and `gate_up_proj` ([`FusedMlp`]: gate | up). With `sliding_window` in
//! its config every layer attends through the window (mask plane 1), as transformers' Phi-3 does.
//!
//! Phi-3 has no mllm file; its QDQ points are named the way mllm names Llama's (`<op>_input_qdq`,
//! `<op>_output_qdq`): the fused projection's output is quantized once, before the split.

use crate::blocks::{attend, cache_kv_of_int16, rope_qk, split_heads, FusedMlp};
use crate::config::TransformerConfig;
use crate::decoder::{AttentionInputs, CausalLmOf, DecoderAttention, LayerOf, LayerOutputs, ModelOf};
use crate::Family;
use mllm_dsl::prelude::*;

pub type Phi3Mlp = FusedMlp;
pub type Phi3DecoderLayer = LayerOf<Phi3Attention, Phi3Mlp>;
pub type Phi3Model = ModelOf<Phi3DecoderLayer>;
pub type Phi3ForCausalLM = CausalLmOf<Phi3DecoderLayer>;

/// `model_type: "phi3"`.
pub const FAMILY: Family = Family { model_types: &["phi3"], build: |cfg| Ok(Box::new(Phi3ForCausalLM::new(cfg))) };

#[module]
pub struct Phi3Attention {
    qkv_proj: Conv2d,
    o_proj: Conv2d,
    hidden: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
}

#[module]
impl DecoderAttention for Phi3Attention {
    fn new(cfg: &TransformerConfig) -> Self {
        let (h, d) = (cfg.hidden_size, cfg.head_dim);
        let (nh, nkv) = (cfg.num_attention_heads, cfg.num_key_value_heads);
        Phi3Attention {
            qkv_proj: Conv2d::new(h, (nh + 2 * nkv) * d),
            o_proj: Conv2d::new(nh * d, h),
            hidden: h,
            heads: nh,
            kv_heads: nkv,
            head_dim: d,
        }
    }

    /// `x [1, S, H]` → `(y [1, S, H], new K [1, Hkv, D, S], new V [1, Hkv, S, D])`.
    fn forward(&self, x: &Tensor, inputs: &AttentionInputs<'_>) -> Result<LayerOutputs> {
        let (h, d) = (self.hidden as i64, self.head_dim);
        let (q_width, kv_width) = (self.heads * d, self.kv_heads * d);
        // 1. the fused projection on NHWC [1, 1, S, H] -> [1, 1, S, (H + 2 Hkv) * D], quantized once
        let x = qdq!(x, "qkv_proj_input_qdq")?.view(&[1, 1, -1, h])?;
        let qkv = qdq!(self.qkv_proj.forward(&x)?, "qkv_proj_output_qdq")?;
        // 2. q | k | v along the features, then heads: [1, 1, S, n*D] -> [1, n, S, D]
        let q = split_heads(&qkv.slice(-1, 0, q_width)?, self.heads, d)?;
        let k = split_heads(&qkv.slice(-1, q_width, q_width + kv_width)?, self.kv_heads, d)?;
        let v = split_heads(&qkv.slice(-1, q_width + kv_width, q_width + 2 * kv_width)?, self.kv_heads, d)?;
        // 3. RoPE, new K/V in the uint8 cache layout (v keeps the fused output's int16 encoding),
        //    masked attention over past ++ new
        let (q, k) = rope_qk(&q, &k, inputs)?;
        let (k, v) = cache_kv_of_int16(&k, &v)?;
        let y = attend(&q, &k, &v, inputs)?;
        // 4. o_proj: NHWC [1, 1, S, H*D] -> [1, S, hidden]
        let y = self.o_proj.forward(&y)?.view(&[1, -1, h])?;
        Ok((y, k, v))
    }
}

//! Llama (2 and 3) in mllm's QNN-AOT form (`examples/llama_qnn_aot/modeling_llama_qnn_aot.hpp`);
//! Qwen2 ([`crate::qwen2`]) is this attention with q/k/v biases.
//!
//! Llama's attention has no q/k norm: the q and k projections' outputs get a QDQ point each
//! (`q_proj_output_qdq`, `k_proj_output_qdq`) and go straight to RoPE. The rest is shared with the
//! other model files ([`crate::blocks`], [`crate::decoder`]). Llama 3's `rope_theta` (500000) and its
//! optional `rope_scaling` of type `llama3` only change the RoPE tables, which come from
//! [`TransformerConfig::rope_inv_freq`] (HF's formula, in `HfConfig::rope_inv_freq`).
//!
//! Every `qdq!` carries mllm's exact name, so the keys match pymllm's checkpoints.

use crate::blocks::{attend, cache_kv, rope_qk, split_heads, Mlp};
use crate::config::TransformerConfig;
use crate::decoder::{AttentionInputs, DecoderAttention, DecoderForCausalLM, DecoderLayer, DecoderModel, LayerOutputs};
use mllm_dsl::prelude::*;

pub type LlamaMlp = Mlp;
pub type LlamaDecoderLayer = DecoderLayer<LlamaAttention>;
pub type LlamaModel = DecoderModel<LlamaAttention>;
/// `model_type: "llama"`.
pub const FAMILY: crate::Family =
    crate::Family { model_types: &["llama"], build: |cfg| Ok(Box::new(LlamaForCausalLM::new(cfg))) };

pub type LlamaForCausalLM = DecoderForCausalLM<LlamaAttention>;

#[module]
pub struct LlamaAttention {
    q_proj: Conv2d,
    k_proj: Conv2d,
    v_proj: Conv2d,
    o_proj: Conv2d,
    hidden: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
}

#[module]
impl DecoderAttention for LlamaAttention {
    fn new(cfg: &TransformerConfig) -> Self {
        let (h, d, bias) = (cfg.hidden_size, cfg.head_dim, cfg.qkv_bias);
        let (nh, nkv) = (cfg.num_attention_heads, cfg.num_key_value_heads);
        LlamaAttention {
            q_proj: Conv2d::new(h, nh * d).with_bias(bias),
            k_proj: Conv2d::new(h, nkv * d).with_bias(bias),
            v_proj: Conv2d::new(h, nkv * d).with_bias(bias),
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
        // 1. projections on NHWC [1, 1, S, H]; q and k quantized right after the projection
        let x = qdq!(x, "q_proj_input_qdq")?.view(&[1, 1, -1, h])?;
        let q = qdq!(self.q_proj.forward(&x)?, "q_proj_output_qdq")?;
        let k = qdq!(self.k_proj.forward(&x)?, "k_proj_output_qdq")?;
        let v = self.v_proj.forward(&x)?;
        // 2. heads: [1, 1, S, n*D] -> [1, n, S, D]
        let q = split_heads(&q, self.heads, d)?;
        let k = split_heads(&k, self.kv_heads, d)?;
        let v = split_heads(&v, self.kv_heads, d)?;
        // 3. RoPE, new K/V in the uint8 cache layout, masked attention over past ++ new
        let (q, k) = rope_qk(&q, &k, inputs)?;
        let (k, v) = cache_kv(&k, &v)?;
        let y = attend(&q, &k, &v, inputs)?;
        // 4. o_proj: NHWC [1, 1, S, H*D] -> [1, S, hidden]
        let y = self.o_proj.forward(&y)?.view(&[1, -1, h])?;
        Ok((y, k, v))
    }
}

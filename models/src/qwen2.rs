//! Qwen2 / Qwen2.5 in mllm's QNN-AOT form (`examples/qwen2_qnn_aot/modeling_qwen2_qnn_aot.hpp`).
//!
//! Qwen2's attention is Llama's with biases on the q, k and v projections (always, although its
//! `config.json` has no key saying so; o_proj has none) and without Qwen3's q/k norm: the q and k
//! projections' outputs get a QDQ point each (`q_proj_output_qdq`, `k_proj_output_qdq`) and go
//! straight to RoPE. The rest is shared with the other model files ([`crate::blocks`],
//! [`crate::decoder`]).
//!
//! mllm's C++ file declares its q/k/v convs without bias while pymllm's Qwen2 trains and exports
//! them with one (`QLinearLPBQ(..., bias=attention_bias)`, default true); this file follows the
//! checkpoints, so HF and pymllm weights both load with their biases.
//!
//! Every `qdq!` carries mllm's exact name, so the keys match pymllm's checkpoints.

use crate::blocks::{attend, cache_kv, rope_qk, split_heads, Mlp};
use crate::config::TransformerConfig;
use crate::decoder::{DecoderAttention, DecoderForCausalLM, DecoderLayer, DecoderModel, LayerOutputs};
use mllm_dsl::prelude::*;

pub type Qwen2Mlp = Mlp;
pub type Qwen2DecoderLayer = DecoderLayer<Qwen2Attention>;
pub type Qwen2Model = DecoderModel<Qwen2Attention>;
pub type Qwen2ForCausalLM = DecoderForCausalLM<Qwen2Attention>;

#[module]
pub struct Qwen2Attention {
    q_proj: Conv2d,
    k_proj: Conv2d,
    v_proj: Conv2d,
    o_proj: Conv2d,
    hidden: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
}

impl Qwen2Attention {
    pub fn new(cfg: &TransformerConfig) -> Self {
        let (h, d) = (cfg.hidden_size, cfg.head_dim);
        let (nh, nkv) = (cfg.num_attention_heads, cfg.num_key_value_heads);
        Qwen2Attention {
            q_proj: Conv2d::new(h, nh * d).with_bias(true),
            k_proj: Conv2d::new(h, nkv * d).with_bias(true),
            v_proj: Conv2d::new(h, nkv * d).with_bias(true),
            o_proj: Conv2d::new(nh * d, h),
            hidden: h,
            heads: nh,
            kv_heads: nkv,
            head_dim: d,
        }
    }
}

#[module]
impl Qwen2Attention {
    /// `x [1, S, H]`, `sin/cos [1, S, D]`, `mask [1, 1, S, ctx]`, past K/V →
    /// `(y [1, S, H], new K [1, Hkv, D, S], new V [1, Hkv, S, D])`.
    pub fn forward(
        &self,
        x: &Tensor,
        sin: &Tensor,
        cos: &Tensor,
        mask: &Tensor,
        past_key: &Tensor,
        past_value: &Tensor,
    ) -> Result<LayerOutputs> {
        let (h, d) = (self.hidden as i64, self.head_dim);
        // 1. projections (with bias) on NHWC [1, 1, S, H]; q and k quantized right after the projection
        let x = qdq!(x, "q_proj_input_qdq")?.view(&[1, 1, -1, h])?;
        let q = qdq!(self.q_proj.forward(&x)?, "q_proj_output_qdq")?;
        let k = qdq!(self.k_proj.forward(&x)?, "k_proj_output_qdq")?;
        let v = self.v_proj.forward(&x)?;
        // 2. heads: [1, 1, S, n*D] -> [1, n, S, D]
        let q = split_heads(&q, self.heads, d)?;
        let k = split_heads(&k, self.kv_heads, d)?;
        let v = split_heads(&v, self.kv_heads, d)?;
        // 3. RoPE, new K/V in the uint8 cache layout, masked attention over past ++ new
        let (q, k) = rope_qk(&q, &k, sin, cos)?;
        let (k, v) = cache_kv(&k, &v)?;
        let y = attend(&q, &k, &v, mask, past_key, past_value)?;
        // 4. o_proj: NHWC [1, 1, S, H*D] -> [1, S, hidden]
        let y = self.o_proj.forward(&y)?.view(&[1, -1, h])?;
        Ok((y, k, v))
    }
}

impl DecoderAttention for Qwen2Attention {
    fn new(cfg: &TransformerConfig) -> Self {
        Qwen2Attention::new(cfg)
    }

    fn forward(
        &self,
        x: &Tensor,
        sin: &Tensor,
        cos: &Tensor,
        mask: &Tensor,
        past_key: &Tensor,
        past_value: &Tensor,
    ) -> Result<LayerOutputs> {
        Qwen2Attention::forward(self, x, sin, cos, mask, past_key, past_value)
    }
}

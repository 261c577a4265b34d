//! Qwen3 in mllm's QNN-AOT form (`examples/qwen3_qnn_aot/modeling_qwen_qnn_aot.hpp`).
//!
//! One file serves float (HF checkpoints on the CPU), fake-quant (pymllm checkpoints, QDQ applied)
//! and the NPU (traced, then compiled). Only the attention is Qwen3's own: a per-head RMSNorm of q
//! and k after the projections. The MLP, the attention steps after q/k/v ([`crate::blocks`]) and
//! the decoder skeleton ([`crate::decoder`]) are shared with the other model files.
//!
//! Every `qdq!` carries mllm's exact name, so the keys match pymllm's checkpoints.

use crate::blocks::{attend, cache_kv, rope_qk, split_heads, Mlp};
use crate::config::TransformerConfig;
use crate::decoder::{AttentionInputs, DecoderAttention, DecoderForCausalLM, DecoderLayer, DecoderModel, LayerOutputs};
use mllm_dsl::prelude::*;

pub type Qwen3Mlp = Mlp;
pub type Qwen3DecoderLayer = DecoderLayer<Qwen3Attention>;
pub type Qwen3Model = DecoderModel<Qwen3Attention>;
/// `model_type: "qwen3"`.
pub const FAMILY: crate::Family =
    crate::Family { model_types: &["qwen3"], build: |cfg| Ok(Box::new(Qwen3ForCausalLM::new(cfg))) };

pub type Qwen3ForCausalLM = DecoderForCausalLM<Qwen3Attention>;

#[module]
pub struct Qwen3Attention {
    q_proj: Conv2d,
    k_proj: Conv2d,
    v_proj: Conv2d,
    o_proj: Conv2d,
    q_norm: RmsNorm,
    k_norm: RmsNorm,
    hidden: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
}

#[module]
impl DecoderAttention for Qwen3Attention {
    fn new(cfg: &TransformerConfig) -> Self {
        let (h, d) = (cfg.hidden_size, cfg.head_dim);
        let (nh, nkv) = (cfg.num_attention_heads, cfg.num_key_value_heads);
        Qwen3Attention {
            q_proj: Conv2d::new(h, nh * d),
            k_proj: Conv2d::new(h, nkv * d),
            v_proj: Conv2d::new(h, nkv * d),
            o_proj: Conv2d::new(nh * d, h),
            q_norm: RmsNorm::new(d, cfg.rms_norm_eps),
            k_norm: RmsNorm::new(d, cfg.rms_norm_eps),
            hidden: h,
            heads: nh,
            kv_heads: nkv,
            head_dim: d,
        }
    }

    /// `x [1, S, H]` → `(y [1, S, H], new K [1, Hkv, D, S], new V [1, Hkv, S, D])`.
    fn forward(&self, x: &Tensor, inputs: &AttentionInputs<'_>) -> Result<LayerOutputs> {
        let (h, d) = (self.hidden as i64, self.head_dim);
        // 1. projections on NHWC [1, 1, S, H], then heads: [1, S, n*D] -> [1, n, S, D]
        let x = qdq!(x, "q_proj_input_qdq")?.view(&[1, 1, -1, h])?;
        let q = split_heads(&self.q_proj.forward(&x)?, self.heads, d)?;
        let k = split_heads(&self.k_proj.forward(&x)?, self.kv_heads, d)?;
        let v = split_heads(&self.v_proj.forward(&x)?, self.kv_heads, d)?;
        // 2. per-head RMSNorm of q and k over D
        let q = qdq!(self.q_norm.forward(&qdq!(q, "q_norm_input_qdq")?)?, "q_norm_output_qdq")?;
        let k = qdq!(self.k_norm.forward(&qdq!(k, "k_norm_input_qdq")?)?, "k_norm_output_qdq")?;
        // 3. RoPE, new K/V in the uint8 cache layout, masked attention over past ++ new
        let (q, k) = rope_qk(&q, &k, inputs)?;
        let (k, v) = cache_kv(&k, &v)?;
        let y = attend(&q, &k, &v, inputs)?;
        // 4. o_proj: NHWC [1, 1, S, H*D] -> [1, S, hidden]
        let y = self.o_proj.forward(&y)?.view(&[1, -1, h])?;
        Ok((y, k, v))
    }
}

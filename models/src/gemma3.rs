//! Gemma 3, text only (`Gemma3ForCausalLM`, `model_type: "gemma3_text"`). What differs from Llama:
//! norms scale by `1 + w` and embeddings by `sqrt(hidden)` (set in [`FAMILY`]); each layer norms
//! before and after the attention and the MLP, q/k are normed per head and scores scaled by
//! `query_pre_attn_scalar^-0.5` (this file); the GELU-tanh MLP, final logit softcapping and the
//! sliding layers with their own RoPE base come from the config (the skeleton and the blocks).
//! Gemma 3 has no mllm file; QDQ points are named the way mllm names Qwen3's.

use crate::blocks::{attend_scaled, cache_kv, residual, rope_qk, split_heads, Mlp};
use crate::config::TransformerConfig;
use crate::decoder::{AttentionInputs, CausalLmOf, DecoderBlock, LayerOutputs, ModelOf};
use crate::Family;
use mllm_dsl::prelude::*;

pub type Gemma3Model = ModelOf<Gemma3DecoderLayer>;
pub type Gemma3ForCausalLM = CausalLmOf<Gemma3DecoderLayer>;

/// `model_type: "gemma3_text"`; the norms' `1 + w` and the embedding scale are Gemma's, not the config's.
pub const FAMILY: Family = Family {
    model_types: &["gemma3_text"],
    build: |cfg| {
        let scale = (cfg.hidden_size as f64).sqrt() as f32;
        let cfg = TransformerConfig { norm_unit_offset: true, embed_scale: Some(scale), ..cfg.clone() };
        Ok(Box::new(Gemma3ForCausalLM::new(&cfg)))
    },
};

#[module]
pub struct Gemma3Attention {
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
    scale: f32,
}

#[module]
impl Gemma3Attention {
    fn new(cfg: &TransformerConfig) -> Self {
        let (h, d, nh, nkv) = (cfg.hidden_size, cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads);
        Gemma3Attention {
            q_proj: Conv2d::new(h, nh * d).with_bias(cfg.qkv_bias),
            k_proj: Conv2d::new(h, nkv * d).with_bias(cfg.qkv_bias),
            v_proj: Conv2d::new(h, nkv * d).with_bias(cfg.qkv_bias),
            o_proj: Conv2d::new(nh * d, h),
            q_norm: cfg.rms_norm(d),
            k_norm: cfg.rms_norm(d),
            hidden: h,
            heads: nh,
            kv_heads: nkv,
            head_dim: d,
            scale: cfg.attn_scale,
        }
    }

    /// `x [1, S, H]` → `(y [1, S, H], new K [1, Hkv, D, S], new V [1, Hkv, S, D])`.
    pub fn forward(&self, x: &Tensor, inputs: &AttentionInputs<'_>) -> Result<LayerOutputs> {
        let (h, d) = (self.hidden as i64, self.head_dim);
        // 1. projections on NHWC [1, 1, S, H], then heads: [1, S, n*D] -> [1, n, S, D]
        let x = qdq!(x, "q_proj_input_qdq")?.view(&[1, 1, -1, h])?;
        let q = split_heads(&self.q_proj.forward(&x)?, self.heads, d)?;
        let k = split_heads(&self.k_proj.forward(&x)?, self.kv_heads, d)?;
        let v = split_heads(&self.v_proj.forward(&x)?, self.kv_heads, d)?;
        // 2. per-head (1 + w) RMSNorm of q and k over D
        let q = qdq!(self.q_norm.forward(&qdq!(q, "q_norm_input_qdq")?)?, "q_norm_output_qdq")?;
        let k = qdq!(self.k_norm.forward(&qdq!(k, "k_norm_input_qdq")?)?, "k_norm_output_qdq")?;
        // 3. RoPE (the layer's own tables), new K/V, attention scaled by query_pre_attn_scalar^-0.5
        let (q, k) = rope_qk(&q, &k, inputs)?;
        let (k, v) = cache_kv(&k, &v)?;
        let y = attend_scaled(&q, &k, &v, inputs, self.scale)?;
        // 4. o_proj: NHWC [1, 1, S, H*D] -> [1, S, hidden]
        Ok((self.o_proj.forward(&y)?.view(&[1, -1, h])?, k, v))
    }
}

#[module]
pub struct Gemma3DecoderLayer {
    self_attn: Gemma3Attention,
    mlp: Mlp,
    input_layernorm: RmsNorm,
    post_attention_layernorm: RmsNorm,
    pre_feedforward_layernorm: RmsNorm,
    post_feedforward_layernorm: RmsNorm,
    layer_idx: usize,
}

#[module]
impl DecoderBlock for Gemma3DecoderLayer {
    fn new(cfg: &TransformerConfig, layer_idx: usize) -> Self {
        let norm = || cfg.rms_norm(cfg.hidden_size);
        Gemma3DecoderLayer {
            self_attn: Gemma3Attention::new(cfg),
            mlp: Mlp::new(cfg),
            input_layernorm: norm(),
            post_attention_layernorm: norm(),
            pre_feedforward_layernorm: norm(),
            post_feedforward_layernorm: norm(),
            layer_idx,
        }
    }

    /// `x [1, S, H]` → `(x [1, S, H], new K, new V)`
    fn forward(&self, x: &Tensor, inputs: &AttentionInputs<'_>) -> Result<LayerOutputs> {
        // 1. x + post_norm(attention(pre_norm(x))) (layer 0's input is the scaled embedding, quantized)
        let x = if self.layer_idx == 0 { x.clone() } else { qdq!(x, "input_layernorm_input_qdq")? };
        let (a, k, v) = self.self_attn.forward(&self.input_layernorm.forward(&x)?, inputs)?;
        let a = self.post_attention_layernorm.forward(&qdq!(a, "post_attention_layernorm_input_qdq")?)?;
        let x = residual(&x, &a, "add_0_lhs_input_qdq", Some("add_0_output_qdq"))?;
        // 2. x + post_norm(mlp(pre_norm(x)))
        let m = self.mlp.forward(&self.pre_feedforward_layernorm.forward(&x)?)?;
        let m = self.post_feedforward_layernorm.forward(&qdq!(m, "post_feedforward_layernorm_input_qdq")?)?;
        Ok((residual(&x, &m, "add_1_lhs_input_qdq", None)?, k, v))
    }
}

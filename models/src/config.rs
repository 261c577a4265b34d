//! The architecture numbers a decoder-only model file needs, independent of where they came from
//! (an HF `config.json`, mllm's config, or a synthetic config for benches and snapshots).

use crate::hf::{default_inv_freq, HfConfig, HiddenAct};

/// Shapes and constants of a Qwen3 / Qwen2 / Llama style decoder.
#[derive(Clone, Debug, PartialEq)]
pub struct TransformerConfig {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    pub rms_norm_eps: f32,
    /// RoPE inverse frequencies (`head_dim / 2` values, rope scaling already applied).
    pub rope_inv_freq: Vec<f32>,
    /// Rows of the RoPE tables (`mllm_qualcomm_max_length`): positions `0..max_positions`.
    pub max_positions: usize,
    pub tie_word_embeddings: bool,
    /// q/k/v projections carry biases (Qwen2; read by `LlamaAttention`).
    pub qkv_bias: bool,
    /// The MLP's gate activation (SiLU, or Gemma's GELU-tanh).
    pub hidden_act: HiddenAct,
    /// The window of the sliding-window layers (`None`: every layer attends to the whole context).
    pub sliding_window: Option<usize>,
    /// Per layer: whether it attends through the window (mask plane 1 instead of 0).
    pub sliding_layers: Vec<bool>,
    /// The sliding layers' own RoPE frequencies when they differ from `rope_inv_freq` (Gemma 3).
    pub sliding_rope_inv_freq: Option<Vec<f32>>,
    /// Attention scores are scaled by this (`head_dim^-0.5`, Gemma 3: `query_pre_attn_scalar^-0.5`).
    pub attn_scale: f32,
    /// Logits become `cap * tanh(logits / cap)` (Gemma's `final_logit_softcapping`).
    pub final_logit_softcapping: Option<f32>,
    /// Norms scale by `1 + w` (Gemma; set by the model file, not by the config).
    pub norm_unit_offset: bool,
    /// Embeddings are multiplied by this (Gemma: `sqrt(hidden_size)`; set by the model file).
    pub embed_scale: Option<f32>,
}

impl TransformerConfig {
    /// The architecture of an HF checkpoint, with RoPE tables for positions `0..max_positions`.
    pub fn from_hf(hf: &HfConfig, max_positions: usize) -> Self {
        TransformerConfig {
            vocab_size: hf.vocab_size,
            hidden_size: hf.hidden_size,
            intermediate_size: hf.intermediate_size,
            num_hidden_layers: hf.num_hidden_layers,
            num_attention_heads: hf.num_attention_heads,
            num_key_value_heads: hf.num_key_value_heads,
            head_dim: hf.head_dim,
            rms_norm_eps: hf.rms_norm_eps as f32,
            rope_inv_freq: hf.rope_inv_freq(),
            max_positions,
            tie_word_embeddings: hf.tie_word_embeddings,
            qkv_bias: hf.qkv_bias(),
            hidden_act: hf.hidden_act,
            sliding_window: hf.attention.sliding_window,
            sliding_layers: (0..hf.num_hidden_layers).map(|i| hf.attention.is_sliding(i)).collect(),
            sliding_rope_inv_freq: hf.attention.sliding_rope_theta.map(|t| default_inv_freq(t, hf.head_dim)),
            attn_scale: match hf.query_pre_attn_scalar {
                Some(s) => s.powf(-0.5) as f32,
                None => 1.0 / (hf.head_dim as f32).sqrt(),
            },
            final_logit_softcapping: hf.final_logit_softcapping.map(|c| c as f32),
            norm_unit_offset: false,
            embed_scale: None,
        }
    }

    /// A norm of width `dim` as this model's norms are (`1 + w` when `norm_unit_offset`).
    pub fn rms_norm(&self, dim: usize) -> mllm_dsl::nn::RmsNorm {
        mllm_dsl::nn::RmsNorm::new(dim, self.rms_norm_eps).with_unit_offset(self.norm_unit_offset)
    }

    pub fn decoder_shape(&self) -> mllm_dsl::DecoderShape {
        mllm_dsl::DecoderShape {
            num_layers: self.num_hidden_layers,
            num_kv_heads: self.num_key_value_heads,
            head_dim: self.head_dim,
            vocab_size: self.vocab_size,
            sliding_window: self.sliding_window,
        }
    }

    /// Query heads per KV head.
    pub fn kv_groups(&self) -> usize {
        self.num_attention_heads / self.num_key_value_heads
    }

    /// A small Qwen3 for snapshots and tests: hidden 64, 2 layers, 4 heads, 2 KV heads, head_dim 16.
    pub fn tiny_qwen3() -> Self {
        Self::tiny(1_000_000.0, false)
    }

    /// [`tiny_qwen3`](Self::tiny_qwen3)'s shapes with Qwen2's q/k/v biases.
    pub fn tiny_qwen2() -> Self {
        Self::tiny(1_000_000.0, true)
    }

    /// [`tiny_qwen3`](Self::tiny_qwen3)'s shapes with Llama 3's RoPE theta (no biases).
    pub fn tiny_llama() -> Self {
        Self::tiny(500_000.0, false)
    }

    fn tiny(rope_theta: f64, qkv_bias: bool) -> Self {
        TransformerConfig {
            vocab_size: 128,
            hidden_size: 64,
            intermediate_size: 128,
            num_hidden_layers: 2,
            num_attention_heads: 4,
            num_key_value_heads: 2,
            head_dim: 16,
            rms_norm_eps: 1e-6,
            rope_inv_freq: default_inv_freq(rope_theta, 16),
            max_positions: 16,
            tie_word_embeddings: true,
            qkv_bias,
            hidden_act: HiddenAct::Silu,
            sliding_window: None,
            sliding_layers: vec![false; 2],
            sliding_rope_inv_freq: None,
            attn_scale: 0.25,
            final_logit_softcapping: None,
            norm_unit_offset: false,
            embed_scale: None,
        }
    }

    /// Qwen3-1.7B as in mllm's `config_1.7B.json`, with RoPE tables for a 1024 context.
    pub fn qwen3_1_7b() -> Self {
        TransformerConfig {
            vocab_size: 151_936,
            hidden_size: 2048,
            intermediate_size: 6144,
            num_hidden_layers: 28,
            num_attention_heads: 16,
            num_key_value_heads: 8,
            head_dim: 128,
            rms_norm_eps: 1e-6,
            rope_inv_freq: default_inv_freq(1_000_000.0, 128),
            max_positions: 1024,
            tie_word_embeddings: true,
            qkv_bias: false,
            hidden_act: HiddenAct::Silu,
            sliding_window: None,
            sliding_layers: vec![false; 28],
            sliding_rope_inv_freq: None,
            attn_scale: 1.0 / (128f32).sqrt(),
            final_logit_softcapping: None,
            norm_unit_offset: false,
            embed_scale: None,
        }
    }
}

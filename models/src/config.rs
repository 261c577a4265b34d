//! The architecture numbers a decoder-only model file needs, independent of where they came from
//! (an HF `config.json`, mllm's config, or a synthetic config for benches and snapshots).

use crate::hf::{default_inv_freq, HfConfig};

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
        }
    }

    pub fn decoder_shape(&self) -> mllm_dsl::DecoderShape {
        mllm_dsl::DecoderShape {
            num_layers: self.num_hidden_layers,
            num_kv_heads: self.num_key_value_heads,
            head_dim: self.head_dim,
            vocab_size: self.vocab_size,
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
        }
    }
}

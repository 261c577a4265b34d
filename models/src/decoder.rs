//! The decoder skeleton of mllm's QNN-AOT Qwen3, Qwen2 and Llama files, generic over the attention
//! (the one part that differs between them):
//! embedding → N × (norm, attention, residual, norm, MLP, residual) → norm → lm_head.
//!
//! A model file writes its attention, implements [`DecoderAttention`] for it and names the skeleton's
//! types (`pub type LlamaForCausalLM = DecoderForCausalLM<LlamaAttention>`). Module names and QDQ
//! names are mllm's (`model.layers.{i}.input_layernorm_input_qdq`, `model.norm_input_qdq`, ...), so
//! they match pymllm's checkpoints.

use crate::blocks::Mlp;
use crate::config::TransformerConfig;
use crate::rope::sin_cos_tables;
use mllm_dsl::prelude::*;

/// `(hidden or logits, new K per layer, new V per layer)`
type Outputs = (Tensor, Vec<Tensor>, Vec<Tensor>);

/// An attention's or a layer's `(y, new K, new V)`.
pub type LayerOutputs = (Tensor, Tensor, Tensor);

/// What the skeleton needs from a model's attention module (`self_attn`).
pub trait DecoderAttention: Module + Send + Sync + Sized {
    fn new(cfg: &TransformerConfig) -> Self;

    /// `x [1, S, H]`, `sin/cos [1, S, D]`, `mask [1, 1, S, ctx]`, past K `[1, Hkv, D, P]`, past V
    /// `[1, Hkv, P, D]` → `(y [1, S, H], new K [1, Hkv, D, S], new V [1, Hkv, S, D])`.
    fn forward(
        &self,
        x: &Tensor,
        sin: &Tensor,
        cos: &Tensor,
        mask: &Tensor,
        past_key: &Tensor,
        past_value: &Tensor,
    ) -> Result<LayerOutputs>;
}

#[module]
pub struct DecoderLayer<A: DecoderAttention> {
    self_attn: A,
    mlp: Mlp,
    input_layernorm: RmsNorm,
    post_attention_layernorm: RmsNorm,
    layer_idx: usize,
}

impl<A: DecoderAttention> DecoderLayer<A> {
    pub fn new(cfg: &TransformerConfig, layer_idx: usize) -> Self {
        DecoderLayer {
            self_attn: A::new(cfg),
            mlp: Mlp::new(cfg),
            input_layernorm: RmsNorm::new(cfg.hidden_size, cfg.rms_norm_eps),
            post_attention_layernorm: RmsNorm::new(cfg.hidden_size, cfg.rms_norm_eps),
            layer_idx,
        }
    }
}

#[module]
impl<A: DecoderAttention> DecoderLayer<A> {
    /// `x [1, S, H]` → `(x [1, S, H], new K, new V)`
    pub fn forward(
        &self,
        x: &Tensor,
        sin: &Tensor,
        cos: &Tensor,
        mask: &Tensor,
        past_key: &Tensor,
        past_value: &Tensor,
    ) -> Result<LayerOutputs> {
        // 1. attention with residual (layer 0's input is the embedding, already quantized)
        let x = if self.layer_idx == 0 { x.clone() } else { qdq!(x, "input_layernorm_input_qdq")? };
        let h = self.input_layernorm.forward(&x)?;
        let (a, k, v) = self.self_attn.forward(&h, sin, cos, mask, past_key, past_value)?;
        let x = qdq!(x.add(&qdq!(a, "add_0_lhs_input_qdq")?)?, "add_0_output_qdq")?;
        // 2. MLP with residual
        let m = self.mlp.forward(&self.post_attention_layernorm.forward(&x)?)?;
        let x = x.add(&qdq!(m, "add_1_lhs_input_qdq")?)?;
        Ok((x, k, v))
    }
}

#[module]
pub struct DecoderModel<A: DecoderAttention> {
    embed_tokens: Embedding,
    layers: ModuleList<DecoderLayer<A>>,
    norm: RmsNorm,
    #[module(rename = "mllm_max_sin_embedding")]
    rope_sin: Param,
    #[module(rename = "mllm_max_cos_embedding")]
    rope_cos: Param,
    hidden: usize,
}

impl<A: DecoderAttention> DecoderModel<A> {
    pub fn new(cfg: &TransformerConfig) -> Self {
        let table = [1, cfg.max_positions, cfg.head_dim];
        let (inv, len) = (cfg.rope_inv_freq.clone(), cfg.max_positions);
        let inv2 = inv.clone();
        DecoderModel {
            embed_tokens: Embedding::new(cfg.vocab_size, cfg.hidden_size),
            layers: (0..cfg.num_hidden_layers).map(|i| DecoderLayer::new(cfg, i)).collect(),
            norm: RmsNorm::new(cfg.hidden_size, cfg.rms_norm_eps),
            // HF checkpoints have no RoPE tables: computed from the config unless the checkpoint has them.
            rope_sin: Param::new(table, ParamRole::RopeTable).or_compute(move || sin_cos_tables(&inv, len).0),
            rope_cos: Param::new(table, ParamRole::RopeTable).or_compute(move || sin_cos_tables(&inv2, len).1),
            hidden: cfg.hidden_size,
        }
    }
}

#[module]
impl<A: DecoderAttention> DecoderModel<A> {
    /// `ids [1, S]`, `positions [S]`, `mask [1, 1, S, ctx]`, past K/V per layer →
    /// `(hidden NHWC [1, 1, S, H], new K per layer, new V per layer)`.
    pub fn forward(
        &self,
        ids: &Tensor,
        positions: &Tensor,
        mask: &Tensor,
        past_keys: &[Tensor],
        past_values: &[Tensor],
    ) -> Result<Outputs> {
        if past_keys.len() != self.layers.len() || past_values.len() != self.layers.len() {
            return Err(Error::msg(format!(
                "the decoder model has {} layers but got {} past keys and {} past values",
                self.layers.len(),
                past_keys.len(),
                past_values.len()
            )));
        }
        // 1. token embedding: [1, S] -> [1, S, H]
        let mut x = self.embed_tokens.forward(ids)?;
        // 2. RoPE rows for these positions: [1, L, D] -> [1, S, D]
        let sin = qdq!(rope self.rope_sin.tensor()?, "sin_embedding_input_qdq")?.gather(1, positions)?;
        let cos = qdq!(rope self.rope_cos.tensor()?, "cos_embedding_input_qdq")?.gather(1, positions)?;
        // 3. decoder layers, collecting the new K/V
        let (mut keys, mut values) = (Vec::new(), Vec::new());
        for (i, layer) in self.layers.iter().enumerate() {
            let (h, k, v) = layer.forward(&x, &sin, &cos, mask, &past_keys[i], &past_values[i])?;
            x = h;
            keys.push(k);
            values.push(v);
        }
        // 4. final norm, NHWC for the lm_head: [1, S, H] -> [1, 1, S, H]
        let x = self.norm.forward(&qdq!(x, "norm_input_qdq")?)?.view(&[1, 1, -1, self.hidden as i64])?;
        Ok((x, keys, values))
    }
}

#[module]
pub struct DecoderForCausalLM<A: DecoderAttention> {
    model: DecoderModel<A>,
    lm_head: Conv2d,
    #[module(skip)]
    cfg: TransformerConfig,
}

impl<A: DecoderAttention> DecoderForCausalLM<A> {
    pub fn new(cfg: &TransformerConfig) -> Self {
        DecoderForCausalLM {
            model: DecoderModel::new(cfg),
            lm_head: Conv2d::new(cfg.hidden_size, cfg.vocab_size),
            cfg: cfg.clone(),
        }
    }
}

impl<A: DecoderAttention> mllm_dsl::CausalLm for DecoderForCausalLM<A> {
    fn forward(&self, ids: &Tensor, pos: &Tensor, mask: &Tensor, k: &[Tensor], v: &[Tensor]) -> Result<Outputs> {
        DecoderForCausalLM::forward(self, ids, pos, mask, k, v)
    }

    fn bind_params(&mut self, src: &ParamSource<'_>) -> Result<()> {
        self.bind("", src)
    }

    fn shape(&self) -> mllm_dsl::DecoderShape {
        self.cfg.decoder_shape()
    }
}

#[module]
impl<A: DecoderAttention> DecoderForCausalLM<A> {
    /// → `(logits [1, 1, S, vocab], new K per layer [1, Hkv, D, S], new V per layer [1, Hkv, S, D])`
    pub fn forward(
        &self,
        ids: &Tensor,
        positions: &Tensor,
        mask: &Tensor,
        past_keys: &[Tensor],
        past_values: &[Tensor],
    ) -> Result<Outputs> {
        let (x, keys, values) = self.model.forward(ids, positions, mask, past_keys, past_values)?;
        // Eager runs that read a few rows only skip the lm_head for the others: [1, 1, S, H] -> [1, 1, r, H]
        let x = match mllm_dsl::logit_rows() {
            Some(rows) if rows.len() < ids.shape()[1] => x.slice(2, rows.start, rows.end)?,
            _ => x,
        };
        let logits = self.lm_head.forward(&qdq!(x, "lm_head_input_qdq")?)?;
        Ok((qdq!(logits, "lm_head_output_qdq")?, keys, values))
    }
}

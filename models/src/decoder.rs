//! The decoder skeleton of mllm's QNN-AOT Qwen3, Qwen2 and Llama files, generic over the attention
//! (the one part that differs between them):
//! embedding → N × (norm, attention, residual, norm, MLP, residual) → norm → lm_head.
//!
//! A model file writes its attention as an `#[module] impl DecoderAttention for ...` block and names
//! the skeleton's types (`pub type LlamaForCausalLM = DecoderForCausalLM<LlamaAttention>`). Module names and QDQ
//! names are mllm's (`model.layers.{i}.input_layernorm_input_qdq`, `model.norm_input_qdq`, ...), so
//! they match pymllm's checkpoints.

use crate::blocks::Mlp;
use crate::config::TransformerConfig;
use crate::rope::sin_cos_tables;
use mllm_dsl::prelude::*;
use std::ops::Range;

/// `(hidden or logits, new K per layer, new V per layer)`
type Outputs = (Tensor, Vec<Tensor>, Vec<Tensor>);

/// An attention's or a layer's `(y, new K, new V)`.
pub type LayerOutputs = (Tensor, Tensor, Tensor);

/// What a layer's attention reads besides its hidden state: this chunk's RoPE rows, the mask and
/// the layer's KV cache.
#[derive(Clone, Copy)]
pub struct AttentionInputs<'a> {
    /// RoPE rows of this chunk's positions, `[1, S, D]` each.
    pub sin: &'a Tensor,
    pub cos: &'a Tensor,
    /// `[1, 1, S, ctx]`, 0.0 where a position may attend.
    pub mask: &'a Tensor,
    /// This layer's past K `[1, Hkv, D, P]` and past V `[1, Hkv, P, D]`.
    pub past_key: &'a Tensor,
    pub past_value: &'a Tensor,
}

/// What the skeleton needs from a model's attention module (`self_attn`). Implement it in an
/// `#[module]` block, so that `forward` is the module's scope.
pub trait DecoderAttention: Module + Send + Sync + Sized {
    fn new(cfg: &TransformerConfig) -> Self;

    /// `x [1, S, H]` → `(y [1, S, H], new K [1, Hkv, D, S], new V [1, Hkv, S, D])`.
    fn forward(&self, x: &Tensor, inputs: &AttentionInputs<'_>) -> Result<LayerOutputs>;
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
    pub fn forward(&self, x: &Tensor, inputs: &AttentionInputs<'_>) -> Result<LayerOutputs> {
        // 1. attention with residual (layer 0's input is the embedding, already quantized)
        let x = if self.layer_idx == 0 { x.clone() } else { qdq!(x, "input_layernorm_input_qdq")? };
        let h = self.input_layernorm.forward(&x)?;
        let (a, k, v) = self.self_attn.forward(&h, inputs)?;
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
            rope_sin: Param::new(table, ParamRole::RopeTable).or_compute(move || Ok(sin_cos_tables(&inv, len)?.0)),
            rope_cos: Param::new(table, ParamRole::RopeTable).or_compute(move || Ok(sin_cos_tables(&inv2, len)?.1)),
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
            let inputs =
                AttentionInputs { sin: &sin, cos: &cos, mask, past_key: &past_keys[i], past_value: &past_values[i] };
            let (h, k, v) = layer.forward(&x, &inputs)?;
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

#[module]
impl<A: DecoderAttention> CausalLm for DecoderForCausalLM<A> {
    /// → `(logits [1, 1, r, vocab] for the `logit_rows`, new K per layer [1, Hkv, D, S], new V per
    /// layer [1, Hkv, S, D])`
    fn forward_rows(
        &self,
        ids: &Tensor,
        positions: &Tensor,
        mask: &Tensor,
        past_keys: &[Tensor],
        past_values: &[Tensor],
        logit_rows: Range<usize>,
    ) -> Result<Outputs> {
        let (x, keys, values) = self.model.forward(ids, positions, mask, past_keys, past_values)?;
        // 1. the lm_head only for rows the caller reads: [1, 1, S, H] -> [1, 1, r, H]
        let x = if logit_rows.len() < ids.dim(-1)? { x.slice(2, logit_rows.start, logit_rows.end)? } else { x };
        // 2. logits [1, 1, r, vocab]
        let logits = self.lm_head.forward(&qdq!(x, "lm_head_input_qdq")?)?;
        Ok((qdq!(logits, "lm_head_output_qdq")?, keys, values))
    }

    fn bind_params(&mut self, src: &ParamSource<'_>) -> Result<()> {
        self.bind("", src)
    }

    fn shape(&self) -> mllm_dsl::DecoderShape {
        self.cfg.decoder_shape()
    }
}

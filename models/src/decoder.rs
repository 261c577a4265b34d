//! The decoder skeleton of mllm's QNN-AOT Qwen3, Qwen2 and Llama files, generic over the attention
//! (the one part that differs between them):
//! embedding → N × (norm, attention, residual, norm, MLP, residual) → norm → lm_head.
//!
//! A model file writes its attention as an `#[module] impl DecoderAttention for ...` block and names
//! the skeleton's types (`pub type LlamaForCausalLM = DecoderForCausalLM<LlamaAttention>`). Module names and QDQ
//! names are mllm's (`model.layers.{i}.input_layernorm_input_qdq`, `model.norm_input_qdq`, ...), so
//! they match pymllm's checkpoints. A model whose layer differs (Gemma 3's four norms) writes its
//! layer as an `#[module] impl DecoderBlock for ...` block and uses [`CausalLmOf`] / [`ModelOf`].
//!
//! Sliding-window layers (`TransformerConfig::sliding_layers`) read plane 1 of the mask input
//! `[1, 2, S, ctx]` and, when the config gives them their own RoPE base, their own RoPE tables
//! (`model.mllm_max_local_{sin,cos}_embedding`).

use crate::blocks::{residual, FusedMlp, Mlp, SIGMOID_SCALE};
use crate::config::TransformerConfig;
use crate::rope::sin_cos_tables;
use mllm_dsl::prelude::*;
use std::ops::Range;

/// `(hidden or logits, new K per layer, new V per layer)`
type Outputs = (Tensor, Vec<Tensor>, Vec<Tensor>);

/// An attention's or a layer's `(y, new K, new V)`.
pub type LayerOutputs = (Tensor, Tensor, Tensor);

/// What a layer's attention reads besides its hidden state: this chunk's RoPE rows, the mask and
/// the layer's KV cache (the RoPE rows and mask plane of the layer's kind: full or sliding).
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

/// One decoder layer as the skeleton drives it. Implement it in an `#[module]` block.
pub trait DecoderBlock: Module + Send + Sync + Sized {
    fn new(cfg: &TransformerConfig, layer_idx: usize) -> Self;

    /// `x [1, S, H]` → `(x [1, S, H], new K [1, Hkv, D, S], new V [1, Hkv, S, D])`.
    fn forward(&self, x: &Tensor, inputs: &AttentionInputs<'_>) -> Result<LayerOutputs>;
}

/// What a layer asks of its MLP (`mlp`): [`Mlp`], or Phi-3's [`FusedMlp`].
pub trait DecoderMlp: Module + Send + Sync + Sized {
    fn new(cfg: &TransformerConfig) -> Self;

    /// `[1, S, H] -> [1, S, H]`
    fn forward(&self, x: &Tensor) -> Result<Tensor>;
}

// The blocks' own `#[module]` forwards are the scopes; these only name them for the skeleton.
impl DecoderMlp for Mlp {
    fn new(cfg: &TransformerConfig) -> Self {
        Mlp::new(cfg)
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        Mlp::forward(self, x)
    }
}

impl DecoderMlp for FusedMlp {
    fn new(cfg: &TransformerConfig) -> Self {
        FusedMlp::new(cfg)
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        FusedMlp::forward(self, x)
    }
}

/// The Llama-style layer with the SwiGLU MLP.
pub type DecoderLayer<A> = LayerOf<A, Mlp>;

/// The Llama-style layer: (norm, attention, residual, norm, MLP, residual).
#[module]
pub struct LayerOf<A: DecoderAttention, M: DecoderMlp> {
    self_attn: A,
    mlp: M,
    input_layernorm: RmsNorm,
    post_attention_layernorm: RmsNorm,
    layer_idx: usize,
}

impl<A: DecoderAttention, M: DecoderMlp> LayerOf<A, M> {
    pub fn new(cfg: &TransformerConfig, layer_idx: usize) -> Self {
        LayerOf {
            self_attn: A::new(cfg),
            mlp: M::new(cfg),
            input_layernorm: cfg.rms_norm(cfg.hidden_size),
            post_attention_layernorm: cfg.rms_norm(cfg.hidden_size),
            layer_idx,
        }
    }
}

#[module]
impl<A: DecoderAttention, M: DecoderMlp> DecoderBlock for LayerOf<A, M> {
    fn new(cfg: &TransformerConfig, layer_idx: usize) -> Self {
        LayerOf::new(cfg, layer_idx)
    }

    /// `x [1, S, H]` → `(x [1, S, H], new K, new V)`
    fn forward(&self, x: &Tensor, inputs: &AttentionInputs<'_>) -> Result<LayerOutputs> {
        // 1. attention with residual (layer 0's input is the embedding, already quantized)
        let x = if self.layer_idx == 0 { x.clone() } else { qdq!(x, "input_layernorm_input_qdq")? };
        let h = self.input_layernorm.forward(&x)?;
        let (a, k, v) = self.self_attn.forward(&h, inputs)?;
        let x = residual(&x, &a, "add_0_lhs_input_qdq", Some("add_0_output_qdq"))?;
        // 2. MLP with residual
        let m = self.mlp.forward(&self.post_attention_layernorm.forward(&x)?)?;
        let x = residual(&x, &m, "add_1_lhs_input_qdq", None)?;
        Ok((x, k, v))
    }
}

/// The skeleton's model with Llama-style layers.
pub type DecoderModel<A> = ModelOf<DecoderLayer<A>>;
/// The skeleton's causal LM with Llama-style layers.
pub type DecoderForCausalLM<A> = CausalLmOf<DecoderLayer<A>>;

/// RoPE `(sin, cos)` tables `[1, L, D]` for positions `0..L`, computed from `inv_freq` unless the
/// checkpoint has them (HF checkpoints never do).
fn rope_tables(inv_freq: &[f32], cfg: &TransformerConfig) -> (Param, Param) {
    let table = [1, cfg.max_positions, cfg.head_dim];
    let (inv, len) = (inv_freq.to_vec(), cfg.max_positions);
    let inv2 = inv.clone();
    (
        Param::new(table, ParamRole::RopeTable).or_compute(move || Ok(sin_cos_tables(&inv, len)?.0)),
        Param::new(table, ParamRole::RopeTable).or_compute(move || Ok(sin_cos_tables(&inv2, len)?.1)),
    )
}

#[module]
pub struct ModelOf<L: DecoderBlock> {
    embed_tokens: Embedding,
    layers: ModuleList<L>,
    norm: RmsNorm,
    #[module(rename = "mllm_max_sin_embedding")]
    rope_sin: Param,
    #[module(rename = "mllm_max_cos_embedding")]
    rope_cos: Param,
    /// The sliding layers' own tables (Gemma 3's local RoPE base).
    #[module(rename = "mllm_max_local_sin_embedding")]
    local_rope_sin: Option<Param>,
    #[module(rename = "mllm_max_local_cos_embedding")]
    local_rope_cos: Option<Param>,
    hidden: usize,
    #[module(skip)]
    embed_scale: Option<f32>,
    #[module(skip)]
    sliding_layers: Vec<bool>,
}

impl<L: DecoderBlock> ModelOf<L> {
    pub fn new(cfg: &TransformerConfig) -> Self {
        let (rope_sin, rope_cos) = rope_tables(&cfg.rope_inv_freq, cfg);
        let local = cfg.sliding_rope_inv_freq.as_ref().map(|inv| rope_tables(inv, cfg));
        let (local_rope_sin, local_rope_cos) = local.map_or((None, None), |(s, c)| (Some(s), Some(c)));
        ModelOf {
            embed_tokens: Embedding::new(cfg.vocab_size, cfg.hidden_size),
            layers: (0..cfg.num_hidden_layers).map(|i| L::new(cfg, i)).collect(),
            norm: cfg.rms_norm(cfg.hidden_size),
            rope_sin,
            rope_cos,
            local_rope_sin,
            local_rope_cos,
            hidden: cfg.hidden_size,
            embed_scale: cfg.embed_scale,
            sliding_layers: cfg.sliding_layers.clone(),
        }
    }
}

#[module]
impl<L: DecoderBlock> ModelOf<L> {
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
        // 1. token embedding: [1, S] -> [1, S, H] (Gemma: times sqrt(H))
        let mut x = self.embed_tokens.forward(ids)?;
        if let Some(scale) = self.embed_scale {
            x = qdq!(x.mul(&qdq!(const scale, "embed_scale_qdq")?)?, "embed_scale_output_qdq")?;
        }
        // 2. RoPE rows for these positions: [1, L, D] -> [1, S, D] (and the sliding layers' own)
        let sin = qdq!(rope self.rope_sin.tensor()?, "sin_embedding_input_qdq")?.gather(1, positions)?;
        let cos = qdq!(rope self.rope_cos.tensor()?, "cos_embedding_input_qdq")?.gather(1, positions)?;
        let local = match (&self.local_rope_sin, &self.local_rope_cos) {
            (Some(s), Some(c)) => Some((
                qdq!(rope s.tensor()?, "local_sin_embedding_input_qdq")?.gather(1, positions)?,
                qdq!(rope c.tensor()?, "local_cos_embedding_input_qdq")?.gather(1, positions)?,
            )),
            _ => None,
        };
        // 3. mask planes: [1, 1, S, T] full causal, and [1, 1, S, T] sliding when the input has two
        let (full, window) = match mask.dim(1)? {
            1 => (mask.clone(), None),
            _ => (mask.slice(1, 0, 1)?, Some(mask.slice(1, 1, 2)?)),
        };
        // 4. decoder layers, collecting the new K/V
        let (mut keys, mut values) = (Vec::new(), Vec::new());
        for (i, layer) in self.layers.iter().enumerate() {
            let sliding = self.sliding_layers.get(i).copied().unwrap_or(false);
            let mask = match (&window, sliding) {
                (Some(w), true) => w,
                (None, true) => return Err(Error::msg(format!("layer {i} slides but the mask has one plane"))),
                _ => &full,
            };
            let (sin, cos) = match (&local, sliding) {
                (Some((s, c)), true) => (s, c),
                _ => (&sin, &cos),
            };
            let inputs = AttentionInputs { sin, cos, mask, past_key: &past_keys[i], past_value: &past_values[i] };
            let (h, k, v) = layer.forward(&x, &inputs)?;
            x = h;
            keys.push(k);
            values.push(v);
        }
        // 5. final norm, NHWC for the lm_head: [1, S, H] -> [1, 1, S, H]
        let x = self.norm.forward(&qdq!(x, "norm_input_qdq")?)?.view(&[1, 1, -1, self.hidden as i64])?;
        Ok((x, keys, values))
    }
}

#[module]
pub struct CausalLmOf<L: DecoderBlock> {
    model: ModelOf<L>,
    lm_head: Conv2d,
    #[module(skip)]
    cfg: TransformerConfig,
}

impl<L: DecoderBlock> CausalLmOf<L> {
    pub fn new(cfg: &TransformerConfig) -> Self {
        CausalLmOf { model: ModelOf::new(cfg), lm_head: Conv2d::new(cfg.hidden_size, cfg.vocab_size), cfg: cfg.clone() }
    }
}

#[module]
impl<L: DecoderBlock> CausalLm for CausalLmOf<L> {
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
        let logits = qdq!(self.lm_head.forward(&qdq!(x, "lm_head_input_qdq")?)?, "lm_head_output_qdq")?;
        // 3. Gemma's softcapping, cap * tanh(logits / cap) = 2 cap * sigmoid(2 logits / cap) - cap
        let Some(cap) = self.cfg.final_logit_softcapping else { return Ok((logits, keys, values)) };
        let z = qdq!(logits.mul(&qdq!(const 2.0 / cap, "softcap_scale_qdq")?)?, "softcap_z_qdq")?;
        let sig = qdq!(fixed z.sigmoid()?, "softcap_sigmoid_output_qdq", scale = SIGMOID_SCALE, zp = 0)?;
        let y = qdq!(sig.mul(&qdq!(const 2.0 * cap, "softcap_range_qdq")?)?, "softcap_mul_output_qdq")?;
        Ok((qdq!(y.add(&qdq!(const -cap, "softcap_shift_qdq")?)?, "softcap_output_qdq")?, keys, values))
    }

    fn bind_params(&mut self, src: &ParamSource<'_>) -> Result<()> {
        self.bind("", src)
    }

    fn shape(&self) -> mllm_dsl::DecoderShape {
        self.cfg.decoder_shape()
    }
}

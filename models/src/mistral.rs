//! Mistral (`MistralForCausalLM`): Llama's attention and MLP; every layer attends through the
//! config's `sliding_window` (the token at position `q` sees positions `q - window + 1 ..= q`).
//!
//! The window is not in this file: `HfConfig` reads it into `TransformerConfig::sliding_layers`,
//! the skeleton ([`crate::decoder`]) hands sliding layers plane 1 of the mask `[1, 2, S, ctx]`, and
//! the runtime (`runtime::AttentionMask`) fills that plane. So the file only names the types.

use crate::decoder::{DecoderForCausalLM, DecoderLayer, DecoderModel};
use crate::llama::LlamaAttention;
use crate::Family;

pub type MistralAttention = LlamaAttention;
pub type MistralDecoderLayer = DecoderLayer<MistralAttention>;
pub type MistralModel = DecoderModel<MistralAttention>;
pub type MistralForCausalLM = DecoderForCausalLM<MistralAttention>;

/// `model_type: "mistral"`.
pub const FAMILY: Family =
    Family { model_types: &["mistral"], build: |cfg| Ok(Box::new(MistralForCausalLM::new(cfg))) };

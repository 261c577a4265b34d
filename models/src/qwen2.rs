//! Qwen2 / Qwen2.5 in mllm's QNN-AOT form (`examples/qwen2_qnn_aot/modeling_qwen2_qnn_aot.hpp`).
//!
//! Qwen2's attention is Llama's ([`LlamaAttention`]) with biases on the q, k and v projections:
//! `TransformerConfig::qkv_bias`, which `HfConfig::qkv_bias` sets for every Qwen2 (its
//! `config.json` has no key saying so; o_proj has none). Like Llama it has no q/k norm.
//!
//! mllm's C++ file declares its q/k/v convs without bias while pymllm's Qwen2 trains and exports
//! them with one (`QLinearLPBQ(..., bias=attention_bias)`, default true); this file follows the
//! checkpoints, so HF and pymllm weights both load with their biases.

use crate::blocks::Mlp;
use crate::decoder::{DecoderForCausalLM, DecoderLayer, DecoderModel};
use crate::llama::LlamaAttention;

pub type Qwen2Attention = LlamaAttention;
pub type Qwen2Mlp = Mlp;
pub type Qwen2DecoderLayer = DecoderLayer<Qwen2Attention>;
pub type Qwen2Model = DecoderModel<Qwen2Attention>;
/// `model_type: "qwen2"`.
pub const FAMILY: crate::Family =
    crate::Family { model_types: &["qwen2"], build: |cfg| Ok(Box::new(Qwen2ForCausalLM::new(cfg))) };

pub type Qwen2ForCausalLM = DecoderForCausalLM<Qwen2Attention>;

//! IR snapshots of the tiny Llama and Qwen2 (hidden 64, chunk 4, context 16) in the QNN form, like
//! `qwen3_ir.rs`: the whole model cut to one layer and the attention, the part each family has its
//! own (`llama__<scope>__trace`, `qwen2__<scope>__trace`). The MLP (`blocks::Mlp`, shared with
//! Qwen3, snapshotted as `qwen3__mlp__trace`) and a decoder layer alone (the model snapshot holds
//! one) are traced and round-tripped but not snapshotted again. Review changes with
//! `cargo insta review`; every program must also parse back.

mod common;

use common::{checked_text, layer_inputs, one_layer, snapshot, snapshot_model};
use mllm_dsl::prelude::*;
use mllm_dsl::{CausalLm, Program};
use models::decoder::{DecoderAttention, DecoderBlock, DecoderForCausalLM, DecoderLayer};
use models::io::trace_inputs;
use models::llama::LlamaAttention;
use models::qwen2::Qwen2Attention;
use models::{blocks::Mlp, TransformerConfig};

const CHUNK: usize = 4;
const CONTEXT: usize = 16;
const QNN: ParamSource<'static> = ParamSource::Symbolic(ParamFormat::QnnW4A16);

fn act(shape: &[usize]) -> TraceInput {
    TraceInput::new("x", shape.to_vec(), DType::U16Asym)
}

fn whole_model<A: DecoderAttention>(cfg: &TransformerConfig) -> Program {
    let mut model = DecoderForCausalLM::<A>::new(cfg);
    model.declare(ParamFormat::QnnW4A16).unwrap();
    let inputs = trace_inputs(cfg, CHUNK, CONTEXT, ParamFormat::QnnW4A16);
    trace(&inputs, |t| model.forward_graph(t)).unwrap()
}

fn mlp_scope(cfg: &TransformerConfig) -> Program {
    let mut mlp = Mlp::new(cfg);
    mlp.bind("model.layers.0.mlp", &QNN).unwrap();
    trace(&[act(&[1, CHUNK, cfg.hidden_size])], |t| mlp.forward(&t[0])).unwrap()
}

/// Layer 0's attention inputs: `x`, `sin`, `cos`, the mask and layer 0's past K/V.
fn attention_inputs(cfg: &TransformerConfig) -> Vec<TraceInput> {
    let all = trace_inputs(cfg, CHUNK, CONTEXT, ParamFormat::QnnW4A16);
    let d = cfg.head_dim;
    vec![
        act(&[1, CHUNK, cfg.hidden_size]),
        TraceInput::new("sin", [1, CHUNK, d], DType::U16Asym),
        TraceInput::new("cos", [1, CHUNK, d], DType::U16Asym),
        all[2].clone(),
        all[3].clone(),
        all[3 + cfg.num_hidden_layers].clone(),
    ]
}

fn attention_scope<A: DecoderAttention>(cfg: &TransformerConfig) -> Program {
    let mut attn = A::new(cfg);
    attn.bind("model.layers.0.self_attn", &QNN).unwrap();
    trace(&attention_inputs(cfg), |t| attn.forward(&t[0], &layer_inputs(t))).unwrap()
}

fn decoder_scope<A: DecoderAttention>(cfg: &TransformerConfig) -> Program {
    let mut layer = DecoderLayer::<A>::new(cfg, 1);
    layer.bind("model.layers.1", &QNN).unwrap();
    trace(&attention_inputs(cfg), |t| layer.forward(&t[0], &layer_inputs(t))).unwrap()
}

#[test]
fn llama_whole_model() {
    let program = whole_model::<LlamaAttention>(&one_layer(TransformerConfig::tiny_llama()));
    snapshot_model("llama__model__trace", &program);
}

#[test]
fn llama_scopes() {
    let cfg = TransformerConfig::tiny_llama();
    checked_text("llama mlp", &mlp_scope(&cfg));
    snapshot("llama__attention__trace", &attention_scope::<LlamaAttention>(&cfg));
    checked_text("llama decoder", &decoder_scope::<LlamaAttention>(&cfg));
}

#[test]
fn qwen2_whole_model() {
    let program = whole_model::<Qwen2Attention>(&one_layer(TransformerConfig::tiny_qwen2()));
    snapshot_model("qwen2__model__trace", &program);
}

#[test]
fn qwen2_scopes() {
    let cfg = TransformerConfig::tiny_qwen2();
    checked_text("qwen2 mlp", &mlp_scope(&cfg));
    snapshot("qwen2__attention__trace", &attention_scope::<Qwen2Attention>(&cfg));
    checked_text("qwen2 decoder", &decoder_scope::<Qwen2Attention>(&cfg));
}

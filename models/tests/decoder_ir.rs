//! IR snapshots of the tiny Llama and Qwen2 (hidden 64, 2 layers, chunk 4, context 16) in the QNN
//! form, per scope, like `qwen3_ir.rs`: `llama__<scope>__trace`, `qwen2__<scope>__trace`. Review
//! changes with `cargo insta review`; every snapshot must also parse back.

mod common;

use common::{layer_inputs, snapshot};
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
    let program = whole_model::<LlamaAttention>(&TransformerConfig::tiny_llama());
    assert!(program.to_string().lines().count() <= 600);
    snapshot("llama__model__trace", &program);
}

#[test]
fn llama_scopes() {
    let cfg = TransformerConfig::tiny_llama();
    snapshot("llama__mlp__trace", &mlp_scope(&cfg));
    snapshot("llama__attention__trace", &attention_scope::<LlamaAttention>(&cfg));
    snapshot("llama__decoder__trace", &decoder_scope::<LlamaAttention>(&cfg));
}

#[test]
fn qwen2_whole_model() {
    let program = whole_model::<Qwen2Attention>(&TransformerConfig::tiny_qwen2());
    assert!(program.to_string().lines().count() <= 600);
    snapshot("qwen2__model__trace", &program);
}

#[test]
fn qwen2_scopes() {
    let cfg = TransformerConfig::tiny_qwen2();
    snapshot("qwen2__mlp__trace", &mlp_scope(&cfg));
    snapshot("qwen2__attention__trace", &attention_scope::<Qwen2Attention>(&cfg));
    snapshot("qwen2__decoder__trace", &decoder_scope::<Qwen2Attention>(&cfg));
}

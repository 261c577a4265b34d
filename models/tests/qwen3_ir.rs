//! IR snapshots of the tiny Qwen3 (hidden 64, chunk 4, context 16) in the QNN form: the whole model
//! cut to one layer (at most [`common::MAX_MODEL_LINES`] lines), the MLP and the attention. A
//! decoder layer alone is traced and round-tripped but not snapshotted (the model snapshot holds
//! one). Review changes with `cargo insta review`; every program must also parse back.

mod common;

use common::{checked_text, layer_inputs, one_layer, snapshot, snapshot_model};
use mllm_dsl::prelude::*;
use mllm_dsl::CausalLm;
use models::decoder::{DecoderAttention, DecoderBlock};
use models::io::trace_inputs;
use models::qwen3::{Qwen3Attention, Qwen3DecoderLayer, Qwen3ForCausalLM, Qwen3Mlp};
use models::TransformerConfig;

const CHUNK: usize = 4;
const CONTEXT: usize = 16;
const QNN: ParamSource<'static> = ParamSource::Symbolic(ParamFormat::QnnW4A16);

fn act(shape: &[usize]) -> TraceInput {
    TraceInput::new("x", shape.to_vec(), DType::U16Asym)
}

#[test]
fn whole_model() {
    let cfg = one_layer(TransformerConfig::tiny_qwen3());
    let mut model = Qwen3ForCausalLM::new(&cfg);
    model.declare(ParamFormat::QnnW4A16).unwrap();
    let inputs = trace_inputs(&cfg, CHUNK, CONTEXT, ParamFormat::QnnW4A16);
    let program = trace(&inputs, |t| model.forward_graph(t)).unwrap();
    snapshot_model("qwen3__model__trace", &program);
}

/// Values are named after what defines them, not numbered through the whole program, so one op
/// inserted into layer 0's MLP changes its own line and its consumer's, not every line after it.
#[test]
fn an_inserted_op_changes_only_the_lines_that_mention_it() {
    use mllm_dsl::ir::{LinalgOp, Node, ValueDef};
    use mllm_dsl::op::OpKind;
    let cfg = TransformerConfig::tiny_qwen3();
    let mut model = Qwen3ForCausalLM::new(&cfg);
    model.declare(ParamFormat::QnnW4A16).unwrap();
    let inputs = trace_inputs(&cfg, CHUNK, CONTEXT, ParamFormat::QnnW4A16);
    let before = trace(&inputs, |t| model.forward_graph(t)).unwrap();
    // A Neg after `up_proj`, read by what read `up_proj`'s output.
    let mut after = before.clone();
    let g = after.graph_id("model.layers.0.mlp").unwrap();
    let body = &after.graph(g).region.body;
    let at = body
        .iter()
        .position(|n| matches!(n, Node::Linalg(op) if op.name.as_deref() == Some("model.layers.0.mlp.up_proj")))
        .unwrap();
    let Node::Linalg(up) = &body[at] else { unreachable!() };
    let (up_out, device) = (up.outputs[0], up.device);
    let neg = after.add_value(ValueDef::new(after.value(up_out).ty.clone()));
    let body = &mut after.graph_mut(g).region.body;
    for node in body.iter_mut().skip(at + 1) {
        if let Node::Linalg(op) = node {
            op.inputs.iter_mut().filter(|v| **v == up_out).for_each(|v| *v = neg);
        }
    }
    let op = LinalgOp {
        device,
        kind: OpKind::Neg,
        name: Some("model.layers.0.mlp.Neg.0".into()),
        attrs: Default::default(),
        inputs: vec![up_out],
        outputs: vec![neg],
    };
    body.insert(at + 1, Node::Linalg(op));
    let diff = common::line_diff(&checked_text("before", &before), &checked_text("after", &after));
    let removed: Vec<&str> = diff.lines().filter(|l| l.starts_with('-')).collect();
    let added: Vec<&str> = diff.lines().filter(|l| l.starts_with('+')).collect();
    assert_eq!((removed.len(), added.len()), (1, 2), "{diff}");
    assert!(added.iter().any(|l| l.contains("NegOp <name=\"model.layers.0.mlp.Neg.0\"> (%.up_proj) -> (%.Neg.0:")));
    assert!(added.iter().any(|l| l.contains("(%.Neg.0)")), "{diff}");
}

#[test]
fn mlp_scope() {
    let cfg = TransformerConfig::tiny_qwen3();
    let mut mlp = Qwen3Mlp::new(&cfg);
    mlp.bind("model.layers.0.mlp", &QNN).unwrap();
    let program = trace(&[act(&[1, CHUNK, 64])], |t| mlp.forward(&t[0])).unwrap();
    snapshot("qwen3__mlp__trace", &program);
}

fn attention_inputs(cfg: &TransformerConfig) -> Vec<TraceInput> {
    let all = trace_inputs(cfg, CHUNK, CONTEXT, ParamFormat::QnnW4A16);
    let (d, past) = (cfg.head_dim, CONTEXT - CHUNK);
    vec![
        act(&[1, CHUNK, cfg.hidden_size]),
        TraceInput::new("sin", [1, CHUNK, d], DType::U16Asym),
        TraceInput::new("cos", [1, CHUNK, d], DType::U16Asym),
        all[2].clone(),
        all[3].clone(),
        all[3 + cfg.num_hidden_layers].clone(),
    ]
    .into_iter()
    .inspect(|t| assert!(t.ty.shape.iter().all(|&s| s > 0) && past > 0))
    .collect()
}

#[test]
fn attention_scope() {
    let cfg = TransformerConfig::tiny_qwen3();
    let mut attn = Qwen3Attention::new(&cfg);
    attn.bind("model.layers.0.self_attn", &QNN).unwrap();
    let program = trace(&attention_inputs(&cfg), |t| attn.forward(&t[0], &layer_inputs(t))).unwrap();
    snapshot("qwen3__attention__trace", &program);
}

#[test]
fn decoder_scope() {
    let cfg = TransformerConfig::tiny_qwen3();
    let mut layer = Qwen3DecoderLayer::new(&cfg, 1);
    layer.bind("model.layers.1", &QNN).unwrap();
    let program = trace(&attention_inputs(&cfg), |t| layer.forward(&t[0], &layer_inputs(t))).unwrap();
    checked_text("qwen3 decoder", &program);
}

/// The real Qwen3-1.7B config traces without weights for both chunk sizes, and the op census equals
/// the one mllm's current modeling file produces (mllm's qwen3_qnn_aot_1.7B.mir dump: Conv2D 197, View 365 counting
/// mllm's unsqueeze views, Mul 196, ...).
#[test]
fn qwen3_1_7b_traces_with_mllm_op_census() {
    use std::collections::BTreeMap;
    let cfg = TransformerConfig::qwen3_1_7b();
    let mut model = Qwen3ForCausalLM::new(&cfg);
    model.declare(ParamFormat::QnnW4A16).unwrap();
    let layers = cfg.num_hidden_layers;
    for chunk in [32, 1] {
        let inputs = trace_inputs(&cfg, chunk, 1024, ParamFormat::QnnW4A16);
        let program = trace(&inputs, |t| model.forward_graph(t)).unwrap();
        let mut census: BTreeMap<&str, usize> = BTreeMap::new();
        for op in program.linalg_ops() {
            *census.entry(op.kind.type_name()).or_default() += 1;
        }
        let expected: BTreeMap<&str, usize> = [
            ("Add", 140),
            ("CastType", 112),
            ("Concat", 112),
            ("Conv2D", 197),
            ("Embedding", 1),
            ("Equal", 28),
            ("Gather", 2),
            ("MatMul", 56),
            ("Mul", 196),
            ("Neg", 56),
            ("RMSNorm", 113),
            ("ReduceMin", 28),
            ("Repeat", 56),
            ("Sigmoid", 28),
            ("Slice", 112),
            ("Softmax", 28),
            ("Transpose", 140),
            ("Unsqueeze", 56),
            ("View", 309),
            ("Where", 28),
        ]
        .into_iter()
        .collect();
        assert_eq!(census, expected, "chunk {chunk}");
        // Subgraphs: @init, @model, and per layer the layer, its attention and its MLP.
        assert_eq!(program.subgraphs().count(), 2 + 3 * layers);
        let logits = program.value(program.main.outputs[0]);
        assert_eq!(logits.ty.shape, vec![1, 1, chunk, cfg.vocab_size]);
    }
}

//! The AOT pass pipeline on a real quantized Qwen3: pymllm's export of the tiny HF Qwen3
//! (`fixtures/pymllm-qwen3-dev-f32`: hidden 32, 2 layers, head_dim 8, vocab 128, LPBQ block 16),
//! traced at chunk 4 / context 16 in the QNN form.
//!
//! - After every pass, the IR prints within the line limit and parses back; what each pass changed
//!   is snapshotted, on the first layer, as a line diff from the stage before
//!   (`snapshots/qwen3__model__passes.snap`, review with `cargo insta review`).
//! - After every pass, backend-cpu's interpreter runs the program on fixed inputs and must give the
//!   eager model's outputs: bit for bit in float, within one quantization step of each output in
//!   fake-quant (QDQ parameters from the checkpoint).
//! - Per-pass checks on the real model: spec sharing, solved parameters, constants, LPBQ layout,
//!   the flat graph, the I/O contract and tensor names; and PTQ's errors on a corrupted checkpoint.
#![allow(clippy::result_large_err)] // PassError carries its context; see compiler::passes.

mod common;

use backend_cpu::{CheckpointStore, CpuBackend, InterpMode, Interpreter, QdqHook, QdqHookError};
use checkpoint::SafetensorsCheckpoint;
use common::{checked_text, line_diff, snapshot_text};
use compiler::aot_config::AotConfig;
use compiler::passes::{qdq_params, ParamError, Pipeline, QuantParamProvider, StoredTensor};
use compiler::quant::fake_quant::FakeQuantizer;
use mllm_dsl::causal_lm::{MASK_SCALE, MASK_ZERO_POINT};
use mllm_dsl::ir::{Node, QuantSpecKind, SpecParams};
use mllm_dsl::prelude::*;
use mllm_dsl::{BackendRef, CausalLm, Program, QdqAttr, Storage, TensorType};
use models::hf::HfConfig;
use models::io::{kv_qdq, trace_inputs, KvCache};
use models::qwen3::Qwen3ForCausalLM;
use models::TransformerConfig;
use std::path::PathBuf;
use std::sync::Arc;

const CHUNK: usize = 4;
const CONTEXT: usize = 16;
/// Valid past tokens in the cache (the rest of the past columns are masked).
const N_PAST: usize = 7;
/// RoPE table rows of the export (`mllm_qualcomm_max_length`).
const MAX_POSITIONS: usize = 1024;

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fixtures/pymllm-qwen3-dev-f32")
}

fn model_config() -> TransformerConfig {
    TransformerConfig::from_hf(&HfConfig::from_dir(fixture()).unwrap(), MAX_POSITIONS)
}

/// The fixture's first `layers` layers (the checkpoint's later layers go unread).
fn first_layers(layers: usize) -> TransformerConfig {
    TransformerConfig { num_hidden_layers: layers, ..model_config() }
}

fn aot_config() -> AotConfig {
    aot_config_for(&model_config())
}

fn aot_config_for(model: &TransformerConfig) -> AotConfig {
    let mut c = AotConfig::w4a16_kv8();
    c.quant_recipe.layers = model.num_hidden_layers as u32;
    c
}

fn checkpoint() -> SafetensorsCheckpoint {
    SafetensorsCheckpoint::open(fixture()).unwrap()
}

fn traced(chunk: usize) -> Program {
    traced_model(&model_config(), chunk)
}

fn traced_model(cfg: &TransformerConfig, chunk: usize) -> Program {
    let cfg = cfg.clone();
    let mut model = Qwen3ForCausalLM::new(&cfg);
    model.declare(ParamFormat::QnnW4A16).unwrap();
    let inputs = trace_inputs(&cfg, chunk, CONTEXT, ParamFormat::QnnW4A16);
    trace(&inputs, |t| model.forward_graph(t)).unwrap()
}

/// The program after the first `n` passes.
fn after(n: usize, chunk: usize) -> Program {
    let (cfg, ckpt) = (aot_config(), checkpoint());
    let mut p = traced(chunk);
    for pass in Pipeline::qnn_aot(&cfg, &ckpt).passes().take(n) {
        pass.run(&mut p).unwrap_or_else(|e| panic!("{e}"));
    }
    p
}

/// Eager fake-quant: every QDQ point quantized with the checkpoint's parameters (torch's rounding).
struct CheckpointQdq(SafetensorsCheckpoint);

impl QdqHook for CheckpointQdq {
    fn apply(&self, point: &QdqAttr, x: &[f32], _shape: &[usize]) -> Result<Option<Vec<f32>>, QdqHookError> {
        let params = qdq_params(point, &self.0).map_err(|e| QdqHookError::Params(e.into()))?;
        let fq = FakeQuantizer::new(&params);
        Ok(Some(x.iter().map(|&v| fq.fake(v)).collect()))
    }

    /// The outputs' 16-bit grid, as the interpreter records it: the linears after a QDQ point
    /// then run the same (integer) products in both.
    fn grid(&self, point: &QdqAttr) -> Option<backend_cpu::kernels::Grid> {
        let p = qdq_params(point, &self.0).ok()?;
        backend_cpu::on_grid::u16_grid(p.scale, p.zero_point, p.qmin, p.qmax)
    }
}

/// Fixed inputs on the quantization grid of the graph inputs (ids, positions N_PAST.., a causal
/// mask over N_PAST valid past columns, past K/V on each layer's u8 grid), as eager tensors.
fn inputs(backend: &BackendRef, ckpt: &SafetensorsCheckpoint) -> Vec<Tensor> {
    let cfg = model_config();
    let (kvh, d, past) = (cfg.num_key_value_heads, cfg.head_dim, CONTEXT - CHUNK);
    let ids: Vec<i64> = vec![5, 17, 99, 3];
    let pos: Vec<i64> = (N_PAST..N_PAST + CHUNK).map(|p| p as i64).collect();
    let masked = -(MASK_ZERO_POINT as f32) * MASK_SCALE; // u16 code 0
    let mut mask = Vec::new();
    for row in 0..CHUNK {
        for col in 0..CONTEXT {
            let attend = col < N_PAST || (col >= past && col - past <= row);
            mask.push(if attend { 0.0 } else { masked });
        }
    }
    let t = |data: Vec<f32>, shape: Vec<usize>, dtype: DType| {
        Tensor::from_storage(TensorType::new(shape, dtype), Storage::F32(data.into()), backend.clone()).unwrap()
    };
    let mut v = vec![
        Tensor::from_i64(ids, vec![1, CHUNK], DType::I32, backend.clone()).unwrap(),
        Tensor::from_i64(pos, vec![CHUNK], DType::I32, backend.clone()).unwrap(),
        t(mask, vec![1, 1, CHUNK, CONTEXT], DType::F32),
    ];
    let mut seed = 0x2545_f491u32;
    let mut codes = |n: usize| -> Vec<i32> {
        (0..n)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 17;
                seed ^= seed << 5;
                // Mostly near the middle, like real K/V.
                (96 + seed % 64) as i32
            })
            .collect()
    };
    for which in [KvCache::Key, KvCache::Value] {
        for l in 0..cfg.num_hidden_layers {
            let scale = QuantParamProvider::scalar_f32(ckpt, &kv_qdq(l, which).scale_key()).unwrap();
            let data: Vec<f32> = codes(kvh * d * past).iter().map(|&c| (c - 128) as f32 * scale).collect();
            let shape = if which == KvCache::Key { vec![1, kvh, d, past] } else { vec![1, kvh, past, d] };
            v.push(t(data, shape, DType::U8Sym));
        }
    }
    v
}

/// The eager model's outputs `[logits, keys.., values..]` on `backend`.
fn eager(backend: BackendRef, ckpt: &SafetensorsCheckpoint) -> Vec<Tensor> {
    let cfg = model_config();
    let store = CheckpointStore::open(fixture(), backend.clone(), cfg.tie_word_embeddings).unwrap();
    let mut model = Qwen3ForCausalLM::new(&cfg);
    model.bind_weights(&store).unwrap();
    let x = inputs(&backend, ckpt);
    let (logits, ks, vs) = model.forward_graph(&x).unwrap();
    std::iter::once(logits).chain(ks).chain(vs).collect()
}

fn interpret(p: &Program, mode: InterpMode<'_>, ckpt: &SafetensorsCheckpoint) -> Vec<Tensor> {
    let backend = CpuBackend::float();
    let store = CheckpointStore::open(fixture(), backend.clone(), true).unwrap();
    Interpreter::new(p, &store, mode).run(&inputs(&backend, ckpt)).unwrap_or_else(|e| panic!("{e}"))
}

/// Quantization step of each output (`[logits, keys.., values..]`).
fn output_steps(ckpt: &SafetensorsCheckpoint) -> Vec<f32> {
    let l = model_config().num_hidden_layers;
    let scale = |k: &str| QuantParamProvider::scalar_f32(ckpt, &format!("{k}.fake_quant.scale")).unwrap();
    let mut steps = vec![scale("lm_head_output_qdq")];
    for which in [KvCache::Key, KvCache::Value] {
        steps.extend((0..l).map(|i| scale(&kv_qdq(i, which).key)));
    }
    steps
}

/// The CPU backend runs RoPE and the masked softmax as fused steps when its hook hands out its
/// quantizers (`FakeQuantHook`), and op by op otherwise (`CheckpointQdq`): the same values either
/// way, bit for bit, on every output. (In float mode, the interpreter's op-by-op run of the
/// traced program is the other side: see `every_pass_preserves_the_models_outputs`.)
#[test]
fn fused_steps_equal_the_ops_in_fake_quant() {
    let ckpt = checkpoint();
    let points = compiler::quant::points::qdq_points(&traced(CHUNK)).unwrap();
    let params = backend_cpu::quant::QdqParams::from_checkpoint(&ckpt, &points).unwrap();
    let fused = eager(CpuBackend::with_qdq(Arc::new(backend_cpu::quant::FakeQuantHook::new(&params))), &ckpt);
    let ops = eager(CpuBackend::with_qdq(Arc::new(CheckpointQdq(checkpoint()))), &ckpt);
    assert_eq!(fused.len(), ops.len());
    for (i, (a, b)) in fused.iter().zip(&ops).enumerate() {
        let (a, b) = (a.as_f32().unwrap(), b.as_f32().unwrap());
        assert!(a.iter().all(|v| v.is_finite()), "output {i} has a non-finite value");
        let differ = a.iter().zip(b).filter(|(x, y)| x.to_bits() != y.to_bits()).count();
        assert!(differ == 0 && a.len() == b.len(), "output {i}: {differ} of {} values differ", a.len());
    }
}

#[test]
fn every_pass_preserves_the_models_outputs() {
    let ckpt = checkpoint();
    let float_ref = eager(CpuBackend::float(), &ckpt);
    let fq_ref = eager(CpuBackend::with_qdq(Arc::new(CheckpointQdq(checkpoint()))), &ckpt);
    let steps = output_steps(&ckpt);
    // Fake quantization changes the result (the comparison below is not vacuous).
    assert_ne!(float_ref[0].as_f32().unwrap(), fq_ref[0].as_f32().unwrap());

    let check = |stage: &str, p: &Program| {
        let float = interpret(p, InterpMode::Float, &ckpt);
        assert_eq!(float.len(), float_ref.len(), "{stage}");
        for (i, (a, b)) in float.iter().zip(&float_ref).enumerate() {
            let (a, b) = (a.as_f32().unwrap(), b.as_f32().unwrap());
            let same = a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
            assert!(same && a.len() == b.len(), "{stage}: float output {i} differs from the eager model");
        }
        let fq = interpret(p, InterpMode::FakeQuant(&ckpt), &ckpt);
        let mut worst_steps = 0.0f32;
        for (i, ((a, b), step)) in fq.iter().zip(&fq_ref).zip(&steps).enumerate() {
            let (a, b) = (a.as_f32().unwrap(), b.as_f32().unwrap());
            let worst = a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0f32, |m: f32, d| {
                if m.is_nan() || d.is_nan() {
                    f32::NAN
                } else {
                    m.max(d)
                }
            });
            assert!(worst <= step * 1.001, "{stage}: fake-quant output {i} is {worst} off (step {step})");
            worst_steps = worst_steps.max(worst / step);
        }
        eprintln!("{stage}: float bit-exact; fake-quant within {worst_steps} quantization steps of eager");
    };

    let (cfg, mut p) = (aot_config(), traced(CHUNK));
    check("trace", &p);
    let mut stages = Vec::new();
    Pipeline::qnn_aot(&cfg, &ckpt)
        .run_observed(&mut p, |pass, prog| {
            checked_text(pass.stage(), prog);
            check(pass.stage(), prog);
            stages.push(pass.stage());
            Ok(())
        })
        .unwrap();
    assert_eq!(stages.len(), 9);
}

/// One snapshot: what each pass changes in the printed program, as line diffs from the stage
/// before, on the fixture's first layer (every layer changes the same way; the traced program is
/// `qwen3__model__trace`'s with the fixture's widths).
#[test]
fn what_each_pass_changes_is_one_reviewable_snapshot() {
    let (model, ckpt) = (first_layers(1), checkpoint());
    let mut p = traced_model(&model, CHUNK);
    let mut previous = checked_text("trace", &p);
    let mut passes = format!("trace: {} lines\n", previous.lines().count());
    Pipeline::qnn_aot(&aot_config_for(&model), &ckpt)
        .run_observed(&mut p, |pass, prog| {
            let text = checked_text(pass.stage(), prog);
            let diff = line_diff(&previous, &text);
            let changed = diff.lines().filter(|l| !l.starts_with("@@")).count();
            passes.push_str(&format!("\n== {} ({changed} lines changed) ==\n{diff}", pass.stage()));
            previous = text;
            Ok(())
        })
        .unwrap();
    let lines = passes.lines().count();
    assert!(lines <= MAX_PASSES_SNAPSHOT_LINES, "the passes snapshot has {lines} lines");
    snapshot_text("qwen3__model__passes", &passes);
}

/// What a reviewer reads for the pass pipeline.
const MAX_PASSES_SNAPSHOT_LINES: usize = 2000;

#[test]
fn recipe_gives_every_model_value_a_spec_with_mllms_sharing() {
    let p = after(4, CHUNK);
    let model_ops = p.linalg_ops();
    for op in &model_ops {
        for v in op.inputs.iter().chain(&op.outputs) {
            assert!(p.value(*v).spec.is_some(), "{:?}: {:?} has no spec", op.name, p.value(*v));
        }
    }
    let by_name = |n: &str| *model_ops.iter().find(|op| op.name.as_deref() == Some(n)).unwrap();
    let spec = |v| p.value(v).spec.unwrap();
    // rotate_half: the concat output is the neg half's spec; the KV concat is past_key's.
    let rot = by_name("model.layers.0.self_attn.Concat.0");
    assert_eq!(spec(rot.outputs[0]), spec(rot.inputs[0]));
    assert_ne!(spec(rot.inputs[0]), spec(rot.inputs[1]));
    let kv = by_name("model.layers.0.self_attn.Concat.2");
    assert_eq!(spec(kv.inputs[0]), spec(p.main.inputs[3]));
    assert_eq!(p.spec(spec(kv.outputs[0])).kind, QuantSpecKind::simple(DType::U8Sym).unwrap());
    // Every projection's weight is LPBQ with the config's block size.
    for op in model_ops.iter().filter(|op| op.kind == mllm_dsl::op::OpKind::Conv2d) {
        assert_eq!(p.value_spec(op.inputs[1]).unwrap().kind, QuantSpecKind::lpbq_hwio(16), "{:?}", op.name);
    }
    // 2 layers x 7 projections + lm_head.
    let lpbq = p.specs.iter().filter(|s| matches!(s.kind, QuantSpecKind::Lpbq { .. })).count();
    assert_eq!(lpbq, 15);
}

#[test]
fn ptq_solves_every_spec_from_the_checkpoint() {
    let p = after(5, CHUNK);
    let ckpt = checkpoint();
    assert!(p.specs.iter().all(|s| s.is_solved()));
    // QDQ-annotated values carry exactly the checkpoint's parameters.
    for def in &p.values {
        let (Some(q), Some(s)) = (def.qdq.as_ref(), def.spec) else { continue };
        let want = qdq_params(q, &ckpt).unwrap();
        assert_eq!(p.spec(s).per_tensor(), Some((want.scale, want.zero_point)), "{}", q.key);
    }
    // Norm and embedding weights: `<op>.scale` / `.zero_point`.
    let norm = p.values.iter().find(|d| d.symbol.as_deref() == Some("model.norm.weight")).unwrap();
    let (s, z) = p.spec(norm.spec.unwrap()).per_tensor().unwrap();
    assert_eq!(s, QuantParamProvider::scalar_f32(&ckpt, "model.norm.scale").unwrap());
    assert_eq!(z, QuantParamProvider::scalar_i32(&ckpt, "model.norm.zero_point").unwrap());
    // mllm's constant rule: 0.0 against the mask encoding is 65535.
    let zero = p.values.iter().find(|d| d.qdq.as_ref().is_some_and(|q| q.key == "constant_zero")).unwrap();
    assert_eq!(zero.quantized, Some(65535));
    assert_eq!(zero.ty.dtype, DType::U16Asym);
}

/// The checkpoint with one scale replaced.
struct Patched {
    ckpt: SafetensorsCheckpoint,
    key: &'static str,
    scale: f32,
}

impl QuantParamProvider for Patched {
    fn name(&self) -> String {
        format!("patched {}", QuantParamProvider::name(&self.ckpt))
    }
    fn tensor(&self, key: &str) -> Result<Option<StoredTensor>, ParamError> {
        self.ckpt.tensor(key)
    }
    fn read_f32(&self, key: &str) -> Result<Vec<f32>, ParamError> {
        if key == self.key {
            return Ok(vec![self.scale]);
        }
        QuantParamProvider::read_f32(&self.ckpt, key)
    }
    fn read_i32(&self, key: &str) -> Result<Vec<i32>, ParamError> {
        QuantParamProvider::read_i32(&self.ckpt, key)
    }
    fn int_range(&self, key: &str) -> Result<Option<(i64, i64)>, ParamError> {
        self.ckpt.int_range(key)
    }
}

#[test]
fn ptq_rejects_a_checkpoint_whose_rotate_half_inputs_disagree() {
    // pymllm's ConcatObserver ties q_rope_neg_half to q_norm_output; break the tie.
    let key = "model.layers.1.self_attn.k_rope_neg_half_qdq.fake_quant.scale";
    let patched = Patched { ckpt: checkpoint(), key, scale: 0.01 };
    let cfg = aot_config();
    let mut p = traced(CHUNK);
    let err = Pipeline::qnn_aot(&cfg, &patched).run(&mut p).unwrap_err().to_string();
    assert!(err.starts_with("PTQ: concat `model.layers.1.self_attn.Concat.1` in `model.layers.1.self_attn`"), "{err}");
    assert!(err.contains("k_norm_output_qdq") || err.contains("k_rope_neg_half_qdq"), "{err}");
}

#[test]
fn lpbq_weights_are_canonical_with_blocks_from_the_config() {
    let p = after(6, CHUNK);
    let cfg = model_config();
    let (h, i, q) = (cfg.hidden_size, cfg.intermediate_size, cfg.num_attention_heads * cfg.head_dim);
    let mut seen = 0;
    for op in p.linalg_ops().iter().filter(|op| op.kind == mllm_dsl::op::OpKind::Conv2d) {
        let w = p.value(op.inputs[1]);
        assert_eq!(w.ty.dtype, DType::I4Lpbq);
        let [1, 1, cin, cout] = w.ty.shape[..] else { panic!() };
        let Some(SpecParams::Lpbq { from, blocks, channels }) = &p.value_spec(op.inputs[1]).unwrap().params else {
            panic!()
        };
        assert_eq!(from, op.name.as_ref().unwrap());
        assert_eq!((*blocks, *channels), (Some(cin / 16), Some(cout)));
        assert!([h, i, q].contains(&cin));
        seen += 1;
    }
    assert_eq!(seen, 15);
}

#[test]
fn split_mark_and_rename_give_mllms_graphs_and_io() {
    for chunk in [CHUNK, 1] {
        let p = after(9, chunk);
        let name = format!("model.0.s{chunk}");
        let symbols: Vec<&str> = p.subgraphs().map(|g| g.symbol.as_str()).collect();
        assert_eq!(symbols, ["init", "model", name.as_str()]);
        let flat = p.subgraph(&name).unwrap();
        assert_eq!(flat.region.inputs, p.main.inputs);
        let io_name = |v| match &p.value(v).name {
            Some(s) => s.clone(),
            other => panic!("{other:?}"),
        };
        let ins: Vec<String> = flat.region.inputs.iter().map(|v| io_name(*v)).collect();
        let outs: Vec<String> = flat.region.outputs.iter().map(|v| io_name(*v)).collect();
        assert_eq!(
            ins,
            ["input_ids", "position_ids", "attention_mask", "past_key_0", "past_key_1", "past_value_0", "past_value_1"]
        );
        assert_eq!(outs, ["logits", "present_key_0", "present_key_1", "present_value_0", "present_value_1"]);
        let ops = flat.region.body.iter().filter(|n| matches!(n, Node::Linalg(_))).count();
        assert_eq!(ops, traced(chunk).linalg_ops().len());
    }
}

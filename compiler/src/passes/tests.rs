//! A two-layer miniature of mllm's Qwen3 (every op kind and QDQ pattern the passes have rules for:
//! embedding, gathered RoPE-like table, norms, 1×1 convs with views, a rotate-half concat, uint8
//! KV cache concatenated with the past and repeated for GQA, the masked softmax with its three
//! constants, a fixed-QDQ sigmoid, lm_head at the top) and pipeline-level tests on it.

use crate::aot_config::AotConfig;
use crate::passes::{Pass, Pipeline, SyntheticParams};
use mllm_dsl::ir::{parse, Attr, Node, Program, QuantSpecKind, ValueId, MAX_LINE};
use mllm_dsl::prelude::*;
use mllm_dsl::{QdqAttr, QdqKind};

pub(crate) const HIDDEN: usize = 16;
pub(crate) const HEAD_DIM: usize = 8;
pub(crate) const CHUNK: usize = 4;
pub(crate) const CONTEXT: usize = 12;
pub(crate) const LAYERS: usize = 2;
pub(crate) const VOCAB: usize = 32;
use mllm_dsl::causal_lm::{MASK_SCALE, MASK_ZERO_POINT};

#[mllm_dsl::module]
struct Attn {
    q_proj: Conv2d,
    k_proj: Conv2d,
    v_proj: Conv2d,
    o_proj: Conv2d,
    q_norm: RmsNorm,
}

#[mllm_dsl::module]
impl Attn {
    fn forward(
        &self,
        x: &Tensor,
        cos: &Tensor,
        mask: &Tensor,
        pk: &Tensor,
        pv: &Tensor,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        let h = HIDDEN as i64;
        let x = qdq!(x, "q_proj_input_qdq")?.view(&[1, 1, -1, h])?;
        let q = self.q_proj.forward(&x)?.view(&[1, -1, 2, 8])?.transpose(1, 2)?;
        let k = self.k_proj.forward(&x)?.view(&[1, -1, 1, 8])?.transpose(1, 2)?;
        let v = self.v_proj.forward(&x)?.view(&[1, -1, 1, 8])?.transpose(1, 2)?;
        let q = qdq!(self.q_norm.forward(&qdq!(q, "q_norm_input_qdq")?)?, "q_norm_output_qdq")?;
        let (x1, x2) = (q.slice(-1, 0, 4)?, q.slice(-1, 4, 8)?);
        let rot = Tensor::cat(&[&qdq!(x2.neg()?, "q_neg_half_qdq")?, &x1], -1)?;
        let q = qdq!(qdq!(q.mul(&cos.unsqueeze(1)?)?, "q_mul_qdq")?.add(&rot)?, "q_add_qdq")?;
        let k = qdq!(k, "k_cast_to_int16_qdq")?;
        let k = qdq!(kv k.to(DType::F32)?.to(DType::U8Sym)?, "k_cast_to_int8_qdq")?.transpose(2, 3)?;
        let v = qdq!(v, "v_cast_to_int16_qdq")?;
        let v = qdq!(kv v.to(DType::F32)?.to(DType::U8Sym)?, "v_cast_to_int8_qdq")?;
        let kh = Tensor::cat(&[pk, &k], -1)?.repeat_interleave(2, 1)?;
        let vh = Tensor::cat(&[pv, &v], 2)?.repeat_interleave(2, 1)?;
        let a = qdq!(q.matmul(&kh)?, "qk_matmul_output_qdq")?;
        let a = qdq!(a.mul(&qdq!(const 0.353_553_4, "scaling_qdq")?)?, "mul_0_output_qdq")?;
        let m = qdq!(a.reduce_min(-1, true)?, "reduce_min_output_qdq")?;
        let m = qdq!(m.add(&qdq!(const -20.0, "neg_20_qdq")?)?, "minus_0_output_qdq")?;
        let zero = qdq!(global const 0.0, "constant_zero", scale = MASK_SCALE, zp = MASK_ZERO_POINT)?;
        let a = qdq!(mask.eq(&zero)?.where_cond(&a, &m)?, "where_attn_qdq")?;
        let a = qdq!(a.softmax(-1)?, "softmax_output_qdq")?;
        let y = qdq!(a.matmul(&vh)?, "attn_value_matmul_output_qdq")?.transpose(1, 2)?.view(&[1, 1, -1, h])?;
        Ok((self.o_proj.forward(&y)?.view(&[1, -1, h])?, k, v))
    }
}

#[mllm_dsl::module]
struct Layer {
    self_attn: Attn,
    input_layernorm: RmsNorm,
    layer_idx: usize,
}

#[mllm_dsl::module]
impl Layer {
    fn forward(
        &self,
        x: &Tensor,
        cos: &Tensor,
        mask: &Tensor,
        pk: &Tensor,
        pv: &Tensor,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        let x = if self.layer_idx == 0 { x.clone() } else { qdq!(x, "input_layernorm_input_qdq")? };
        let (a, k, v) = self.self_attn.forward(&self.input_layernorm.forward(&x)?, cos, mask, pk, pv)?;
        let h = qdq!(x.add(&qdq!(a, "add_0_lhs_input_qdq")?)?, "add_0_output_qdq")?;
        let g = qdq!(fixed h.sigmoid()?, "sigmoid_output_qdq", scale = 1.0 / 65536.0, zp = 0)?;
        Ok((h.add(&qdq!(h.mul(&g)?, "act_output_qdq")?)?, k, v))
    }
}

#[mllm_dsl::module]
struct Model {
    embed_tokens: Embedding,
    layers: ModuleList<Layer>,
    norm: RmsNorm,
    #[module(rename = "mllm_max_cos_embedding")]
    rope_cos: Param,
}

#[mllm_dsl::module]
impl Model {
    fn forward(
        &self,
        ids: &Tensor,
        pos: &Tensor,
        mask: &Tensor,
        pks: &[Tensor],
        pvs: &[Tensor],
    ) -> Result<(Tensor, Vec<Tensor>, Vec<Tensor>)> {
        let mut x = self.embed_tokens.forward(ids)?;
        let cos = qdq!(rope self.rope_cos.tensor()?, "cos_embedding_input_qdq")?.gather(1, pos)?;
        let (mut ks, mut vs) = (Vec::new(), Vec::new());
        for (i, layer) in self.layers.iter().enumerate() {
            let (h, k, v) = layer.forward(&x, &cos, mask, &pks[i], &pvs[i])?;
            x = h;
            ks.push(k);
            vs.push(v);
        }
        let x = self.norm.forward(&qdq!(x, "norm_input_qdq")?)?.view(&[1, 1, -1, HIDDEN as i64])?;
        Ok((x, ks, vs))
    }
}

#[mllm_dsl::module]
pub(crate) struct TinyLm {
    model: Model,
    lm_head: Conv2d,
}

#[mllm_dsl::module]
impl TinyLm {
    fn forward(
        &self,
        ids: &Tensor,
        pos: &Tensor,
        mask: &Tensor,
        pks: &[Tensor],
        pvs: &[Tensor],
    ) -> Result<(Tensor, Vec<Tensor>, Vec<Tensor>)> {
        let (x, ks, vs) = self.model.forward(ids, pos, mask, pks, pvs)?;
        let logits = qdq!(self.lm_head.forward(&qdq!(x, "lm_head_input_qdq")?)?, "lm_head_output_qdq")?;
        Ok((logits, ks, vs))
    }
}

fn conv(i: usize, o: usize) -> Conv2d {
    Conv2d::new(i, o)
}

pub(crate) fn tiny_model() -> TinyLm {
    let layer = |i| Layer {
        self_attn: Attn {
            q_proj: conv(HIDDEN, 16),
            k_proj: conv(HIDDEN, 8),
            v_proj: conv(HIDDEN, 8),
            o_proj: conv(16, HIDDEN),
            q_norm: RmsNorm::new(HEAD_DIM, 1e-6),
        },
        input_layernorm: RmsNorm::new(HIDDEN, 1e-6),
        layer_idx: i,
    };
    TinyLm {
        model: Model {
            embed_tokens: Embedding::new(VOCAB, HIDDEN),
            layers: (0..LAYERS).map(layer).collect(),
            norm: RmsNorm::new(HIDDEN, 1e-6),
            rope_cos: Param::new([1, CONTEXT, HEAD_DIM], ParamRole::RopeTable),
        },
        lm_head: conv(HIDDEN, VOCAB),
    }
}

/// The trace inputs in mllm's positional order, quantized as `makeTraceInputs` makes them.
pub(crate) fn tiny_inputs(chunk: usize) -> Vec<TraceInput> {
    let past = CONTEXT - chunk;
    let mut v = vec![
        TraceInput::new("input_ids", [1, chunk], DType::I32),
        TraceInput::new("position_ids", [chunk], DType::I32),
        TraceInput::new("causal_mask", [1, 1, chunk, CONTEXT], DType::U16Asym).with_qdq(QdqAttr {
            kind: QdqKind::Global { scale: MASK_SCALE, zero_point: MASK_ZERO_POINT },
            key: "causal_mask".into(),
        }),
    ];
    let kv = |l: usize, w: &str| QdqAttr {
        kind: QdqKind::KvCache,
        key: format!("model.layers.{l}.self_attn.{w}_cast_to_int8_qdq"),
    };
    for l in 0..LAYERS {
        v.push(TraceInput::new(format!("past_key_{l}"), [1, 1, HEAD_DIM, past], DType::U8Sym).with_qdq(kv(l, "k")));
    }
    for l in 0..LAYERS {
        v.push(TraceInput::new(format!("past_value_{l}"), [1, 1, past, HEAD_DIM], DType::U8Sym).with_qdq(kv(l, "v")));
    }
    v
}

pub(crate) fn trace_tiny(chunk: usize) -> Program {
    let mut m = tiny_model();
    m.declare(ParamFormat::QnnW4A16).unwrap();
    trace(&tiny_inputs(chunk), |t| m.forward(&t[0], &t[1], &t[2], &t[3..3 + LAYERS], &t[3 + LAYERS..])).unwrap()
}

pub(crate) fn tiny_program() -> Program {
    trace_tiny(CHUNK)
}

pub(crate) fn tiny_config() -> AotConfig {
    let mut c = AotConfig::w4a16_kv8();
    c.quant_recipe.layers = LAYERS as u32;
    c
}

pub(crate) fn tiny_params(p: &Program) -> SyntheticParams {
    SyntheticParams::for_program(p, 16)
}

/// Runs the first `n` passes of the full pipeline.
pub(crate) fn after(n: usize, p: &mut Program) {
    let cfg = tiny_config();
    let params = tiny_params(p);
    let pipeline = Pipeline::qnn_aot(&cfg, &params);
    for pass in pipeline.passes().take(n) {
        pass.run(p).unwrap_or_else(|e| panic!("{}: {e}", pass.name()));
    }
}

fn check_text(p: &Program) {
    let text = p.to_string();
    for (i, line) in text.lines().enumerate() {
        assert!(line.len() <= MAX_LINE, "line {} has {} chars: {line}", i + 1, line.len());
    }
    let back = parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert_eq!(back, p.canonicalize());
    assert_eq!(back.to_string(), text);
}

#[test]
fn every_stage_prints_within_limits_and_parses_back() {
    let mut p = tiny_program();
    let cfg = tiny_config();
    let params = tiny_params(&p);
    let mut stages = Vec::new();
    Pipeline::qnn_aot(&cfg, &params)
        .run_observed(&mut p, |pass, prog| {
            check_text(prog);
            stages.push(pass.stage());
            Ok(())
        })
        .unwrap();
    assert_eq!(
        stages,
        [
            "mark_qnn_graph",
            "op_naming",
            "merge_llm_head",
            "llm_quant_recipe",
            "ptq",
            "lpbq_canonicalize",
            "split_llm_graph",
            "mark_tensor_io",
            "tensor_renaming"
        ]
    );
}

#[test]
fn trace_prints_no_spec_table_and_recipe_adds_one() {
    let mut p = tiny_program();
    assert!(!p.to_string().contains("quant.specs"));
    after(4, &mut p);
    let text = p.to_string();
    // A spec is named after the first value that refers to it: `@main`'s first input here.
    assert!(text.contains("quant.specs {") && text.contains("[spec:$0]") && text.contains("\n    $0 = "), "{text}");
}

#[test]
fn dump_writes_every_stage_atomically() {
    let dir = std::env::temp_dir().join(format!("mllm-dsl-pass-dump-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut p = tiny_program();
    let cfg = tiny_config();
    let params = tiny_params(&p);
    let report = Pipeline::qnn_aot(&cfg, &params).dump_to(&dir).run(&mut p).unwrap();
    let mut files: Vec<String> =
        std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    files.sort();
    assert_eq!(files.len(), 10, "{files:?}");
    assert_eq!(files[0], "00-trace.mir");
    assert_eq!(files[9], "09-tensor_renaming.mir");
    assert_eq!(report.dumps.len(), 10);
    assert_eq!(report.timings.len(), 9);
    // The last dump is the final program.
    assert_eq!(std::fs::read_to_string(&report.dumps[9]).unwrap(), p.to_string());
    let first = parse(&std::fs::read_to_string(dir.join("00-trace.mir")).unwrap()).unwrap();
    assert_eq!(first, tiny_program().canonicalize());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn config_errors_are_reported_before_any_pass() {
    let p = tiny_program();
    let params = tiny_params(&p);
    let run = |cfg: &AotConfig| Pipeline::qnn_aot(cfg, &params).run(&mut p.clone()).unwrap_err().to_string();

    let mut cfg = tiny_config();
    cfg.split_graph = 0;
    let err = run(&cfg);
    assert!(err.contains("`split_graph`") && err.contains("found 0"), "{err}");

    let mut cfg = tiny_config();
    cfg.graph_on_qnn = vec!["decoder".into()];
    let err = run(&cfg);
    assert!(err.contains("graph_on_qnn[0]") && err.contains("`decoder`") && err.contains("model"), "{err}");

    let mut v = tiny_config().to_json();
    v["quant_recipe"]["builtin_llm_pass"]["linear"]["fallback"]["block_size"] = 12.into();
    let cfg = AotConfig::from_json(&v).unwrap();
    let err = run(&cfg);
    assert!(err.contains("block size 12 does not divide the input width 16"), "{err}");
    assert!(err.contains("linear.fallback.block_size"), "{err}");
}

#[test]
fn the_final_graph_is_flat_and_marked() {
    let mut p = tiny_program();
    after(9, &mut p);
    let flat = p.subgraph("model.0.s4").expect("flat graph");
    assert!(flat.region.body.iter().all(|n| !matches!(n, Node::Call(_) | Node::SubGraph(_))));
    assert_eq!(flat.attrs.get("use_qnn"), Some(&Attr::Bool(true)));
    let symbols: Vec<&str> = p.subgraphs().map(|g| g.symbol.as_str()).collect();
    assert_eq!(symbols, ["init", "model", "model.0.s4"]);
}

/// Synthetic parameters with some keys changed, hidden, or given stored code ranges.
#[derive(Default)]
struct Tweaked {
    base: SyntheticParams,
    scales: std::collections::HashMap<String, f32>,
    hidden: std::collections::HashSet<String>,
    ranges: std::collections::HashMap<String, (i64, i64)>,
}

impl crate::passes::QuantParamProvider for Tweaked {
    fn name(&self) -> String {
        "tweaked synthetic parameters".into()
    }
    fn tensor(&self, key: &str) -> Result<Option<crate::passes::StoredTensor>, crate::passes::ParamError> {
        if self.hidden.contains(key) {
            return Ok(None);
        }
        self.base.tensor(key)
    }
    fn read_f32(&self, key: &str) -> Result<Vec<f32>, crate::passes::ParamError> {
        if self.hidden.contains(key) {
            return Err(self.error(key, "missing".into()));
        }
        match self.scales.get(key) {
            Some(s) => Ok(vec![*s]),
            None => self.base.read_f32(key),
        }
    }
    fn read_i32(&self, key: &str) -> Result<Vec<i32>, crate::passes::ParamError> {
        self.base.read_i32(key)
    }
    fn int_range(&self, key: &str) -> Result<Option<(i64, i64)>, crate::passes::ParamError> {
        Ok(self.ranges.get(key).copied())
    }
}

fn run_with(p: &mut Program, params: &dyn crate::passes::QuantParamProvider) -> Result<(), crate::passes::PassError> {
    let cfg = tiny_config();
    let result = Pipeline::qnn_aot(&cfg, params).run(p);
    result.map(|_| ())
}

fn tweaked(p: &Program) -> Tweaked {
    Tweaked { base: tiny_params(p), ..Default::default() }
}

#[test]
fn recipe_shares_specs_through_data_movement_only() {
    let mut p = tiny_program();
    after(4, &mut p);
    let attn = p.subgraph("model.layers.0.self_attn").unwrap();
    let ops: Vec<&mllm_dsl::ir::LinalgOp> = attn
        .region
        .body
        .iter()
        .filter_map(|n| match n {
            Node::Linalg(op) => Some(op),
            _ => None,
        })
        .collect();
    let spec = |v| p.value(v).spec.unwrap();
    for op in &ops {
        let (i0, o) = (op.inputs[0], op.outputs[0]);
        match op.kind {
            mllm_dsl::op::OpKind::View { .. }
            | mllm_dsl::op::OpKind::Transpose { .. }
            | mllm_dsl::op::OpKind::Slice { .. }
            | mllm_dsl::op::OpKind::Repeat { .. }
            | mllm_dsl::op::OpKind::Unsqueeze { .. }
            | mllm_dsl::op::OpKind::Concat { .. } => assert_eq!(spec(i0), spec(o), "{:?}", op.name),
            mllm_dsl::op::OpKind::Equal => {
                assert_eq!(p.spec(spec(o)).kind, mllm_dsl::ir::QuantSpecKind::Raw { dtype: DType::Bool });
                let c = p.value_spec(op.inputs[1]).unwrap();
                assert_eq!(c.kind, mllm_dsl::ir::QuantSpecKind::u16_asym());
            }
            mllm_dsl::op::OpKind::Conv2d => {
                assert_ne!(spec(i0), spec(o));
                let w = p.value_spec(op.inputs[1]).unwrap();
                assert_eq!(w.kind, mllm_dsl::ir::QuantSpecKind::lpbq_hwio(16));
            }
            _ => assert!(op.inputs.iter().all(|&i| spec(i) != spec(o)), "{:?} shares", op.name),
        }
    }
    // The embedding's output is its weight's spec.
    let model = p.subgraph("model").unwrap();
    let Some(Node::Linalg(emb)) = model.region.body.first() else { panic!() };
    assert_eq!(spec(emb.inputs[1]), spec(emb.outputs[0]));
    // Nothing is solved yet.
    assert!(p.specs.iter().all(|s| s.params.is_none()));
}

/// Defines `Outer { model: Inner { proj: $proj } }` whose forward is `proj(qdq(x))`: one
/// projection at `model.proj` behind the QDQ point `model.proj_input_qdq`.
macro_rules! one_projection_model {
    ($proj:ty) => {
        #[mllm_dsl::module]
        struct Inner {
            proj: $proj,
        }
        #[mllm_dsl::module]
        impl Inner {
            fn forward(&self, x: &Tensor) -> Result<Tensor> {
                self.proj.forward(&qdq!(x, "proj_input_qdq")?)
            }
        }
        #[mllm_dsl::module]
        struct Outer {
            model: Inner,
        }
        #[mllm_dsl::module]
        impl Outer {
            fn forward(&self, x: &Tensor) -> Result<Tensor> {
                self.model.forward(x)
            }
        }
    };
}

#[test]
fn linear_has_no_recipe_rule() {
    one_projection_model!(Linear);
    let mut m = Outer { model: Inner { proj: Linear::new(16, 8) } };
    m.declare(ParamFormat::QnnW4A16).unwrap();
    let mut p = trace(&[TraceInput::new("x", [1, 4, 16], DType::U16Asym)], |t| m.forward(&t[0])).unwrap();
    let err = crate::passes::LlmQuantRecipe::new(&tiny_config()).run(&mut p).unwrap_err().to_string();
    assert!(err.contains("`model.proj` (Linear) in `model` has no quantization recipe rule"), "{err}");
    assert!(err.contains("Conv2d"), "{err}");
}

#[test]
fn conv_bias_stays_a_raw_float_parameter() {
    one_projection_model!(Conv2d);
    let mut m = Outer { model: Inner { proj: Conv2d::new(16, 8).with_bias(true) } };
    m.declare(ParamFormat::QnnW4A16).unwrap();
    let traced = trace(&[TraceInput::new("x", [1, 1, 4, 16], DType::U16Asym)], |t| m.forward(&t[0])).unwrap();
    let bias = |p: &Program| {
        (0..p.values.len() as u32)
            .map(ValueId)
            .find(|&v| p.value(v).symbol.as_deref() == Some("model.proj.bias"))
            .unwrap()
    };
    let mut p = traced.clone();
    crate::passes::LlmQuantRecipe::new(&tiny_config()).run(&mut p).unwrap();
    assert_eq!(p.value_spec(bias(&p)).unwrap().kind, QuantSpecKind::simple(DType::F32).unwrap());
    // Anything but a Float32 [Out] bias is named.
    let mut p = traced;
    let b = bias(&p);
    p.values[b.0 as usize].ty.dtype = DType::F16;
    let err = crate::passes::LlmQuantRecipe::new(&tiny_config()).run(&mut p).unwrap_err().to_string();
    assert!(err.contains("a Conv2D bias must be a registered Float32 [8] parameter"), "{err}");
}

#[test]
fn ptq_reports_values_no_qdq_point_solves() {
    let mut p = tiny_program();
    // Drop the QDQ point of the first q_mul output.
    let v = (0..p.values.len())
        .map(|i| mllm_dsl::ir::ValueId(i as u32))
        .find(|v| p.value(*v).qdq.as_ref().is_some_and(|q| q.key == "model.layers.0.self_attn.q_mul_qdq"))
        .unwrap();
    p.value_mut(v).qdq = None;
    let params = tweaked(&p);
    let err = run_with(&mut p, &params).unwrap_err().to_string();
    assert!(err.starts_with("PTQ:"), "{err}");
    assert!(err.contains("output 0 of op `model.layers.0.self_attn.Mul.0` in `model.layers.0.self_attn`"), "{err}");
    assert!(err.contains("unsolved quantization spec AsymPerTensor") && err.contains("no QDQ point"), "{err}");
}

#[test]
fn ptq_rejects_disagreeing_concat_inputs() {
    let mut p = tiny_program();
    let mut params = tweaked(&p);
    params.scales.insert("model.layers.1.self_attn.q_neg_half_qdq.fake_quant.scale".into(), 0.5);
    let err = run_with(&mut p, &params).unwrap_err().to_string();
    assert!(err.contains("concat `model.layers.1.self_attn.Concat.0` in `model.layers.1.self_attn`"), "{err}");
    assert!(err.contains("input 0") && err.contains("scale 5e-1"), "{err}");
    assert!(err.contains("q_norm_output_qdq") || err.contains("q_neg_half_qdq"), "{err}");
}

#[test]
fn ptq_names_missing_parameters_and_out_of_range_codes() {
    let mut p = tiny_program();
    let mut params = tweaked(&p);
    params.hidden.insert("model.layers.1.self_attn.softmax_output_qdq.fake_quant.scale".into());
    let err = run_with(&mut p, &params).unwrap_err().to_string();
    assert!(err.contains("model.layers.1.self_attn.softmax_output_qdq.fake_quant.scale"), "{err}");
    assert!(err.contains("`model.layers.1.self_attn.Softmax.0`"), "{err}");

    let mut p = tiny_program();
    let mut params = tweaked(&p);
    params.ranges.insert("model.layers.0.self_attn.o_proj.weight".into(), (-3, 15));
    let err = run_with(&mut p, &params).unwrap_err().to_string();
    assert!(err.contains("model.layers.0.self_attn.o_proj.weight") && err.contains("-3..=15"), "{err}");
    assert!(err.contains("op `model.layers.0.self_attn.o_proj`"), "{err}");

    let mut p = tiny_program();
    let mut params = tweaked(&p);
    params.hidden.insert("lm_head.scale2".into());
    let err = run_with(&mut p, &params).unwrap_err().to_string();
    assert!(err.contains("lm_head.scale2") && err.contains("missing"), "{err}");
}

#[test]
fn ptq_quantizes_constants_with_mllms_rule() {
    let mut p = tiny_program();
    after(5, &mut p);
    let mut seen = 0;
    for def in &p.values {
        let Some(c) = def.constant else { continue };
        let Some(code) = def.quantized else { panic!("{def:?} not quantized") };
        let (s, z) = p.spec(def.spec.unwrap()).per_tensor().unwrap();
        // clamp(round(v / s) + z) computed independently, in f64 with half away from zero.
        let want = ((f64::from(c) / f64::from(s)).round() + f64::from(z)).clamp(0.0, 65535.0) as i64;
        assert_eq!(code, want, "{def:?}");
        assert_eq!(def.ty.dtype, DType::U16Asym);
        seen += 1;
    }
    assert_eq!(seen, 3 * LAYERS);
    assert!(p.specs.iter().all(|s| s.is_solved()));
}

#[test]
fn lpbq_layout_is_checked_against_stored_scales() {
    let mut p = tiny_program();
    after(6, &mut p);
    for s in &p.specs {
        if let Some(mllm_dsl::ir::SpecParams::Lpbq { from, blocks, channels }) = &s.params {
            let out = if from.ends_with("k_proj") || from.ends_with("v_proj") {
                8
            } else if from == "lm_head" {
                VOCAB
            } else {
                16
            };
            assert_eq!((*blocks, *channels), (Some(1), Some(out)), "{from}");
        }
    }
    // A scale1 with the wrong number of blocks.
    struct WrongScale1(SyntheticParams);
    impl crate::passes::QuantParamProvider for WrongScale1 {
        fn name(&self) -> String {
            self.0.name()
        }
        fn tensor(&self, key: &str) -> Result<Option<crate::passes::StoredTensor>, crate::passes::ParamError> {
            let mut t = self.0.tensor(key)?;
            if key == "model.layers.0.self_attn.q_proj.scale1" {
                t = Some(crate::passes::StoredTensor { dtype: DType::U8, shape: vec![32] });
            }
            Ok(t)
        }
        fn read_f32(&self, key: &str) -> Result<Vec<f32>, crate::passes::ParamError> {
            self.0.read_f32(key)
        }
        fn read_i32(&self, key: &str) -> Result<Vec<i32>, crate::passes::ParamError> {
            self.0.read_i32(key)
        }
        fn int_range(&self, key: &str) -> Result<Option<(i64, i64)>, crate::passes::ParamError> {
            self.0.int_range(key)
        }
    }
    let mut p = tiny_program();
    let params = WrongScale1(tiny_params(&p));
    let err = run_with(&mut p, &params).unwrap_err().to_string();
    assert!(
        err.starts_with("LPBQCanonicalize")
            && err.contains("`model.layers.0.self_attn.q_proj.scale1` must hold 16 values"),
        "{err}"
    );
    assert!(err.contains("found 32 values"), "{err}");
}

#[test]
fn split_keeps_every_op_once_in_walk_order() {
    let mut p = tiny_program();
    after(6, &mut p);
    let before: Vec<String> = p.linalg_ops().iter().map(|op| op.name.clone().unwrap()).collect();
    after_from(6, 7, &mut p);
    let flat = p.subgraph("model.0.s4").unwrap();
    let names: Vec<String> = flat
        .region
        .body
        .iter()
        .filter_map(|n| match n {
            Node::Linalg(op) => Some(op.name.clone().unwrap()),
            _ => None,
        })
        .collect();
    let mut a = before.clone();
    let mut b = names.clone();
    a.sort();
    b.sort();
    assert_eq!(a, b);
    // Walk order: the embedding first, the head last.
    assert_eq!(names.first().map(String::as_str), Some("model.embed_tokens"));
    assert_eq!(names.last().map(String::as_str), Some("lm_head"));
    let mut decode = trace_tiny(1);
    after(9, &mut decode);
    assert!(decode.subgraph("model.0.s1").is_some());
}

/// Runs passes `from..to` of the full pipeline.
fn after_from(from: usize, to: usize, p: &mut Program) {
    let cfg = tiny_config();
    let params = tiny_params(p);
    let pipeline = Pipeline::qnn_aot(&cfg, &params);
    for pass in pipeline.passes().skip(from).take(to - from) {
        pass.run(p).unwrap_or_else(|e| panic!("{}: {e}", pass.name()));
    }
}

#[test]
fn io_follows_the_positional_contract() {
    let mut p = tiny_program();
    after(8, &mut p);
    let flat = p.subgraph("model.0.s4").unwrap();
    assert_eq!(flat.region.inputs, p.main.inputs);
    assert_eq!(flat.region.outputs, p.main.outputs);
    for v in &p.main.inputs {
        assert!(p.value(*v).graph_input);
    }
    // A config with another layer count breaks the contract.
    let mut p = tiny_program();
    after(7, &mut p);
    let mut cfg = tiny_config();
    cfg.quant_recipe.layers = 3;
    let err = crate::passes::MarkTensorIo::new(&cfg).run(&mut p).unwrap_err().to_string();
    assert!(err.contains("3-layer LLM graph has 9 inputs and 7 outputs, found 7 and 5"), "{err}");
}

#[test]
fn tensor_names_are_unique_safe_and_shared_across_chunk_sizes() {
    let names = |chunk: usize| {
        let mut p = trace_tiny(chunk);
        after(9, &mut p);
        let mut all = std::collections::BTreeMap::new();
        for def in &p.values {
            if let Some(n) = &def.name {
                assert!(n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'), "{n}");
                assert!(all.insert(n.clone(), def.symbol.clone()).is_none(), "duplicate {n}");
            }
        }
        all
    };
    let (prefill, decode) = (names(4), names(1));
    let statics = |m: &std::collections::BTreeMap<String, Option<String>>| {
        m.iter().filter(|(_, s)| s.is_some()).map(|(n, _)| n.clone()).collect::<Vec<_>>()
    };
    assert_eq!(statics(&prefill), statics(&decode));
    assert!(prefill.contains_key("model_layers_0_self_attn_q_proj_weight"));
    assert!(prefill.contains_key("past_value_1") && prefill.contains_key("logits"));
    assert_eq!(prefill.len(), decode.len());
}

#[test]
fn graph_names_round_trip_and_refuse_other_names() {
    use super::{graph_name, parse_graph_name, shard_graph_name};
    assert_eq!(graph_name(32), "model.0.s32");
    assert_eq!(parse_graph_name(&shard_graph_name(2, 128)), Some((2, 128)));
    for other in ["model", "model.0.s", "model..s32", "model.+1.s32", "model.0.s32_cl4096", "ar32_cl1024"] {
        assert_eq!(parse_graph_name(other), None, "{other}");
    }
}

//! QDQ naming: how `qdq!` names resolve to checkpoint keys against module paths, the key strings of
//! scales and zero points, and the misuses `qdq!` rejects.

use mllm_dsl::backend::{Backend, BackendError, Storage};
use mllm_dsl::ir::Node;
use mllm_dsl::op::OpKind;
use mllm_dsl::prelude::*;
use mllm_dsl::tensor::apply_qdq;
use mllm_dsl::{CallSite, Program, QdqAttr, QdqKind, TensorType};
use std::sync::{Arc, Mutex};

/// A leaf block: one QDQ point on a new value.
#[module]
struct Inner {
    proj: Linear,
}

#[module]
impl Inner {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        qdq!(x.neg()?, "out_qdq")
    }
}

/// A tree with a `ModuleList`, a renamed field and a config field.
#[module]
struct Outer {
    layers: ModuleList<Inner>,
    #[module(rename = "final_block")]
    last: Inner,
    width: usize,
}

#[module]
impl Outer {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut h = qdq!(x.neg()?, "top_qdq")?;
        for layer in &self.layers {
            h = layer.forward(&h)?;
        }
        self.last.forward(&h)
    }
}

fn outer() -> Outer {
    let inner = || Inner { proj: Linear::new(4, 4) };
    Outer { layers: ModuleList::new(vec![inner(), inner()]), last: inner(), width: 4 }
}

/// Every QDQ annotation of the program, in the order the values were created.
fn qdq_attrs(p: &Program) -> Vec<QdqAttr> {
    p.values.iter().filter_map(|v| v.qdq.clone()).collect()
}

fn keys(p: &Program) -> Vec<String> {
    qdq_attrs(p).into_iter().map(|q| q.key).collect()
}

fn x_input(dtype: DType) -> TraceInput {
    TraceInput::new("x", [1, 4], dtype)
}

#[test]
fn top_level_module_adds_no_prefix() {
    let mut model = outer();
    model.declare(ParamFormat::Float).unwrap();
    let p = trace(&[x_input(DType::F32)], |t| model.forward(&t[0])).unwrap();
    assert_eq!(keys(&p), ["top_qdq", "layers.0.out_qdq", "layers.1.out_qdq", "final_block.out_qdq"]);
    assert!(qdq_attrs(&p).iter().all(|q| q.kind == QdqKind::Activation));
    assert_eq!(model.width, 4);
}

#[test]
fn keys_follow_nested_module_paths() {
    let mut model = outer();
    model.bind("model", &ParamSource::Symbolic(ParamFormat::Float)).unwrap();
    let p = trace(&[x_input(DType::U16Asym)], |t| model.forward(&t[0])).unwrap();
    let want = ["model.top_qdq", "model.layers.0.out_qdq", "model.layers.1.out_qdq", "model.final_block.out_qdq"];
    assert_eq!(keys(&p), want);
    // The same name in two modules is two points; each module call is its own subgraph.
    let symbols: Vec<&str> = p.subgraphs().map(|g| g.symbol.as_str()).collect();
    assert_eq!(symbols, ["init", "model", "model.layers.0", "model.layers.1", "model.final_block"]);
    let text = p.to_string();
    for key in want {
        assert!(text.contains(&format!("qdq:act(\"{key}\")")), "{key} missing from\n{text}");
    }
}

/// Float-mode backend: computes `Neg` and records the QDQ points it is asked to apply.
#[derive(Default)]
struct Recorder {
    points: Mutex<Vec<QdqAttr>>,
}

impl Backend for Recorder {
    fn name(&self) -> &str {
        "recorder"
    }

    fn execute(&self, op: &OpKind, inputs: &[&Tensor], _out: &TensorType) -> Result<Storage, BackendError> {
        match (op, inputs[0].as_f32()) {
            (OpKind::Neg, Some(x)) => Ok(Storage::F32(x.iter().map(|v| -v).collect())),
            _ => Err(BackendError::Op(format!("recorder cannot compute {}", op.type_name()))),
        }
    }

    fn qdq(&self, x: &Tensor, point: &QdqAttr) -> Result<Tensor, BackendError> {
        self.points.lock().unwrap().push(point.clone());
        Ok(x.clone())
    }
}

/// Eager execution resolves the same keys as tracing.
#[test]
fn eager_execution_resolves_the_same_keys() {
    let backend = Arc::new(Recorder::default());
    let mut model = outer();
    model.bind("model", &ParamSource::Symbolic(ParamFormat::Float)).unwrap();
    let x = Tensor::from_f32(vec![1.0, -2.0, 3.0, 0.5], vec![1, 4], backend.clone()).unwrap();
    let y = model.forward(&x).unwrap();
    // Four negations.
    assert_eq!(y.as_f32().unwrap(), [1.0, -2.0, 3.0, 0.5]);
    let got: Vec<String> = backend.points.lock().unwrap().iter().map(|q| q.key.clone()).collect();
    assert_eq!(got, ["model.top_qdq", "model.layers.0.out_qdq", "model.layers.1.out_qdq", "model.final_block.out_qdq"]);
}

const ATTN: &str = "model.layers.0.self_attn";

/// A module bound at [`ATTN`] that runs a closure in its scope.
#[module]
struct Scope {
    proj: Linear,
}

#[module]
impl Scope {
    fn forward(&self, inputs: &[Tensor], f: impl FnOnce(&[Tensor]) -> Result<Tensor>) -> Result<Tensor> {
        f(inputs)
    }
}

fn in_scope(inputs: &[TraceInput], f: impl FnOnce(&[Tensor]) -> Result<Tensor>) -> Result<Program> {
    let mut scope = Scope { proj: Linear::new(4, 4) };
    scope.bind(ATTN, &ParamSource::Symbolic(ParamFormat::Float))?;
    trace(inputs, |t| scope.forward(t, f))
}

/// `(error, line of the invocation)`; keep invocations on one line.
macro_rules! fails {
    ($inputs:expr, $f:expr) => {
        (in_scope(&$inputs, $f).expect_err("the QDQ must be rejected"), line!())
    };
}

#[track_caller]
fn assert_qdq_err((err, line): (Error, u32), name: &str, module_path: &str, parts: &[&str]) {
    let text = err.to_string();
    let Error::Qdq { name: got_name, module_path: got_path, site, message } = err else {
        panic!("expected Error::Qdq for {name}, got {err:?}");
    };
    assert_eq!((got_name.as_str(), got_path.as_str()), (name, module_path), "{text}");
    assert_eq!((site.0.file(), site.0.line()), (file!(), line), "call site of: {text}");
    for part in parts {
        assert!(message.contains(part), "message should mention `{part}`: {message}");
    }
    assert!(text.starts_with(&format!("qdq!(\"{name}\") in module `{module_path}` at {}:{line}:", file!())), "{text}");
}

#[test]
fn global_ignores_the_module_prefix() {
    let mask = TraceInput::new("mask", [1, 1, 2, 8], DType::U16Asym);
    let p = in_scope(&[mask], |t| {
        let zero = qdq!(global const 0.0, "constant_zero", scale = 0.5, zp = 7)?;
        let x = qdq!(t[0].neg()?, "x_qdq")?;
        x.eq(&zero)?.where_cond(&x, &Tensor::scalar(1.0))
    })
    .unwrap();
    let attrs = qdq_attrs(&p);
    let zero = attrs.iter().find(|q| q.kind.tag() == "global").expect("the global QDQ is in the IR");
    assert_eq!(zero, &QdqAttr { kind: QdqKind::Global { scale: 0.5, zero_point: 7 }, key: "constant_zero".into() });
    assert_eq!(
        (zero.scale_key(), zero.zero_point_key()),
        ("constant_zero.scale".into(), "constant_zero.zero_point".into())
    );
    assert_eq!(zero.fixed_params(), Some((0.5, 7)));

    let act = attrs.iter().find(|q| q.kind == QdqKind::Activation).unwrap();
    assert_eq!(act.key, format!("{ATTN}.x_qdq"));
    assert_eq!(act.scale_key(), format!("{ATTN}.x_qdq.fake_quant.scale"));
    assert_eq!(act.zero_point_key(), format!("{ATTN}.x_qdq.fake_quant.zero_point"));
    assert_eq!(act.fixed_params(), None);
}

#[test]
fn key_strings_of_every_kind() {
    let cases = [
        (QdqKind::Activation, "act(\"m.a\")", "m.a.fake_quant.scale", "m.a.fake_quant.zero_point", None),
        (QdqKind::KvCache, "kv(\"m.a\")", "m.a.fake_quant.scale", "m.a.fake_quant.zero_point", None),
        (QdqKind::Constant, "const(\"m.a\")", "m.a.fake_quant.scale", "m.a.fake_quant.zero_point", None),
        (QdqKind::Rope, "rope(\"m.a\")", "m.a.fake_quant.scale", "m.a.fake_quant.zero_point", None),
        (
            QdqKind::Fixed { scale: 1.0 / 65536.0, zero_point: 0 },
            "fixed(\"m.a\", 1.5258789e-5, 0)",
            "m.a.fake_quant.scale",
            "m.a.fake_quant.zero_point",
            Some((1.0 / 65536.0, 0)),
        ),
        (
            QdqKind::Global { scale: 0.25, zero_point: 65535 },
            "global(\"m.a\", 0.25, 65535)",
            "m.a.scale",
            "m.a.zero_point",
            Some((0.25, 65535)),
        ),
    ];
    for (kind, printed, scale, zp, fixed) in cases {
        let q = QdqAttr { kind: kind.clone(), key: "m.a".into() };
        assert_eq!((q.to_string(), q.scale_key(), q.zero_point_key()), (printed.into(), scale.into(), zp.into()));
        assert_eq!(q.fixed_params(), fixed, "{kind:?}");
        let range = if kind == QdqKind::KvCache { (0, 255) } else { (0, 65535) };
        assert_eq!(q.kind.qrange(), range, "{kind:?}");
    }
    assert_eq!(mllm_dsl::qdq::qdq_key("", "norm_input_qdq"), "norm_input_qdq");
    assert_eq!(mllm_dsl::qdq::qdq_key("model.norm", "x"), "model.norm.x");
}

#[test]
fn every_form_of_the_macro_resolves_in_the_module() {
    let ins = [TraceInput::new("k", [1, 2, 16, 4], DType::F32), TraceInput::new("sin", [1, 8, 16], DType::U16Asym)];
    let p = in_scope(&ins, |t| {
        let k = qdq!(kv t[0].to(DType::U8Sym)?, "k_cast_to_int8_qdq")?;
        let sig = qdq!(fixed t[0].sigmoid()?, "sigmoid_output_qdq", scale = 1.0 / 65536.0, zp = 0)?;
        qdq!(rope t[1], "sin_embedding_input_qdq")?;
        k.to(DType::F32)?.mul(&sig)?.add(&qdq!(const 2.0, "two_qdq")?)
    })
    .unwrap();
    // In value order: the input table, the cast K, the sigmoid, the constant (emitted when first used).
    let got: Vec<(&str, String)> = qdq_attrs(&p).iter().map(|q| (q.kind.tag(), q.key.clone())).collect();
    let want = [
        ("rope", "sin_embedding_input_qdq"),
        ("kv", "k_cast_to_int8_qdq"),
        ("fixed", "sigmoid_output_qdq"),
        ("const", "two_qdq"),
    ];
    let want: Vec<(&str, String)> = want.iter().map(|&(tag, name)| (tag, format!("{ATTN}.{name}"))).collect();
    assert_eq!(got, want);
    let fixed = &qdq_attrs(&p)[2];
    assert_eq!(fixed.kind, QdqKind::Fixed { scale: 1.0 / 65536.0, zero_point: 0 });
}

#[test]
fn a_repeated_name_in_one_module_call_is_an_error() {
    let ins = [x_input(DType::F32)];
    let err = fails!(ins, |t| qdq!(t[0].neg()?, "dup_qdq")?.sigmoid().and_then(|s| qdq!(s, "dup_qdq")));
    assert_qdq_err(err, "dup_qdq", ATTN, &["already used in this module call"]);
}

#[test]
fn applying_two_qdqs_to_one_value_is_an_error() {
    let ins = [x_input(DType::F32)];
    let err = fails!(ins, |t| qdq!(t[0].neg()?, "first_qdq").and_then(|y| qdq!(y, "second_qdq")));
    let already = format!("already carries QDQ '{ATTN}.first_qdq'");
    assert_qdq_err(err, "second_qdq", ATTN, &[&already]);
    // A trace input that carries its QDQ (the mask, past K/V) cannot get another one.
    let kv = QdqAttr { kind: QdqKind::KvCache, key: "past_k".into() };
    let ins = [TraceInput::new("past_k", [1, 4], DType::U8Sym).with_qdq(kv)];
    let err = fails!(ins, |t| qdq!(kv t[0], "k_qdq"));
    assert_qdq_err(err, "k_qdq", ATTN, &["already carries QDQ 'past_k'"]);
    // The same holds for a constant.
    let err = fails!([x_input(DType::F32)], |_| qdq!(qdq!(const 1.0, "c_qdq")?, "c2_qdq"));
    assert_qdq_err(err, "c2_qdq", ATTN, &["constant already carries QDQ", "c_qdq"]);
}

#[test]
fn kind_specific_dtype_checks() {
    let parts = ["UInt8PerTensorSym", "Float32"];
    assert_qdq_err(fails!([x_input(DType::F32)], |t| qdq!(kv t[0], "k_qdq")), "k_qdq", ATTN, &parts);
    let parts = ["UInt8PerTensorSym", "UInt16PerTensorAsy"];
    assert_qdq_err(fails!([x_input(DType::U16Asym)], |t| qdq!(kv t[0], "v_qdq")), "v_qdq", ATTN, &parts);
    let parts = ["float or UInt16PerTensorAsy", "Int32"];
    assert_qdq_err(fails!([x_input(DType::I32)], |t| qdq!(t[0], "ids_qdq")), "ids_qdq", ATTN, &parts);
    let parts = ["float or UInt16PerTensorAsy", "UInt8PerTensorSym"];
    assert_qdq_err(fails!([x_input(DType::U8Sym)], |t| qdq!(t[0], "kv_as_act")), "kv_as_act", ATTN, &parts);
    assert_qdq_err(fails!([x_input(DType::F32)], |t| qdq!(rope t[0].eq(&t[0])?, "r")), "r", ATTN, &["Bool"]);
    // The const kind is for scalar constants only.
    let err = fails!([x_input(DType::F32)], |t| apply_qdq(&t[0], "c_qdq", QdqKind::Constant, CallSite::here()));
    assert_qdq_err(err, "c_qdq", ATTN, &["a scalar constant"]);
}

#[test]
fn const_kind_emits_a_constant_with_its_qdq() {
    let p = in_scope(&[x_input(DType::U16Asym)], |t| {
        let scale = qdq!(const 0.125, "scaling_qdq")?;
        t[0].mul(&scale)
    })
    .unwrap();
    let g = p.subgraph(ATTN).expect("the module's subgraph");
    let consts: Vec<_> = g
        .region
        .body
        .iter()
        .filter_map(|n| match n {
            Node::Constant { value, .. } => Some(*value),
            _ => None,
        })
        .collect();
    assert_eq!(consts.len(), 1);
    let def = p.value(consts[0]);
    assert_eq!(def.ty, TensorType::new(vec![1], DType::F32));
    assert_eq!(def.constant, Some(0.125));
    let want = QdqAttr { kind: QdqKind::Constant, key: format!("{ATTN}.scaling_qdq") };
    assert_eq!(def.qdq, Some(want));
    // The constant is the first value of its subgraph without an op or parameter to name it.
    let constant = format!("%.#0:tensor<[1], Float32, CPU>[constant:0.125, qdq:const(\"{ATTN}.scaling_qdq\")]");
    let line = format!("tensor.CPU.constant () -> ({constant})");
    assert!(p.to_string().contains(&line), "{line}\nnot in\n{p}");
}

#[test]
fn errors_outside_modules_name_the_top_level() {
    let err = trace(&[x_input(DType::F32)], |t| {
        let a = qdq!(t[0].neg()?, "a_qdq")?;
        qdq!(a.neg()?, "a_qdq")
    })
    .unwrap_err();
    let Error::Qdq { name, module_path, .. } = &err else { panic!("expected Error::Qdq, got {err:?}") };
    assert_eq!((name.as_str(), module_path.as_str()), ("a_qdq", ""));
    assert!(err.to_string().starts_with("qdq!(\"a_qdq\") in module `<top>` at "), "{err}");
    // At the top level, names are keys as they are.
    let p = trace(&[x_input(DType::F32)], |t| qdq!(t[0].neg()?, "lm_head_input_qdq")).unwrap();
    assert_eq!(keys(&p), ["lm_head_input_qdq"]);
}

//! The IR printer and parser: deterministic text, parse errors with positions, a lossless round trip
//! over every attribute and node kind, and line wrapping at `MAX_LINE`.

use mllm_dsl::ir::{parse, Attr, Attrs, CallGraph, LinalgOp, Node, Region, SubGraph, ValueDef, ValueId, MAX_LINE};
use mllm_dsl::op::{OpKind, ReduceKind};
use mllm_dsl::prelude::*;
use mllm_dsl::{Device, Program, QdqAttr, QdqKind, TensorType};

// ----- printer determinism ---------------------------------------------------------------------

#[module]
struct Mlp {
    up_proj: Conv2d,
    down_proj: Conv2d,
    hidden: usize,
}

#[module]
impl Mlp {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let h = self.hidden as i64;
        let x = qdq!(x.neg()?, "up_proj_input_qdq")?.view(&[1, 1, -1, h])?;
        let up = qdq!(self.up_proj.forward(&x)?.silu()?, "act_qdq")?;
        let y = self.down_proj.forward(&up)?;
        let y = qdq!(y.mul(&qdq!(const 0.5, "half_qdq")?)?, "scaled_qdq")?;
        y.view(&[1, -1, h])
    }
}

#[module]
struct Tiny {
    layers: ModuleList<Mlp>,
    norm: RmsNorm,
}

#[module]
impl Tiny {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut x = x.clone();
        for layer in &self.layers {
            x = x.add(&layer.forward(&x)?)?;
        }
        let zero = qdq!(global const 0.0, "constant_zero", scale = 0.25, zp = 3)?;
        let y = self.norm.forward(&x)?;
        y.eq(&zero)?.where_cond(&y, &Tensor::scalar(-20.0))
    }
}

fn trace_tiny() -> String {
    let mlp = || Mlp { up_proj: Conv2d::new(8, 16), down_proj: Conv2d::new(16, 8), hidden: 8 };
    let mut model = Tiny { layers: (0..3).map(|_| mlp()).collect(), norm: RmsNorm::new(8, 1e-6) };
    model.bind("model", &ParamSource::Symbolic(ParamFormat::QnnW4A16)).unwrap();
    let program = trace(&[TraceInput::new("x", [1, 4, 8], DType::U16Asym)], |t| model.forward(&t[0])).unwrap();
    let text = program.to_string();
    assert_eq!(parse(&text).unwrap(), program.canonicalize());
    text
}

#[test]
fn printing_is_deterministic() {
    let first = trace_tiny();
    // Same module type, fresh instance, after other traces advanced the global trace/constant counters.
    assert_eq!(trace_tiny(), first);
    // And on another thread (the builder and scope stacks are thread-local).
    let other = std::thread::spawn(trace_tiny).join().unwrap();
    assert_eq!(other, first);
    // Sanity: the text has what the module did, numbered from %0.
    assert!(first.starts_with("@main (%0:tensor<[1, 4, 8], UInt16PerTensorAsy, CPU>) -> ("), "{first}");
    for needle in [
        "graph.SubGraphOp @model.layers.2 CPU {",
        "graph.CallGraphOp @model.layers.1 (",
        "linalg.CPU.Conv2DOp <name=\"model.layers.0.up_proj\"> (",
        "[@model.layers.0.up_proj.weight]",
        "qdq:global(\"constant_zero\", 0.25, 3)",
        "qdq:const(\"model.layers.2.half_qdq\")",
    ] {
        assert!(first.contains(needle), "`{needle}` missing from\n{first}");
    }
}

// ----- parse errors ----------------------------------------------------------------------------

#[track_caller]
fn parse_error(text: &str) -> (usize, usize, String) {
    match parse(text) {
        Err(Error::Parse { line, column, message }) => (line, column, message),
        Err(other) => panic!("expected Error::Parse, got {other:?}"),
        Ok(p) => panic!("parsed malformed input as\n{p}"),
    }
}

#[track_caller]
fn assert_parse_error(text: &str, line: usize, column: usize, message: &str) {
    let (l, c, m) = parse_error(text);
    assert!(m.contains(message), "message `{m}` should contain `{message}`");
    assert_eq!((l, c), (line, column), "position of `{m}` in\n{text}");
    let shown = Error::Parse { line: l, column: c, message: m }.to_string();
    assert!(shown.starts_with(&format!("IR parse error at line {line}, column {column}: ")), "{shown}");
}

#[test]
fn parse_errors_report_line_and_column() {
    assert_parse_error("@main () -> () {\n    foo.bar () -> ()\n}\n", 2, 5, "unknown op 'foo.bar'");
    assert_parse_error("@main () -> () {\n    $\n}\n", 2, 5, "unexpected character '$'");
    assert_parse_error("@main () -> () {\n    linalg.CPU.NegOp <name=\"abc\n}\n", 2, 28, "unterminated string");
    assert_parse_error("@main () () {\n}\n", 1, 10, "expected '->'");
    assert_parse_error("@main () -> () {\n}\nextra\n", 3, 1, "unexpected text after the closing brace");
    assert_parse_error("@main () -> () {", 1, 16, "unexpected end of input");
    assert_parse_error("main () -> () {\n}\n", 1, 1, "expected '@main'");
    // The position of the offending token itself.
    let bad_dtype = "@main (%0:tensor<[1, 2], Float33, CPU>) -> (%0) {\n    cf.ReturnOp (%0) -> ()\n}\n";
    assert_parse_error(bad_dtype, 1, 26, "unknown dtype 'Float33'");
    let bad_device = "@main (%0:tensor<[1], Float32, GPU>) -> (%0) {\n    cf.ReturnOp (%0) -> ()\n}\n";
    assert_parse_error(bad_device, 1, 32, "unknown device 'GPU'");
    // A value used but never defined is reported where it is first mentioned.
    assert_parse_error(
        "@main () -> (%3) {\n    cf.ReturnOp (%3) -> ()\n}\n",
        1,
        14,
        "value %3 is used but never defined",
    );
    let redeclared = "@main (%0:tensor<[1], Float32, CPU>) -> (%0) {\n    \
                      linalg.CPU.NegOp (%0) -> (%0:tensor<[2], Float32, CPU>)\n}\n";
    assert_parse_error(redeclared, 2, 31, "redeclared");
    // Value metadata is typed: an unknown key or a value of the wrong kind names the key.
    let unknown = "@main (%0:tensor<[1], Float32, CPU>[colour:1]) -> (%0) {\n    cf.ReturnOp (%0) -> ()\n}\n";
    assert_parse_error(unknown, 1, 45, "unknown value attribute 'colour'");
    let wrong = "@main (%0:tensor<[1], Float32, CPU>[constant:\"x\"]) -> (%0) {\n    cf.ReturnOp (%0) -> ()\n}\n";
    assert_parse_error(wrong, 1, 49, "value attribute 'constant' has the wrong kind of value");
}

// ----- lossless round trip ---------------------------------------------------------------------

/// Builds programs value by value.
#[derive(Default)]
struct Builder {
    p: Program,
}

impl Builder {
    fn value(&mut self, shape: &[usize], dtype: DType) -> ValueId {
        self.p.add_value(ValueDef::new(TensorType::new(shape.to_vec(), dtype)))
    }

    fn value_with(&mut self, ty: TensorType, symbol: Option<&str>, meta: impl FnOnce(&mut ValueDef)) -> ValueId {
        let mut def = ValueDef::new(ty);
        def.symbol = symbol.map(str::to_string);
        meta(&mut def);
        self.p.add_value(def)
    }
}

fn attrs(items: Vec<(&str, Attr)>) -> Attrs {
    items.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
}

fn qdq(kind: QdqKind, key: &str) -> Attr {
    Attr::Qdq(QdqAttr { kind, key: key.into() })
}

/// Every typed value field set, with awkward values (spec ids are covered by the pass snapshots).
fn every_value_field(def: &mut ValueDef) {
    def.qdq = Some(QdqAttr { kind: QdqKind::Activation, key: "key with \"quotes\"".into() });
    def.constant = Some(f32::NEG_INFINITY);
    def.name = Some("a \"quoted\" \\ name,\n\tcafé [x]".into());
    def.quantized = Some(i64::MIN);
    def.graph_input = true;
    def.graph_output = true;
}

/// One attribute of every variant, with awkward values (escapes, infinities, extremes).
fn every_attr() -> Attrs {
    attrs(vec![
        ("flag", Attr::Bool(true)),
        ("off", Attr::Bool(false)),
        ("count", Attr::Int(-3)),
        ("big", Attr::Int(i64::MIN)),
        ("epsilon", Attr::Float(1e-6)),
        ("whole", Attr::Float(3.0)),
        ("huge", Attr::Float(1e20)),
        ("neg_inf", Attr::Float(f32::NEG_INFINITY)),
        ("inf", Attr::Float(f32::INFINITY)),
        ("tiny", Attr::Float(f32::MIN_POSITIVE)),
        ("label", Attr::Str("a \"quoted\" \\ name,\n\tcafé [x] {y} // z \u{1}".into())),
        ("empty", Attr::Str(String::new())),
        ("dims", Attr::Ints(vec![-1, 0, 7, i64::MAX])),
        ("no_dims", Attr::Ints(vec![])),
        ("weights", Attr::Floats(vec![0.5, -2.0, 1e20, f32::INFINITY, f32::NEG_INFINITY, 1.0])),
        ("dtype", Attr::DType(DType::I4Lpbq)),
        ("bool_dtype", Attr::DType(DType::Bool)),
        ("q_act", qdq(QdqKind::Activation, "model.layers.0.mlp.up_proj_input_qdq")),
        ("q_kv", qdq(QdqKind::KvCache, "model.layers.0.self_attn.k_cast_to_int8_qdq")),
        ("q_fixed", qdq(QdqKind::Fixed { scale: 1.0 / 65536.0, zero_point: 0 }, "m.sigmoid_output_qdq")),
        ("q_const", qdq(QdqKind::Constant, "m.scaling_qdq")),
        ("q_rope", qdq(QdqKind::Rope, "model.sin_embedding_input_qdq")),
        ("q_global", qdq(QdqKind::Global { scale: 0.001 / 65535.0, zero_point: -65535 }, "causal_mask")),
        ("q_odd", qdq(QdqKind::Activation, "key with \"quotes\"")),
    ])
}

/// Every op kind with options that exercise each attribute.
fn every_op() -> Vec<OpKind> {
    vec![
        OpKind::View { shape: vec![1, -1, 8] },
        OpKind::Transpose { dim0: 1, dim1: 2 },
        OpKind::Permute { perm: vec![0, 2, 1] },
        OpKind::Unsqueeze { dim: 0 },
        OpKind::Slice { dim: 2, start: 1, end: 5 },
        OpKind::Concat { dim: 3 },
        OpKind::Repeat { dim: 1, times: 2 },
        OpKind::MatMul,
        OpKind::Add,
        OpKind::Sub,
        OpKind::Mul,
        OpKind::Neg,
        OpKind::Sigmoid,
        OpKind::Silu,
        OpKind::Softmax { dim: 3 },
        OpKind::RmsNorm { eps: 1e-6, unit_offset: false },
        OpKind::Embedding,
        OpKind::Gather { dim: 1 },
        OpKind::Conv2d,
        OpKind::Linear,
        OpKind::Reduce { kind: ReduceKind::Min, dim: 3, keepdim: true },
        OpKind::Reduce { kind: ReduceKind::Max, dim: 0, keepdim: false },
        OpKind::Reduce { kind: ReduceKind::Mean, dim: 2, keepdim: true },
        OpKind::Equal,
        OpKind::Where,
        OpKind::Cast { to: DType::U8Sym },
    ]
}

/// A program with every node kind, every attribute variant (on values, subgraphs and ops), every
/// op kind, both devices, and value ids deliberately out of print order.
fn hand_built() -> Program {
    let mut b = Builder::default();
    // Created first but printed late: the printer renumbers.
    let out = b.value(&[1, 4, 8], DType::F32);
    let mask_qdq = |d: &mut ValueDef| {
        d.qdq = Some(QdqAttr { kind: QdqKind::Global { scale: 0.5, zero_point: 65535 }, key: "causal_mask".into() })
    };
    let mask = b.value_with(TensorType::new(vec![1, 1, 4, 16], DType::U16Asym), None, mask_qdq);
    let x = b.value(&[1, 4, 8], DType::F32);
    let mut qnn_ty = TensorType::new(vec![1, 1, 8, 16], DType::I4Lpbq);
    qnn_ty.device = Device::Qnn;
    let weight = b.value_with(qnn_ty, Some("model.layers.0.mlp.up_proj.weight"), |_| {});
    let norm_w = b.value_with(TensorType::new(vec![8], DType::U16Asym), Some("model.norm.weight"), every_value_field);
    let constant = b.value_with(TensorType::new(vec![1], DType::F32), None, |d| {
        d.constant = Some(-20.0);
        d.qdq = Some(QdqAttr { kind: QdqKind::Constant, key: "model.neg_20_qdq".into() });
    });

    // The module subgraph: every op kind, each reading x and defining a fresh value.
    let mut body = vec![Node::Comment("every op kind, in OpKind order".into())];
    for (i, kind) in every_op().into_iter().enumerate() {
        let res = b.value(&[1, 4, i + 1], DType::F32);
        let (name, op_attrs) = match i % 3 {
            0 => (Some(format!("model.layers.0.mlp.{}.{i}", kind.type_name())), Attrs::new()),
            1 => (None, attrs(vec![("note", Attr::Str(format!("op {i}"))), ("order", Attr::Int(i as i64))])),
            _ => (Some(format!("op-{i}")), every_attr()),
        };
        let device = if i % 2 == 0 { Device::Cpu } else { Device::Qnn };
        let inputs = if kind == OpKind::Conv2d { vec![x, weight] } else { vec![x; kind.arity().0] };
        body.push(Node::Linalg(LinalgOp { device, kind, name, attrs: op_attrs, inputs, outputs: vec![res] }));
    }
    body.push(Node::Constant { device: Device::Cpu, value: constant });
    let y = b.value(&[1, 4, 8], DType::U16Asym);
    body.push(Node::Linalg(LinalgOp {
        device: Device::Cpu,
        kind: OpKind::Mul,
        name: None,
        attrs: Attrs::new(),
        inputs: vec![x, constant],
        outputs: vec![y],
    }));
    body.push(Node::Return(vec![y]));
    let module = SubGraph {
        symbol: "model.layers.0.mlp".into(),
        device: Some(Device::Qnn),
        attrs: every_attr(),
        region: Region { inputs: vec![x], outputs: vec![y], body },
    };
    let init = SubGraph {
        symbol: "init".into(),
        device: None,
        attrs: Attrs::new(),
        region: Region {
            inputs: vec![],
            outputs: vec![],
            body: vec![
                Node::Register { device: Device::Qnn, value: weight },
                Node::Register { device: Device::Cpu, value: norm_w },
            ],
        },
    };
    // A call whose outputs are fresh values, then a top-level op and the return.
    let called = b.value(&[1, 4, 8], DType::U16Asym);
    b.p.main = Region {
        inputs: vec![x, mask],
        outputs: vec![out],
        body: vec![
            Node::SubGraph(init),
            Node::SubGraph(module),
            Node::Comment("the call".into()),
            Node::Call(CallGraph { symbol: "model.layers.0.mlp".into(), inputs: vec![x], outputs: vec![called] }),
            Node::Linalg(LinalgOp {
                device: Device::Cpu,
                kind: OpKind::RmsNorm { eps: 1e-5, unit_offset: false },
                name: Some("model.norm".into()),
                attrs: Attrs::new(),
                inputs: vec![called, norm_w],
                outputs: vec![out],
            }),
            Node::Return(vec![out]),
        ],
    };
    b.p
}

#[test]
fn every_attr_and_node_kind_round_trips() {
    let p = hand_built();
    let text = p.to_string();
    let parsed = parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert_eq!(parsed, p.canonicalize(), "\n{text}");
    assert_eq!(parsed.to_string(), text);
    // Canonical ids follow print order: the output, created first, is numbered late.
    assert!(text.starts_with("@main (%0:tensor<[1, 4, 8], Float32, CPU>, %1:tensor<[1, 1, 4, 16], UInt16PerTensorAsy"));
    assert_eq!(parsed.values.len(), p.values.len());
    assert_ne!(p.canonicalize(), p, "the hand-built ids are out of print order");
    // Everything made it into the text.
    for needle in [
        "graph.SubGraphOp @init notype {",
        "graph.SubGraphOp @model.layers.0.mlp QNN [",
        "tensor.QNN.register () -> (",
        "[@model.layers.0.mlp.up_proj.weight]",
        "tensor.CPU.constant () -> (",
        "// the call",
        "linalg.QNN.TransposeOp [dim0:1, dim1:2, note:\"op 1\", order:1] (",
        "linalg.QNN.ReduceMaxOp <name=\"model.layers.0.mlp.ReduceMax.21\"> [dim:0, keepdim:false] (",
        "linalg.CPU.PermuteOp <name=\"op-2\"> [big:",
        "q_fixed:fixed(\"m.sigmoid_output_qdq\", 1.5258789e-5, 0)",
        "label:\"a \\\"quoted\\\" \\\\ name,\\n\\tcafé [x] {y} // z \\u{1}\"",
        "neg_inf:-inf",
        "no_dims:[]",
    ] {
        assert!(text.contains(needle), "`{needle}` missing from\n{text}");
    }
    let ops = parsed.linalg_ops();
    let kinds: Vec<&OpKind> = ops.iter().map(|op| &op.kind).take(every_op().len()).collect();
    assert_eq!(kinds, every_op().iter().collect::<Vec<_>>());
}

/// Every way a value gets its name, in one file: a main input (`%0`), a parameter (its symbol), an
/// op's outputs (its name, `#1` for the second), a constant and an unnamed op's output (numbered in
/// their subgraph, `%.#0`), a repeated op name (`~2`); relative names (`%.v` in `@m`) and specs
/// named after their first value (`$0`, `$m.w.weight`). It reads back and prints identically, and a
/// relative name means the same as its full spelling.
#[test]
fn named_values_read_back_and_print_identically() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/ir/named.mir");
    let text = std::fs::read_to_string(path).unwrap();
    let p = parse(&text).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(p.to_string(), text);
    let full = text.replace("(%.v, %.#0) -> (%.Mul.0:", "(%m.v, %m.#0) -> (%m.Mul.0:");
    assert_ne!(full, text);
    assert_eq!(parse(&full).unwrap(), p);
    // A relative name outside any subgraph is the name itself, which is not defined there.
    let (_, _, message) = parse_error("@main () -> (%.x) {\n    cf.ReturnOp (%.x) -> ()\n}\n");
    assert_eq!(message, "value %.x is used but never defined");
}

/// A traced program round-trips too (the snapshot tests of the models rely on it).
#[test]
fn traced_programs_round_trip() {
    let text = trace_tiny();
    assert_eq!(parse(&text).unwrap().to_string(), text);
}

// ----- line wrapping ---------------------------------------------------------------------------

#[test]
fn long_lists_wrap_one_item_per_line() {
    let mut b = Builder::default();
    let ins: Vec<ValueId> = (0..8).map(|_| b.value(&[1024, 1024, 1024], DType::F32)).collect();
    b.p.main = Region { inputs: ins.clone(), outputs: vec![ins[0], ins[7]], body: vec![Node::Return(ins.clone())] };
    let ty = "tensor<[1024, 1024, 1024], Float32, CPU>";
    let items: Vec<String> = (0..8).map(|i| format!("    %{i}:{ty}")).collect();
    let want = format!(
        "@main (\n{}\n) -> (\n    %0,\n    %7\n) {{\n    cf.ReturnOp (%0, %1, %2, %3, %4, %5, %6, %7) -> ()\n}}\n",
        items.join(",\n")
    );
    assert_eq!(b.p.to_string(), want);
    assert_eq!(parse(&want).unwrap(), b.p.canonicalize());
}

#[test]
fn wrapping_starts_just_past_max_line() {
    for extra in [0, 1] {
        let mut b = Builder::default();
        let (x, y) = (b.value(&[1], DType::F32), b.value(&[1], DType::F32));
        let line = |symbol: &str| format!("    graph.CallGraphOp @{symbol} (%0) -> (%1:tensor<[1], Float32, CPU>)");
        let symbol = "s".repeat(MAX_LINE - line("").len() + extra);
        let call = Node::Call(CallGraph { symbol: symbol.clone(), inputs: vec![x], outputs: vec![y] });
        b.p.main = Region { inputs: vec![x], outputs: vec![y], body: vec![call, Node::Return(vec![y])] };
        let text = b.p.to_string();
        let second = text.lines().nth(1).unwrap();
        if extra == 0 {
            assert_eq!(second, line(&symbol));
            assert_eq!(second.len(), MAX_LINE);
        } else {
            assert_eq!(second, format!("    graph.CallGraphOp @{symbol} ("));
            let rest: Vec<&str> = text.lines().skip(2).take(4).collect();
            assert_eq!(rest, ["        %0", "    ) -> (", "        %1:tensor<[1], Float32, CPU>", "    )"]);
        }
        assert_eq!(parse(&text).unwrap(), b.p.canonicalize());
    }
}

#[test]
fn wrapped_programs_keep_every_line_within_max_line() {
    // A concat of 60 inputs, inside a module subgraph, with a long output list.
    let mut b = Builder::default();
    let ins: Vec<ValueId> = (0..60).map(|_| b.value(&[1, 2, 64, 1], DType::U8Sym)).collect();
    let cat = b.value(&[1, 2, 64, 60], DType::U8Sym);
    let op = LinalgOp {
        device: Device::Cpu,
        kind: OpKind::Concat { dim: 3 },
        name: Some("model.layers.27.self_attn.Concat.0".into()),
        attrs: Attrs::new(),
        inputs: ins.clone(),
        outputs: vec![cat],
    };
    let g = SubGraph {
        symbol: "model.layers.27.self_attn".into(),
        device: Some(Device::Cpu),
        attrs: Attrs::new(),
        region: Region {
            inputs: ins.clone(),
            outputs: vec![cat],
            body: vec![Node::Linalg(op), Node::Return(vec![cat])],
        },
    };
    let mut outs = ins.clone();
    outs.push(cat);
    let call = Node::Call(CallGraph { symbol: g.symbol.clone(), inputs: ins.clone(), outputs: vec![cat] });
    b.p.main =
        Region { inputs: ins.clone(), outputs: outs.clone(), body: vec![Node::SubGraph(g), call, Node::Return(outs)] };
    let text = b.p.to_string();
    let longest = text.lines().map(str::len).max().unwrap();
    assert!(longest <= MAX_LINE, "a line has {longest} chars:\n{text}");
    assert!(
        text.contains("\n            linalg.CPU.ConcatOp <name=\"model.layers.27.self_attn.Concat.0\"> [dim:3] (\n")
    );
    assert_eq!(parse(&text).unwrap(), b.p.canonicalize());
}

#[test]
fn an_item_longer_than_max_line_puts_its_symbol_and_attributes_on_lines_of_their_own() {
    // A parameter registered in `@init`: its name is its symbol, and its spec is named after it.
    let mut b = Builder::default();
    let symbol = format!("model.layers.27.{}.weight", "s".repeat(60));
    let w = b.value_with(TensorType::new(vec![1, 1024, 8], DType::U16Asym), Some(&symbol), |def| {
        def.qdq = Some(QdqAttr { kind: QdqKind::Rope, key: "model.sin_embedding_input_qdq".into() })
    });
    let spec = b.p.add_spec(mllm_dsl::ir::QuantSpec::new(mllm_dsl::ir::QuantSpecKind::u16_asym()));
    b.p.set_value_spec(w, spec);
    let init = SubGraph {
        symbol: "init".into(),
        device: None,
        attrs: Attrs::new(),
        region: Region {
            inputs: vec![],
            outputs: vec![],
            body: vec![Node::Register { device: Device::Cpu, value: w }, Node::Return(vec![])],
        },
    };
    b.p.main = Region { inputs: vec![], outputs: vec![], body: vec![Node::SubGraph(init), Node::Return(vec![])] };
    let text = b.p.to_string();
    let longest = text.lines().map(str::len).max().unwrap();
    assert!(longest <= MAX_LINE, "a line has {longest} chars:\n{text}");
    let want = format!(
        "            tensor.CPU.register () -> (\n\
         \x20               %{symbol}:tensor<[1, 1024, 8], UInt16PerTensorAsy, CPU>\n\
         \x20                   [@{symbol}]\n\
         \x20                   [qdq:rope(\"model.sin_embedding_input_qdq\"), spec:${symbol}]\n\
         \x20           )\n"
    );
    assert!(text.contains(&want), "{text}");
    assert_eq!(parse(&text).unwrap(), b.p.canonicalize());
}

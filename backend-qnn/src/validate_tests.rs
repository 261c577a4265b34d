//! One small violating graph per validation rule.

use std::sync::Arc;

use super::*;
use crate::encoding::{BlockScales, BlockwiseExpansion, ScaleOffset};
use crate::graph::{GraphBuilder, Scalar, StaticData};

const U16: DataType = DataType::UFixedPoint16;

fn act() -> Encoding {
    Encoding::from_zero_point(0.01, 30000)
}

fn t(name: &str, ty: TensorType, dtype: DataType, dims: &[u32]) -> QnnTensor {
    let enc = if dtype.is_fixed_point() { act() } else { Encoding::Undefined };
    QnnTensor::new(name, ty, dtype, dims, enc)
}

fn lpbq(out: u32, nb: u32, scales: Vec<u8>) -> Encoding {
    Encoding::BlockwiseExpansion(BlockwiseExpansion {
        axis: 3,
        scale_offsets: vec![ScaleOffset { scale: 0.01, offset: 0 }; out as usize].into(),
        num_blocks_per_axis: nb,
        block_scale_bitwidth: 4,
        block_scales: BlockScales::U8(scales.into()),
    })
}

/// x[1,1,4,8] -> Conv2d(LPBQ w[1,1,8,4]) -> RmsNorm -> Softmax -> out.
fn base() -> QnnGraph {
    let mut b = GraphBuilder::new("base");
    let x = b.input("x", U16, &[1, 1, 4, 8], act());
    let w = b.static_tensor(
        "w",
        DataType::SFixedPoint4,
        &[1, 1, 8, 4],
        lpbq(4, 2, vec![1, 2, 3, 4, 5, 6, 7, 16]),
        StaticData::new(vec![0x07u8; 32]),
    );
    let y = b
        .node("conv", OpType::Conv2d)
        .input(&x)
        .input(&w)
        .tensor_param_u32("stride", &[2], &[1, 1])
        .tensor_param_u32("pad_amount", &[2, 2], &[0, 0, 0, 0])
        .output("y", U16, &[1, 1, 4, 4], act())
        .finish_one();
    let gamma = b.static_tensor("gamma", U16, &[4], act(), StaticData::from_u16(&[1, 2, 3, 4]));
    let beta = b.static_tensor("beta", U16, &[4], act(), StaticData::from_u16(&[0; 4]));
    let n = b
        .node("norm", OpType::RmsNorm)
        .inputs([&y, &gamma, &beta])
        .scalar("epsilon", Scalar::Float32(1e-6))
        .tensor_param_u32("axes", &[1], &[3])
        .output("n", U16, &[1, 1, 4, 4], act())
        .finish_one();
    b.node("softmax", OpType::Softmax).input(&n).graph_output("out", U16, &[1, 1, 4, 4], act()).finish();
    b.finish_unchecked()
}

fn err(g: &QnnGraph) -> ValidationError {
    validate(g).expect_err("graph should be invalid")
}

fn tensor_mut<'g>(g: &'g mut QnnGraph, name: &str) -> &'g mut QnnTensor {
    g.tensors.iter_mut().find(|t| t.name == name).unwrap()
}

fn node_mut<'g>(g: &'g mut QnnGraph, name: &str) -> &'g mut QnnNode {
    g.nodes.iter_mut().find(|n| n.name == name).unwrap()
}

/// in (APP_WRITE) -> op -> out (APP_READ), with extra static inputs appended.
fn single(op: OpType, inputs: Vec<QnnTensor>, out: QnnTensor, params: Vec<(&str, Param)>) -> QnnGraph {
    let mut tensors = Vec::new();
    let mut graph_inputs = Vec::new();
    for mut i in inputs.clone() {
        if i.tensor_type != TensorType::Static {
            i.tensor_type = TensorType::AppWrite;
            graph_inputs.push(i.name.clone());
        }
        tensors.push(i);
    }
    let mut out = out;
    out.tensor_type = TensorType::AppRead;
    let out_name = out.name.clone();
    tensors.push(out);
    QnnGraph {
        name: "single".into(),
        tensors,
        nodes: vec![QnnNode {
            name: "n".into(),
            package: QNN_OP_PACKAGE.into(),
            op_type: op,
            params: params.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
            inputs: inputs.iter().map(|t| t.name.clone()).collect(),
            outputs: vec![out_name.clone()],
        }],
        inputs: graph_inputs,
        outputs: vec![out_name],
        int4_storage: Int4Storage::default(),
    }
}

fn f32t(name: &str, dims: &[u32]) -> QnnTensor {
    t(name, TensorType::Native, DataType::Float32, dims)
}

fn u32_param(name: &str, dims: &[u32], values: &[u32]) -> Param {
    Param::Tensor(QnnTensor::new_static(
        name,
        DataType::UInt32,
        dims,
        Encoding::Undefined,
        StaticData::from_u32(values),
    ))
}

fn i32_param(name: &str, dims: &[u32], values: &[i32]) -> Param {
    Param::Tensor(QnnTensor::new_static(name, DataType::Int32, dims, Encoding::Undefined, StaticData::from_i32(values)))
}

fn op_detail(e: ValidationError) -> String {
    match e {
        ValidationError::Op { detail, .. } => detail,
        other => panic!("expected an Op error, found {other:?}"),
    }
}

fn param_of(e: ValidationError) -> (String, String) {
    match e {
        ValidationError::Param { param, detail, .. } => (param, detail),
        other => panic!("expected a Param error, found {other:?}"),
    }
}

#[test]
fn base_graph_is_valid() {
    validate(&base()).unwrap();
}

// ---- graph and tensor rules -----------------------------------------------------------------

#[test]
fn empty_graph_name() {
    let mut g = base();
    g.name.clear();
    assert!(matches!(err(&g), ValidationError::GraphName { .. }));
}

#[test]
fn duplicate_graph_tensor() {
    let mut g = base();
    let dup = g.tensors[0].clone();
    g.tensors.push(dup);
    assert!(matches!(err(&g), ValidationError::DuplicateTensor { tensor, .. } if tensor == "x"));
}

#[test]
fn param_tensor_name_clashes_with_graph_tensor() {
    let mut g = base();
    tensor_mut(&mut g, "gamma").name = "conv.stride".into();
    node_mut(&mut g, "norm").inputs[1] = "conv.stride".into();
    let e = err(&g);
    assert!(
        matches!(&e, ValidationError::DuplicateTensor { tensor, second, .. }
            if tensor == "conv.stride" && second.contains("param `stride` of node `conv`")),
        "{e}"
    );
}

#[test]
fn duplicate_node_name() {
    let mut g = base();
    node_mut(&mut g, "norm").name = "conv".into();
    assert!(matches!(err(&g), ValidationError::DuplicateNode { node } if node == "conv"));
}

#[test]
fn zero_dim() {
    let mut g = base();
    tensor_mut(&mut g, "x").dims = vec![1, 0, 4, 8];
    assert!(matches!(err(&g), ValidationError::Tensor { tensor, .. } if tensor == "x"));
}

#[test]
fn static_without_data_and_native_with_data() {
    let mut g = base();
    tensor_mut(&mut g, "gamma").data = None;
    assert!(matches!(err(&g), ValidationError::StaticData { tensor, .. } if tensor == "gamma"));
    let mut g = base();
    tensor_mut(&mut g, "y").data = Some(StaticData::from_u16(&[0; 16]));
    assert!(matches!(err(&g), ValidationError::StaticData { tensor, .. } if tensor == "y"));
}

#[test]
fn static_data_size() {
    let mut g = base();
    tensor_mut(&mut g, "gamma").data = Some(StaticData::from_u16(&[1, 2, 3]));
    let e = err(&g);
    assert!(
        matches!(&e, ValidationError::StaticData { tensor, detail }
            if tensor == "gamma" && detail.contains("6 bytes, expected 8")),
        "{e}"
    );
}

#[test]
fn four_bit_sizes_follow_the_storage_convention() {
    // LowNibble: one byte per element, high nibble zero.
    let mut g = base();
    tensor_mut(&mut g, "w").data = Some(StaticData::new(vec![0u8; 16]));
    assert!(matches!(err(&g), ValidationError::StaticData { tensor, .. } if tensor == "w"));
    let mut g = base();
    let mut bytes = vec![0x07u8; 32];
    bytes[5] = 0xF9; // un-masked int8 -7
    tensor_mut(&mut g, "w").data = Some(StaticData::new(bytes));
    let e = err(&g);
    assert!(matches!(&e, ValidationError::StaticData { detail, .. } if detail.contains("byte 5")), "{e}");
    // Packed: two per byte -> 16 bytes is right, 32 is wrong.
    let mut g = base();
    g.int4_storage = Int4Storage::Packed;
    assert!(matches!(err(&g), ValidationError::StaticData { tensor, .. } if tensor == "w"));
    tensor_mut(&mut g, "w").data = Some(StaticData::new(vec![0x77u8; 16]));
    validate(&g).unwrap();
    // Int8Container: sign-extended -8..=7.
    let mut g = base();
    g.int4_storage = Int4Storage::Int8Container;
    let mut bytes = vec![0xF9u8; 32];
    validate(&{
        tensor_mut(&mut g, "w").data = Some(StaticData::new(bytes.clone()));
        g.clone()
    })
    .unwrap();
    bytes[3] = 0x09;
    tensor_mut(&mut g, "w").data = Some(StaticData::new(bytes));
    assert!(matches!(err(&g), ValidationError::StaticData { detail, .. } if detail.contains("byte 3")));
}

#[test]
fn bool_static_values() {
    let cond = QnnTensor::new_static("c", DataType::Bool8, &[2], Encoding::Undefined, StaticData::new(vec![0u8, 2]));
    let g = single(OpType::ElementWiseSelect, vec![cond, f32t("a", &[2]), f32t("b", &[2])], f32t("o", &[2]), vec![]);
    assert!(matches!(err(&g), ValidationError::StaticData { tensor, .. } if tensor == "c"));
}

#[test]
fn encoding_presence_follows_dtype() {
    let mut g = base();
    tensor_mut(&mut g, "y").encoding = Encoding::Undefined;
    assert!(matches!(err(&g), ValidationError::Encoding { tensor, .. } if tensor == "y"));
    let mut f = f32t("a", &[2]);
    f.encoding = act();
    let g = single(OpType::Sigmoid, vec![f], f32t("o", &[2]), vec![]);
    assert!(matches!(err(&g), ValidationError::Encoding { tensor, .. } if tensor == "a"));
}

#[test]
fn scale_must_be_positive_and_finite() {
    for bad in [0.0, -1.0, f32::NAN, f32::INFINITY] {
        let mut g = base();
        tensor_mut(&mut g, "y").encoding = Encoding::scale_offset(bad, 0);
        assert!(matches!(err(&g), ValidationError::Encoding { tensor, .. } if tensor == "y"));
    }
}

#[test]
fn offsets_within_dtype_range() {
    for (offset, ok) in [(0, true), (-65535, true), (1, false), (-65536, false)] {
        let mut g = base();
        tensor_mut(&mut g, "y").encoding = Encoding::scale_offset(0.1, offset);
        assert_eq!(validate(&g).is_ok(), ok, "offset {offset}");
    }
    // uint8 symmetric KV: offset -128 is valid for UFIXED_POINT_8, -256 is not.
    let mk = |offset| {
        let mut a = t("a", TensorType::Native, DataType::UFixedPoint8, &[2]);
        a.encoding = Encoding::scale_offset(0.1, offset);
        let mut o = a.clone();
        o.name = "o".into();
        single(OpType::ElementWiseNeg, vec![a], o, vec![])
    };
    validate(&mk(-128)).unwrap();
    assert!(matches!(err(&mk(-256)), ValidationError::Encoding { .. }));
}

#[test]
fn axis_scale_offset_counts() {
    let so = ScaleOffset { scale: 0.1, offset: 0 };
    let mut g = base();
    tensor_mut(&mut g, "gamma").encoding = Encoding::AxisScaleOffset { axis: 0, scale_offsets: vec![so; 3].into() };
    let e = err(&g);
    assert!(matches!(&e, ValidationError::Encoding { detail, .. } if detail.contains("3 scale/offset pairs")), "{e}");
    tensor_mut(&mut g, "gamma").encoding = Encoding::AxisScaleOffset { axis: 1, scale_offsets: vec![so; 4].into() };
    assert!(matches!(err(&g), ValidationError::Encoding { detail, .. } if detail.contains("axis 1")));
    tensor_mut(&mut g, "gamma").encoding = Encoding::AxisScaleOffset { axis: 0, scale_offsets: vec![so; 4].into() };
    validate(&g).unwrap();
}

fn blockwise_err(mutate: impl FnOnce(&mut QnnTensor)) -> String {
    let mut g = base();
    mutate(tensor_mut(&mut g, "w"));
    match err(&g) {
        ValidationError::Encoding { tensor, detail } if tensor == "w" => detail,
        other => panic!("expected a blockwise encoding error, found {other:?}"),
    }
}

fn with_bw(t: &mut QnnTensor, f: impl FnOnce(&mut BlockwiseExpansion)) {
    let Encoding::BlockwiseExpansion(bw) = &mut t.encoding else { panic!("not blockwise") };
    f(bw);
}

#[test]
fn blockwise_invariants() {
    assert!(blockwise_err(|t| {
        t.dtype = DataType::UFixedPoint8;
        t.data = Some(StaticData::new(vec![0u8; 32]));
    })
    .contains("SFIXED_POINT_4 or SFIXED_POINT_8"));
    assert!(blockwise_err(|t| with_bw(t, |bw| {
        bw.scale_offsets = vec![ScaleOffset { scale: 0.1, offset: -1 }; 4].into()
    }))
    .contains("offset must be 0"));
    assert!(blockwise_err(|t| with_bw(t, |bw| {
        bw.scale_offsets = vec![ScaleOffset { scale: 0.1, offset: 0 }; 3].into()
    }))
    .contains("3 per-channel scales"));
    assert!(blockwise_err(|t| with_bw(t, |bw| bw.num_blocks_per_axis = 3)).contains("does not divide In"));
    assert!(blockwise_err(|t| with_bw(t, |bw| bw.num_blocks_per_axis = 4)).contains("8 block scales, expected"));
    assert!(blockwise_err(|t| with_bw(t, |bw| {
        bw.block_scales = BlockScales::U8(Arc::from(vec![1u8, 2, 0, 4, 5, 6, 7, 8]))
    }))
    .contains("block scale [1][0] = 0"));
    assert!(blockwise_err(|t| with_bw(t, |bw| {
        bw.block_scales = BlockScales::U8(Arc::from(vec![1u8, 2, 3, 4, 5, 6, 7, 17]))
    }))
    .contains("= 17 is outside 1..=16"));
    assert!(blockwise_err(|t| with_bw(t, |bw| bw.block_scale_bitwidth = 9)).contains("blockScaleBitwidth 9"));
    assert!(blockwise_err(|t| with_bw(t, |bw| bw.axis = 2)).contains("expected the output channel"));
    assert!(blockwise_err(|t| {
        t.dims = vec![2, 1, 4, 4];
    })
    .contains("only 1x1 kernels"));
}

#[test]
fn blockwise_must_be_static() {
    let mut w = t("w", TensorType::Native, DataType::SFixedPoint8, &[4, 8]);
    w.encoding = Encoding::BlockwiseExpansion(BlockwiseExpansion {
        axis: 0,
        scale_offsets: vec![ScaleOffset { scale: 0.1, offset: 0 }; 4].into(),
        num_blocks_per_axis: 2,
        block_scale_bitwidth: 4,
        block_scales: BlockScales::U8(vec![1u8; 8].into()),
    });
    let g = single(OpType::ElementWiseNeg, vec![w.clone()], w.clone(), vec![]);
    assert!(matches!(err(&g), ValidationError::Encoding { detail, .. } if detail.contains("only STATIC")));
}

// ---- node structure ------------------------------------------------------------------------

#[test]
fn package_must_be_qti_aisw() {
    let mut g = base();
    node_mut(&mut g, "softmax").package = "my.pkg".into();
    assert!(matches!(err(&g), ValidationError::Package { node, .. } if node == "softmax"));
}

#[test]
fn input_arity() {
    let mut g = base();
    node_mut(&mut g, "conv").inputs.truncate(1);
    let e = err(&g);
    assert!(matches!(&e, ValidationError::InputArity { expected, found: 1, .. } if expected == "2 to 3"), "{e}");
    let mut g = base();
    node_mut(&mut g, "softmax").inputs.push("x".into());
    assert!(matches!(err(&g), ValidationError::InputArity { found: 2, .. }));
    let g = single(OpType::Concat, vec![], f32t("o", &[2]), vec![("axis", Param::Scalar(Scalar::UInt32(0)))]);
    assert!(matches!(err(&g), ValidationError::InputArity { expected, .. } if expected == "at least 1"));
}

#[test]
fn output_arity() {
    let mut g = base();
    node_mut(&mut g, "norm").outputs.push("extra".into());
    assert!(matches!(err(&g), ValidationError::OutputArity { found: 2, expected: 1, .. }));
}

#[test]
fn unknown_input_tensor() {
    let mut g = base();
    node_mut(&mut g, "softmax").inputs[0] = "nope".into();
    assert!(matches!(err(&g), ValidationError::UnknownTensor { tensor, .. } if tensor == "nope"));
}

#[test]
fn inputs_must_be_defined_before_use() {
    let mut g = base();
    g.nodes.swap(1, 2); // softmax before norm
    assert!(matches!(err(&g),
        ValidationError::UseBeforeDefinition { node, tensor } if node == "softmax" && tensor == "n"));
}

#[test]
fn node_outputs_must_be_native_or_app_read() {
    let mut g = base();
    node_mut(&mut g, "norm").outputs[0] = "gamma".into();
    assert!(matches!(err(&g),
        ValidationError::OutputType { tensor, found: TensorType::Static, .. } if tensor == "gamma"));
    let mut g = base();
    node_mut(&mut g, "norm").outputs[0] = "x".into();
    assert!(matches!(err(&g), ValidationError::OutputType { found: TensorType::AppWrite, .. }));
}

#[test]
fn single_producer() {
    let mut g = base();
    node_mut(&mut g, "norm").outputs[0] = "y".into();
    assert!(matches!(err(&g),
        ValidationError::MultipleProducers { tensor, first, second } if tensor == "y" && first == "conv" && second == "norm"));
}

// ---- params --------------------------------------------------------------------------------

#[test]
fn missing_mandatory_param() {
    let mut g = base();
    node_mut(&mut g, "conv").params.retain(|(n, _)| n != "pad_amount");
    assert!(matches!(err(&g), ValidationError::MissingParam { param, .. } if param == "pad_amount"));
}

#[test]
fn unknown_and_repeated_params() {
    let mut g = base();
    node_mut(&mut g, "softmax").params.push(("temperature".into(), Param::Scalar(Scalar::Float32(1.0))));
    assert!(matches!(err(&g), ValidationError::UnknownParam { param, .. } if param == "temperature"));
    let mut g = base();
    let n = node_mut(&mut g, "softmax");
    n.params.push(("beta".into(), Param::Scalar(Scalar::Float32(1.0))));
    n.params.push(("beta".into(), Param::Scalar(Scalar::Float32(2.0))));
    assert_eq!(param_of(err(&g)).0, "beta");
}

#[test]
fn param_kind_and_dtype() {
    let mut g = base();
    node_mut(&mut g, "softmax").params.push(("axis".into(), Param::Scalar(Scalar::Int32(3))));
    let (p, d) = param_of(err(&g));
    assert_eq!(p, "axis");
    assert!(d.contains("expected a UINT_32 scalar, found INT_32"), "{d}");

    let mut g = base();
    node_mut(&mut g, "softmax").params.push(("axis".into(), u32_param("ax", &[1], &[3])));
    assert!(param_of(err(&g)).1.contains("found a tensor"));

    let mut g = base();
    node_mut(&mut g, "conv").params[0].1 = Param::Scalar(Scalar::UInt32(1));
    assert!(param_of(err(&g)).1.contains("expected a tensor param"));

    let mut g = base();
    node_mut(&mut g, "conv").params[0].1 = i32_param("conv.stride", &[2], &[1, 1]);
    assert!(param_of(err(&g)).1.contains("expected a UINT_32 tensor, found INT_32"));

    let mut g = base();
    node_mut(&mut g, "softmax").params.push(("beta".into(), Param::Scalar(Scalar::Float32(f32::NAN))));
    assert!(param_of(err(&g)).1.contains("finite"));
}

#[test]
fn tensor_param_shape_and_type() {
    let mut g = base();
    node_mut(&mut g, "conv").params[1].1 = u32_param("conv.pad_amount", &[4], &[0, 0, 0, 0]);
    let (p, d) = param_of(err(&g));
    assert_eq!(p, "pad_amount");
    assert!(d.contains("expected [2, 2]"), "{d}");

    let mut g = base();
    if let Param::Tensor(t) = &mut node_mut(&mut g, "conv").params[0].1 {
        t.tensor_type = TensorType::Native;
        t.data = None;
    }
    assert!(param_of(err(&g)).1.contains("must be STATIC"));
}

// ---- per-op rules --------------------------------------------------------------------------

fn conv_graph(input: &[u32], filter: &[u32], bias: Option<&[u32]>, out: &[u32], group: u32) -> QnnGraph {
    let mut ins = vec![
        f32t("x", input),
        QnnTensor::new_static(
            "w",
            DataType::Float32,
            filter,
            Encoding::Undefined,
            StaticData::from_f32(&vec![0.0; filter.iter().product::<u32>() as usize]),
        ),
    ];
    if let Some(b) = bias {
        ins.push(QnnTensor::new_static(
            "b",
            DataType::Float32,
            b,
            Encoding::Undefined,
            StaticData::from_f32(&vec![0.0; b.iter().product::<u32>() as usize]),
        ));
    }
    single(
        OpType::Conv2d,
        ins,
        f32t("o", out),
        vec![
            ("stride", u32_param("n.stride", &[2], &[1, 1])),
            ("pad_amount", u32_param("n.pad", &[2, 2], &[0, 0, 0, 0])),
            ("group", Param::Scalar(Scalar::UInt32(group))),
        ],
    )
}

#[test]
fn conv2d_rules() {
    validate(&conv_graph(&[1, 3, 3, 4], &[2, 2, 2, 6], Some(&[6]), &[1, 2, 2, 6], 2)).unwrap();
    assert!(op_detail(err(&conv_graph(&[1, 3, 3, 4], &[2, 2, 3, 6], None, &[1, 2, 2, 6], 1)))
        .contains("in-channels 3 x group 1 != input channels 4"));
    assert!(op_detail(err(&conv_graph(&[1, 3, 3, 4], &[2, 2, 4], None, &[1, 2, 2, 6], 1))).contains("HWIO rank 4"));
    assert!(op_detail(err(&conv_graph(&[1, 3, 3, 4], &[2, 2, 4, 6], Some(&[4]), &[1, 2, 2, 6], 1)))
        .contains("bias `b` has dims [4], expected [6]"));
    assert!(op_detail(err(&conv_graph(&[1, 3, 3, 4], &[2, 2, 4, 6], None, &[1, 3, 3, 6], 1)))
        .contains("expected [1, 2, 2, 6]"));
}

#[test]
fn fully_connected_rules() {
    let w = |dims: &[u32]| {
        QnnTensor::new_static(
            "w",
            DataType::Float32,
            dims,
            Encoding::Undefined,
            StaticData::from_f32(&vec![0.0; dims.iter().product::<u32>() as usize]),
        )
    };
    validate(&single(OpType::FullyConnected, vec![f32t("x", &[2, 3, 4]), w(&[5, 4])], f32t("o", &[6, 5]), vec![]))
        .unwrap();
    validate(&single(
        OpType::FullyConnected,
        vec![f32t("x", &[2, 3, 4]), w(&[5, 4])],
        f32t("o", &[2, 3, 5]),
        vec![("keep_dims", Param::Scalar(Scalar::Bool8(true)))],
    ))
    .unwrap();
    assert!(op_detail(err(&single(
        OpType::FullyConnected,
        vec![f32t("x", &[2, 3]), w(&[5, 4])],
        f32t("o", &[2, 5]),
        vec![]
    )))
    .contains("weights expect In = 4"));
}

#[test]
fn matmul_inner_dims() {
    let g = |a: &[u32], b: &[u32], o: &[u32], t1: bool| {
        single(
            OpType::MatMul,
            vec![f32t("a", a), f32t("b", b)],
            f32t("o", o),
            vec![("transpose_in1", Param::Scalar(Scalar::Bool8(t1)))],
        )
    };
    validate(&g(&[1, 2, 3, 4], &[1, 2, 4, 5], &[1, 2, 3, 5], false)).unwrap();
    validate(&g(&[1, 2, 3, 4], &[1, 2, 5, 4], &[1, 2, 3, 5], true)).unwrap();
    assert!(op_detail(err(&g(&[1, 2, 3, 4], &[1, 2, 5, 4], &[1, 2, 3, 5], false))).contains("inner dims differ"));
}

#[test]
fn elementwise_broadcast_and_bool_rules() {
    let add = |a: &[u32], b: &[u32], o: &[u32]| {
        single(OpType::ElementWiseAdd, vec![f32t("a", a), f32t("b", b)], f32t("o", o), vec![])
    };
    validate(&add(&[2, 1, 4], &[3, 1], &[2, 3, 4])).unwrap();
    assert!(op_detail(err(&add(&[2, 3], &[4, 3], &[2, 3]))).contains("not broadcastable"));
    assert!(op_detail(err(&add(&[2, 3], &[1, 3], &[3, 3]))).contains("expected [2, 3]"));

    let eq = single(OpType::ElementWiseEqual, vec![f32t("a", &[2]), f32t("b", &[2])], f32t("o", &[2]), vec![]);
    assert!(op_detail(err(&eq)).contains("must be BOOL_8"));
    let sel = single(
        OpType::ElementWiseSelect,
        vec![f32t("c", &[2]), f32t("a", &[2]), f32t("b", &[2])],
        f32t("o", &[2]),
        vec![],
    );
    assert!(op_detail(err(&sel)).contains("condition `c` must be BOOL_8"));
}

#[test]
fn softmax_axis_range() {
    let mut g = base();
    node_mut(&mut g, "softmax").params.push(("axis".into(), Param::Scalar(Scalar::UInt32(4))));
    let (p, d) = param_of(err(&g));
    assert_eq!(p, "axis");
    assert!(d.contains("out of range for rank 4"));
}

#[test]
fn rmsnorm_rules() {
    let mut g = base();
    let gamma = tensor_mut(&mut g, "gamma");
    gamma.dims = vec![1, 4];
    assert!(op_detail(err(&g)).contains("gamma `gamma` has dims [1, 4], expected [4]"));
    let mut g = base();
    node_mut(&mut g, "norm").params[0].1 = Param::Scalar(Scalar::Float32(-1.0));
    assert_eq!(param_of(err(&g)).0, "epsilon");
    let mut g = base();
    node_mut(&mut g, "norm").params[1].1 = u32_param("norm.axes", &[2], &[3, 3]);
    assert!(param_of(err(&g)).1.contains("appears twice"));
    let mut g = base();
    node_mut(&mut g, "norm").params[1].1 = u32_param("norm.axes", &[1], &[4]);
    assert!(param_of(err(&g)).1.contains("out of range"));
}

#[test]
fn transpose_perm_is_a_permutation() {
    let g = |perm: &[u32], out: &[u32]| {
        single(
            OpType::Transpose,
            vec![f32t("a", &[2, 3, 4])],
            f32t("o", out),
            vec![("perm", u32_param("n.perm", &[3], perm))],
        )
    };
    validate(&g(&[2, 0, 1], &[4, 2, 3])).unwrap();
    let (p, d) = param_of(err(&g(&[2, 2, 1], &[4, 4, 3])));
    assert_eq!(p, "perm");
    assert!(d.contains("not a permutation"));
    assert!(op_detail(err(&g(&[2, 0, 1], &[2, 3, 4]))).contains("expected [4, 2, 3]"));
    // perm length must equal the input rank (param shape rule).
    let short = single(
        OpType::Transpose,
        vec![f32t("a", &[2, 3, 4])],
        f32t("o", &[3, 2, 4]),
        vec![("perm", u32_param("n.perm", &[2], &[1, 0]))],
    );
    assert!(param_of(err(&short)).1.contains("input rank"));
}

#[test]
fn reshape_element_count_and_dtype() {
    let ok = single(OpType::Reshape, vec![f32t("a", &[2, 6])], f32t("o", &[3, 4]), vec![]);
    validate(&ok).unwrap();
    let bad = single(OpType::Reshape, vec![f32t("a", &[2, 6])], f32t("o", &[3, 5]), vec![]);
    assert!(op_detail(err(&bad)).contains("12 elements"));
    let mut out = t("o", TensorType::Native, DataType::Float16, &[3, 4]);
    out.encoding = Encoding::Undefined;
    let bad = single(OpType::Reshape, vec![f32t("a", &[2, 6])], out, vec![]);
    assert!(op_detail(err(&bad)).contains("does not change the data type"));
}

#[test]
fn concat_dims() {
    let g = |b: &[u32], o: &[u32]| {
        single(
            OpType::Concat,
            vec![f32t("a", &[1, 2, 3]), f32t("b", b)],
            f32t("o", o),
            vec![("axis", Param::Scalar(Scalar::UInt32(1)))],
        )
    };
    validate(&g(&[1, 5, 3], &[1, 7, 3])).unwrap();
    assert!(op_detail(err(&g(&[2, 5, 3], &[1, 7, 3]))).contains("outside axis 1"));
    assert!(op_detail(err(&g(&[1, 5, 3], &[1, 8, 3]))).contains("expected [1, 7, 3]"));
}

#[test]
fn gather_rules() {
    let idx = |dtype: DataType, values: &[i32]| {
        QnnTensor::new_static("i", dtype, &[values.len() as u32], Encoding::Undefined, StaticData::from_i32(values))
    };
    let g = |i: QnnTensor, o: &[u32]| single(OpType::Gather, vec![f32t("a", &[5, 3]), i], f32t("o", o), vec![]);
    validate(&g(idx(DataType::Int32, &[0, 4]), &[2, 3])).unwrap();
    assert!(op_detail(err(&g(idx(DataType::Int32, &[0, 5]), &[2, 3]))).contains("outside 0..5"));
    let mut f = idx(DataType::Int32, &[0, 1]);
    f.dtype = DataType::Float32;
    assert!(op_detail(err(&g(f, &[2, 3]))).contains("INT_32 or UINT_32"));
}

#[test]
fn strided_slice_rules() {
    let g = |ranges: &[i32], new_axes: u32, o: &[u32]| {
        single(
            OpType::StridedSlice,
            vec![f32t("a", &[4, 6])],
            f32t("o", o),
            vec![
                ("ranges", i32_param("n.ranges", &[2, 3], ranges)),
                ("new_axes_mask", Param::Scalar(Scalar::UInt32(new_axes))),
            ],
        )
    };
    validate(&g(&[0, 4, 1, 1, 5, 2], 0, &[4, 2])).unwrap();
    assert!(op_detail(err(&g(&[0, 4, 1, 1, 5, 2], 0, &[4, 3]))).contains("expected [4, 2]"));
    assert!(param_of(err(&g(&[0, 4, 1, 1, 5, 2], 1, &[4, 2]))).1.contains("new_axes_mask"));
    assert!(param_of(err(&g(&[0, 4, 1, 1, 5, 0], 0, &[4, 2]))).1.contains("stride must be non-zero"));
}

#[test]
fn reduce_rules() {
    let g = |axes: &[u32], keep: bool, o: &[u32]| {
        single(
            OpType::ReduceMin,
            vec![f32t("a", &[2, 3, 4])],
            f32t("o", o),
            vec![
                ("axes", u32_param("n.axes", &[axes.len() as u32], axes)),
                ("keep_dims", Param::Scalar(Scalar::Bool8(keep))),
            ],
        )
    };
    validate(&g(&[2], true, &[2, 3, 1])).unwrap();
    validate(&g(&[2], false, &[2, 3])).unwrap();
    assert!(param_of(err(&g(&[3], true, &[2, 3, 1]))).1.contains("out of range"));
    assert!(op_detail(err(&g(&[2], true, &[2, 3]))).contains("expected [2, 3, 1]"));
}

#[test]
fn quantize_dequantize_dtypes() {
    let q = t("q", TensorType::Native, U16, &[2]);
    validate(&single(OpType::Quantize, vec![f32t("a", &[2])], q.clone(), vec![])).unwrap();
    validate(&single(OpType::Dequantize, vec![q.clone()], f32t("o", &[2]), vec![])).unwrap();
    assert!(op_detail(err(&single(OpType::Quantize, vec![q.clone()], f32t("o", &[2]), vec![])))
        .contains("float input and a fixed-point output"));
    assert!(op_detail(err(&single(OpType::Dequantize, vec![f32t("a", &[2])], q, vec![])))
        .contains("fixed-point input and a float output"));
}

// ---- graph I/O ----------------------------------------------------------------------------

#[test]
fn graph_inputs_are_app_write_and_listed() {
    let mut g = base();
    g.inputs.push("gamma".into());
    assert!(
        matches!(err(&g), ValidationError::GraphInput { tensor, detail } if tensor == "gamma" && detail.contains("APP_WRITE"))
    );
    let mut g = base();
    g.inputs.clear();
    assert!(matches!(err(&g), ValidationError::GraphInput { detail, .. } if detail.contains("missing")));
    let mut g = base();
    g.inputs.push("x".into());
    assert!(matches!(err(&g), ValidationError::GraphInput { detail, .. } if detail.contains("twice")));
    let mut g = base();
    g.inputs.push("ghost".into());
    assert!(matches!(err(&g), ValidationError::GraphInput { detail, .. } if detail.contains("not a tensor")));
}

#[test]
fn graph_outputs_are_app_read_never_app_write_or_static() {
    for bad in ["x", "gamma", "y"] {
        let mut g = base();
        g.outputs.push(bad.into());
        let e = err(&g);
        assert!(
            matches!(&e, ValidationError::GraphOutput { tensor, detail }
            if tensor == bad && detail.contains("must be APP_READ")),
            "{e}"
        );
    }
    let mut g = base();
    g.outputs.clear();
    assert!(matches!(err(&g), ValidationError::GraphOutput { detail, .. } if detail.contains("missing")));
    let mut g = base();
    g.outputs.push("out".into());
    assert!(matches!(err(&g), ValidationError::GraphOutput { detail, .. } if detail.contains("twice")));
}

#[test]
fn outputs_must_be_produced_and_natives_too() {
    let mut g = base();
    let mut orphan = t("orphan", TensorType::AppRead, U16, &[2]);
    orphan.encoding = act();
    g.tensors.push(orphan);
    g.outputs.push("orphan".into());
    assert!(matches!(err(&g), ValidationError::GraphOutput { detail, .. } if detail.contains("no node produces")));
    let mut g = base();
    g.tensors.push(t("dangling", TensorType::Native, U16, &[2]));
    assert!(matches!(err(&g), ValidationError::Tensor { tensor, .. } if tensor == "dangling"));
}

#[test]
fn errors_name_the_element_and_expectation() {
    let mut g = base();
    tensor_mut(&mut g, "gamma").data = Some(StaticData::from_u16(&[1]));
    assert_eq!(err(&g).to_string(), "tensor `gamma`: static data: 2 bytes, expected 8 = 4 elements x UFIXED_POINT_16");
    let mut g = base();
    g.nodes.swap(1, 2);
    assert_eq!(
        err(&g).to_string(),
        "node `softmax`: input `n` is used before any node produces it (nodes must be in dependency order)"
    );
}

//! Our `validate` against Qualcomm's HTP backend, node by node.
//!
//! Every node of the tiny Qwen3, Llama, Llama 3 and Qwen2 fixtures (graphs `model.0.s32` and
//! `model.0.s1`, lowered as `qwen3_aot` lowers them) is cut out into a one-node graph (its
//! non-static inputs become graph inputs, its outputs graph outputs) and judged by both: both
//! must accept it. Then deliberately broken variants of fixture nodes (wrong rank, wrong dtype,
//! missing param, unknown param) go to both, and both must refuse them.
//!
//! Encodings are not judged by `backendValidateOpConfig` (it accepts every bad encoding tried
//! here): the one-node graph is built for real (tensors, node, finalize). A NaN or negative scale
//! is refused by both; a zero scale, an offset outside the dtype's codes and LPBQ blocks that do
//! not tile the input are built by QAIRT 2.51 and refused by ours only (tests pin that leniency).
//! Fails, naming `scripts/fetch-qnn-sdk`, when Qualcomm's libraries are absent.

mod model_common;

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;

use backend_qnn::encoding::{BlockScales, BlockwiseExpansion};
use backend_qnn::sdk::ffi::{LibraryPaths, SdkApi};
use backend_qnn::sdk::{
    ApiError, BackendHandle, BoundParam, BoundParamValue, BoundTensor, ContextHandle, HtpOptions, LogLevel, OpConfig,
    QnnApi, TensorId,
};
use backend_qnn::{
    validate, DataType, Encoding, LowerOptions, OpType, Param, QnnGraph, QnnNode, QnnTensor, Scalar, ScaleOffset,
    TensorType,
};
use model_common::{fixture, AotModel};

/// Context length of the traced graphs, as `qwen3_aot` uses.
const CONTEXT: usize = 1024;

/// Qualcomm's HTP backend is a process-wide singleton: one judge at a time.
static BACKEND: Mutex<()> = Mutex::new(());

/// Graph `g` reduced to node `index`: the tensors it touches, its non-static inputs as
/// `APP_WRITE` graph inputs, its outputs as `APP_READ` graph outputs.
fn single_node(g: &QnnGraph, index: usize) -> QnnGraph {
    let node = g.nodes[index].clone();
    let mut tensors = Vec::new();
    let mut inputs = Vec::new();
    for name in node.inputs.iter().chain(&node.outputs) {
        if tensors.iter().any(|t: &QnnTensor| &t.name == name) {
            continue;
        }
        let mut t = g.tensor(name).unwrap_or_else(|| panic!("{}: no tensor `{name}`", g.name)).clone();
        if node.outputs.contains(name) {
            t.tensor_type = TensorType::AppRead;
        } else if t.tensor_type != TensorType::Static {
            t.tensor_type = TensorType::AppWrite;
            inputs.push(name.clone());
        }
        tensors.push(t);
    }
    QnnGraph {
        name: format!("{}.{}", g.name, node.name),
        tensors,
        outputs: node.outputs.clone(),
        inputs,
        nodes: vec![node],
        int4_storage: g.int4_storage,
    }
}

/// The only node of `g` as an op config, each tensor bound to the id `id_of` gives it.
fn bound_op<'g>(g: &'g QnnGraph, mut id_of: impl FnMut(&'g QnnTensor) -> TensorId) -> OpConfig<'g> {
    let node = &g.nodes[0];
    let mut bind = |name: &String| {
        let tensor = g.tensors.iter().find(|t| &t.name == name).unwrap();
        BoundTensor { id: id_of(tensor), tensor }
    };
    let inputs = node.inputs.iter().map(&mut bind).collect();
    let outputs = node.outputs.iter().map(&mut bind).collect();
    let params = node
        .params
        .iter()
        .map(|(name, p)| BoundParam {
            name,
            value: match p {
                Param::Scalar(s) => BoundParamValue::Scalar(*s),
                Param::Tensor(tensor) => BoundParamValue::Tensor(BoundTensor { id: id_of(tensor), tensor }),
            },
        })
        .collect();
    OpConfig { name: &node.name, package: &node.package, op_type: node.op_type.as_str(), params, inputs, outputs }
}

/// Qualcomm's verdict on the only node of `g`: `backendValidateOpConfig` on a fresh backend.
fn qualcomms_verdict(api: &mut SdkApi, g: &QnnGraph) -> Result<(), ApiError> {
    // Validation does not look tensors up in a graph: ids only have to be distinct.
    let mut next_id = 0;
    let op = bound_op(g, |_| {
        next_id += 1;
        TensorId(next_id)
    });
    // A log, so a refusal carries the backend's own lines.
    let log = api.log_create(LogLevel::Warn).expect("logCreate");
    let backend = api.backend_create(Some(log)).expect("backendCreate");
    let verdict = api.backend_validate_op_config(backend, &op);
    api.backend_free(backend).expect("backendFree");
    api.log_free(log).expect("logFree");
    verdict
}

/// Qualcomm's verdict on `g` built for real, as the driver builds graphs (SM8650 device and
/// graph configs): every tensor created, the node validated and added, the graph finalized.
/// Encodings are judged here, not by `backendValidateOpConfig`.
fn qualcomms_build_verdict(api: &mut SdkApi, g: &QnnGraph) -> Result<(), ApiError> {
    let target = HtpOptions::sm8650();
    let log = api.log_create(LogLevel::Warn).expect("logCreate");
    let backend = api.backend_create(Some(log)).expect("backendCreate");
    let device = api.device_create(Some(log), &target.device.device_configs()).expect("deviceCreate");
    let context = api.context_create(backend, device, &[]).expect("contextCreate");
    let verdict = build_one_node(api, backend, context, g, &target);
    api.context_free(context).expect("contextFree");
    api.device_free(device).expect("deviceFree");
    api.backend_free(backend).expect("backendFree");
    api.log_free(log).expect("logFree");
    verdict
}

fn build_one_node(
    api: &mut SdkApi,
    backend: BackendHandle,
    context: ContextHandle,
    g: &QnnGraph,
    target: &HtpOptions,
) -> Result<(), ApiError> {
    let graph = api.graph_create(context, &g.name, &target.graph.graph_configs())?;
    let mut ids = HashMap::new();
    for t in g.tensors_and_params() {
        ids.insert(t.name.clone(), api.tensor_create_graph_tensor(graph, t)?);
    }
    let op = bound_op(g, |t| ids[&t.name]);
    api.backend_validate_op_config(backend, &op)?;
    api.graph_add_node(graph, &op)?;
    api.graph_finalize(graph)
}

fn real_api() -> SdkApi {
    let paths = LibraryPaths::find().unwrap_or_else(|e| panic!("{e}"));
    SdkApi::load(&paths).expect("the real libQnnHtp.so loads")
}

/// What distinguishes one use of an op from another: type, param names, input and output dtypes.
fn combination(g: &QnnGraph, node: &QnnNode) -> String {
    let params: Vec<&str> = node.params.iter().map(|(n, _)| n.as_str()).collect();
    let dtypes = |names: &[String]| -> Vec<String> {
        names.iter().map(|n| g.tensor(n).map(|t| t.dtype.to_string()).unwrap_or_default()).collect()
    };
    format!("{} params {:?} in {:?} out {:?}", node.op_type, params, dtypes(&node.inputs), dtypes(&node.outputs))
}

fn lowered(model: &AotModel) -> Vec<QnnGraph> {
    let options = LowerOptions::qualcomm_htp();
    let graphs = model.lowered_at(&[32, 1], CONTEXT, options);
    assert_eq!(graphs.iter().map(|g| g.name.as_str()).collect::<Vec<_>>(), ["model.0.s32", "model.0.s1"]);
    graphs
}

fn both_accept_every_node(model: AotModel) {
    let graphs = lowered(&model);
    let _one_at_a_time = BACKEND.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let mut api = real_api();
    let mut combinations = BTreeSet::new();
    let mut disagreements = Vec::new();
    for g in &graphs {
        validate(g).unwrap_or_else(|e| panic!("{}: our validator refuses the whole graph: {e}", g.name));
        for (i, node) in g.nodes.iter().enumerate() {
            let one = single_node(g, i);
            let ours = validate(&one);
            let theirs = qualcomms_verdict(&mut api, &one);
            if ours.is_err() || theirs.is_err() {
                disagreements.push(format!("{}: {}: ours {ours:?}, Qualcomm's {theirs:?}", g.name, node.name));
            }
            combinations.insert(combination(g, node));
        }
    }
    eprintln!("{}: {} op/param combinations, all accepted by both:", model.dir.display(), combinations.len());
    for c in &combinations {
        eprintln!("  {c}");
    }
    assert!(disagreements.is_empty(), "{}", disagreements.join("\n"));
}

#[test]
fn qwen3_nodes_pass_both_validators() {
    both_accept_every_node(AotModel::open(fixture("pymllm-qwen3-dev-f32")));
}

#[test]
fn llama_nodes_pass_both_validators() {
    both_accept_every_node(AotModel::calibrated("llama-dev-f32"));
}

#[test]
fn llama3_nodes_pass_both_validators() {
    both_accept_every_node(AotModel::calibrated("llama3-dev-f32"));
}

#[test]
fn qwen2_nodes_pass_both_validators() {
    both_accept_every_node(AotModel::calibrated("qwen2-dev-f32"));
}

// ------------------------------------------------------------------ invalid configs ---------

/// The one-node graph of the first node of `op` in the Qwen3 fixture's decode graph.
fn qwen3_node(op: OpType) -> QnnGraph {
    let graphs = lowered(&AotModel::open(fixture("pymllm-qwen3-dev-f32")));
    let g = &graphs[1];
    let i = g.nodes.iter().position(|n| n.op_type == op).unwrap_or_else(|| panic!("{}: no {op} node", g.name));
    single_node(g, i)
}

fn tensor_mut<'g>(g: &'g mut QnnGraph, name: &str) -> &'g mut QnnTensor {
    g.tensors.iter_mut().find(|t| t.name == name).unwrap()
}

/// Both validators must refuse `broken`; `what` says how it was broken. Returns Qualcomm's
/// error (with the lines its backend logged).
fn both_refuse(what: &str, broken: QnnGraph) -> ApiError {
    both_refuse_with(what, broken, qualcomms_verdict)
}

/// How Qualcomm judges a graph: by `backendValidateOpConfig` alone, or by building it.
type Verdict = fn(&mut SdkApi, &QnnGraph) -> Result<(), ApiError>;

/// Our validator must refuse `broken`; returns Qualcomm's verdict on it by `verdict`.
fn ours_refuses(what: &str, broken: &QnnGraph, verdict: Verdict) -> Result<(), ApiError> {
    let ours = validate(broken);
    let theirs = {
        let _one_at_a_time = BACKEND.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        verdict(&mut real_api(), broken)
    };
    eprintln!("{what}: ours {ours:?}; Qualcomm's {theirs:?}");
    assert!(ours.is_err(), "{what}: our validator accepts it");
    theirs
}

/// [`both_refuse`] with Qualcomm judging `broken` by `verdict`.
fn both_refuse_with(what: &str, broken: QnnGraph, verdict: Verdict) -> ApiError {
    ours_refuses(what, &broken, verdict).expect_err(&format!("{what}: Qualcomm's backend accepts it"))
}

#[test]
fn sanity_the_unbroken_nodes_pass_both() {
    // Without this the refusals below could come from the cut-out itself.
    for op in
        [OpType::RmsNorm, OpType::MatMul, OpType::Transpose, OpType::ElementWiseAdd, OpType::Softmax, OpType::Conv2d]
    {
        let g = qwen3_node(op);
        validate(&g).unwrap_or_else(|e| panic!("{op}: {e}"));
        let _one_at_a_time = BACKEND.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        qualcomms_verdict(&mut real_api(), &g).unwrap_or_else(|e| panic!("{op}: {e}"));
        qualcomms_build_verdict(&mut real_api(), &g).unwrap_or_else(|e| panic!("{op} built: {e}"));
    }
}

#[test]
fn wrong_rank_is_refused_by_both() {
    // MatMul of a rank-4 activation with a rank-1 operand.
    let mut g = qwen3_node(OpType::MatMul);
    let b = g.nodes[0].inputs[1].clone();
    let t = tensor_mut(&mut g, &b);
    assert!(t.data.is_none(), "the MatMul's second operand is an activation");
    t.dims = vec![t.dims.iter().product()];
    both_refuse("MatMul with a rank-1 second operand", g);
}

/// An RmsNorm whose activation input is a plain INT_32 tensor (no encoding) while gamma and the
/// output are UFIXED_POINT_16: Qualcomm's backend refuses it (3110), and so does our validator
/// (normalizing needs a float or fixed-point input).
#[test]
fn wrong_dtype_rmsnorm_input_is_refused_by_both() {
    let mut g = qwen3_node(OpType::RmsNorm);
    let x = g.nodes[0].inputs[0].clone();
    let t = tensor_mut(&mut g, &x);
    t.dtype = DataType::Int32;
    t.encoding = Encoding::Undefined;
    both_refuse("RmsNorm with an INT_32 input", g);
}

#[test]
fn missing_mandatory_param_is_refused_by_both() {
    let mut g = qwen3_node(OpType::Transpose);
    g.nodes[0].params.retain(|(name, _)| name != "perm");
    both_refuse("Transpose without `perm`", g);
}

#[test]
fn unknown_param_is_refused_by_both() {
    let mut g = qwen3_node(OpType::Softmax);
    g.nodes[0].params.push(("not_a_param".into(), Param::Scalar(Scalar::UInt32(1))));
    both_refuse("Softmax with an unknown param", g);
}

/// Backend leniency, shared by ours: an activation output with a per-axis (per-channel)
/// scale/offset encoding. Both validators accept it at op-validation time.
#[test]
fn per_axis_encoded_activation_is_accepted_by_both() {
    let mut g = qwen3_node(OpType::ElementWiseAdd);
    let y = g.nodes[0].outputs[0].clone();
    let t = tensor_mut(&mut g, &y);
    let axis = (t.dims.len() - 1) as u32;
    let channels = *t.dims.last().unwrap() as usize;
    t.encoding = Encoding::AxisScaleOffset {
        axis,
        scale_offsets: vec![ScaleOffset { scale: 1e-3, offset: 0 }; channels].into(),
    };
    assert_eq!(validate(&g), Ok(()));
    let _one_at_a_time = BACKEND.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    qualcomms_verdict(&mut real_api(), &g).unwrap();
}

// ------------------------------------------------------------------ bad encodings ----------

/// The fixture's first ElementWiseAdd (UFIXED_POINT_16 in and out) with `encode` applied to its
/// output's scale/offset.
fn add_with_output(encode: impl FnOnce(&mut ScaleOffset)) -> QnnGraph {
    let mut g = qwen3_node(OpType::ElementWiseAdd);
    let y = g.nodes[0].outputs[0].clone();
    let t = tensor_mut(&mut g, &y);
    assert_eq!(t.dtype, DataType::UFixedPoint16);
    let Encoding::ScaleOffset(so) = &mut t.encoding else { panic!("`{y}` is not per-tensor quantized") };
    encode(so);
    g
}

/// Qualcomm's HTP backend judges encodings when the node is added (`backendValidateOpConfig`
/// accepts all of them): a NaN or negative output scale is refused with 6007 and the log line
/// "Output def has a bad scale (nan, inf, or too small)".
fn refused_for_a_bad_scale(what: &str, scale: f32) {
    let err = both_refuse_with(what, add_with_output(|so| so.scale = scale), qualcomms_build_verdict);
    assert_eq!((err.function(), err.qnn_code()), ("graphAddNode", Some(6007)), "{err}");
    assert!(err.backend_log().iter().any(|l| l.contains("Output def has a bad scale")), "{err}");
}

#[test]
fn negative_scale_is_refused_by_both() {
    refused_for_a_bad_scale("ElementWiseAdd output with scale -1e-3", -1e-3);
}

#[test]
fn nan_scale_is_refused_by_both() {
    refused_for_a_bad_scale("ElementWiseAdd output with a NaN scale", f32::NAN);
}

/// Where Qualcomm's backend is more lenient than our validator, `broken` is built for real
/// (tensors, node, finalize) and must succeed there while ours refuses it: these tests are the
/// evidence for the backend's rule, and fail when a QAIRT release starts refusing it.
fn only_ours_refuses(what: &str, broken: QnnGraph) {
    let theirs = ours_refuses(what, &broken, qualcomms_build_verdict);
    assert_eq!(theirs, Ok(()), "{what}: Qualcomm's backend now refuses it; make the two agree");
}

/// Backend leniency: a scale of exactly 0 passes tensor creation, node addition and finalize
/// (QAIRT 2.51), although it maps every code to 0. Ours refuses it (scale must be > 0).
#[test]
fn zero_scale_is_refused_by_ours_only() {
    only_ours_refuses("ElementWiseAdd output with scale 0", add_with_output(|so| so.scale = 0.0));
}

/// Backend leniency: offset = -zero_point outside the UFIXED_POINT_16 codes ([-65535, 0]) is
/// built without complaint (QAIRT 2.51). Ours refuses it: no code is the real zero.
#[test]
fn offset_outside_the_dtype_range_is_refused_by_ours_only() {
    only_ours_refuses("ElementWiseAdd output with offset -70000", add_with_output(|so| so.offset = -70_000));
}

/// The fixture's first LPBQ linear (Conv2d, HWIO weight) with its block count changed so that
/// blocks no longer tile the input channels (arrays kept consistent with the new count).
/// Backend leniency: numBlocksPerAxis not dividing In is built without complaint (QAIRT 2.51;
/// the block size is then not the one the codes were quantized with). Ours refuses it.
#[test]
fn lpbq_blocks_that_do_not_tile_the_input_are_refused_by_ours_only() {
    let mut g = qwen3_node(OpType::Conv2d);
    let w = g.nodes[0].inputs[1].clone();
    let t = tensor_mut(&mut g, &w);
    let Encoding::BlockwiseExpansion(bw) = &t.encoding else { panic!("`{w}` is not LPBQ-encoded") };
    let (channels, blocks) = (bw.scale_offsets.len(), bw.num_blocks_per_axis + 1);
    let broken = BlockwiseExpansion {
        num_blocks_per_axis: blocks,
        block_scales: BlockScales::U8(vec![1u8; channels * blocks as usize].into()),
        ..bw.clone()
    };
    t.encoding = Encoding::BlockwiseExpansion(broken);
    only_ours_refuses(&format!("LPBQ weight `{w}` with {blocks} blocks per channel"), g);
}

//! Static validation of a [`QnnGraph`]: everything that can be checked without the QNN SDK.
//!
//! The aim is that a graph which passes here fails `graphAddNode` / `graphFinalize` only for
//! backend-specific reasons (HTP op support), never for structural ones. Rules, in check order:
//!
//! 1. tensors: unique names (graph and param tensors share one namespace, QNN hashes all names,
//!    QnnCommon.h error 7006); no zero dims; `STATIC` exactly when data is present; static
//!    data size = numel x element size (4-bit per the graph's [`Int4Storage`],
//!    whose byte content is also checked); encodings: fixed-point types need one, other types
//!    must have none, `scale` finite and > 0, offsets within the dtype's range (offset =
//!    -zero_point), per-axis counts = `dims[axis]`, and the LPBQ invariants (see
//!    [`check_blockwise`]).
//! 2. nodes: unique names; package `qti.aisw`; input/output arity from the op table; every
//!    input defined before use (graph inputs and statics are defined up front, `NATIVE` /
//!    `APP_READ` tensors once a previous node produced them: QNN's UNCONNECTED_NODE rule);
//!    each output produced once and `NATIVE` / `APP_READ`; params known, not repeated, of the
//!    right kind / dtype / shape, mandatory ones present, tensor params `STATIC`.
//! 3. per-op dtype and shape rules (elementwise broadcast, matmul inner dims, conv channels,
//!    reshape element counts, permutations, concat dims, ...), see `check_op`.
//! 4. graph I/O: inputs are `APP_WRITE`, outputs `APP_READ` (so never `APP_WRITE` / `STATIC`),
//!    both lists complete and without repeats; every `NATIVE` tensor is produced.
//!
//! The first violation is returned as a [`ValidationError`] naming the graph element and what
//! was expected.

use std::collections::{HashMap, HashSet};

use crate::dtype::{DataType, TensorType};
use crate::encoding::{BlockScales, BlockwiseExpansion, Encoding, Int4Storage, ScaleOffset};
use crate::graph::{Param, QnnGraph, QnnNode, QnnTensor, QNN_OP_PACKAGE};
use crate::opdef::{Inputs, OpType, ParamKind, ParamShape};
use crate::params::{self, ParamReadError};
use crate::shape;

/// Why a graph is invalid.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ValidationError {
    #[error("graph name is invalid: {detail}")]
    GraphName { detail: String },
    #[error("tensor name `{tensor}` is defined more than once ({first} and {second})")]
    DuplicateTensor { tensor: String, first: String, second: String },
    #[error("node name `{node}` is used more than once")]
    DuplicateNode { node: String },
    #[error("tensor `{tensor}`: {detail}")]
    Tensor { tensor: String, detail: String },
    #[error("tensor `{tensor}`: static data: {detail}")]
    StaticData { tensor: String, detail: String },
    #[error("tensor `{tensor}`: quantization encoding: {detail}")]
    Encoding { tensor: String, detail: String },
    #[error("node `{node}` ({op}): package `{package}` is not `qti.aisw`")]
    Package { node: String, op: OpType, package: String },
    #[error("node `{node}` ({op}): expected {expected} inputs, found {found}")]
    InputArity { node: String, op: OpType, expected: String, found: usize },
    #[error("node `{node}` ({op}): expected {expected} outputs, found {found}")]
    OutputArity { node: String, op: OpType, expected: usize, found: usize },
    #[error("node `{node}`: input `{tensor}` is not a tensor of the graph")]
    UnknownTensor { node: String, tensor: String },
    #[error(
        "node `{node}`: input `{tensor}` is used before any node produces it \
         (nodes must be in dependency order)"
    )]
    UseBeforeDefinition { node: String, tensor: String },
    #[error("node `{node}`: output `{tensor}` is {found}; node outputs must be NATIVE or APP_READ")]
    OutputType { node: String, tensor: String, found: TensorType },
    #[error("tensor `{tensor}` is produced by both `{first}` and `{second}`")]
    MultipleProducers { tensor: String, first: String, second: String },
    #[error("node `{node}` ({op}): mandatory param `{param}` is missing")]
    MissingParam { node: String, op: OpType, param: String },
    #[error("node `{node}` ({op}): `{param}` is not a param of {op}")]
    UnknownParam { node: String, op: OpType, param: String },
    #[error("node `{node}` ({op}): param `{param}`: {detail}")]
    Param { node: String, op: OpType, param: String, detail: String },
    #[error("node `{node}` ({op}): {detail}")]
    Op { node: String, op: OpType, detail: String },
    #[error("graph input `{tensor}`: {detail}")]
    GraphInput { tensor: String, detail: String },
    #[error("graph output `{tensor}`: {detail}")]
    GraphOutput { tensor: String, detail: String },
}

type Result<T> = std::result::Result<T, ValidationError>;

/// Check every rule listed in the module docs; the first violation is returned.
pub fn validate(graph: &QnnGraph) -> Result<()> {
    if graph.name.is_empty() {
        return Err(ValidationError::GraphName { detail: "must not be empty".into() });
    }
    let tensors = check_tensors(graph)?;
    let producers = check_nodes(graph, &tensors)?;
    check_graph_io(graph, &tensors, &producers)
}

/// Graph tensors by name (after uniqueness has been checked).
type TensorMap<'g> = HashMap<&'g str, &'g QnnTensor>;

fn check_tensors(graph: &QnnGraph) -> Result<TensorMap<'_>> {
    // name -> description of its first owner, for the duplicate message.
    let mut owners: HashMap<&str, String> = HashMap::new();
    let claim = |name: &'_ str, owner: String, owners: &HashMap<&str, String>| match owners.get(name) {
        Some(first) => {
            Err(ValidationError::DuplicateTensor { tensor: name.to_string(), first: first.clone(), second: owner })
        }
        None => Ok(()),
    };
    let mut map = HashMap::with_capacity(graph.tensors.len());
    for t in &graph.tensors {
        claim(&t.name, "a graph tensor".into(), &owners)?;
        owners.insert(&t.name, "a graph tensor".into());
        check_tensor(t, graph.int4_storage)?;
        map.insert(t.name.as_str(), t);
    }
    for node in &graph.nodes {
        for (pname, p) in &node.params {
            if let Param::Tensor(t) = p {
                let owner = format!("param `{pname}` of node `{}`", node.name);
                claim(&t.name, owner.clone(), &owners)?;
                owners.insert(&t.name, owner);
                check_tensor(t, graph.int4_storage)?;
            }
        }
    }
    Ok(map)
}

fn tensor_err(t: &QnnTensor, detail: impl Into<String>) -> ValidationError {
    ValidationError::Tensor { tensor: t.name.clone(), detail: detail.into() }
}

fn check_tensor(t: &QnnTensor, int4: Int4Storage) -> Result<()> {
    if t.name.is_empty() {
        return Err(tensor_err(t, "name must not be empty"));
    }
    if t.dims.contains(&0) {
        return Err(tensor_err(t, format!("dims {:?} contain 0; QNN tensors have static, non-zero dims", t.dims)));
    }
    if matches!(t.dtype, DataType::Undefined | DataType::String) {
        return Err(tensor_err(t, format!("data type {} cannot hold tensor data", t.dtype)));
    }
    if t.tensor_type == TensorType::Null {
        return Err(tensor_err(
            t,
            "NULL tensors are not used: optional inputs of the modelled ops are trailing and are omitted",
        ));
    }
    match (t.tensor_type, &t.data) {
        (TensorType::Static, None) => {
            return Err(ValidationError::StaticData {
                tensor: t.name.clone(),
                detail: "STATIC tensor has no data".into(),
            })
        }
        (ty, Some(_)) if ty != TensorType::Static => {
            return Err(ValidationError::StaticData {
                tensor: t.name.clone(),
                detail: format!("{ty} tensor must not carry data (only STATIC tensors do)"),
            })
        }
        _ => {}
    }
    check_encoding(t)?;
    if let Some(data) = &t.data {
        check_static_data(t, data.bytes(), int4)?;
    }
    Ok(())
}

fn check_static_data(t: &QnnTensor, bytes: &[u8], int4: Int4Storage) -> Result<()> {
    let err = |detail: String| ValidationError::StaticData { tensor: t.name.clone(), detail };
    let numel = t.numel();
    let expected = t.dtype.storage_bytes(numel, int4).ok_or_else(|| err(format!("{} has no storage size", t.dtype)))?;
    if bytes.len() as u64 != expected {
        let rule = match t.dtype {
            DataType::SFixedPoint4 | DataType::UFixedPoint4 => format!(" ({int4:?} 4-bit storage)"),
            _ => String::new(),
        };
        return Err(err(format!("{} bytes, expected {expected} = {numel} elements x {}{rule}", bytes.len(), t.dtype)));
    }
    match (t.dtype, int4) {
        (DataType::SFixedPoint4 | DataType::UFixedPoint4, Int4Storage::LowNibble) => {
            if let Some(i) = bytes.iter().position(|b| b & 0xF0 != 0) {
                return Err(err(format!(
                    "byte {i} is {:#04x}; LowNibble 4-bit storage keeps values in the low nibble (q & 0x0F)",
                    bytes[i]
                )));
            }
        }
        (DataType::SFixedPoint4, Int4Storage::Int8Container) => {
            if let Some(i) = bytes.iter().position(|&b| !(-8..=7).contains(&(b as i8))) {
                return Err(err(format!(
                    "byte {i} is {} as int8; Int8Container storage of SFIXED_POINT_4 holds -8..=7",
                    bytes[i] as i8
                )));
            }
        }
        (DataType::UFixedPoint4, Int4Storage::Int8Container) => {
            if let Some(i) = bytes.iter().position(|&b| b > 15) {
                return Err(err(format!(
                    "byte {i} is {}; Int8Container storage of UFIXED_POINT_4 holds 0..=15",
                    bytes[i]
                )));
            }
        }
        (DataType::Bool8, _) => {
            if let Some(i) = bytes.iter().position(|&b| b > 1) {
                return Err(err(format!("BOOL_8 element {i} is {}, expected 0 or 1", bytes[i])));
            }
        }
        _ => {}
    }
    Ok(())
}

fn check_scale_offset(t: &QnnTensor, so: &ScaleOffset, what: &str) -> Result<()> {
    let err = |detail: String| ValidationError::Encoding { tensor: t.name.clone(), detail };
    if !(so.scale.is_finite() && so.scale > 0.0) {
        return Err(err(format!("{what}scale must be finite and > 0, found {}", so.scale)));
    }
    // offset = -zero_point and the zero point must be a representable code.
    if let Some((lo, hi)) = t.dtype.integer_range() {
        let offset = i64::from(so.offset);
        if offset < -hi || offset > -lo {
            return Err(err(format!(
                "{what}offset {} is outside [{}, {}] for {} (offset = -zero_point)",
                so.offset, -hi, -lo, t.dtype
            )));
        }
    }
    Ok(())
}

fn check_encoding(t: &QnnTensor) -> Result<()> {
    let err = |detail: String| ValidationError::Encoding { tensor: t.name.clone(), detail };
    match (&t.encoding, t.dtype.is_fixed_point()) {
        (Encoding::Undefined, true) => {
            return Err(err(format!("{} is a fixed-point type and needs a quantization encoding", t.dtype)))
        }
        (Encoding::Undefined, false) => return Ok(()),
        (enc, false) => {
            return Err(err(format!(
                "{} is not a fixed-point type; expected UNDEFINED, found {}",
                t.dtype,
                enc.c_name()
            )))
        }
        _ => {}
    }
    match &t.encoding {
        Encoding::Undefined => Ok(()),
        Encoding::ScaleOffset(so) => check_scale_offset(t, so, ""),
        Encoding::AxisScaleOffset { axis, scale_offsets } => {
            let axis = *axis as usize;
            if axis >= t.rank() {
                return Err(err(format!("axis {axis} is out of range for rank {}", t.rank())));
            }
            if scale_offsets.len() != t.dims[axis] as usize {
                return Err(err(format!(
                    "{} scale/offset pairs, expected dims[{axis}] = {}",
                    scale_offsets.len(),
                    t.dims[axis]
                )));
            }
            for (c, so) in scale_offsets.iter().enumerate() {
                check_scale_offset(t, so, &format!("channel {c}: "))?;
            }
            Ok(())
        }
        Encoding::BlockwiseExpansion(bw) => check_blockwise(t, bw),
    }
}

/// LPBQ invariants (`QnnTypes.h`; ExecuTorch backends/qualcomm/builders/node_visitor.py; mllm's QNNTensorWrapper::setBlockwiseQuantization):
/// signed 4- or 8-bit STATIC weight; `axis` is the output channel of an HWIO `[1, 1, In, Out]`
/// filter (axis 3) or an `[Out, In]` weight (axis 0); one per-channel scale per output channel,
/// each with offset 0; `numBlocksPerAxis * block == In`; `[Out][numBlocks]` block scales whose
/// values lie in `1..=2^bitwidth` (executorch and mllm clamp to 16 for bitwidth 4, so 16 is
/// accepted although it needs 5 bits); 8-bit storage for bitwidth <= 8.
pub fn check_blockwise(t: &QnnTensor, bw: &BlockwiseExpansion) -> Result<()> {
    let err = |detail: String| ValidationError::Encoding {
        tensor: t.name.clone(),
        detail: format!("BLOCKWISE_EXPANSION: {detail}"),
    };
    if !matches!(t.dtype, DataType::SFixedPoint4 | DataType::SFixedPoint8) {
        return Err(err(format!("weights must be SFIXED_POINT_4 or SFIXED_POINT_8, found {}", t.dtype)));
    }
    if t.tensor_type != TensorType::Static {
        return Err(err(format!("only STATIC weights are blockwise-quantized, found {}", t.tensor_type)));
    }
    let rank = t.rank();
    let Some(block_axis) = bw.block_axis(rank) else {
        return Err(err(format!(
            "axis {} on dims {:?}: expected the output channel of HWIO [1, 1, In, Out] (axis 3) or [Out, In] (axis 0)",
            bw.axis, t.dims
        )));
    };
    let axis = bw.axis as usize;
    if let Some((i, d)) = t.dims.iter().enumerate().find(|&(i, &d)| i != axis && i != block_axis && d != 1) {
        return Err(err(format!("dims {:?}: dim {i} = {d} must be 1 (only 1x1 kernels are modelled)", t.dims)));
    }
    let channels = t.dims[axis] as usize;
    let inputs = t.dims[block_axis];
    if bw.scale_offsets.len() != channels {
        return Err(err(format!("{} per-channel scales, expected dims[{axis}] = {channels}", bw.scale_offsets.len())));
    }
    for (c, so) in bw.scale_offsets.iter().enumerate() {
        if !(so.scale.is_finite() && so.scale > 0.0) {
            return Err(err(format!("channel {c}: scale must be finite and > 0, found {}", so.scale)));
        }
        if so.offset != 0 {
            return Err(err(format!("channel {c}: offset must be 0 (symmetric), found {}", so.offset)));
        }
    }
    let nb = bw.num_blocks_per_axis;
    if nb == 0 || !inputs.is_multiple_of(nb) {
        return Err(err(format!(
            "numBlocksPerAxis {nb} does not divide In = dims[{block_axis}] = {inputs} (numBlocks x block must equal In)"
        )));
    }
    let max_bits = match bw.block_scales {
        BlockScales::U8(_) => 8,
        BlockScales::U16(_) => 16,
    };
    if bw.block_scale_bitwidth == 0 || bw.block_scale_bitwidth > max_bits {
        return Err(err(format!(
            "blockScaleBitwidth {} does not fit {max_bits}-bit block-scale storage",
            bw.block_scale_bitwidth
        )));
    }
    let expected = channels * nb as usize;
    if bw.block_scales.len() != expected {
        return Err(err(format!(
            "{} block scales, expected Out x numBlocks = {channels} x {nb} = {expected}",
            bw.block_scales.len()
        )));
    }
    let max = 1u32 << bw.block_scale_bitwidth;
    if let Some(i) = (0..expected).find(|&i| !(1..=max).contains(&bw.block_scales.get(i))) {
        return Err(err(format!(
            "block scale [{}][{}] = {} is outside 1..={max}",
            i / nb as usize,
            i % nb as usize,
            bw.block_scales.get(i)
        )));
    }
    Ok(())
}

/// Walk nodes in order; returns tensor name -> producing node name.
fn check_nodes<'g>(graph: &'g QnnGraph, tensors: &TensorMap<'g>) -> Result<HashMap<&'g str, &'g str>> {
    let mut node_names = HashSet::with_capacity(graph.nodes.len());
    let mut producers: HashMap<&str, &str> = HashMap::new();
    for node in &graph.nodes {
        if !node_names.insert(node.name.as_str()) {
            return Err(ValidationError::DuplicateNode { node: node.name.clone() });
        }
        let op = node.op_type;
        if node.package != QNN_OP_PACKAGE {
            return Err(ValidationError::Package { node: node.name.clone(), op, package: node.package.clone() });
        }
        let def = op.def();
        let (min, max) = def.input_arity();
        let n = node.inputs.len();
        if n < min || max.is_some_and(|m| n > m) {
            let expected = match (max, def.inputs) {
                (Some(m), _) if m == min => format!("{min}"),
                (Some(m), _) => format!("{min} to {m}"),
                (None, Inputs::Variadic { .. }) | (None, _) => format!("at least {min}"),
            };
            return Err(ValidationError::InputArity { node: node.name.clone(), op, expected, found: n });
        }
        if node.outputs.len() != def.num_outputs {
            return Err(ValidationError::OutputArity {
                node: node.name.clone(),
                op,
                expected: def.num_outputs,
                found: node.outputs.len(),
            });
        }
        let mut inputs = Vec::with_capacity(n);
        for name in &node.inputs {
            let t = *tensors
                .get(name.as_str())
                .ok_or_else(|| ValidationError::UnknownTensor { node: node.name.clone(), tensor: name.clone() })?;
            let defined_up_front =
                matches!(t.tensor_type, TensorType::AppWrite | TensorType::AppReadWrite | TensorType::Static);
            if !defined_up_front && !producers.contains_key(name.as_str()) {
                return Err(ValidationError::UseBeforeDefinition { node: node.name.clone(), tensor: name.clone() });
            }
            inputs.push(t);
        }
        let mut outputs = Vec::with_capacity(node.outputs.len());
        for name in &node.outputs {
            let t = *tensors
                .get(name.as_str())
                .ok_or_else(|| ValidationError::UnknownTensor { node: node.name.clone(), tensor: name.clone() })?;
            if !matches!(t.tensor_type, TensorType::Native | TensorType::AppRead) {
                return Err(ValidationError::OutputType {
                    node: node.name.clone(),
                    tensor: name.clone(),
                    found: t.tensor_type,
                });
            }
            if let Some(first) = producers.insert(name.as_str(), node.name.as_str()) {
                return Err(ValidationError::MultipleProducers {
                    tensor: name.clone(),
                    first: first.to_string(),
                    second: node.name.clone(),
                });
            }
            outputs.push(t);
        }
        check_params(node, inputs.first().map_or(0, |t| t.rank()))?;
        check_op(node, &inputs, outputs[0])?;
    }
    Ok(producers)
}

fn param_err(node: &QnnNode, param: &str, detail: impl Into<String>) -> ValidationError {
    ValidationError::Param {
        node: node.name.clone(),
        op: node.op_type,
        param: param.to_string(),
        detail: detail.into(),
    }
}

fn check_params(node: &QnnNode, input_rank: usize) -> Result<()> {
    let def = node.op_type.def();
    for (i, (name, param)) in node.params.iter().enumerate() {
        if node.params[..i].iter().any(|(n, _)| n == name) {
            return Err(param_err(node, name, "is given more than once"));
        }
        let spec = def.param(name).ok_or_else(|| ValidationError::UnknownParam {
            node: node.name.clone(),
            op: node.op_type,
            param: name.clone(),
        })?;
        let expected_names =
            |dtypes: &[DataType]| dtypes.iter().map(|d| d.short_name()).collect::<Vec<_>>().join(" or ");
        match (spec.kind, param) {
            (ParamKind::Scalar(dtypes), Param::Scalar(s)) => {
                if !dtypes.contains(&s.dtype()) {
                    return Err(param_err(
                        node,
                        name,
                        format!("expected a {} scalar, found {}", expected_names(dtypes), s.dtype()),
                    ));
                }
                if let Some(v) = s.as_f64() {
                    if !v.is_finite() {
                        return Err(param_err(node, name, format!("must be finite, found {v}")));
                    }
                }
            }
            (ParamKind::Tensor { dtypes, shape }, Param::Tensor(t)) => {
                if t.tensor_type != TensorType::Static {
                    return Err(param_err(
                        node,
                        name,
                        format!("tensor params must be STATIC, found {}", t.tensor_type),
                    ));
                }
                if !dtypes.contains(&t.dtype) {
                    return Err(param_err(
                        node,
                        name,
                        format!("expected a {} tensor, found {}", expected_names(dtypes), t.dtype),
                    ));
                }
                let ok = match shape {
                    ParamShape::Fixed(dims) => t.dims == dims,
                    ParamShape::InputRank => t.dims == [input_rank as u32],
                    ParamShape::InputRankBy3 => t.dims == [input_rank as u32, 3],
                    ParamShape::Vector => t.rank() == 1,
                };
                if !ok {
                    let want = match shape {
                        ParamShape::Fixed(dims) => format!("{dims:?}"),
                        ParamShape::InputRank => format!("[{input_rank}] (input rank)"),
                        ParamShape::InputRankBy3 => format!("[{input_rank}, 3] (input rank x 3)"),
                        ParamShape::Vector => "rank 1".into(),
                    };
                    return Err(param_err(node, name, format!("dims {:?}, expected {want}", t.dims)));
                }
            }
            (ParamKind::Scalar(_), Param::Tensor(_)) => {
                return Err(param_err(node, name, "expected a scalar param, found a tensor"))
            }
            (ParamKind::Tensor { .. }, Param::Scalar(_)) => {
                return Err(param_err(node, name, "expected a tensor param, found a scalar"))
            }
        }
    }
    if let Some(missing) = def.params.iter().find(|spec| spec.required() && node.param(spec.name).is_none()) {
        return Err(ValidationError::MissingParam {
            node: node.name.clone(),
            op: node.op_type,
            param: missing.name.to_string(),
        });
    }
    Ok(())
}

/// Per-op dtype and shape rules. `inputs` are in positional order; one output.
fn check_op(node: &QnnNode, inputs: &[&QnnTensor], out: &QnnTensor) -> Result<()> {
    let op = node.op_type;
    let fail = |detail: String| ValidationError::Op { node: node.name.clone(), op, detail };
    let read = |e: ParamReadError| param_err(node, &e.param, e.detail);
    let expect_dims = |dims: Vec<u32>| -> Result<()> {
        if out.dims == dims {
            Ok(())
        } else {
            Err(fail(format!("output `{}` has dims {:?}, expected {dims:?}", out.name, out.dims)))
        }
    };
    let same_dtype = |t: &QnnTensor| -> Result<()> {
        if t.dtype == out.dtype {
            Ok(())
        } else {
            Err(fail(format!(
                "output `{}` is {} but input `{}` is {}; {op} does not change the data type",
                out.name, out.dtype, t.name, t.dtype
            )))
        }
    };
    let in0 = inputs[0];
    match op {
        OpType::Conv2d => {
            let (filter, bias) = (inputs[1], inputs.get(2));
            let stride = params::pair(node, "stride").map_err(read)?;
            let dilation = params::pair(node, "dilation").map_err(read)?;
            let pad = params::pad_amount(node).map_err(read)?;
            let group = params::int(node, "group", 0).map_err(read)? as u32;
            let dims = shape::conv2d_output(&in0.dims, &filter.dims, stride, pad, dilation, group)
                .map_err(|e| fail(e.to_string()))?;
            if let Some(b) = bias {
                if b.dims != [dims[3]] {
                    return Err(fail(format!(
                        "bias `{}` has dims {:?}, expected [{}] (Cout)",
                        b.name, b.dims, dims[3]
                    )));
                }
            }
            expect_dims(dims)
        }
        OpType::FullyConnected => {
            let (w, bias) = (inputs[1], inputs.get(2));
            if w.rank() != 2 {
                return Err(fail(format!("weights `{}` must be [Out, In], found {:?}", w.name, w.dims)));
            }
            let (outc, inc) = (w.dims[0], w.dims[1]);
            if in0.dims.last() != Some(&inc) {
                return Err(fail(format!(
                    "input `{}` dims {:?} end in {:?}, weights expect In = {inc}",
                    in0.name,
                    in0.dims,
                    in0.dims.last()
                )));
            }
            if let Some(b) = bias {
                if b.dims != [outc] {
                    return Err(fail(format!("bias `{}` has dims {:?}, expected [{outc}] (Out)", b.name, b.dims)));
                }
            }
            let dims = if params::flag(node, "keep_dims").map_err(read)? {
                let mut d = in0.dims.clone();
                *d.last_mut().unwrap_or(&mut 0) = outc;
                d
            } else {
                vec![(in0.numel() / u64::from(inc)) as u32, outc]
            };
            expect_dims(dims)
        }
        OpType::MatMul => {
            let ta = params::flag(node, "transpose_in0").map_err(read)?;
            let tb = params::flag(node, "transpose_in1").map_err(read)?;
            expect_dims(shape::matmul_output(&in0.dims, &inputs[1].dims, ta, tb).map_err(|e| fail(e.to_string()))?)
        }
        OpType::ElementWiseAdd | OpType::ElementWiseMultiply | OpType::ElementWiseSubtract => {
            expect_dims(shape::broadcast(&[&in0.dims, &inputs[1].dims]).map_err(|e| fail(e.to_string()))?)
        }
        OpType::ElementWiseEqual => {
            if out.dtype != DataType::Bool8 {
                return Err(fail(format!("output `{}` must be BOOL_8, found {}", out.name, out.dtype)));
            }
            expect_dims(shape::broadcast(&[&in0.dims, &inputs[1].dims]).map_err(|e| fail(e.to_string()))?)
        }
        OpType::ElementWiseSelect => {
            if in0.dtype != DataType::Bool8 {
                return Err(fail(format!("condition `{}` must be BOOL_8, found {}", in0.name, in0.dtype)));
            }
            expect_dims(
                shape::broadcast(&[&in0.dims, &inputs[1].dims, &inputs[2].dims]).map_err(|e| fail(e.to_string()))?,
            )
        }
        OpType::ElementWiseNeg | OpType::Sigmoid => expect_dims(in0.dims.clone()),
        OpType::Softmax => {
            let axis = params::int(node, "axis", in0.rank()).map_err(read)?;
            if axis < 0 || axis as usize >= in0.rank() {
                return Err(param_err(node, "axis", format!("{axis} is out of range for rank {}", in0.rank())));
            }
            expect_dims(in0.dims.clone())
        }
        OpType::RmsNorm => {
            // Qualcomm's HTP backend refuses plain integer inputs (3110 for INT_32): normalizing
            // needs a float or fixed-point value.
            if !(in0.dtype.is_float() || in0.dtype.is_fixed_point()) {
                return Err(fail(format!("input `{}` must be float or fixed-point, found {}", in0.name, in0.dtype)));
            }
            let eps = params::float(node, "epsilon").map_err(read)?;
            if eps < 0.0 {
                return Err(param_err(node, "epsilon", format!("must be >= 0, found {eps}")));
            }
            let axes = params::u32s(node, "axes").map_err(read)?;
            shape::check_axes(in0.rank(), &axes).map_err(|e| param_err(node, "axes", e.to_string()))?;
            let norm_dims: Vec<u32> = axes.iter().map(|&a| in0.dims[a as usize]).collect();
            for (role, t) in ["gamma", "beta"].iter().zip(inputs[1..].iter()) {
                if t.dims != norm_dims {
                    return Err(fail(format!(
                        "{role} `{}` has dims {:?}, expected {norm_dims:?} (input dims at axes {axes:?})",
                        t.name, t.dims
                    )));
                }
            }
            expect_dims(in0.dims.clone())
        }
        OpType::Transpose => {
            same_dtype(in0)?;
            let perm = params::u32s(node, "perm").map_err(read)?;
            expect_dims(shape::transpose_output(&in0.dims, &perm).map_err(|e| param_err(node, "perm", e.to_string()))?)
        }
        OpType::Reshape => {
            same_dtype(in0)?;
            if in0.numel() != out.numel() {
                return Err(fail(format!(
                    "input `{}` {:?} has {} elements but output `{}` {:?} has {}",
                    in0.name,
                    in0.dims,
                    in0.numel(),
                    out.name,
                    out.dims,
                    out.numel()
                )));
            }
            Ok(())
        }
        OpType::Concat => {
            for t in inputs {
                same_dtype(t)?;
            }
            let axis = params::int(node, "axis", in0.rank()).map_err(read)?;
            let dims: Vec<&[u32]> = inputs.iter().map(|t| t.dims.as_slice()).collect();
            expect_dims(shape::concat_output(&dims, axis as u32).map_err(|e| fail(e.to_string()))?)
        }
        OpType::Gather => {
            same_dtype(in0)?;
            let idx = inputs[1];
            if !matches!(idx.dtype, DataType::Int32 | DataType::UInt32) {
                return Err(fail(format!("indices `{}` must be INT_32 or UINT_32, found {}", idx.name, idx.dtype)));
            }
            let axis = params::int(node, "axis", in0.rank()).map_err(read)? as i32;
            let (axis, dims) =
                shape::gather_output(&in0.dims, &idx.dims, axis).map_err(|e| param_err(node, "axis", e.to_string()))?;
            if let Some(data) = &idx.data {
                let bound = i64::from(in0.dims[axis]);
                for (i, c) in data.bytes().chunks_exact(4).enumerate() {
                    let v = match idx.dtype {
                        DataType::Int32 => i64::from(i32::from_le_bytes([c[0], c[1], c[2], c[3]])),
                        _ => i64::from(u32::from_le_bytes([c[0], c[1], c[2], c[3]])),
                    };
                    if !(0..bound).contains(&v) {
                        return Err(fail(format!("static index {i} of `{}` is {v}, outside 0..{bound}", idx.name)));
                    }
                }
            }
            expect_dims(dims)
        }
        OpType::StridedSlice => {
            same_dtype(in0)?;
            let ranges = params::i32s(node, "ranges").map_err(read)?;
            let mask = |n: &str| params::int(node, n, 0).map(|v| v as u32).map_err(read);
            let (_, dims) = shape::strided_slice(
                &in0.dims,
                &ranges,
                mask("begin_mask")?,
                mask("end_mask")?,
                mask("shrink_axes")?,
                mask("new_axes_mask")?,
            )
            .map_err(|e| param_err(node, "ranges", e.to_string()))?;
            expect_dims(dims)
        }
        OpType::ReduceMin | OpType::ReduceMax | OpType::ReduceMean => {
            let axes = params::u32s(node, "axes").map_err(read)?;
            let keep = params::flag(node, "keep_dims").map_err(read)?;
            expect_dims(
                shape::reduce_output(&in0.dims, &axes, keep).map_err(|e| param_err(node, "axes", e.to_string()))?,
            )
        }
        OpType::Convert | OpType::Cast => expect_dims(in0.dims.clone()),
        OpType::Quantize => {
            if !in0.dtype.is_float() || !out.dtype.is_fixed_point() {
                return Err(fail(format!(
                    "expects a float input and a fixed-point output, found {} -> {}",
                    in0.dtype, out.dtype
                )));
            }
            expect_dims(in0.dims.clone())
        }
        OpType::Dequantize => {
            if !in0.dtype.is_fixed_point() || !out.dtype.is_float() {
                return Err(fail(format!(
                    "expects a fixed-point input and a float output, found {} -> {}",
                    in0.dtype, out.dtype
                )));
            }
            expect_dims(in0.dims.clone())
        }
    }
}

fn check_graph_io<'g>(
    graph: &'g QnnGraph,
    tensors: &TensorMap<'g>,
    producers: &HashMap<&'g str, &'g str>,
) -> Result<()> {
    let mut seen = HashSet::new();
    for name in &graph.inputs {
        let err = |detail: String| ValidationError::GraphInput { tensor: name.clone(), detail };
        let t = tensors.get(name.as_str()).ok_or_else(|| err("is not a tensor of the graph".into()))?;
        if t.tensor_type != TensorType::AppWrite {
            return Err(err(format!("graph inputs must be APP_WRITE, found {}", t.tensor_type)));
        }
        if !seen.insert(name.as_str()) {
            return Err(err("is listed twice".into()));
        }
    }
    let mut seen_out = HashSet::new();
    for name in &graph.outputs {
        let err = |detail: String| ValidationError::GraphOutput { tensor: name.clone(), detail };
        let t = tensors.get(name.as_str()).ok_or_else(|| err("is not a tensor of the graph".into()))?;
        if t.tensor_type != TensorType::AppRead {
            return Err(err(format!(
                "graph outputs must be APP_READ (never APP_WRITE or STATIC), found {}",
                t.tensor_type
            )));
        }
        if !seen_out.insert(name.as_str()) {
            return Err(err("is listed twice".into()));
        }
        if !producers.contains_key(name.as_str()) {
            return Err(err("no node produces it".into()));
        }
    }
    for t in &graph.tensors {
        match t.tensor_type {
            TensorType::AppWrite if !seen.contains(t.name.as_str()) => {
                return Err(ValidationError::GraphInput {
                    tensor: t.name.clone(),
                    detail: "is APP_WRITE but missing from the graph's input list".into(),
                })
            }
            TensorType::AppRead if !seen_out.contains(t.name.as_str()) => {
                return Err(ValidationError::GraphOutput {
                    tensor: t.name.clone(),
                    detail: "is APP_READ but missing from the graph's output list".into(),
                })
            }
            TensorType::AppReadWrite => {
                return Err(tensor_err(
                    t,
                    "APP_READWRITE tensors are not modelled (use an APP_WRITE input and an APP_READ output)",
                ))
            }
            TensorType::Native if !producers.contains_key(t.name.as_str()) => {
                return Err(tensor_err(t, "is NATIVE but no node produces it"))
            }
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
#[path = "validate_tests.rs"]
mod tests;

//! One visitor per IR op: the QNN node (type, inputs, params) each op becomes. The table is in
//! the module docs of [`super`].

use mllm_dsl::ir::{Attr, LinalgOp, Program, ValueId};
use mllm_dsl::op::{OpKind, ReduceKind};

use crate::dtype::DataType;
use crate::encoding::{Encoding, ScaleOffset};
use crate::graph::{QnnTensor, Scalar, StaticData};
use crate::opdef::OpType;

use super::encode::{self, EncodeError};
use super::{qnn_safe, GraphLowering, LowerError, SelectBroadcast};

/// The static tensor of a scalar constant: PTQ's quantized code (`ValueDef::quantized`) in the
/// value's encoding, or the float itself for unquantized constants.
pub(super) fn constant_tensor(p: &Program, v: ValueId, name: &str) -> Result<QnnTensor, EncodeError> {
    let def = p.value(v);
    let value = def.constant.ok_or(EncodeError::NotConstant)?;
    let dims = encode::dims(&def.ty.shape)?;
    let numel: usize = def.ty.shape.iter().product();
    let (dtype, encoding) = encode::value_type(p, v)?;
    let data = match (dtype, def.quantized) {
        (DataType::UFixedPoint16, Some(q)) => {
            let q = u16::try_from(q).map_err(|_| EncodeError::CodeRange { code: q, storage: "uint16" })?;
            StaticData::from_u16(&vec![q; numel])
        }
        (DataType::UFixedPoint8, Some(q)) => {
            let q = u8::try_from(q).map_err(|_| EncodeError::CodeRange { code: q, storage: "uint8" })?;
            StaticData::new(vec![q; numel])
        }
        (DataType::Float32, None) => StaticData::from_f32(&vec![value; numel]),
        (qnn, code) => return Err(EncodeError::ConstantType { value, qnn, code }),
    };
    Ok(QnnTensor::new_static(name, dtype, &dims, encoding, data))
}

impl GraphLowering<'_, '_, '_> {
    pub(super) fn lower_op(&mut self, op: &LinalgOp) -> Result<(), LowerError> {
        let kind = op.kind.type_name();
        let Some(name) = op.name.clone() else {
            let outs = op.outputs.iter().map(|&v| self.describe(v)).collect::<Vec<_>>().join(", ");
            return Err(self.graph_err(format!("a {kind} op producing {outs} has no name (run OpNaming)")));
        };
        let graph = self.graph;
        let op_err = |detail: String| LowerError::Op { graph: graph.to_string(), op: name.clone(), kind, detail };
        if op.attrs.get("using_qnn") != Some(&Attr::Bool(true)) {
            return Err(op_err("is not marked using_qnn (MarkQnnGraph marks every op of a QNN graph)".into()));
        }
        let (min, max) = op.kind.arity();
        if op.inputs.len() < min || op.inputs.len() > max {
            return Err(op_err(format!("has {} inputs, expected {min} to {max}", op.inputs.len())));
        }
        let [out] = op.outputs[..] else {
            return Err(op_err(format!("has {} outputs; every lowered op has one", op.outputs.len())));
        };
        let mut inputs: Vec<String> = Vec::with_capacity(op.inputs.len());
        for (i, &v) in op.inputs.iter().enumerate() {
            let name = match (&op.kind, i) {
                (OpKind::Conv2d, 2) => self.conv_bias(v, &inputs[0], &inputs[1])?,
                (OpKind::RmsNorm { unit_offset: true, .. }, 1) => self.unit_offset_gamma(v)?,
                _ => self.operand(v)?,
            };
            inputs.push(name);
        }
        let p = self.program;
        let shape = |v: ValueId| &p.value(v).ty.shape;
        if matches!(op.kind, OpKind::Where) && self.lowering.options.select_broadcast == SelectBroadcast::Explicit {
            let out_dims = encode::dims(shape(out)).map_err(|e| self.type_err(out, e))?;
            for (i, input) in inputs.iter_mut().enumerate().skip(1) {
                *input = self.broadcast_to(&name, i, input, &out_dims, |e| op_err(e.to_string()))?;
            }
        }
        let in_rank = shape(op.inputs[0]).len();
        let out_name = self.value_name(out)?;
        let (out_dtype, out_encoding) = encode::value_type(p, out).map_err(|e| self.type_err(out, e))?;
        let out_dims = encode::dims(shape(out)).map_err(|e| self.type_err(out, e))?;
        let check_dim = |dim: usize, what: &str| -> Result<u32, LowerError> {
            if dim < in_rank {
                Ok(dim as u32)
            } else {
                Err(op_err(format!("{what} {dim} is out of range for rank {in_rank}")))
            }
        };

        // Extra static operands the QNN op needs (RMSNorm beta, GQA indices).
        let mut extra: Option<QnnTensor> = None;
        let (op_type, params): (OpType, Vec<(String, ParamValue)>) = match &op.kind {
            OpKind::View { .. } | OpKind::Unsqueeze { .. } => (OpType::Reshape, vec![]),
            OpKind::Transpose { dim0, dim1 } => {
                let (a, b) = (check_dim(*dim0, "dim0")?, check_dim(*dim1, "dim1")?);
                let mut perm: Vec<u32> = (0..in_rank as u32).collect();
                perm.swap(a as usize, b as usize);
                (OpType::Transpose, vec![u32s("perm", &[in_rank as u32], perm)])
            }
            OpKind::Permute { perm } => {
                let perm = perm.iter().map(|&d| check_dim(d, "perm entry")).collect::<Result<Vec<_>, _>>()?;
                (OpType::Transpose, vec![u32s("perm", &[in_rank as u32], perm)])
            }
            OpKind::Slice { dim, start, end } => {
                let dim = check_dim(*dim, "dim")? as usize;
                let dims = shape(op.inputs[0]);
                if !(start < end && *end <= dims[dim]) {
                    return Err(op_err(format!("slice {start}..{end} of dim {dim} (size {})", dims[dim])));
                }
                let mut ranges = Vec::with_capacity(in_rank * 3);
                for (d, &size) in dims.iter().enumerate() {
                    let (b, e) = if d == dim { (*start, *end) } else { (0, size) };
                    let to_i32 = |x: usize| i32::try_from(x).map_err(|_| op_err(format!("bound {x} overflows int32")));
                    ranges.extend([to_i32(b)?, to_i32(e)?, 1]);
                }
                (OpType::StridedSlice, vec![i32s("ranges", &[in_rank as u32, 3], ranges)])
            }
            OpKind::Concat { dim } => {
                (OpType::Concat, vec![("axis".into(), ParamValue::Scalar(Scalar::UInt32(check_dim(*dim, "dim")?)))])
            }
            OpKind::Repeat { dim, times } => {
                // Repeat-interleave: output index j along `dim` reads input index j / times.
                let axis = check_dim(*dim, "dim")?;
                let n = shape(op.inputs[0])[axis as usize];
                if *times == 0 {
                    return Err(op_err("repeats 0 times".into()));
                }
                let indices: Vec<i32> = (0..n * times).map(|j| (j / times) as i32).collect();
                let count = u32::try_from(indices.len()).map_err(|_| op_err("too many repeats".into()))?;
                let t = QnnTensor::new_static(
                    format!("{}_indices", qnn_safe(&name)),
                    DataType::Int32,
                    &[count],
                    Encoding::Undefined,
                    StaticData::from_i32(&indices),
                );
                extra = Some(t);
                (OpType::Gather, vec![("axis".into(), ParamValue::Scalar(Scalar::Int32(axis as i32)))])
            }
            OpKind::MatMul => (OpType::MatMul, vec![]),
            OpKind::Add => (OpType::ElementWiseAdd, vec![]),
            OpKind::Sub => (OpType::ElementWiseSubtract, vec![]),
            OpKind::Mul => (OpType::ElementWiseMultiply, vec![]),
            OpKind::Neg => (OpType::ElementWiseNeg, vec![]),
            OpKind::Sigmoid => (OpType::Sigmoid, vec![]),
            OpKind::Silu => {
                return Err(op_err(
                    "SiLU has no lowering: QNN models compute x * sigmoid(x) with a QDQ point on each result \
                     (write the model that way)"
                        .into(),
                ))
            }
            OpKind::Softmax { dim } => (
                OpType::Softmax,
                vec![
                    ("axis".into(), ParamValue::Scalar(Scalar::UInt32(check_dim(*dim, "dim")?))),
                    ("beta".into(), ParamValue::Scalar(Scalar::Float32(1.0))),
                ],
            ),
            OpKind::RmsNorm { eps, .. } => {
                let gamma = shape(op.inputs[1]);
                let Ok(d) = u32::try_from(gamma.iter().product::<usize>()) else {
                    return Err(op_err("gamma is too large".into()));
                };
                // QNN's beta, given explicitly as zeros (mllm's `<op>_runtime_bias`): u16 with the
                // output's scale and offset 0 for a quantized output, f32 otherwise.
                let (dtype, encoding, data) = match &out_encoding {
                    Encoding::ScaleOffset(so) if out_dtype == DataType::UFixedPoint16 => (
                        DataType::UFixedPoint16,
                        Encoding::ScaleOffset(ScaleOffset { scale: so.scale, offset: 0 }),
                        StaticData::from_u16(&vec![0; d as usize]),
                    ),
                    Encoding::Undefined if out_dtype == DataType::Float32 => {
                        (DataType::Float32, Encoding::Undefined, StaticData::from_f32(&vec![0.0; d as usize]))
                    }
                    _ => return Err(op_err(format!("RMSNorm output of type {out_dtype} is not supported"))),
                };
                let gamma_dims: Vec<u32> = gamma.iter().map(|&g| g as u32).collect();
                extra = Some(QnnTensor::new_static(
                    format!("{}_runtime_bias", qnn_safe(&name)),
                    dtype,
                    &gamma_dims,
                    encoding,
                    data,
                ));
                (
                    OpType::RmsNorm,
                    vec![
                        ("epsilon".into(), ParamValue::Scalar(Scalar::Float32(*eps))),
                        u32s("axes", &[1], vec![in_rank as u32 - 1]),
                    ],
                )
            }
            OpKind::Embedding => {
                // QNN's Gather takes the table first (mllm/backends/qnn/aot/visitor).
                inputs.swap(0, 1);
                (OpType::Gather, vec![("axis".into(), ParamValue::Scalar(Scalar::Int32(0)))])
            }
            OpKind::Gather { dim } => (
                OpType::Gather,
                vec![("axis".into(), ParamValue::Scalar(Scalar::Int32(check_dim(*dim, "dim")? as i32)))],
            ),
            OpKind::Conv2d => (
                OpType::Conv2d,
                vec![
                    u32s("stride", &[2], vec![1, 1]),
                    u32s("pad_amount", &[2, 2], vec![0, 0, 0, 0]),
                    u32s("dilation", &[2], vec![1, 1]),
                ],
            ),
            OpKind::Linear => {
                return Err(op_err(
                    "Linear has no QNN lowering in this flow: QNN models use 1x1 Conv2D with HWIO LPBQ weights \
                     (declare parameters with ParamFormat::QnnW4A16)"
                        .into(),
                ))
            }
            OpKind::Reduce { kind, dim, keepdim } => (
                match kind {
                    ReduceKind::Min => OpType::ReduceMin,
                    ReduceKind::Max => OpType::ReduceMax,
                    ReduceKind::Mean => OpType::ReduceMean,
                },
                vec![
                    u32s("axes", &[1], vec![check_dim(*dim, "dim")?]),
                    ("keep_dims".into(), ParamValue::Scalar(Scalar::Bool8(*keepdim))),
                ],
            ),
            OpKind::Equal => (OpType::ElementWiseEqual, vec![]),
            OpKind::Where => (OpType::ElementWiseSelect, vec![]),
            OpKind::Cast { .. } => {
                let (in_dtype, _) = encode::value_type(p, op.inputs[0]).map_err(|e| self.type_err(op.inputs[0], e))?;
                let op_type = match (in_dtype.is_fixed_point(), out_dtype.is_fixed_point()) {
                    (true, false) if out_dtype.is_float() => OpType::Dequantize,
                    (false, true) if in_dtype.is_float() => OpType::Quantize,
                    (true, true) => OpType::Convert,
                    _ => OpType::Cast,
                };
                (op_type, vec![])
            }
        };

        if let Some(t) = extra {
            let t = self.lowering.share_static(self.graph, t)?;
            inputs.push(t.name.clone());
            self.add_static(t)?;
        }
        let mut node = self.builder.node(name, op_type).inputs(&inputs);
        for (pname, value) in params {
            node = match value {
                ParamValue::Scalar(s) => node.scalar(&pname, s),
                ParamValue::U32s(dims, values) => node.tensor_param_u32(&pname, &dims, &values),
                ParamValue::I32s(dims, values) => node.tensor_param_i32(&pname, &dims, &values),
            };
        }
        node.output(out_name.clone(), out_dtype, &out_dims, out_encoding).finish();
        self.names.insert(out, out_name);
        Ok(())
    }
}

/// A param before it is attached to its node.
enum ParamValue {
    Scalar(Scalar),
    U32s(Vec<u32>, Vec<u32>),
    I32s(Vec<u32>, Vec<i32>),
}

fn u32s(name: &str, dims: &[u32], values: Vec<u32>) -> (String, ParamValue) {
    (name.to_string(), ParamValue::U32s(dims.to_vec(), values))
}

fn i32s(name: &str, dims: &[u32], values: Vec<i32>) -> (String, ParamValue) {
    (name.to_string(), ParamValue::I32s(dims.to_vec(), values))
}

impl GraphLowering<'_, '_, '_> {
    /// A Conv2D's float bias as QNN's int32 bias for the already lowered input `x` and filter
    /// `w` (see `weights::conv_bias_tensor`); shared between graphs like every static.
    fn conv_bias(&mut self, b: ValueId, x: &str, w: &str) -> Result<String, LowerError> {
        if let Some(name) = self.names.get(&b) {
            return Ok(name.clone());
        }
        let Some(symbol) = self.program.value(b).symbol.clone() else {
            return Err(self.value_err(b, "a Conv2D bias must be a registered parameter".into()));
        };
        let name = self.value_name(b)?;
        let encoding = |n: &str| self.builder.get(n).map(|t| t.encoding.clone()).unwrap_or_default();
        let t = super::weights::conv_bias_tensor(&symbol, &name, self.lowering.weights, &encoding(x), &encoding(w))
            .map_err(|e| LowerError::Weight { graph: self.graph.to_string(), key: e.key, source: e.problem })?;
        let t = self.lowering.share_static(self.graph, t)?;
        self.add_static(t)?;
        self.names.insert(b, name.clone());
        Ok(name)
    }
}

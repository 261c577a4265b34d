//! A CPU reference interpreter for [`QnnGraph`] with QNN quantization semantics.
//!
//! Every tensor is held as the device would hold it: fixed-point tensors as integer codes in
//! their encoding, integer/bool tensors as integers, float tensors as f32 (FLOAT_16 rounded to
//! half precision). Each op dequantizes its inputs (`real = scale * (q + offset)`, LPBQ weights
//! expanded from their integers and block scales exactly as encoded), computes in f32 (f64
//! accumulation for reductions, `gemm` for matrix products), and requantizes the result to its
//! output's encoding with round-half-to-even and saturation (see `encoding.rs` for why
//! half-even). Data-movement ops (Reshape, Transpose, StridedSlice, Gather, Concat) move codes
//! untouched when input and output share dtype and encoding, and requantize otherwise.
//!
//! What it does not model: HTP's internal fixed-point arithmetic and FP16 graph precision, so
//! results can differ from a device by about one quantization step per op.
//!
//! Cast semantics chosen here (QNN documents Cast as a data-type change): to float types the
//! value converts exactly, to fixed-point types it is requantized (executorch uses Cast between
//! 8/16-bit signed and unsigned types with equal scale, QnnOpDef.h, the qti.aisw op package), to integer types it is
//! truncated toward zero with saturation, to BOOL_8 it is `value != 0`.

mod kernels;
mod value;

pub use value::{TensorValue, Values};

use value::StaticCodes;

use std::collections::HashMap;

use crate::dtype::TensorType;
use crate::encoding::Int4Storage;
use crate::graph::{QnnGraph, QnnNode, QnnTensor};
use crate::opdef::OpType;
use crate::params::{self, ParamReadError};
use crate::shape;
use crate::validate::{validate, ValidationError};

use kernels::{MatRef, Reduce};

/// Why a graph could not be executed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum InterpError {
    #[error("graph is invalid: {0}")]
    Invalid(#[from] ValidationError),
    #[error("graph `{graph}` takes {expected} inputs, {found} were given")]
    InputCount { graph: String, expected: usize, found: usize },
    #[error("input {index} (`{tensor}`): {detail}")]
    Input { index: usize, tensor: String, detail: String },
    #[error("tensor `{tensor}`: {detail}")]
    Value { tensor: String, detail: String },
    #[error("node `{node}` ({op}): {detail}")]
    Op { node: String, op: OpType, detail: String },
}

/// Executes one validated graph.
#[derive(Debug)]
pub struct Interpreter<'g> {
    graph: &'g QnnGraph,
    index: HashMap<&'g str, usize>,
    /// Node index after which each intermediate can be dropped.
    last_use: HashMap<&'g str, usize>,
}

impl<'g> Interpreter<'g> {
    /// Validate `graph` and prepare to run it.
    pub fn new(graph: &'g QnnGraph) -> Result<Interpreter<'g>, InterpError> {
        validate(graph)?;
        let mut last_use = HashMap::new();
        for (i, node) in graph.nodes.iter().enumerate() {
            for name in &node.inputs {
                last_use.insert(name.as_str(), i);
            }
        }
        Ok(Interpreter { graph, index: graph.tensor_index(), last_use })
    }

    fn meta(&self, name: &str) -> &'g QnnTensor {
        // Names were validated; the index is complete.
        &self.graph.tensors[self.index[name]]
    }

    /// A graph input from real values (quantized with the input's encoding).
    pub fn input_from_real(&self, position: usize, values: &[f32]) -> Result<TensorValue, InterpError> {
        let name = self.graph.inputs.get(position).ok_or_else(|| InterpError::InputCount {
            graph: self.graph.name.clone(),
            expected: self.graph.inputs.len(),
            found: position + 1,
        })?;
        TensorValue::from_real(self.meta(name), values)
    }

    /// Run with positional inputs; returns the graph outputs in order.
    pub fn run(&self, inputs: &[TensorValue]) -> Result<Vec<TensorValue>, InterpError> {
        let mut env = self.execute(inputs, false)?;
        Ok(self
            .graph
            .outputs
            .iter()
            .map(|name| env.remove(name.as_str()).expect("validated outputs are produced"))
            .collect())
    }

    /// Run and keep every graph-input and node-output value, by tensor name (for debugging
    /// and layer-by-layer comparisons).
    pub fn run_all(&self, inputs: &[TensorValue]) -> Result<HashMap<String, TensorValue>, InterpError> {
        Ok(self.execute(inputs, true)?.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
    }

    /// Node `index` alone on `values` for its non-static inputs (statics come from the graph):
    /// to check one op against a reference fed the same inputs, so that errors carried in from
    /// earlier ops do not count.
    pub fn run_node(&self, index: usize, values: &HashMap<String, TensorValue>) -> Result<TensorValue, InterpError> {
        let node = &self.graph.nodes[index];
        let args = node
            .inputs
            .iter()
            .map(|name| {
                let meta = self.meta(name);
                if meta.tensor_type == TensorType::Static {
                    return Ok(Operand::Static(meta));
                }
                let value = values.get(name).ok_or_else(|| InterpError::Value {
                    tensor: name.clone(),
                    detail: format!("input of node `{}` was not given", node.name),
                })?;
                if value.dtype != meta.dtype || value.dims != meta.dims || value.encoding != meta.encoding {
                    return Err(InterpError::Value {
                        tensor: name.clone(),
                        detail: format!(
                            "given as {} {:?}, the graph declares {} {:?}",
                            value.dtype, value.dims, meta.dtype, meta.dims
                        ),
                    });
                }
                Ok(Operand::Value(value))
            })
            .collect::<Result<Vec<_>, _>>()?;
        eval(node, &args, self.meta(&node.outputs[0]), self.graph.int4_storage).map_err(|e| match e {
            EvalError::Detail(detail) => InterpError::Op { node: node.name.clone(), op: node.op_type, detail },
            EvalError::Interp(e) => e,
        })
    }

    fn execute(&self, inputs: &[TensorValue], keep_all: bool) -> Result<HashMap<&'g str, TensorValue>, InterpError> {
        let graph = self.graph;
        if inputs.len() != graph.inputs.len() {
            return Err(InterpError::InputCount {
                graph: graph.name.clone(),
                expected: graph.inputs.len(),
                found: inputs.len(),
            });
        }
        let mut env: HashMap<&'g str, TensorValue> = HashMap::new();
        for (index, (name, value)) in graph.inputs.iter().zip(inputs).enumerate() {
            let meta = self.meta(name);
            let bad = |detail: String| InterpError::Input { index, tensor: name.clone(), detail };
            if value.dtype != meta.dtype || value.dims != meta.dims || value.encoding != meta.encoding {
                return Err(bad(format!(
                    "value is {} {:?} ({}), the graph declares {} {:?} ({})",
                    value.dtype,
                    value.dims,
                    value.encoding.c_name(),
                    meta.dtype,
                    meta.dims,
                    meta.encoding.c_name()
                )));
            }
            if value.numel() as u64 != meta.numel() {
                return Err(bad(format!("{} elements, expected {}", value.numel(), meta.numel())));
            }
            env.insert(name.as_str(), value.clone());
        }
        for (i, node) in graph.nodes.iter().enumerate() {
            // Statics stay as bytes until an op needs them, so weights are never held twice.
            let args: Vec<Operand<'_>> = node
                .inputs
                .iter()
                .map(|name| {
                    let meta = self.meta(name);
                    if meta.tensor_type == TensorType::Static {
                        Operand::Static(meta)
                    } else {
                        Operand::Value(&env[name.as_str()])
                    }
                })
                .collect();
            let out_meta = self.meta(&node.outputs[0]);
            let out = eval(node, &args, out_meta, graph.int4_storage).map_err(|e| match e {
                EvalError::Detail(detail) => InterpError::Op { node: node.name.clone(), op: node.op_type, detail },
                EvalError::Interp(e) => e,
            })?;
            if !keep_all {
                for name in &node.inputs {
                    if self.last_use.get(name.as_str()) == Some(&i) && !graph.outputs.contains(name) {
                        env.remove(name.as_str());
                    }
                }
            }
            env.insert(out_meta.name.as_str(), out);
        }
        Ok(env)
    }
}

enum EvalError {
    Detail(String),
    Interp(InterpError),
}

impl From<InterpError> for EvalError {
    fn from(e: InterpError) -> Self {
        EvalError::Interp(e)
    }
}

impl From<ParamReadError> for EvalError {
    fn from(e: ParamReadError) -> Self {
        EvalError::Detail(format!("param `{}`: {}", e.param, e.detail))
    }
}

impl From<crate::shape::ShapeError> for EvalError {
    fn from(e: crate::shape::ShapeError) -> Self {
        EvalError::Detail(e.to_string())
    }
}

impl From<String> for EvalError {
    fn from(e: String) -> Self {
        EvalError::Detail(e)
    }
}

/// Real values -> output tensor value.
fn emit(out: &QnnTensor, real: &[f32]) -> Result<TensorValue, EvalError> {
    Ok(TensorValue::from_real(out, real)?)
}

/// An op input: a computed value, or a static tensor still in its bytes.
enum Operand<'a> {
    Value(&'a TensorValue),
    Static(&'a QnnTensor),
}

impl Operand<'_> {
    fn dims(&self) -> &[u32] {
        match self {
            Operand::Value(v) => &v.dims,
            Operand::Static(t) => &t.dims,
        }
    }

    fn dtype(&self) -> crate::dtype::DataType {
        match self {
            Operand::Value(v) => v.dtype,
            Operand::Static(t) => t.dtype,
        }
    }

    fn encoding(&self) -> &crate::encoding::Encoding {
        match self {
            Operand::Value(v) => &v.encoding,
            Operand::Static(t) => &t.encoding,
        }
    }

    fn same_representation(&self, out: &QnnTensor) -> bool {
        self.dtype() == out.dtype && *self.encoding() == out.encoding
    }

    /// The whole value (statics decoded).
    fn value(&self, int4: Int4Storage) -> Result<std::borrow::Cow<'_, TensorValue>, InterpError> {
        Ok(match self {
            Operand::Value(v) => std::borrow::Cow::Borrowed(*v),
            Operand::Static(t) => std::borrow::Cow::Owned(TensorValue::from_static(t, int4)?),
        })
    }

    /// Real values; statics are dequantized straight from their bytes (LPBQ expanded from
    /// integers and block scales as encoded).
    fn real(&self, int4: Int4Storage) -> Result<Vec<f32>, InterpError> {
        match self {
            Operand::Value(v) => v.to_real(),
            Operand::Static(t) if t.dtype.is_float() => TensorValue::from_static(t, int4)?.to_real(),
            Operand::Static(t) => {
                let codes = StaticCodes::new(t, int4)?;
                if t.dtype.is_fixed_point() {
                    t.encoding
                        .dequantize_each(&t.dims, |i| codes.get(i))
                        .map_err(|e| InterpError::Value { tensor: t.name.clone(), detail: e.to_string() })
                } else {
                    Ok((0..t.numel() as usize).map(|i| codes.get(i) as f32).collect())
                }
            }
        }
    }

    /// Integer codes at the `map` positions (statics decode only those elements).
    fn codes_at(&self, map: &[usize], int4: Int4Storage) -> Result<Option<Vec<i64>>, InterpError> {
        Ok(match self {
            Operand::Value(v) => v.codes().map(|c| map.iter().map(|&i| c[i]).collect()),
            Operand::Static(t) if t.dtype.is_float() => None,
            Operand::Static(t) => {
                let codes = StaticCodes::new(t, int4)?;
                Some(map.iter().map(|&i| codes.get(i)).collect())
            }
        })
    }
}

/// Move elements by `map` (identity when `None`); codes pass through when the representation
/// is unchanged, otherwise values are requantized.
fn relayout(
    input: &Operand<'_>,
    map: Option<&[usize]>,
    out: &QnnTensor,
    int4: Int4Storage,
) -> Result<TensorValue, EvalError> {
    if input.same_representation(out) {
        let identity: Vec<usize>;
        let map = match map {
            Some(m) => m,
            None => {
                identity = (0..shape::numel(input.dims()) as usize).collect();
                &identity
            }
        };
        let values = match input.codes_at(map, int4)? {
            Some(codes) => Values::Codes(codes),
            None => {
                let real = input.real(int4)?;
                Values::Real(map.iter().map(|&i| real[i]).collect())
            }
        };
        return Ok(TensorValue { dtype: out.dtype, dims: out.dims.clone(), encoding: out.encoding.clone(), values });
    }
    let real = input.real(int4)?;
    let moved: Vec<f32> = match map {
        Some(m) => m.iter().map(|&i| real[i]).collect(),
        None => real,
    };
    emit(out, &moved)
}

fn eval(node: &QnnNode, args: &[Operand<'_>], out: &QnnTensor, int4: Int4Storage) -> Result<TensorValue, EvalError> {
    let real = |i: usize| -> Result<Vec<f32>, EvalError> { Ok(args[i].real(int4)?) };
    let x = &args[0];
    let map_of = |i: usize| kernels::broadcast_map(&out.dims, args[i].dims());
    match node.op_type {
        OpType::ElementWiseAdd | OpType::ElementWiseSubtract | OpType::ElementWiseMultiply => {
            let (a, b) = (real(0)?, real(1)?);
            let (ma, mb) = (map_of(0), map_of(1));
            let f: fn(f32, f32) -> f32 = match node.op_type {
                OpType::ElementWiseAdd => |p, q| p + q,
                OpType::ElementWiseSubtract => |p, q| p - q,
                _ => |p, q| p * q,
            };
            let r: Vec<f32> = ma.iter().zip(&mb).map(|(&i, &j)| f(a[i], b[j])).collect();
            emit(out, &r)
        }
        OpType::ElementWiseNeg => emit(out, &real(0)?.iter().map(|v| -v).collect::<Vec<_>>()),
        OpType::Sigmoid => {
            emit(out, &real(0)?.iter().map(|&v| (1.0 / (1.0 + (-f64::from(v)).exp())) as f32).collect::<Vec<_>>())
        }
        OpType::ElementWiseEqual => {
            let (ma, mb) = (map_of(0), map_of(1));
            let same = args[0].dtype() == args[1].dtype() && args[0].encoding() == args[1].encoding();
            let (va, vb) = (args[0].value(int4)?, args[1].value(int4)?);
            let codes: Vec<i64> = match (same, va.codes(), vb.codes()) {
                // Equal codes in one encoding <=> equal reals; avoids float products.
                (true, Some(a), Some(b)) => ma.iter().zip(&mb).map(|(&i, &j)| i64::from(a[i] == b[j])).collect(),
                _ => {
                    let (a, b) = (va.to_real()?, vb.to_real()?);
                    ma.iter().zip(&mb).map(|(&i, &j)| i64::from(a[i] == b[j])).collect()
                }
            };
            Ok(TensorValue::from_codes(out, codes)?)
        }
        OpType::ElementWiseSelect => {
            let cond = args[0].value(int4)?;
            let cond = cond.codes().ok_or("condition holds no codes".to_string())?;
            let (a, b) = (real(1)?, real(2)?);
            let (mc, ma, mb) = (map_of(0), map_of(1), map_of(2));
            let r: Vec<f32> = (0..mc.len()).map(|k| if cond[mc[k]] != 0 { a[ma[k]] } else { b[mb[k]] }).collect();
            emit(out, &r)
        }
        OpType::Softmax => {
            let axis = params::int(node, "axis", x.dims().len())? as usize;
            let beta = params::float(node, "beta")?;
            emit(out, &kernels::softmax(&real(0)?, x.dims(), axis, beta))
        }
        OpType::RmsNorm => {
            let axes = params::u32s(node, "axes")?;
            let eps = params::float(node, "epsilon")?;
            let gamma = real(1)?;
            let beta = if args.len() > 2 { Some(real(2)?) } else { None };
            emit(out, &kernels::rms_norm(&real(0)?, x.dims(), &axes, &gamma, beta.as_deref(), eps))
        }
        OpType::Transpose => {
            let perm = params::u32s(node, "perm")?;
            relayout(x, Some(&kernels::transpose_map(x.dims(), &perm)), out, int4)
        }
        OpType::Reshape => relayout(x, None, out, int4),
        OpType::Convert | OpType::Cast | OpType::Quantize | OpType::Dequantize => emit(out, &real(0)?),
        OpType::StridedSlice => {
            let ranges = params::i32s(node, "ranges")?;
            let mask = |n: &str| params::int(node, n, 0).map(|v| v as u32);
            let (axes, _) = shape::strided_slice(
                x.dims(),
                &ranges,
                mask("begin_mask")?,
                mask("end_mask")?,
                mask("shrink_axes")?,
                mask("new_axes_mask")?,
            )?;
            relayout(x, Some(&kernels::slice_map(x.dims(), &axes)), out, int4)
        }
        OpType::Gather => {
            let axis = params::int(node, "axis", x.dims().len())? as i32;
            let (axis, _) = shape::gather_output(x.dims(), args[1].dims(), axis)?;
            let dim = x.dims()[axis] as i64;
            let indices = args[1].value(int4)?;
            let raw = indices.codes().ok_or("indices hold no codes".to_string())?;
            let mut idx = Vec::with_capacity(raw.len());
            for (k, &v) in raw.iter().enumerate() {
                if !(0..dim).contains(&v) {
                    return Err(format!("index {k} is {v}, outside 0..{dim} of axis {axis}").into());
                }
                idx.push(v as usize);
            }
            relayout(x, Some(&kernels::gather_map(x.dims(), axis, &idx)), out, int4)
        }
        OpType::Concat => {
            let axis = params::int(node, "axis", x.dims().len())? as usize;
            let values = args.iter().map(|a| a.value(int4)).collect::<Result<Vec<_>, _>>()?;
            if args.iter().all(|a| a.same_representation(out)) {
                if let Some(parts) =
                    values.iter().map(|v| v.codes().map(|c| (c, v.dims.as_slice()))).collect::<Option<Vec<_>>>()
                {
                    return Ok(TensorValue::from_codes(out, kernels::concat(&parts, axis))?);
                }
            }
            let reals = values.iter().map(|v| v.to_real()).collect::<Result<Vec<_>, _>>()?;
            let parts: Vec<(&[f32], &[u32])> =
                reals.iter().zip(&values).map(|(r, v)| (r.as_slice(), v.dims.as_slice())).collect();
            emit(out, &kernels::concat(&parts, axis))
        }
        OpType::ReduceMin | OpType::ReduceMax | OpType::ReduceMean => {
            let axes = params::u32s(node, "axes")?;
            let how = match node.op_type {
                OpType::ReduceMin => Reduce::Min,
                OpType::ReduceMax => Reduce::Max,
                _ => Reduce::Mean,
            };
            let (groups_of, groups) = kernels::group_map(x.dims(), &axes);
            emit(out, &kernels::reduce(&real(0)?, &groups_of, groups, how))
        }
        OpType::MatMul => {
            let ta = params::flag(node, "transpose_in0")?;
            let tb = params::flag(node, "transpose_in1")?;
            let r = matmul(&real(0)?, args[0].dims(), &real(1)?, args[1].dims(), ta, tb, &out.dims);
            emit(out, &r)
        }
        OpType::FullyConnected => {
            let w = args[1].dims();
            let (outc, inc) = (w[0] as usize, w[1] as usize);
            let (xr, wr) = (real(0)?, real(1)?);
            let rows = xr.len() / inc;
            let mut r = vec![0f32; rows * outc];
            kernels::matmul(
                &mut r,
                MatRef { data: &xr, row_stride: inc as isize, col_stride: 1 },
                // W is [Out, In]; the product needs W^T [In, Out].
                MatRef { data: &wr, row_stride: 1, col_stride: inc as isize },
                rows,
                outc,
                inc,
            );
            if args.len() > 2 {
                let b = real(2)?;
                for row in r.chunks_mut(outc) {
                    row.iter_mut().zip(&b).for_each(|(o, b)| *o += b);
                }
            }
            emit(out, &r)
        }
        OpType::Conv2d => {
            let stride = params::pair(node, "stride")?;
            let dilation = params::pair(node, "dilation")?;
            let pad = params::pad_amount(node)?;
            let group = params::int(node, "group", 0)? as usize;
            let d = |dims: &[u32]| -> [usize; 4] {
                [dims[0] as usize, dims[1] as usize, dims[2] as usize, dims[3] as usize]
            };
            let geometry = kernels::ConvGeometry {
                input: d(x.dims()),
                filter: d(args[1].dims()),
                output: d(&out.dims),
                stride: [stride[0] as usize, stride[1] as usize],
                pad_before: [pad[0][0] as usize, pad[1][0] as usize],
                dilation: [dilation[0] as usize, dilation[1] as usize],
                group,
            };
            let bias = if args.len() > 2 { Some(real(2)?) } else { None };
            emit(out, &kernels::conv2d(&real(0)?, &real(1)?, bias.as_deref(), &geometry))
        }
    }
}

/// Batched `[..., M, K] x [..., K, N]` with broadcast batch dims and optional transposes.
fn matmul(ar: &[f32], a_dims: &[u32], br: &[f32], b_dims: &[u32], ta: bool, tb: bool, out_dims: &[u32]) -> Vec<f32> {
    let (ra, rb) = (a_dims.len(), b_dims.len());
    let (a_rows, a_cols) = (a_dims[ra - 2] as usize, a_dims[ra - 1] as usize);
    let (b_rows, b_cols) = (b_dims[rb - 2] as usize, b_dims[rb - 1] as usize);
    let (m, k) = if ta { (a_cols, a_rows) } else { (a_rows, a_cols) };
    let n = if tb { b_rows } else { b_cols };
    let batch_dims = &out_dims[..out_dims.len() - 2];
    let a_batch = kernels::broadcast_map(batch_dims, &a_dims[..ra - 2]);
    let b_batch = kernels::broadcast_map(batch_dims, &b_dims[..rb - 2]);
    let (a_mat, b_mat) = (a_rows * a_cols, b_rows * b_cols);
    let mut r = vec![0f32; a_batch.len() * m * n];
    for (bi, (&ia, &ib)) in a_batch.iter().zip(&b_batch).enumerate() {
        let am = &ar[ia * a_mat..(ia + 1) * a_mat];
        let bm = &br[ib * b_mat..(ib + 1) * b_mat];
        let a_ref = if ta {
            MatRef { data: am, row_stride: 1, col_stride: a_cols as isize }
        } else {
            MatRef { data: am, row_stride: a_cols as isize, col_stride: 1 }
        };
        let b_ref = if tb {
            MatRef { data: bm, row_stride: 1, col_stride: b_cols as isize }
        } else {
            MatRef { data: bm, row_stride: b_cols as isize, col_stride: 1 }
        };
        kernels::matmul(&mut r[bi * m * n..(bi + 1) * m * n], a_ref, b_ref, m, n, k);
    }
    r
}

#[cfg(test)]
mod tests;

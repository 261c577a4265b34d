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
//! 8/16-bit signed and unsigned types with equal scale, qnn-api.md §4), to integer types it is
//! truncated toward zero with saturation, to BOOL_8 it is `value != 0`.

mod kernels;
mod value;

pub use value::{TensorValue, Values};

use std::collections::HashMap;

use crate::dtype::TensorType;
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
    InputCount {
        graph: String,
        expected: usize,
        found: usize,
    },
    #[error("input {index} (`{tensor}`): {detail}")]
    Input {
        index: usize,
        tensor: String,
        detail: String,
    },
    #[error("tensor `{tensor}`: {detail}")]
    Value { tensor: String, detail: String },
    #[error("node `{node}` ({op}): {detail}")]
    Op {
        node: String,
        op: OpType,
        detail: String,
    },
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
        Ok(Interpreter {
            graph,
            index: graph.tensor_index(),
            last_use,
        })
    }

    fn meta(&self, name: &str) -> &'g QnnTensor {
        // Names were validated; the index is complete.
        &self.graph.tensors[self.index[name]]
    }

    /// A graph input from real values (quantized with the input's encoding).
    pub fn input_from_real(
        &self,
        position: usize,
        values: &[f32],
    ) -> Result<TensorValue, InterpError> {
        let name = self
            .graph
            .inputs
            .get(position)
            .ok_or_else(|| InterpError::InputCount {
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
            .map(|name| {
                env.remove(name.as_str())
                    .expect("validated outputs are produced")
            })
            .collect())
    }

    /// Run and keep every graph-input and node-output value, by tensor name (for debugging
    /// and layer-by-layer comparisons).
    pub fn run_all(
        &self,
        inputs: &[TensorValue],
    ) -> Result<HashMap<String, TensorValue>, InterpError> {
        Ok(self
            .execute(inputs, true)?
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect())
    }

    fn execute(
        &self,
        inputs: &[TensorValue],
        keep_all: bool,
    ) -> Result<HashMap<&'g str, TensorValue>, InterpError> {
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
            let bad = |detail: String| InterpError::Input {
                index,
                tensor: name.clone(),
                detail,
            };
            if value.dtype != meta.dtype
                || value.dims != meta.dims
                || value.encoding != meta.encoding
            {
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
                return Err(bad(format!(
                    "{} elements, expected {}",
                    value.numel(),
                    meta.numel()
                )));
            }
            env.insert(name.as_str(), value.clone());
        }
        for (i, node) in graph.nodes.iter().enumerate() {
            let mut args = Vec::with_capacity(node.inputs.len());
            for name in &node.inputs {
                let meta = self.meta(name);
                args.push(if meta.tensor_type == TensorType::Static {
                    // Decoded on use so weights are never held twice.
                    std::borrow::Cow::Owned(TensorValue::from_static(meta, graph.int4_storage)?)
                } else {
                    std::borrow::Cow::Borrowed(&env[name.as_str()])
                });
            }
            let args: Vec<&TensorValue> = args.iter().map(|c| c.as_ref()).collect();
            let out_meta = self.meta(&node.outputs[0]);
            let out = eval(node, &args, out_meta).map_err(|e| match e {
                EvalError::Detail(detail) => InterpError::Op {
                    node: node.name.clone(),
                    op: node.op_type,
                    detail,
                },
                EvalError::Interp(e) => e,
            })?;
            if !keep_all {
                for name in &node.inputs {
                    if self.last_use.get(name.as_str()) == Some(&i) && !graph.outputs.contains(name)
                    {
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

impl From<String> for EvalError {
    fn from(e: String) -> Self {
        EvalError::Detail(e)
    }
}

/// Real values -> output tensor value.
fn emit(out: &QnnTensor, real: &[f32]) -> Result<TensorValue, EvalError> {
    Ok(TensorValue::from_real(out, real)?)
}

/// Move elements by `map`; codes pass through when the representation is unchanged.
fn relayout(
    input: &TensorValue,
    map: Option<&[usize]>,
    out: &QnnTensor,
) -> Result<TensorValue, EvalError> {
    if input.same_representation(out) {
        let values = match map {
            Some(m) => input.values.take(m),
            None => input.values.clone(),
        };
        return Ok(TensorValue {
            dtype: out.dtype,
            dims: out.dims.clone(),
            encoding: out.encoding.clone(),
            values,
        });
    }
    let real = input.to_real()?;
    let moved: Vec<f32> = match map {
        Some(m) => m.iter().map(|&i| real[i]).collect(),
        None => real,
    };
    emit(out, &moved)
}

fn eval(node: &QnnNode, args: &[&TensorValue], out: &QnnTensor) -> Result<TensorValue, EvalError> {
    let real = |i: usize| -> Result<Vec<f32>, EvalError> { Ok(args[i].to_real()?) };
    let x = args[0];
    match node.op_type {
        OpType::ElementWiseAdd | OpType::ElementWiseSubtract | OpType::ElementWiseMultiply => {
            let (a, b) = (real(0)?, real(1)?);
            let ma = kernels::broadcast_map(&out.dims, &args[0].dims);
            let mb = kernels::broadcast_map(&out.dims, &args[1].dims);
            let f: fn(f32, f32) -> f32 = match node.op_type {
                OpType::ElementWiseAdd => |p, q| p + q,
                OpType::ElementWiseSubtract => |p, q| p - q,
                _ => |p, q| p * q,
            };
            let r: Vec<f32> = ma.iter().zip(&mb).map(|(&i, &j)| f(a[i], b[j])).collect();
            emit(out, &r)
        }
        OpType::ElementWiseNeg => emit(out, &real(0)?.iter().map(|v| -v).collect::<Vec<_>>()),
        OpType::Sigmoid => emit(
            out,
            &real(0)?
                .iter()
                .map(|&v| (1.0 / (1.0 + (-f64::from(v)).exp())) as f32)
                .collect::<Vec<_>>(),
        ),
        OpType::ElementWiseEqual => {
            let ma = kernels::broadcast_map(&out.dims, &args[0].dims);
            let mb = kernels::broadcast_map(&out.dims, &args[1].dims);
            let same = args[0].dtype == args[1].dtype && args[0].encoding == args[1].encoding;
            let codes: Vec<i64> = match (same, args[0].codes(), args[1].codes()) {
                // Equal codes in one encoding <=> equal reals; avoids float products.
                (true, Some(a), Some(b)) => ma
                    .iter()
                    .zip(&mb)
                    .map(|(&i, &j)| i64::from(a[i] == b[j]))
                    .collect(),
                _ => {
                    let (a, b) = (real(0)?, real(1)?);
                    ma.iter()
                        .zip(&mb)
                        .map(|(&i, &j)| i64::from(a[i] == b[j]))
                        .collect()
                }
            };
            Ok(TensorValue::from_codes(out, codes)?)
        }
        OpType::ElementWiseSelect => {
            let cond = args[0]
                .codes()
                .ok_or("condition holds no codes".to_string())?;
            let (a, b) = (real(1)?, real(2)?);
            let mc = kernels::broadcast_map(&out.dims, &args[0].dims);
            let ma = kernels::broadcast_map(&out.dims, &args[1].dims);
            let mb = kernels::broadcast_map(&out.dims, &args[2].dims);
            let r: Vec<f32> = (0..mc.len())
                .map(|k| if cond[mc[k]] != 0 { a[ma[k]] } else { b[mb[k]] })
                .collect();
            emit(out, &r)
        }
        OpType::Softmax => {
            let axis = params::int(node, "axis", x.dims.len())? as usize;
            let beta = params::float(node, "beta")?;
            emit(out, &kernels::softmax(&real(0)?, &x.dims, axis, beta))
        }
        OpType::RmsNorm => {
            let axes = params::u32s(node, "axes")?;
            let eps = params::float(node, "epsilon")?;
            let gamma = real(1)?;
            let beta = if args.len() > 2 { Some(real(2)?) } else { None };
            emit(
                out,
                &kernels::rms_norm(&real(0)?, &x.dims, &axes, &gamma, beta.as_deref(), eps),
            )
        }
        OpType::Transpose => {
            let perm = params::u32s(node, "perm")?;
            relayout(x, Some(&kernels::transpose_map(&x.dims, &perm)), out)
        }
        OpType::Reshape
        | OpType::Convert
        | OpType::Cast
        | OpType::Quantize
        | OpType::Dequantize => {
            if node.op_type == OpType::Reshape {
                relayout(x, None, out)
            } else {
                emit(out, &real(0)?)
            }
        }
        OpType::StridedSlice => {
            let ranges = params::i32s(node, "ranges")?;
            let mask = |n: &str| params::int(node, n, 0).map(|v| v as u32);
            let (axes, _) = shape::strided_slice(
                &x.dims,
                &ranges,
                mask("begin_mask")?,
                mask("end_mask")?,
                mask("shrink_axes")?,
                mask("new_axes_mask")?,
            )?;
            relayout(x, Some(&kernels::slice_map(&x.dims, &axes)), out)
        }
        OpType::Gather => {
            let axis = params::int(node, "axis", x.dims.len())? as i32;
            let (axis, _) = shape::gather_output(&x.dims, &args[1].dims, axis)?;
            let dim = x.dims[axis] as i64;
            let raw = args[1].codes().ok_or("indices hold no codes".to_string())?;
            let mut idx = Vec::with_capacity(raw.len());
            for (k, &v) in raw.iter().enumerate() {
                if !(0..dim).contains(&v) {
                    return Err(format!("index {k} is {v}, outside 0..{dim} of axis {axis}").into());
                }
                idx.push(v as usize);
            }
            relayout(x, Some(&kernels::gather_map(&x.dims, axis, &idx)), out)
        }
        OpType::Concat => {
            let axis = params::int(node, "axis", x.dims.len())? as usize;
            if args.iter().all(|a| a.same_representation(out)) {
                if let Some(parts) = args
                    .iter()
                    .map(|a| a.codes().map(|c| (c, a.dims.as_slice())))
                    .collect::<Option<Vec<_>>>()
                {
                    return Ok(TensorValue::from_codes(out, kernels::concat(&parts, axis))?);
                }
            }
            let reals = args
                .iter()
                .map(|a| a.to_real())
                .collect::<Result<Vec<_>, _>>()?;
            let parts: Vec<(&[f32], &[u32])> = reals
                .iter()
                .zip(args)
                .map(|(r, a)| (r.as_slice(), a.dims.as_slice()))
                .collect();
            emit(out, &kernels::concat(&parts, axis))
        }
        OpType::ReduceMin | OpType::ReduceMax | OpType::ReduceMean => {
            let axes = params::u32s(node, "axes")?;
            let how = match node.op_type {
                OpType::ReduceMin => Reduce::Min,
                OpType::ReduceMax => Reduce::Max,
                _ => Reduce::Mean,
            };
            let (groups_of, groups) = kernels::group_map(&x.dims, &axes);
            emit(out, &kernels::reduce(&real(0)?, &groups_of, groups, how))
        }
        OpType::MatMul => matmul(node, args, out),
        OpType::FullyConnected => {
            let w = args[1];
            let (outc, inc) = (w.dims[0] as usize, w.dims[1] as usize);
            let (xr, wr) = (real(0)?, real(1)?);
            let rows = xr.len() / inc;
            let mut r = vec![0f32; rows * outc];
            kernels::matmul(
                &mut r,
                MatRef {
                    data: &xr,
                    row_stride: inc as isize,
                    col_stride: 1,
                },
                // W is [Out, In]; the product needs W^T [In, Out].
                MatRef {
                    data: &wr,
                    row_stride: 1,
                    col_stride: inc as isize,
                },
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
                [
                    dims[0] as usize,
                    dims[1] as usize,
                    dims[2] as usize,
                    dims[3] as usize,
                ]
            };
            let geometry = kernels::ConvGeometry {
                input: d(&x.dims),
                filter: d(&args[1].dims),
                output: d(&out.dims),
                stride: [stride[0] as usize, stride[1] as usize],
                pad_before: [pad[0][0] as usize, pad[1][0] as usize],
                dilation: [dilation[0] as usize, dilation[1] as usize],
                group,
            };
            let bias = if args.len() > 2 { Some(real(2)?) } else { None };
            emit(
                out,
                &kernels::conv2d(&real(0)?, &real(1)?, bias.as_deref(), &geometry),
            )
        }
    }
}

fn matmul(
    node: &QnnNode,
    args: &[&TensorValue],
    out: &QnnTensor,
) -> Result<TensorValue, EvalError> {
    let (a, b) = (args[0], args[1]);
    let ta = params::flag(node, "transpose_in0")?;
    let tb = params::flag(node, "transpose_in1")?;
    let (ar, br) = (a.to_real()?, b.to_real()?);
    let (ra, rb) = (a.dims.len(), b.dims.len());
    let (a_rows, a_cols) = (a.dims[ra - 2] as usize, a.dims[ra - 1] as usize);
    let (b_rows, b_cols) = (b.dims[rb - 2] as usize, b.dims[rb - 1] as usize);
    let (m, k) = if ta {
        (a_cols, a_rows)
    } else {
        (a_rows, a_cols)
    };
    let n = if tb { b_rows } else { b_cols };
    let batch_dims = &out.dims[..out.dims.len() - 2];
    let a_batch = kernels::broadcast_map(batch_dims, &a.dims[..ra - 2]);
    let b_batch = kernels::broadcast_map(batch_dims, &b.dims[..rb - 2]);
    let (a_mat, b_mat) = (a_rows * a_cols, b_rows * b_cols);
    let mut r = vec![0f32; a_batch.len() * m * n];
    for (bi, (&ia, &ib)) in a_batch.iter().zip(&b_batch).enumerate() {
        let am = &ar[ia * a_mat..(ia + 1) * a_mat];
        let bm = &br[ib * b_mat..(ib + 1) * b_mat];
        let a_ref = if ta {
            MatRef {
                data: am,
                row_stride: 1,
                col_stride: a_cols as isize,
            }
        } else {
            MatRef {
                data: am,
                row_stride: a_cols as isize,
                col_stride: 1,
            }
        };
        let b_ref = if tb {
            MatRef {
                data: bm,
                row_stride: 1,
                col_stride: b_cols as isize,
            }
        } else {
            MatRef {
                data: bm,
                row_stride: b_cols as isize,
                col_stride: 1,
            }
        };
        kernels::matmul(&mut r[bi * m * n..(bi + 1) * m * n], a_ref, b_ref, m, n, k);
    }
    emit(out, &r)
}

#[cfg(test)]
mod tests;

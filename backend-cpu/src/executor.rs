//! [`CpuBackend`]: executes mllm-dsl ops eagerly on f32 host buffers with the [`kernels`].
//!
//! QDQ points are the identity in float mode; a [`QdqHook`] turns them into fake-quant (or
//! calibration observers) without touching the model file.

use crate::kernels::{self, BinaryOp, ReduceKind as KReduce, UnaryOp};
use mllm_dsl::op::{OpKind, ReduceKind};
use mllm_dsl::{Backend, BackendRef, QdqAttr, Storage, Tensor, TensorType};
use std::sync::Arc;

/// What happens at a QDQ point in eager mode.
pub trait QdqHook: Send + Sync {
    /// Returns the new data for `x` at `point` (quantized-dequantized, or observed and passed
    /// through). `Ok(None)` leaves the tensor unchanged.
    fn apply(&self, point: &QdqAttr, x: &[f32], shape: &[usize]) -> Result<Option<Vec<f32>>, String>;
}

/// The eager CPU backend.
#[derive(Clone, Default)]
pub struct CpuBackend {
    qdq: Option<Arc<dyn QdqHook>>,
}

impl CpuBackend {
    /// Float mode: QDQ points are the identity.
    pub fn float() -> BackendRef {
        Arc::new(CpuBackend { qdq: None })
    }

    /// QDQ points go through `hook` (fake-quant, calibration).
    pub fn with_qdq(hook: Arc<dyn QdqHook>) -> BackendRef {
        Arc::new(CpuBackend { qdq: Some(hook) })
    }
}

fn f32_of<'a>(t: &'a Tensor, what: &str) -> Result<&'a [f32], String> {
    t.as_f32().ok_or_else(|| format!("{what} must hold real-valued data, got {}", t.dtype()))
}

fn i64_of<'a>(t: &'a Tensor, what: &str) -> Result<&'a [i64], String> {
    t.as_i64().ok_or_else(|| format!("{what} must hold integer ids, got {}", t.dtype()))
}

fn out_f32(data: Vec<f32>) -> Storage {
    Storage::F32(data.into())
}

impl Backend for CpuBackend {
    fn name(&self) -> &str {
        if self.qdq.is_some() {
            "cpu-qdq"
        } else {
            "cpu"
        }
    }

    fn execute(&self, op: &OpKind, inputs: &[&Tensor], out: &TensorType) -> Result<Storage, String> {
        let x = inputs[0];
        let shape = x.shape();
        let e = |err: kernels::KernelError| err.to_string();
        let data = match op {
            // Views keep the buffer: only the logical type changes.
            OpKind::View { .. } | OpKind::Unsqueeze { .. } => return Ok(x.storage().cloned().ok_or("no data")?),
            OpKind::Cast { to } => return cast(x, *to),
            OpKind::Transpose { dim0, dim1 } => {
                kernels::transpose(f32_of(x, "input")?, shape, *dim0 as isize, *dim1 as isize).map_err(e)?.0
            }
            OpKind::Permute { perm } => {
                let perm: Vec<isize> = perm.iter().map(|&p| p as isize).collect();
                kernels::permute(f32_of(x, "input")?, shape, &perm).map_err(e)?.0
            }
            OpKind::Slice { dim, start, end } => {
                kernels::slice(f32_of(x, "input")?, shape, *dim as isize, *start as isize, *end as isize).map_err(e)?.0
            }
            OpKind::Concat { dim } => {
                let parts =
                    inputs.iter().map(|t| Ok((f32_of(t, "input")?, t.shape()))).collect::<Result<Vec<_>, String>>()?;
                kernels::concat(&parts, *dim as isize).map_err(e)?.0
            }
            OpKind::Repeat { dim, times } => {
                kernels::repeat_interleave(f32_of(x, "input")?, shape, *dim as isize, *times).map_err(e)?.0
            }
            OpKind::MatMul => {
                let y = inputs[1];
                kernels::matmul(f32_of(x, "lhs")?, shape, f32_of(y, "rhs")?, y.shape()).map_err(e)?.0
            }
            OpKind::Add | OpKind::Sub | OpKind::Mul | OpKind::Equal => {
                let y = inputs[1];
                let (a, b) = (f32_of(x, "lhs")?, f32_of(y, "rhs")?);
                match op {
                    OpKind::Equal => kernels::equal(a, shape, b, y.shape()),
                    OpKind::Add => kernels::binary(BinaryOp::Add, a, shape, b, y.shape()),
                    OpKind::Sub => kernels::binary(BinaryOp::Sub, a, shape, b, y.shape()),
                    _ => kernels::binary(BinaryOp::Mul, a, shape, b, y.shape()),
                }
                .map_err(e)?
                .0
            }
            OpKind::Neg => kernels::unary(UnaryOp::Neg, f32_of(x, "input")?),
            OpKind::Sigmoid => kernels::unary(UnaryOp::Sigmoid, f32_of(x, "input")?),
            OpKind::Silu => kernels::unary(UnaryOp::Silu, f32_of(x, "input")?),
            OpKind::Softmax { dim } => kernels::softmax(f32_of(x, "input")?, shape, *dim as isize).map_err(e)?,
            OpKind::RmsNorm { eps } => {
                kernels::rms_norm(f32_of(x, "input")?, shape, f32_of(inputs[1], "weight")?, *eps).map_err(e)?
            }
            OpKind::Embedding => {
                let w = inputs[1];
                kernels::index_select(f32_of(w, "weight")?, w.shape(), 0, i64_of(x, "ids")?, shape).map_err(e)?.0
            }
            OpKind::Gather { dim } => {
                let idx = inputs[1];
                kernels::index_select(f32_of(x, "table")?, shape, *dim as isize, i64_of(idx, "indices")?, idx.shape())
                    .map_err(e)?
                    .0
            }
            OpKind::Conv2d => {
                // NHWC [N, H, W, In] x HWIO [1, 1, In, Out]: a [N*H*W, In] x [In, Out] product.
                let (w, k) = (inputs[1], shape[3]);
                let n = w.shape()[3];
                let bias = inputs.get(2).map(|b| f32_of(b, "bias")).transpose()?;
                kernels::linear_kn(f32_of(x, "input")?, x.numel() / k, k, f32_of(w, "weight")?, n, bias).map_err(e)?
            }
            OpKind::Linear => {
                let (w, k) = (inputs[1], *shape.last().unwrap_or(&1));
                let n = w.shape()[0];
                let bias = inputs.get(2).map(|b| f32_of(b, "bias")).transpose()?;
                kernels::linear_nk(f32_of(x, "input")?, x.numel() / k, k, f32_of(w, "weight")?, n, bias).map_err(e)?
            }
            OpKind::Reduce { kind, dim, keepdim } => {
                let kind = match kind {
                    ReduceKind::Min => KReduce::Min,
                    ReduceKind::Max => KReduce::Max,
                    ReduceKind::Mean => KReduce::Mean,
                };
                kernels::reduce(f32_of(x, "input")?, shape, *dim as isize, *keepdim, kind).map_err(e)?.0
            }
            OpKind::Where => {
                let (a, b) = (inputs[1], inputs[2]);
                kernels::where_(
                    f32_of(x, "condition")?,
                    shape,
                    f32_of(a, "on_true")?,
                    a.shape(),
                    f32_of(b, "on_false")?,
                    b.shape(),
                )
                .map_err(e)?
                .0
            }
        };
        if data.len() != out.numel() {
            return Err(format!("kernel produced {} elements, expected {} for {out}", data.len(), out.numel()));
        }
        Ok(out_f32(data))
    }

    fn qdq(&self, x: &Tensor, point: &QdqAttr) -> Result<Tensor, String> {
        let Some(hook) = &self.qdq else { return Ok(x.clone()) };
        let data = f32_of(x, "QDQ input")?;
        match hook.apply(point, data, x.shape())? {
            None => Ok(x.clone()),
            Some(new) => {
                let backend = x.backend().cloned().ok_or("QDQ input has no backend")?;
                Tensor::from_storage(x.ty().clone(), out_f32(new), backend).map_err(|e| e.to_string())
            }
        }
    }
}

/// Casts keep real values real (float and quantized dtypes all hold f32 data here: quantization
/// happens at QDQ points) and convert between real and integer storage.
fn cast(x: &Tensor, to: mllm_dsl::DType) -> Result<Storage, String> {
    let storage = x.storage().ok_or("cast of a tensor without data")?;
    Ok(match (storage, to.is_index()) {
        (Storage::F32(v), true) => Storage::I64(v.iter().map(|&f| f as i64).collect::<Vec<_>>().into()),
        (Storage::I64(v), false) => Storage::F32(v.iter().map(|&i| i as f32).collect::<Vec<_>>().into()),
        (s, _) => s.clone(),
    })
}

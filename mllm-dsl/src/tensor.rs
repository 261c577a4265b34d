//! `Tensor`: one torch-like handle for eager execution and tracing.
//!
//! An op on eager tensors is computed by their backend; an op on symbolic tensors (inside
//! [`trace`](crate::trace::trace)) is recorded as IR. Shape and dtype inference is shared, so a shape
//! error is the same typed [`Error::Op`] in both modes, raised at the user's call with the module path.

use crate::backend::{BackendRef, F32Buffer, Storage};
use crate::dtype::{fmt_shape, DType, TensorType};
use crate::error::{CallSite, Error, Result};
use crate::ir::ValueId;
use crate::op::{norm_dim, OpKind, ReduceKind};
use crate::qdq::{QdqAttr, QdqKind};
use crate::{scope, trace};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// How a tensor is represented.
#[derive(Clone)]
pub enum Repr {
    /// A value of the trace with this id.
    Traced { trace: u64, value: ValueId },
    /// An unloaded parameter: registered in `@init` with this symbol when a trace uses it.
    Param { key: Arc<str> },
    /// A scalar constant (`[1]`, f32), optionally with its own QDQ point.
    Constant { id: u64, value: f32, qdq: Option<QdqAttr> },
    /// Host data computed by a backend.
    Eager { storage: Storage, backend: BackendRef },
}

#[derive(Clone)]
pub struct Tensor {
    inner: Arc<(TensorType, Repr)>,
}

static NEXT_CONSTANT: AtomicU64 = AtomicU64::new(1);

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.repr() {
            Repr::Traced { .. } => "traced",
            Repr::Param { .. } => "param",
            Repr::Constant { .. } => "constant",
            Repr::Eager { .. } => "eager",
        };
        write!(f, "Tensor({kind}, {})", self.ty())
    }
}

impl AsRef<Tensor> for Tensor {
    fn as_ref(&self) -> &Tensor {
        self
    }
}

impl Tensor {
    pub(crate) fn from_repr(ty: TensorType, repr: Repr) -> Tensor {
        Tensor { inner: Arc::new((ty, repr)) }
    }

    /// An eager tensor holding `storage`, computed by `backend`.
    pub fn from_storage(ty: TensorType, storage: Storage, backend: BackendRef) -> Result<Tensor> {
        if storage.len() != ty.numel() {
            return Err(Error::msg(format!(
                "storage has {} elements but the type {ty} needs {}",
                storage.len(),
                ty.numel()
            )));
        }
        Ok(Tensor::from_repr(ty, Repr::Eager { storage, backend }))
    }

    /// An eager f32 tensor.
    pub fn from_f32(data: impl Into<F32Buffer>, shape: impl Into<Vec<usize>>, backend: BackendRef) -> Result<Tensor> {
        Tensor::from_storage(TensorType::new(shape, DType::F32), Storage::F32(data.into()), backend)
    }

    /// An eager integer tensor (token ids, positions).
    pub fn from_i64(
        data: impl Into<Arc<[i64]>>,
        shape: impl Into<Vec<usize>>,
        dtype: DType,
        backend: BackendRef,
    ) -> Result<Tensor> {
        Tensor::from_storage(TensorType::new(shape, dtype), Storage::I64(data.into()), backend)
    }

    /// A symbolic parameter (tracing without weights).
    pub fn param(key: &str, ty: TensorType) -> Tensor {
        Tensor::from_repr(ty, Repr::Param { key: key.into() })
    }

    /// A scalar f32 constant, `[1]`. Give it a QDQ point with `qdq!(const v, "name")`.
    pub fn scalar(value: f32) -> Tensor {
        let id = NEXT_CONSTANT.fetch_add(1, Ordering::Relaxed);
        Tensor::from_repr(TensorType::new(vec![1], DType::F32), Repr::Constant { id, value, qdq: None })
    }

    pub fn ty(&self) -> &TensorType {
        &self.inner.0
    }

    pub fn repr(&self) -> &Repr {
        &self.inner.1
    }

    pub fn shape(&self) -> &[usize] {
        &self.ty().shape
    }

    pub fn dtype(&self) -> DType {
        self.ty().dtype
    }

    pub fn rank(&self) -> usize {
        self.ty().rank()
    }

    pub fn numel(&self) -> usize {
        self.ty().numel()
    }

    /// Size of a dim (negative counts from the end).
    #[track_caller]
    pub fn dim(&self, d: i64) -> Result<usize> {
        let site = CallSite::here();
        let d = norm_dim(d, self.rank()).map_err(|e| op_error("dim", site, e.to_string()))?;
        Ok(self.shape()[d])
    }

    /// The eager data as f32 (floats, quantized types and bools), also when a backend's own data
    /// holds it as is ([`NativeData::dense_f32`](crate::NativeData::dense_f32)).
    pub fn as_f32(&self) -> Option<&[f32]> {
        match self.repr() {
            Repr::Eager { storage, .. } => storage.dense_f32().map(|v| &v[..]),
            _ => None,
        }
    }

    /// The eager data as i64 (ids, positions).
    pub fn as_i64(&self) -> Option<&[i64]> {
        match self.repr() {
            Repr::Eager { storage: Storage::I64(v), .. } => Some(v),
            _ => None,
        }
    }

    pub fn storage(&self) -> Option<&Storage> {
        match self.repr() {
            Repr::Eager { storage, .. } => Some(storage),
            _ => None,
        }
    }

    pub fn backend(&self) -> Option<&BackendRef> {
        match self.repr() {
            Repr::Eager { backend, .. } => Some(backend),
            _ => None,
        }
    }

    /// The same data with another logical type (used by backends, e.g. for casts).
    pub fn with_type(&self, ty: TensorType) -> Tensor {
        Tensor::from_repr(ty, self.repr().clone())
    }

    // ----- shape ops -------------------------------------------------------------------------

    /// Reshape; one dim may be `-1`.
    #[track_caller]
    pub fn view(&self, shape: &[i64]) -> Result<Tensor> {
        apply(OpKind::View { shape: shape.to_vec() }, &[self], None, CallSite::here())
    }

    /// Alias of [`view`](Self::view).
    #[track_caller]
    pub fn reshape(&self, shape: &[i64]) -> Result<Tensor> {
        apply(OpKind::View { shape: shape.to_vec() }, &[self], None, CallSite::here())
    }

    #[track_caller]
    pub fn transpose(&self, dim0: i64, dim1: i64) -> Result<Tensor> {
        let site = CallSite::here();
        let (dim0, dim1) = (self.norm("Transpose", dim0, site)?, self.norm("Transpose", dim1, site)?);
        apply(OpKind::Transpose { dim0, dim1 }, &[self], None, site)
    }

    #[track_caller]
    pub fn permute(&self, perm: &[usize]) -> Result<Tensor> {
        apply(OpKind::Permute { perm: perm.to_vec() }, &[self], None, CallSite::here())
    }

    #[track_caller]
    pub fn unsqueeze(&self, dim: i64) -> Result<Tensor> {
        let site = CallSite::here();
        // The new dim may be one past the last.
        let dim = norm_dim(dim, self.rank() + 1)
            .map_err(|m| op_error("Unsqueeze", site, format!("{m} (shape {})", fmt_shape(self.shape()))))?;
        apply(OpKind::Unsqueeze { dim }, &[self], None, site)
    }

    /// `x[..., start..end, ...]` along `dim`.
    #[track_caller]
    pub fn slice(&self, dim: i64, start: usize, end: usize) -> Result<Tensor> {
        let site = CallSite::here();
        let dim = self.norm("Slice", dim, site)?;
        apply(OpKind::Slice { dim, start, end }, &[self], None, site)
    }

    /// Concatenates along `dim`.
    #[track_caller]
    pub fn cat(tensors: &[&Tensor], dim: i64) -> Result<Tensor> {
        let site = CallSite::here();
        let first = tensors.first().ok_or_else(|| op_error("Concat", site, "needs at least one tensor".into()))?;
        let dim = first.norm("Concat", dim, site)?;
        apply(OpKind::Concat { dim }, tensors, None, site)
    }

    /// Repeat-interleave along `dim` (GQA: kv head h serves query heads h*times..(h+1)*times).
    #[track_caller]
    pub fn repeat_interleave(&self, times: usize, dim: i64) -> Result<Tensor> {
        let site = CallSite::here();
        let dim = self.norm("Repeat", dim, site)?;
        apply(OpKind::Repeat { dim, times }, &[self], None, site)
    }

    // ----- arithmetic ------------------------------------------------------------------------

    #[track_caller]
    pub fn matmul(&self, rhs: &Tensor) -> Result<Tensor> {
        apply(OpKind::MatMul, &[self, rhs], None, CallSite::here())
    }

    #[track_caller]
    pub fn add(&self, rhs: &Tensor) -> Result<Tensor> {
        apply(OpKind::Add, &[self, rhs], None, CallSite::here())
    }

    #[track_caller]
    pub fn sub(&self, rhs: &Tensor) -> Result<Tensor> {
        apply(OpKind::Sub, &[self, rhs], None, CallSite::here())
    }

    #[track_caller]
    pub fn mul(&self, rhs: &Tensor) -> Result<Tensor> {
        apply(OpKind::Mul, &[self, rhs], None, CallSite::here())
    }

    /// `x + c` with a plain constant (no QDQ point; for float-only code).
    #[track_caller]
    pub fn add_scalar(&self, c: f32) -> Result<Tensor> {
        apply(OpKind::Add, &[self, &Tensor::scalar(c)], None, CallSite::here())
    }

    /// `x * c` with a plain constant (no QDQ point; for float-only code).
    #[track_caller]
    pub fn mul_scalar(&self, c: f32) -> Result<Tensor> {
        apply(OpKind::Mul, &[self, &Tensor::scalar(c)], None, CallSite::here())
    }

    #[track_caller]
    pub fn neg(&self) -> Result<Tensor> {
        apply(OpKind::Neg, &[self], None, CallSite::here())
    }

    #[track_caller]
    pub fn sigmoid(&self) -> Result<Tensor> {
        apply(OpKind::Sigmoid, &[self], None, CallSite::here())
    }

    #[track_caller]
    pub fn silu(&self) -> Result<Tensor> {
        apply(OpKind::Silu, &[self], None, CallSite::here())
    }

    #[track_caller]
    pub fn softmax(&self, dim: i64) -> Result<Tensor> {
        let site = CallSite::here();
        let dim = self.norm("Softmax", dim, site)?;
        apply(OpKind::Softmax { dim }, &[self], None, site)
    }

    #[track_caller]
    pub fn reduce_min(&self, dim: i64, keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceKind::Min, dim, keepdim, CallSite::here())
    }

    #[track_caller]
    pub fn reduce_max(&self, dim: i64, keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceKind::Max, dim, keepdim, CallSite::here())
    }

    #[track_caller]
    pub fn mean(&self, dim: i64, keepdim: bool) -> Result<Tensor> {
        self.reduce(ReduceKind::Mean, dim, keepdim, CallSite::here())
    }

    fn reduce(&self, kind: ReduceKind, dim: i64, keepdim: bool, site: CallSite) -> Result<Tensor> {
        let op = OpKind::Reduce { kind, dim: 0, keepdim }.type_name();
        let dim = self.norm(op, dim, site)?;
        apply(OpKind::Reduce { kind, dim, keepdim }, &[self], None, site)
    }

    /// Elementwise `==`, giving a Bool tensor.
    #[track_caller]
    pub fn eq(&self, rhs: &Tensor) -> Result<Tensor> {
        apply(OpKind::Equal, &[self, rhs], None, CallSite::here())
    }

    /// `torch.where(self, on_true, on_false)`; `self` is the Bool condition.
    #[track_caller]
    pub fn where_cond(&self, on_true: &Tensor, on_false: &Tensor) -> Result<Tensor> {
        apply(OpKind::Where, &[self, on_true, on_false], None, CallSite::here())
    }

    /// `table.index_select(dim, indices)` (RoPE tables gathered by position ids).
    #[track_caller]
    pub fn gather(&self, dim: i64, indices: &Tensor) -> Result<Tensor> {
        let site = CallSite::here();
        let dim = self.norm("Gather", dim, site)?;
        apply(OpKind::Gather { dim }, &[self, indices], None, site)
    }

    /// Dtype cast (`.to(kFloat32)`, `.to(kUInt8PerTensorSym)`).
    #[track_caller]
    pub fn to(&self, dtype: DType) -> Result<Tensor> {
        apply(OpKind::Cast { to: dtype }, &[self], None, CallSite::here())
    }

    /// Normalizes a dim argument of `op`; the error names the op and this tensor's shape.
    fn norm(&self, op: &str, dim: i64, site: CallSite) -> Result<usize> {
        norm_dim(dim, self.rank()).map_err(|m| op_error(op, site, format!("{m} (shape {})", fmt_shape(self.shape()))))
    }
}

pub(crate) fn op_error(op: &str, site: CallSite, message: String) -> Error {
    Error::Op { op: op.to_string(), module_path: scope::current_path(), site, message }
}

/// Applies an op: infers its output type, then records it (tracing) or computes it (eager).
/// Layers pass their path as `name`; anonymous ops are named by the trace.
pub fn apply(kind: OpKind, inputs: &[&Tensor], name: Option<&str>, site: CallSite) -> Result<Tensor> {
    // An eager decode step applies a few thousand ops: the input types of the usual one to four
    // inputs stay on the stack.
    const ON_STACK: usize = 4;
    static UNUSED: TensorType = TensorType { shape: Vec::new(), dtype: DType::F32, device: crate::Device::Cpu };
    let out_ty = if inputs.len() <= ON_STACK {
        let mut types = [&UNUSED; ON_STACK];
        for (slot, t) in types.iter_mut().zip(inputs) {
            *slot = t.ty();
        }
        kind.infer(&types[..inputs.len()])
    } else {
        kind.infer(&inputs.iter().map(|t| t.ty()).collect::<Vec<_>>())
    };
    let out_ty = out_ty.map_err(|m| op_error(kind.type_name(), site, m.to_string()))?;
    if trace::is_tracing() {
        return trace::record(kind, inputs, out_ty, name.map(str::to_string));
    }
    let backend = inputs
        .iter()
        .find_map(|t| t.backend())
        .ok_or_else(|| {
            let what = if inputs.iter().any(|t| matches!(t.repr(), Repr::Traced { .. })) {
                "a traced tensor was used outside its trace"
            } else if inputs.iter().any(|t| matches!(t.repr(), Repr::Param { .. })) {
                "a parameter has no data: bind the model to a weight store before running it"
            } else {
                "no input has data (only constants)"
            };
            op_error(kind.type_name(), site, what.to_string())
        })?
        .clone();
    // Eager inputs go to the backend as they are; constants and parameters are materialized.
    let owned: Vec<Tensor>;
    let refs: Vec<&Tensor>;
    let inputs = if inputs.iter().all(|t| matches!(t.repr(), Repr::Eager { .. })) {
        inputs
    } else {
        owned = inputs.iter().map(|t| materialize(t, &backend, site, kind.type_name())).collect::<Result<_>>()?;
        refs = owned.iter().collect();
        &refs
    };
    let storage = backend.execute(&kind, inputs, &out_ty).map_err(|m| Error::Backend {
        op: format!("{} ({})", name.unwrap_or(kind.type_name()), site),
        module_path: scope::current_path(),
        message: m.to_string(),
    })?;
    Tensor::from_storage(out_ty, storage, backend)
}

/// Turns constants and parameters into eager tensors of `backend` (constants get their QDQ applied).
pub(crate) fn materialize(t: &Tensor, backend: &BackendRef, site: CallSite, op: &str) -> Result<Tensor> {
    match t.repr() {
        Repr::Eager { .. } => Ok(t.clone()),
        Repr::Constant { value, qdq, .. } => {
            let c = Tensor::from_f32(vec![*value], vec![1], backend.clone())?;
            match qdq {
                Some(q) => backend.qdq(&c, q).map_err(|e| op_error(op, site, e.to_string())),
                None => Ok(c),
            }
        }
        Repr::Param { key } => {
            Err(op_error(op, site, format!("parameter `{key}` has no data: bind the model to a weight store")))
        }
        Repr::Traced { .. } => Err(op_error(op, site, "a traced tensor was used outside its trace".into())),
    }
}

/// Applies a QDQ point (the function behind `qdq!`).
pub fn apply_qdq(x: &Tensor, name: &str, kind: QdqKind, site: CallSite) -> Result<Tensor> {
    // The module path only goes into errors (this call's frame is still the innermost).
    let err =
        |message: String| Error::Qdq { name: name.to_string(), module_path: scope::current_path(), site, message };
    let Some(key) = scope::claim_qdq(name, matches!(kind, QdqKind::Global { .. })) else {
        return Err(err("this QDQ name is already used in this module call; each QDQ point needs its own name".into()));
    };
    let dtype = x.dtype();
    let dtype_ok = match &kind {
        QdqKind::Activation | QdqKind::Fixed { .. } => dtype.is_float() || dtype == DType::U16Asym,
        QdqKind::KvCache => dtype == DType::U8Sym,
        QdqKind::Constant => matches!(x.repr(), Repr::Constant { .. }),
        QdqKind::Rope | QdqKind::Global { .. } => dtype.is_numeric(),
    };
    if !dtype_ok {
        let expected = match &kind {
            QdqKind::KvCache => "a UInt8PerTensorSym tensor (cast the K/V with .to(DType::U8Sym) first)",
            QdqKind::Constant => "a scalar constant",
            _ => "a float or UInt16PerTensorAsy tensor",
        };
        return Err(err(format!("expects {expected}, got {dtype}")));
    }
    let attr = QdqAttr { kind, key };
    if let Repr::Constant { id, value, qdq } = x.repr() {
        if let Some(old) = qdq {
            return Err(err(format!("constant already carries QDQ '{}'", old.key)));
        }
        return Ok(Tensor::from_repr(x.ty().clone(), Repr::Constant { id: *id, value: *value, qdq: Some(attr) }));
    }
    if trace::is_tracing() {
        trace::annotate_qdq(x, attr).map_err(|e| err(e.to_string()))?;
        return Ok(x.clone());
    }
    match x.backend() {
        Some(b) => b.qdq(x, &attr).map_err(|e| err(e.to_string())),
        None => Err(err("needs an eager tensor outside tracing".into())),
    }
}

//! The eager side: what a backend implements so that model files run (CPU float, fake-quant,
//! calibration observers, ...). The core infers shapes and dtypes; the backend only computes.

use crate::dtype::TensorType;
use crate::fused::Fused;
use crate::op::OpKind;
use crate::qdq::QdqAttr;
use crate::tensor::Tensor;
use std::any::Any;
use std::fmt;
use std::sync::Arc;

/// Host data of an eager tensor. Real-valued data (float and quantized dtypes, booleans as 0/1) is
/// held as f32; token ids and positions as i64. A backend may also keep data in a layout of its own
/// ([`Storage::Native`]), e.g. the CPU backend's weights packed for its matrix kernels in bf16.
#[derive(Clone, Debug)]
pub enum Storage {
    F32(F32Buffer),
    I64(Arc<[i64]>),
    Native(Arc<dyn NativeData>),
}

/// Shared, immutable f32 data of an eager tensor.
///
/// Made from a `Vec` without copying it: a kernel's output becomes a tensor as is (an `Arc<[f32]>`
/// would copy every op's output once more, serially, between the kernels).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct F32Buffer(Arc<Vec<f32>>);

impl F32Buffer {
    /// The values, writable while no other tensor shares them.
    pub fn get_mut(&mut self) -> Option<&mut [f32]> {
        Arc::get_mut(&mut self.0).map(Vec::as_mut_slice)
    }

    /// The vector itself while no other tensor shares it, so its allocation can be refilled.
    pub fn vec_mut(&mut self) -> Option<&mut Vec<f32>> {
        Arc::get_mut(&mut self.0)
    }

    /// A weak reference to the values: while it lives their address is not reused, and they are
    /// not kept alive (a backend's record of which buffer it has seen).
    pub fn downgrade(&self) -> std::sync::Weak<Vec<f32>> {
        Arc::downgrade(&self.0)
    }
}

impl std::ops::Deref for F32Buffer {
    type Target = [f32];

    fn deref(&self) -> &[f32] {
        &self.0
    }
}

impl From<Vec<f32>> for F32Buffer {
    fn from(v: Vec<f32>) -> Self {
        F32Buffer(Arc::new(v))
    }
}

/// Shares the vector (no copy): a backend reading a buffer it does not own, such as the runtime's
/// KV cache.
impl From<Arc<Vec<f32>>> for F32Buffer {
    fn from(v: Arc<Vec<f32>>) -> Self {
        F32Buffer(v)
    }
}

impl From<&[f32]> for F32Buffer {
    fn from(v: &[f32]) -> Self {
        v.to_vec().into()
    }
}

impl<const N: usize> From<[f32; N]> for F32Buffer {
    fn from(v: [f32; N]) -> Self {
        v.to_vec().into()
    }
}

impl FromIterator<f32> for F32Buffer {
    fn from_iter<I: IntoIterator<Item = f32>>(iter: I) -> Self {
        iter.into_iter().collect::<Vec<_>>().into()
    }
}

/// Data in a backend's own layout. The core only needs its element count; the backend that made
/// it reads it back with [`NativeData::downcast_ref`].
pub trait NativeData: Any + Send + Sync + fmt::Debug {
    /// Number of logical elements (the product of the tensor's shape).
    fn len(&self) -> usize;

    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `self` as [`Any`], for downcasting to the concrete type.
    fn as_any(&self) -> &dyn Any;

    /// The logical f32 values, for data that holds them as they are (with something beside them
    /// that only its backend reads); `None` when they would have to be computed.
    fn dense_f32(&self) -> Option<&F32Buffer> {
        None
    }
}

impl dyn NativeData {
    /// The concrete data, if it is a `T`.
    pub fn downcast_ref<T: NativeData>(&self) -> Option<&T> {
        self.as_any().downcast_ref()
    }
}

impl Storage {
    /// The f32 values held as they are: f32 storage, or native data that holds them
    /// ([`NativeData::dense_f32`]); `None` for integers and data whose values must be computed.
    pub fn dense_f32(&self) -> Option<&F32Buffer> {
        match self {
            Storage::F32(v) => Some(v),
            Storage::Native(data) => data.dense_f32(),
            Storage::I64(_) => None,
        }
    }

    pub fn len(&self) -> usize {
        match self {
            Storage::F32(v) => v.len(),
            Storage::I64(v) => v.len(),
            Storage::Native(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Why a backend could not run an op or apply a QDQ point. The core wraps it with the op, module
/// path and call site ([`crate::Error::Backend`], [`crate::Error::Qdq`]).
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum BackendError {
    /// The op cannot run on these inputs (a kernel's shape or dtype check, an input without data).
    #[error("{0}")]
    Op(String),
    /// The QDQ point cannot be applied (its quantization parameters are missing or invalid).
    #[error("QDQ point '{key}': {message}")]
    Qdq { key: String, message: String },
}

/// Executes ops on eager tensors.
pub trait Backend: Send + Sync {
    /// Short name for error messages (`cpu`, `cpu-fakequant`).
    fn name(&self) -> &str;

    /// Computes `op` on `inputs`; `out` is the output type the core inferred. The core adds the
    /// op, module path and call site to an error.
    fn execute(&self, op: &OpKind, inputs: &[&Tensor], out: &TensorType) -> Result<Storage, BackendError>;

    /// Applies a QDQ point: the identity in float mode, quantize-dequantize in fake-quant mode,
    /// observation during calibration.
    fn qdq(&self, x: &Tensor, point: &QdqAttr) -> Result<Tensor, BackendError>;

    /// Whether [`Backend::fused`] may compute `kind` (the core then prepares its inputs); `false`
    /// (the default) runs the step op by op without asking.
    fn fuses(&self, kind: Fused) -> bool {
        let _ = kind;
        false
    }

    /// Computes the fused step `kind` ([`crate::fused`]) on `inputs` with its QDQ `points`, or
    /// `None` to have the step run op by op (the default). A backend offers only what it computes
    /// exactly as the ops and points would.
    fn fused(&self, kind: Fused, inputs: &[&Tensor], points: &[QdqAttr]) -> Option<Result<Tensor, BackendError>> {
        let _ = (kind, inputs, points);
        None
    }
}

/// A shareable backend handle.
pub type BackendRef = Arc<dyn Backend>;

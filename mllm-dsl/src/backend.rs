//! The eager side: what a backend implements so that model files run (CPU float, fake-quant,
//! calibration observers, ...). The core infers shapes and dtypes; the backend only computes.

use crate::dtype::TensorType;
use crate::op::OpKind;
use crate::qdq::QdqAttr;
use crate::tensor::Tensor;
use std::sync::Arc;

/// Host data of an eager tensor. Real-valued data (float and quantized dtypes, booleans as 0/1) is
/// held as f32; token ids and positions as i64.
#[derive(Clone, Debug)]
pub enum Storage {
    F32(Arc<[f32]>),
    I64(Arc<[i64]>),
}

impl Storage {
    pub fn len(&self) -> usize {
        match self {
            Storage::F32(v) => v.len(),
            Storage::I64(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Executes ops on eager tensors.
pub trait Backend: Send + Sync {
    /// Short name for error messages (`cpu`, `cpu-fakequant`).
    fn name(&self) -> &str;

    /// Computes `op` on `inputs`; `out` is the output type the core inferred. Errors are plain
    /// messages; the core adds the op, module path and call site.
    fn execute(&self, op: &OpKind, inputs: &[&Tensor], out: &TensorType) -> Result<Storage, String>;

    /// Applies a QDQ point: the identity in float mode, quantize-dequantize in fake-quant mode,
    /// observation during calibration.
    fn qdq(&self, x: &Tensor, point: &QdqAttr) -> Result<Tensor, String>;
}

/// A shareable backend handle.
pub type BackendRef = Arc<dyn Backend>;

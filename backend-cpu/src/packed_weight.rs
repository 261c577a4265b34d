//! [`PackedWeight`]: the storage of a weight tensor whose data is a [`PackedMatrix`] (bf16 or f32
//! panels for the linear kernels) instead of a plain f32 buffer.
//!
//! The store packs linear, conv and embedding weights of float checkpoints this way, so bf16
//! checkpoints stay bf16 in memory (half the bytes each decode step streams) and a tied embedding
//! and LM head share one matrix. The executor runs `Conv2d`, `Linear` and `Embedding` on the
//! packed data directly; any other op sees the weight as f32 in its logical layout.

use crate::kernels::PackedMatrix;
use mllm_dsl::{BackendRef, DType, NativeData, Result, Storage, Tensor, TensorType};
use std::any::Any;
use std::sync::Arc;

/// How a tensor's logical layout maps onto its packed `[K, N]` matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightView {
    /// `[.., K, N]`, e.g. a HWIO 1×1 conv weight `[1, 1, in, out]`.
    KN,
    /// `[N, K]`: the rows the matrix was packed from, e.g. an `nn.Linear` weight `[out, in]` or an
    /// embedding table `[vocab, hidden]`.
    NK,
}

#[derive(Debug, Clone)]
pub struct PackedWeight {
    pub matrix: Arc<PackedMatrix>,
    pub view: WeightView,
}

impl NativeData for PackedWeight {
    fn len(&self) -> usize {
        self.matrix.k() * self.matrix.n()
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl PackedWeight {
    /// An eager f32 tensor of `shape` (whose element count must be `K * N`) backed by this weight.
    pub fn into_tensor(self, shape: Vec<usize>, backend: BackendRef) -> Result<Tensor> {
        Tensor::from_storage(TensorType::new(shape, DType::F32), Storage::Native(Arc::new(self)), backend)
    }

    /// The values in the tensor's logical (row-major) layout.
    pub fn to_f32(&self) -> Vec<f32> {
        match self.view {
            WeightView::KN => self.matrix.to_kn_f32(),
            WeightView::NK => self.matrix.to_nk_f32(),
        }
    }
}

/// The packed weight behind `t`, if it has one.
pub fn packed_of(t: &Tensor) -> Option<&PackedWeight> {
    match t.storage()? {
        Storage::Native(data) => data.downcast_ref::<PackedWeight>(),
        _ => None,
    }
}

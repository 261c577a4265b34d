//! Where PTQ gets quantization parameters and weight metadata from.
//!
//! [`QuantParamProvider`] is what mllm's `ParameterFile` is to its PTQ pass: QDQ scales and zero
//! points (`<key>.fake_quant.scale` / `.zero_point`), per-tensor weight parameters (`<op>.scale` /
//! `.zero_point`), and the dtype and shape of stored weights. Weights themselves are never read
//! into the IR: specs keep their keys. backend-cpu implements the trait for safetensors
//! checkpoints; [`SyntheticParams`](super::SyntheticParams) makes up consistent parameters for
//! benches.

use crate::quant::spec::{QuantParams, KV_ZERO_POINT};
use mllm_dsl::dtype::DType;
use mllm_dsl::qdq::{QdqAttr, QdqKind};

/// Dtype and shape of a stored tensor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredTensor {
    pub dtype: DType,
    pub shape: Vec<usize>,
}

impl StoredTensor {
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

/// A parameter that is missing, malformed or out of range.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{provider}: tensor `{key}`: {message}")]
pub struct ParamError {
    /// What was asked (`checkpoint fixtures/x/model.safetensors`, `synthetic parameters`).
    pub provider: String,
    pub key: String,
    pub message: String,
}

/// Quantization parameters and stored-weight metadata, by checkpoint key.
pub trait QuantParamProvider: Send + Sync {
    /// A short description for error messages.
    fn name(&self) -> String;

    /// Dtype and shape of a stored tensor, without reading it; `Ok(None)` when absent.
    fn tensor(&self, key: &str) -> Result<Option<StoredTensor>, ParamError>;

    /// A small real-valued tensor (a scale); an error when absent.
    fn read_f32(&self, key: &str) -> Result<Vec<f32>, ParamError>;

    /// A small integer tensor (a zero point); an error when absent.
    fn read_i32(&self, key: &str) -> Result<Vec<i32>, ParamError>;

    /// `(min, max)` over the elements of an integer tensor, for range checks of stored codes;
    /// `Ok(None)` when the provider holds no data for it (metadata only).
    fn int_range(&self, key: &str) -> Result<Option<(i64, i64)>, ParamError>;

    /// The stored bytes of a tensor, little-endian in its stored dtype (see [`tensor`](Self::tensor)),
    /// for backends that embed weights as they are stored (the QNN lowering). Providers that hold
    /// no weight data (metadata only) keep this default, an error.
    fn read_bytes(&self, key: &str) -> Result<Vec<u8>, ParamError> {
        Err(self.error(key, "this provider holds parameters only, no weight data".into()))
    }

    /// Hands the stored bytes of `key` (as [`read_bytes`](Self::read_bytes) returns them) to
    /// `visit` in one piece. Providers that can lend them without a copy (a memory-mapped
    /// checkpoint) override this, so a backend that re-encodes a weight allocates only its result.
    fn with_stored_bytes(&self, key: &str, visit: &mut dyn FnMut(&[u8])) -> Result<(), ParamError> {
        visit(&self.read_bytes(key)?);
        Ok(())
    }

    /// An error about `key` from this provider.
    fn error(&self, key: &str, message: String) -> ParamError {
        ParamError { provider: self.name(), key: key.to_string(), message }
    }

    /// One scalar `f32` (a `[1]` scale).
    fn scalar_f32(&self, key: &str) -> Result<f32, ParamError> {
        match self.read_f32(key)?.as_slice() {
            [v] => Ok(*v),
            other => Err(self.error(key, format!("expected one value, found {}", other.len()))),
        }
    }

    /// One scalar `i32` (a `[1]` zero point).
    fn scalar_i32(&self, key: &str) -> Result<i32, ParamError> {
        match self.read_i32(key)?.as_slice() {
            [v] => Ok(*v),
            other => Err(self.error(key, format!("expected one value, found {}", other.len()))),
        }
    }
}

/// The per-tensor parameters of a QDQ point, as mllm's QDQ helpers attach them: fixed kinds carry
/// their own, the others come from `<key>.fake_quant.{scale, zero_point}`; KV points must have zero
/// point 128 (`QDQ_KV`'s assertion).
pub fn qdq_params(point: &QdqAttr, provider: &dyn QuantParamProvider) -> Result<QuantParams, ParamError> {
    let (qmin, qmax) = point.kind.qrange();
    let (scale, zero_point, key) = match point.fixed_params() {
        Some((s, z)) => (s, z, point.key.clone()),
        None => {
            let scale_key = point.scale_key();
            let scale = provider.scalar_f32(&scale_key)?;
            let zp_key = point.zero_point_key();
            let zero_point = provider.scalar_i32(&zp_key)?;
            if point.kind == QdqKind::KvCache && zero_point != KV_ZERO_POINT {
                return Err(provider.error(
                    &zp_key,
                    format!("a KV cache QDQ must have zero point {KV_ZERO_POINT} (u8 'symmetric'), found {zero_point}"),
                ));
            }
            (scale, zero_point, scale_key)
        }
    };
    QuantParams::new(scale, zero_point, qmin, qmax).map_err(|e| provider.error(&key, e.to_string()))
}

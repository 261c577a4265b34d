//! Quantization math of mllm's W4A16KV8 QNN recipe, as pure functions over `f32` slices.
//!
//! Everything here reproduces what mllm's Python side (pymllm on top of torch / torchao) computes,
//! bit for bit where the oracle allows checking it:
//! - [`spec`]: per-tensor parameters and the kinds of QDQ points a model file declares;
//! - [`fake_quant`]: torch's `fake_quantize_per_tensor_affine` and integer codes;
//! - [`observer`]: min/max observers that turn calibration data into parameters;
//! - [`act_range`]: percentile and clipping-error ranges on a bounded [`histogram`];
//! - [`lpbq`]: int4 linear weights with low-power blockwise (two-level) scales;
//! - [`int8_channel`]: per-channel int8 linear weights, for the linears a mixed recipe raises;
//! - [`lpbq_search`]: LPBQ scales chosen by (activation-weighted) error search on the deployed grid;
//! - [`seqmse`]: LPBQ scales chosen for the least error of the layer's output (SeqMSE);
//! - [`uint16`]: per-tensor u16 weights of RMSNorm and Embedding;
//! - [`points`]: the QDQ points, concatenation groups and layer outputs of a traced program.
//!
//! The tensor and IR code calls into these; apart from [`points`], which reads a traced program,
//! nothing here knows about tensors or graphs.

pub mod act_range;
pub mod fake_quant;
pub mod histogram;
pub mod int8_channel;
pub mod lpbq;
pub mod lpbq_search;
pub mod observer;
pub mod points;
pub mod seqmse;
pub mod spec;
pub mod uint16;

mod rounding;

/// Fixed pseudo-random samples the quantization tests share.
#[cfg(test)]
pub(crate) mod test_data {
    /// `n` values uniform in `[-0.5, 0.5)` from a 32-bit LCG.
    pub fn uniform(n: usize, seed: u32) -> Vec<f32> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                (s >> 8) as f32 / (1u32 << 24) as f32 - 0.5
            })
            .collect()
    }

    /// Heavy tails like trained weights: `u^3 * scale` of [`uniform`] values.
    pub fn cubed(n: usize, seed: u32, scale: f32) -> Vec<f32> {
        uniform(n, seed).into_iter().map(|u| u * u * u * scale).collect()
    }
}

pub use fake_quant::{dequantize, fake_quantize, quantize, FakeQuantizer};
pub use lpbq::{decode_lpbq, quantize_lpbq, LpbqBlockQuant, LpbqExport, LpbqShape};
pub use observer::{calculate_qparams, min_max_of, ConcatObserver, ConcatSharing, MinMaxObserver, ObserverScheme};
pub use spec::{QdqKind, QuantParams, StorageType};
pub use uint16::{decode_u16, export_u16, quantize_u16_weight, U16Weight};

/// Why a quantization step refused its input.
///
/// The functions here work on bare slices and do not know tensor names; callers add the name
/// with [`QuantError::in_tensor`].
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum QuantError {
    #[error(
        "invalid quantization parameters (scale {scale}, zero_point {zero_point}, range {qmin}..={qmax}): {reason}"
    )]
    InvalidParams { scale: f32, zero_point: i32, qmin: i32, qmax: i32, reason: &'static str },
    #[error("{what}: expected {expected} elements, found {found}")]
    LengthMismatch { what: &'static str, expected: usize, found: usize },
    #[error("LPBQ block size must be greater than 0")]
    ZeroBlockSize,
    #[error("LPBQ block size {block_size} does not divide the input width {in_features}")]
    BlockSizeDoesNotDivide { block_size: usize, in_features: usize },
    #[error("{what} has an empty dimension ({out_features} x {in_features})")]
    EmptyShape { what: &'static str, out_features: usize, in_features: usize },
    #[error("{what}: element {index} is {value}, expected a finite number")]
    NonFinite { what: &'static str, index: usize, value: f32 },
    #[error("{what}: element {index} is {value}, expected a value in {min}..={max}")]
    CodeOutOfRange { what: &'static str, index: usize, value: i64, min: i64, max: i64 },
    #[error("{what}: element {index} is {value}, expected a finite value > 0")]
    BadScale { what: &'static str, index: usize, value: f32 },
    #[error("observer has seen no data, so it has no range to compute parameters from")]
    Unobserved,
    #[error("observer has seen a non-finite value (range {min}..{max}); parameters would be meaningless")]
    NonFiniteObservation { min: f32, max: f32 },
    #[error("parameters {params:?} do not fit the {storage:?} storage range")]
    StorageRange { params: QuantParams, storage: StorageType },
    #[error("tensor `{tensor}`: {source}")]
    InTensor { tensor: String, source: Box<QuantError> },
}

impl QuantError {
    /// Names the tensor the failing data belongs to.
    pub fn in_tensor(self, tensor: impl Into<String>) -> QuantError {
        QuantError::InTensor { tensor: tensor.into(), source: Box::new(self) }
    }
}

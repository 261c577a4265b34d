//! [`QuantizationError`]: what can go wrong loading, calibrating, exporting or evaluating a
//! quantized model. Every variant names the checkpoint key, QDQ point or file involved.

use std::path::PathBuf;

use compiler::aot_config::AotConfigError;
use compiler::quant::points::PointsError;
use compiler::quant::QuantError;

use checkpoint::CheckpointError;

#[derive(Debug, thiserror::Error)]
pub enum QuantizationError {
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    #[error("`{key}`: {source}")]
    Quant {
        key: String,
        #[source]
        source: QuantError,
    },
    #[error("QDQ parameter `{key}`: {problem}")]
    BadParam { key: String, problem: String },
    #[error(
        "KV cache QDQ `{point}`: zero point `{key}` is {found}, expected 128 (mllm stores the uint8 KV cache \
         with the fixed QNN offset -128)"
    )]
    KvZeroPoint { point: String, key: String, found: i32 },
    #[error("fixed QDQ `{point}`: the model file fixes {expected} but the checkpoint's `{key}` holds {found}")]
    FixedMismatch { point: String, key: String, expected: String, found: String },
    #[error("QDQ point `{key}` was never reached during calibration, so it has no range to compute parameters from")]
    Unobserved { key: String },
    #[error("calibration data: {0}")]
    CalibrationData(String),
    #[error(transparent)]
    Points(#[from] PointsError),
    #[error(transparent)]
    AotConfig(#[from] AotConfigError),
    #[error("LPBQ block size: {0}")]
    BlockSize(String),
    #[error("parameter `{key}`: {problem}")]
    Param { key: String, problem: String },
    #[error("model: {0}")]
    Model(#[from] mllm_dsl::Error),
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Report(String),
}

impl QuantizationError {
    pub(crate) fn quant(key: impl Into<String>, source: QuantError) -> Self {
        QuantizationError::Quant { key: key.into(), source }
    }

    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        QuantizationError::Io { path: path.into(), source }
    }
}

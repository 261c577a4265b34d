//! Errors of GGUF reading and conversion; each names the file and the tensor, metadata key or
//! header field at fault, and what was expected.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The header, metadata or tensor table is malformed; `field` names what was being read.
    #[error("{path}: corrupt GGUF file at byte {offset} ({field}): {reason}")]
    Corrupt { path: PathBuf, offset: u64, field: String, reason: String },
    #[error("{path}: tensor '{tensor}': {reason}")]
    BadTensor { path: PathBuf, tensor: String, reason: String },
    #[error(
        "{path}: tensor '{tensor}' has ggml type {ggml_type}, which cannot be dequantized (supported: {})",
        super::SUPPORTED_TYPES
    )]
    UnsupportedType { path: PathBuf, tensor: String, ggml_type: String },
    #[error("{path}: tensor '{tensor}' not found")]
    MissingTensor { path: PathBuf, tensor: String },
    #[error("{path}: metadata key '{key}' is missing (expected {expected})")]
    MissingKey { path: PathBuf, key: String, expected: String },
    #[error("{path}: metadata key '{key}' must be {expected}, found {found}")]
    WrongKeyType { path: PathBuf, key: String, expected: String, found: String },
    #[error("{path}: metadata key '{key}' is invalid: {reason}")]
    InvalidKey { path: PathBuf, key: String, reason: String },
    #[error("cannot write {path}: {reason}")]
    Write { path: PathBuf, reason: String },
    /// Staging, writing or moving the converted directory (the error names the path).
    #[error(transparent)]
    File(#[from] mllm_dsl::files::FileError),
}

//! Errors of checkpoint reading and writing; each names the file and, where there is one, the tensor.

use std::path::PathBuf;

use super::StDtype;

#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "no safetensors checkpoint in {dir}: expected model.safetensors or \
         model.safetensors.index.json"
    )]
    NotFound { dir: PathBuf },
    #[error("{path}: invalid shard index: {reason}")]
    BadIndex { path: PathBuf, reason: String },
    #[error("{path}: corrupt safetensors file: {reason}")]
    Corrupt { path: PathBuf, reason: String },
    #[error("{index} maps tensor '{key}' to {shard}, which does not contain it")]
    ShardMissingTensor { index: PathBuf, key: String, shard: PathBuf },
    #[error("tensor '{key}' is stored twice: in {first} and in {second}")]
    DuplicateTensor { key: String, first: PathBuf, second: PathBuf },
    #[error(
        "tensor '{key}' not found in checkpoint {checkpoint}{}{}",
        requester_suffix(requested_by),
        near_suffix(near)
    )]
    MissingTensor {
        checkpoint: PathBuf,
        key: String,
        /// Module path of the layer that asked for it; empty until a loader attaches it with
        /// [`CheckpointError::requested_by`].
        requested_by: String,
        /// Up to 3 stored keys closest by edit distance, nearest first.
        near: Vec<String>,
    },
    #[error("tensor '{key}' in {path}: expected dtype {expected}, found {found}")]
    DtypeMismatch { key: String, path: PathBuf, expected: String, found: StDtype },
    #[error("tensor '{key}' in {path} has dtype {dtype}, which cannot be converted to f32")]
    UnsupportedDtype { key: String, path: PathBuf, dtype: StDtype },
    #[error(
        "tensor '{key}' in {path}: element {index} is {value} as f32; a float parameter must be finite \
         (inf or NaN would silently poison every output)"
    )]
    NonFinite { key: String, path: PathBuf, index: usize, value: f32 },
    #[error("{config} field `{field}` does not match the checkpoint {checkpoint}: {reason}")]
    ConfigMismatch { config: PathBuf, field: String, checkpoint: PathBuf, reason: String },
    #[error("cannot write {path}: {reason}")]
    Write { path: PathBuf, reason: String },
    #[error(transparent)]
    File(#[from] mllm_dsl::files::FileError),
}

impl CheckpointError {
    /// Names the module that asked for a missing tensor, for errors like "q_proj weight missing,
    /// requested by model.layers.3.self_attn.q_proj". Other errors pass through unchanged.
    pub fn requested_by(mut self, module_path: impl Into<String>) -> Self {
        if let CheckpointError::MissingTensor { requested_by, .. } = &mut self {
            *requested_by = module_path.into();
        }
        self
    }
}

fn requester_suffix(requested_by: &str) -> String {
    if requested_by.is_empty() {
        String::new()
    } else {
        format!(" (requested by {requested_by})")
    }
}

fn near_suffix(near: &[String]) -> String {
    if near.is_empty() {
        "; no similar keys".to_string()
    } else {
        format!("; similar keys: {}", near.join(", "))
    }
}

//! Hugging Face safetensors checkpoints: reading (single file or sharded, memory-mapped,
//! converted on demand) and atomic writing.
//!
//! This module knows bytes, dtypes and shapes only; mapping tensor names onto model layers is
//! the loaders' job. Loaders attach their module path to a missing-tensor error with
//! [`CheckpointError::requested_by`] and can warn about [`SafetensorsCheckpoint::unused_keys`].

mod convert;
mod error;
mod mapped_file;
mod near;
mod reader;
mod writer;

pub use convert::LeScalar;
pub use error::CheckpointError;
pub use reader::{SafetensorsCheckpoint, SHARD_INDEX, SINGLE_FILE};
pub use writer::{write_safetensors_atomic, TensorBytes};

/// Element type of a stored tensor, as the safetensors format names it.
pub use safetensors::Dtype as StDtype;

#[cfg(test)]
mod tests;

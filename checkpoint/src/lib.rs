//! Checkpoint files, reachable by both backends and the tools: Hugging Face safetensors
//! checkpoints read (single file or sharded, memory-mapped, converted on demand) and written
//! atomically, GGUF files read and converted to HF directories ([`gguf`]), a directory's chat template
//! rendered ([`ChatTemplate`]), and a checkpoint's stored quantization parameters served to mllm-dsl's PTQ pass.
//!
//! ```no_run
//! let ckpt = checkpoint::SafetensorsCheckpoint::open("fixtures/qwen3-dev-f32")?;
//! let weight: Vec<f32> = ckpt.read_f32("model.norm.weight")?;
//! # Ok::<(), checkpoint::CheckpointError>(())
//! ```
//!
//! This crate knows bytes, dtypes and shapes only; mapping tensor names onto model layers is
//! the loaders' job. Loaders attach their module path to a missing-tensor error with
//! [`CheckpointError::requested_by`] and can warn about [`SafetensorsCheckpoint::unused_keys`].

mod chat_template;
mod consistency;
mod convert;
mod error;
pub mod gguf;
mod mapped_file;
mod near;
mod reader;
mod writer;
// The checkpoint as the PTQ pass's `compiler::passes::QuantParamProvider`.
mod ptq_params;

pub use chat_template::{ChatMessage, ChatTemplate, ChatTemplateError, CHAT_TEMPLATE_FILE, TOKENIZER_CONFIG_FILE};
pub use consistency::check_config;
pub use convert::LeScalar;
pub use error::CheckpointError;
pub use mapped_file::MappedBytes;
pub use reader::{SafetensorsCheckpoint, SHARD_INDEX, SINGLE_FILE};
pub use writer::{write_safetensors_atomic, TensorBytes};

/// Element type of a stored tensor, as the safetensors format names it.
pub use safetensors::Dtype as StDtype;

#[cfg(test)]
mod tests;

//! Model files written with mllm-dsl.
//!
//! Each model is one file in mllm's QNN-AOT form that also runs in float on plain HF checkpoints.
//! [`io`] describes the graph inputs every model takes (ids, positions, mask, KV cache).

pub mod config;
pub mod io;
pub mod qwen3;
pub mod rope;

pub use config::TransformerConfig;

use mllm_dsl::config::hf::{HfConfig, ModelType};
use mllm_dsl::{CausalLm, Error, Result};

/// Builds the model file for an HF checkpoint's `model_type` (unbound: bind it to weights or
/// declare symbolic parameters next). RoPE tables cover positions `0..max_positions`.
pub fn build(hf: &HfConfig, max_positions: usize) -> Result<Box<dyn CausalLm>> {
    let cfg = TransformerConfig::from_hf(hf, max_positions);
    match hf.model_kind().map_err(|e| Error::msg(e.to_string()))? {
        ModelType::Qwen3 => Ok(Box::new(qwen3::Qwen3ForCausalLM::new(&cfg))),
        other => Err(Error::msg(format!(
            "{}: model_type '{}' has no model file yet (supported: qwen3)",
            hf.source.display(),
            other.as_str()
        ))),
    }
}

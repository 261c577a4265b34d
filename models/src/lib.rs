//! Model files written with mllm-dsl.
//!
//! Each model is one file in mllm's QNN-AOT form that also runs in float on plain HF checkpoints.
//! [`io`] describes the graph inputs every model takes (ids, positions, mask, KV cache).

pub mod config;
pub mod io;
pub mod qwen3;
pub mod rope;

pub use config::TransformerConfig;

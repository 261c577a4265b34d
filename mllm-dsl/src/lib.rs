//! mllm-dsl

pub mod config;
pub mod quant;

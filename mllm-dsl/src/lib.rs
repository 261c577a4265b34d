//! mllm-dsl

pub mod config;

//! mllm-dsl

pub mod runtime;

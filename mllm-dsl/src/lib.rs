//! mllm-dsl

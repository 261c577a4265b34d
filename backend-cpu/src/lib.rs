//! backend-cpu: eager CPU execution of mllm-dsl model files, float and fake-quant.

pub mod executor;
pub mod kernels;

pub use executor::{CpuBackend, QdqHook};

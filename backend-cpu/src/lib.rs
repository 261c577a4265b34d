//! backend-cpu: eager CPU execution of mllm-dsl model files, float and fake-quant.

pub mod checkpoint;
pub mod chunk_model;
pub mod executor;
pub mod kernels;
pub mod lazy;
pub mod packed_weight;
pub mod store;

pub use chunk_model::CpuChunkModel;
pub use executor::{CpuBackend, QdqHook};
pub use packed_weight::{PackedWeight, WeightView};
pub use store::CheckpointStore;

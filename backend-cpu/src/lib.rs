//! backend-cpu: eager CPU execution of mllm-dsl model files, float and fake-quant, plus calibration
//! and export of quantized checkpoints ([`quant`]).

pub mod chunk_model;
pub mod executor;
pub mod interp;
pub mod kernels;
pub mod lazy;
pub mod on_grid;
pub mod packed_weight;
pub mod quant;
pub mod rng;
pub mod store;
pub mod u16_table;

pub use chunk_model::CpuChunkModel;
pub use executor::{Bf16Products, CpuBackend, CpuOpError, GridProducts, QdqHook, QdqHookError, Quantized};
pub use interp::{Interpreter, Mode as InterpMode};
pub use packed_weight::{PackedWeight, WeightView};
pub use store::{CheckpointStore, QuantizedWeights};

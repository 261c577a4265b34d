//! backend-cpu: eager CPU execution of mllm-dsl model files, float and fake-quant, plus calibration
//! and export of quantized checkpoints ([`quant`]).
//!
//! # Quick start
//!
//! A checkpoint's tensors bound to its model file on a [`CpuBackend`], then generated from
//! (`aot::load_model` does this for any checkpoint, float or quantized):
//!
//! ```
//! use backend_cpu::{Bf16Products, CheckpointStore, CpuBackend, CpuChunkModel};
//! use mllm_dsl::module::ParamSource;
//! use runtime::{GenerationConfig, Generator, Sampling};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let dir = std::path::Path::new("../fixtures/qwen3-dev-bf16");
//! let config = models::hf::HfConfig::from_dir(dir)?;
//! // Float mode; `Bf16Products::Bf16` would round each linear's input to bf16 and multiply
//! // on AMX tiles or with AVX-512 BF16 (docs/cpu.md).
//! let backend = CpuBackend::float_with(Bf16Products::F32);
//! let store = CheckpointStore::for_config(dir, backend.clone(), &config)?;
//! let mut model = models::build(&config, 64)?;
//! model.bind_params(&ParamSource::Store(&store))?;
//! let mut generator = Generator::new(CpuChunkModel::new(model, backend, 64))?;
//! let config = GenerationConfig {
//!     max_new_tokens: 4,
//!     prefill_chunk: 32,
//!     sampling: Sampling::Greedy,
//!     eos_ids: Vec::new(),
//!     collect_prompt_logits: false,
//! };
//! let out = generator.generate(&[5, 17, 42], &config)?;
//! assert_eq!(out.ids.len(), 4);
//! # Ok(()) }
//! ```
//!
//! Map: [`executor`] runs each op ([`CpuBackend`], its QDQ hook and product settings) and,
//! through `siblings`, a decode step's linears that share an input as one job ([`SIBLINGS_ENV`]),
//! [`kernels`] the f32, bf16 and int4 compute, [`store`] loads weights in the form the kernels
//! read, [`chunk_model`] adapts a model to the runtime's chunked prefill and decode, [`interp`]
//! runs an IR program, [`quant`] calibrates and exports; [`knobs`] holds the speed settings
//! (`MLLM_CPU_*`) and lets a benchmark change them between generations.

pub mod chunk_model;
pub mod executor;
pub mod interp;
pub mod kernels;
pub mod knobs;
pub mod lazy;
pub mod on_grid;
pub mod packed_weight;
pub mod quant;
pub mod rng;
mod siblings;
pub mod store;
pub mod u16_table;

pub use chunk_model::CpuChunkModel;
pub use executor::{Bf16Products, CpuBackend, CpuOpError, GridProducts, QdqHook, QdqHookError, Quantized};
pub use interp::{Interpreter, Mode as InterpMode};
pub use packed_weight::{PackedWeight, WeightView};
pub use siblings::SIBLINGS_ENV;
pub use store::{CheckpointStore, QuantizedWeights};

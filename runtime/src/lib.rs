//! Backend-agnostic generation runtime: KV cache, attention mask, sampling and the prefill/decode
//! loop around a model that runs one fixed-size chunk at a time.
//!
//! It reproduces the static I/O layout of mllm's Qwen3 QNN AOT runtime (itself ExecuTorch's
//! "SMART_MASK" static-llama layout): past K `[Hkv, D, ctx-ar]` and V `[Hkv, ctx-ar, D]` owned by
//! the runtime and re-strided when switching between the prefill graph (`ar` = 32) and the decode
//! graph (`ar` = 1), a u16 mask whose first `ctx-ar` columns address the past, and only the new
//! K/V returned by each run. Unlike mllm it never writes past a cache row at full context, and
//! it also offers seeded temperature / top-k / top-p sampling besides greedy decoding.
//!
//! Backends implement [`ChunkModel`]; [`Generator`] drives them.

mod error;
mod generate;
pub mod huge_pages;
mod kv_cache;
mod mask;
mod model;
mod sampler;
mod select;
mod sequence;

pub use error::{ModelError, RuntimeError};
pub use generate::{
    DecodeOutput, GenerationConfig, GenerationOutput, GenerationTimings, Generator, PrefillOutput, PromptProcessor,
    StopReason, TokenGenerator, DEFAULT_PREFILL_CHUNK,
};
pub use kv_cache::{KvCache, KvPrefix};
pub use mask::{dequantize_mask_value, AttentionMask, MASK_ATTEND, MASK_MASKED, MASK_SCALE, MASK_ZERO_POINT};
pub use model::{ChunkInputs, ChunkModel, ChunkOutputs, ModelLayout};
pub use sampler::{argmax, RandomSampling, Sampler, Sampling};
pub use select::{GraphChoice, GraphMenu, PlannedCall, Step};
pub use sequence::Sequence;

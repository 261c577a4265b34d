//! AscendV1 — msModelSlim's quantized-weight format for Huawei Ascend NPUs (loaded by MindIE and
//! vLLM Ascend) — exported from the same model file the QNN path compiles.
//!
//! ```no_run
//! use aot::ascend::{export_ascend, AscendOptions, QuantType};
//! # fn f(opts: AscendOptions) -> aot::Result<()> {
//! let outcome = export_ascend(&AscendOptions { quant_type: QuantType::W8A8, ..opts })?;
//! println!("{} linears, model_quant_type {}", outcome.linears.len(), outcome.model_quant_type);
//! # Ok(()) }
//! ```
//!
//! The export walks the traced model file, not an architecture: its Linear / Conv2D ops give the
//! linears (module path = checkpoint key, shape, bias), the QDQ point each linear's input comes
//! from is where W8A8's per-tensor input range is observed (and where the fake-quant run
//! quantizes), and the KV-cache QDQ points are where C8's per-channel ranges are observed, named
//! after the linear that produces the cached tensor ([`graph`]).
//!
//! What AscendV1 needs that the QNN path does not, and where it lives (never in a model file):
//! - int8 asymmetric per-tensor input parameters per linear and the derived `deq_scale` /
//!   `quant_bias` (QNN quantizes activations to uint16 at every QDQ point instead) — [`format`];
//! - per-token dynamic activations (W8A8_DYNAMIC, W4A8_DYNAMIC), which QNN has no notion of:
//!   the fake-quant run computes them at the linear's input point — [`hooks`];
//! - W4A8_DYNAMIC's `scale_bias`, whose layout depends on whether a linear is column- or
//!   row-parallel; msModelSlim decides by the linear's name, and so does [`format::Parallelism`];
//! - per-channel KV scales (QNN's KV cache is per tensor).
//!
//! Files written (msModelSlim's AscendV1 saver): `quant_model_description.json` (every tensor key
//! → its quant type tag, plus `model_quant_type`, `version`, `group_size`, `metadata`, `optional`,
//! and `kv_cache_type` / `kv_quant_type` with C8), `quant_model_weights.safetensors` or its
//! shards `quant_model_weights-0000i-of-0000n.safetensors` with
//! `quant_model_weights.safetensors.index.json`, `config.json` without `quantization_config`, and
//! the model directory's other `.json` / `.txt` / `.jinja` / `.py` files (tokenizer...).

pub mod decode;
pub mod error;
pub mod eval;
pub mod export;
pub mod format;
pub mod graph;
pub mod hooks;

pub use decode::{decode_dir, decode_linear, AscendDir, Decoded, DecodedLinear};
pub use error::AscendError;
pub use eval::{ascend_quality, AscendQuality, AscendQualityRow};
pub use export::{assign_types, export_ascend, AscendOptions, AscendOutcome};
pub use format::{model_quant_type, QuantType};

/// The description file.
pub const DESCRIPTION_FILE: &str = "quant_model_description.json";
/// The weights when not sharded.
pub const WEIGHTS_FILE: &str = "quant_model_weights.safetensors";
/// The shards' name prefix.
pub const WEIGHTS_PREFIX: &str = "quant_model_weights";
/// The shard index.
pub const WEIGHTS_INDEX_FILE: &str = "quant_model_weights.safetensors.index.json";

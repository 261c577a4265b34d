//! backend-qnn: the SDK-free half of lowering to Qualcomm QNN (HTP).
//!
//! - [`dtype`], [`encoding`]: QNN data types, tensor types and quantization encodings with
//!   their exact numeric values and integer <-> real mappings.
//! - [`graph`]: an owned model of one lowered QNN graph plus a builder for lowering passes.
//! - [`opdef`], [`params`], [`shape`], [`mod@validate`]: the op-definition table and the static
//!   checks a graph must pass before it is handed to the QNN API.
//! - [`target`]: the AOT `target_machine` JSON mapped to HTP device / graph / context options.
//! - [`artifacts`]: QNN Netron JSON, `model.cpp` + `model.bin` for `qnn-model-lib-generator`,
//!   and a summary, written atomically and deterministically.
//! - [`interp`]: a CPU reference interpreter with QNN quantization semantics.
//! - [`lower`]: LLM2QnnLowering, the AOT pipeline's final IR to [`QnnGraph`]s.
//! - [`context`]: lowered graphs + `target_machine` -> one weight-sharing context binary.
//! - [`chunk_model`]: [`QnnChunkModel`], a context binary's graphs as the generation runtime's
//!   `ChunkModel` (prefill/decode through the QNN execute API).
//! - [`sharded`]: [`ShardedChunkModel`], several context binaries (shards of contiguous layers)
//!   chained as one `ChunkModel`.
//! - [`sdk`]: the QNN API driver (recording; Qualcomm's libraries through committed bindings + libloading).

pub mod artifacts;
pub mod chunk_model;
pub mod context;
pub mod cost;
pub mod dtype;
pub mod encoding;
pub mod graph;
pub mod interp;
pub mod io;
pub(crate) mod json;
pub mod lower;
pub mod opdef;
pub mod params;
pub mod sdk;
pub mod shape;
pub mod sharded;
pub mod target;
pub mod validate;

pub use chunk_model::{QnnChunkModel, QnnModelError};
pub use dtype::{DataType, TensorType};
pub use encoding::{Encoding, Int4Storage, ScaleOffset};
pub use graph::{GraphBuilder, Param, QnnGraph, QnnNode, QnnTensor, Scalar, StaticData, TensorRef};
pub use io::{GraphIo, IoTensor};
pub use lower::{EncodeError, LowerError, LowerOptions, QnnLowering, SelectBroadcast, WeightProblem};
pub use opdef::OpType;
pub use sharded::{ShardBinary, ShardedChunkModel, TokenEmbedding, HIDDEN_STATES, HIDDEN_STATES_OUT};
pub use validate::{validate, ValidationError};

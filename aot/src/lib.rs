//! The main job as library calls: an HF checkpoint calibrated and quantized on the CPU
//! ([`quantize`]), a quantized checkpoint compiled into QNN graphs ([`compile`]), the whole flow
//! with its artifacts and per-stage accuracy ledger ([`run`], a sequence of typed [`stages`]), and a checkpoint or context binary
//! loaded to generate from ([`Runner`]).
//!
//! # Quick start
//!
//! ```no_run
//! // The embedded tiny Qwen3, calibrated, quantized, lowered, its artifacts written into `out/`.
//! let report = aot::run(&aot::AotOptions::embedded("out"))?;
//! print!("{}", report.summary());
//! # Ok::<(), aot::AotError>(())
//! ```
//!
//! The same flow one stage at a time ([`stages`]), stopping after the lowered graphs:
//!
//! ```no_run
//! use aot::stages;
//! let opts = aot::AotOptions::embedded("out");
//! let (mut out, mut clock) = (stages::OutputDir::new("out"), aot::Stopwatch::start());
//! let loaded = stages::load(&opts, stages::preflight(&opts)?, &mut out)?;
//! let model = stages::quantize(&opts, &loaded, &mut out, &mut clock)?;
//! let progress = aot::progress::Silent;
//! let traced = stages::trace(&model.hf, model.max_positions, &loaded.family, &progress)?;
//! let passed = stages::passes(traced, &loaded.aot, &model.checkpoint, None, &progress)?;
//! let lowered = stages::lower(passed, &model.checkpoint, &progress)?;
//! println!("{} QNN graphs", lowered.graphs.len());
//! # Ok::<(), aot::AotError>(())
//! ```
//!
//! Only the quantized checkpoint ([`quantize`]): an HF float checkpoint and calibration token
//! ids in, pymllm's quantized format out, with its fake-quant-vs-float report:
//!
//! ```no_run
//! let calibration = vec![vec![9707_i64, 11, 1879, 0]];
//! let opts = aot::QuantizeOptions {
//!     weight_method: backend_cpu::quant::WeightMethod::Gptq,
//!     ..aot::QuantizeOptions::new("SmolLM2-135M-Instruct", calibration, "smollm2-w4a16kv8")
//! };
//! print!("{}", aot::quantize(&opts)?.report.table());
//! # Ok::<(), aot::AotError>(())
//! ```
//!
//! It is the one crate that sees the model files and both backends: calibration runs on
//! backend-cpu, lowering and artifacts come from backend-qnn, and the ledger compares the two.

pub mod ascend;
pub mod calibrate;
pub mod chat;
pub mod compile;
pub mod config;
pub mod context_bench;
pub mod cpu_embedding;
pub mod deploy;
pub mod divergence;
pub mod embedded;
pub mod error;
pub mod family;
pub mod generation;
pub mod htp;
pub mod ledger;
pub mod load;
pub mod loss_breakdown;
pub mod mixed;
pub mod model_path;
mod probe;
pub mod progress;
pub mod real_model;
pub mod recipe;
pub mod report;
pub mod run_sizes;
pub mod runner;
pub mod sequences;
pub mod shard;
pub mod shard_bench;
pub mod shard_build;
pub mod sharded_aot;
pub mod sink;
pub mod stages;
pub mod synthetic;
pub mod text_quality;
pub mod trace;

pub use calibrate::{evaluate, quantize, PendingEvaluation, QuantizeOptions, QuantizeOutcome, SinkSummary};
pub use chat::{load_chat_template, stop_ids, user_turn_prompt, Conversation, TextStream};
pub use compile::{
    compile, lower_family, lower_for_context, run, AotOptions, CompileOptions, CompileTimings, CompiledGraph,
    CompiledModel, ModelSource,
};
pub use config::{default_out_dir, load_aot_config, DEFAULT_CHUNKS, DEFAULT_CONTEXT_LEN, DEFAULT_MAX_POSITIONS};
pub use deploy::{ArtifactRuntimes, Runtime, TargetRuntime, TargetRuntimeRefusal};
pub use error::{AotError, Context, Result};
pub use family::{FamilyError, GraphFamily, GraphNaming, GraphSpec};
pub use generation::GenerateRequest;
pub use htp::ContextBinary;
pub use ledger::LedgerEntry;
pub use load::{load_float, load_float_with, load_model, load_model_with, CpuModel, RunMode};
pub use model_path::{resolve_model, ModelPathError};
pub use real_model::{gemma3_dir, smollm2_dir};
pub use recipe::{Chosen, Recipe, RecipeName, Refinements};
pub use report::{AotReport, GraphReport, Step, Stopwatch, Timings};
pub use runner::Runner;
pub use sequences::{encode_prompt, load_id_sequences, load_text_sequences, load_tokenizer, CalibSource, PromptText};
pub use sink::sink_prefix_ids;
pub use trace::{trace_graph, trace_model};

//! # compiler
//!
//! The compiler side of mllm-dsl: what turns a traced model file into QNN-ready IR.
//!
//! ## Quick start
//!
//! ```no_run
//! use compiler::aot_config::AotConfig;
//! use compiler::passes::{Pipeline, SyntheticParams};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let mut program: mllm_dsl::Program = unimplemented!();
//! // mllm's QNN AOT config (qnn_aot_cfg_*.json); `AotConfig::w4a16_kv8()` is the built-in one.
//! let config = AotConfig::from_file("qnn_aot_cfg.json")?;
//! // Parameters from a checkpoint, or synthetic ones for a program traced without weights.
//! let params = SyntheticParams::for_program(&program, 16);
//! // mllm's pass order, with the IR dumped after every pass.
//! let report = Pipeline::qnn_aot(&config, &params).dump_to("ir/").run(&mut program)?;
//! # let _ = report; Ok(()) }
//! ```
//!
//! ## Map
//! - [`quant`]: quantization math of mllm's W4A16KV8 recipe (LPBQ, observers, fake quant, u16
//!   weights), as pure functions the CPU backend and the passes share.
//! - [`passes`]: the AOT pass pipeline in mllm's order.
//! - [`aot_config`]: mllm's QNN AOT config (target SoC, graphs on QNN, quantization recipe) and
//!   Qualcomm's chip table.

pub mod aot_config;
pub mod passes;
pub mod quant;

//! # mllm-dsl
//!
//! Write an LLM model file once — torch-like eager code with explicit quantize/dequantize (QDQ)
//! points — then run it on the CPU or trace it to mllm's IR and compile it for Qualcomm NPUs.
//!
//! ## Quick start
//!
//! ```
//! use mllm_dsl::prelude::*;
//!
//! #[module]
//! pub struct Mlp {
//!     up_proj: Conv2d,
//!     down_proj: Conv2d,
//! }
//!
//! #[module]
//! impl Mlp {
//!     pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
//!         // 1. x: [1, 1, S, 8] -> [1, 1, S, 16], quantized where the NPU needs it.
//!         let x = qdq!(x, "up_proj_input_qdq")?;
//!         let h = self.up_proj.forward(&x)?.silu()?;
//!         // 2. [1, 1, S, 16] -> [1, 1, S, 8]
//!         self.down_proj.forward(&h)
//!     }
//! }
//!
//! # fn main() -> Result<()> {
//! let mut mlp = Mlp { up_proj: Conv2d::new(8, 16), down_proj: Conv2d::new(16, 8) };
//! // Bind as the module `model.mlp` with symbolic f32 parameters, then trace without weights.
//! mlp.bind("model.mlp", &ParamSource::Symbolic(ParamFormat::Float))?;
//! let program = trace(&[TraceInput::new("x", [1, 1, 4, 8], DType::F32)], |x| mlp.forward(&x[0]))?;
//! let text = program.to_string();
//! assert!(text.contains("linalg.CPU.Conv2DOp <name=\"model.mlp.up_proj\">"));
//! assert!(text.contains("act(\"model.mlp.up_proj_input_qdq\")"));
//! # Ok(()) }
//! ```
//!
//! ## Map
//! - [`tensor`]: the [`Tensor`] handle and its ops (eager or traced).
//! - [`module`] and [`nn`]: module trees, parameter binding, layers; `#[module]` generates the glue.
//! - [`qdq!`] and [`qdq`]: QDQ points and their checkpoint keys.
//! - [`trace`](mod@trace): recording a [`Program`]; [`ir`]: the program, its printer and parser.
//! - [`fused`]: steps of a model file an eager backend may run in one pass (RoPE).
//! - [`backend`]: what an eager backend implements; [`causal_lm`]: what every decoder model file
//!   offers (its graph I/O contract).
//! - [`files`]: bounded reads, atomic writes and staged output directories, for every crate.
//! - [`memory`]: current and peak resident memory and CPU seconds, for benches.
//! - [`simd`]: hot loops compiled for the widest vector extension the CPU has.

pub mod backend;
pub mod causal_lm;
pub mod dtype;
pub mod error;
pub mod files;
pub mod fused;
pub mod fuzz;
pub mod ir;
pub mod macros;
pub mod memory;
pub mod module;
pub mod nn;
pub mod op;
pub mod qdq;
mod scope;
pub mod simd;
pub mod tensor;
pub mod trace;

pub use backend::{Backend, BackendError, BackendRef, F32Buffer, NativeData, Storage};
pub use causal_lm::{CausalLm, DecoderShape};
pub use dtype::{DType, Device, TensorType, UnknownName};
pub use error::{CallSite, Error, Result};
pub use ir::Program;
pub use module::{Module, ModuleList, ParamFormat, ParamRequest, ParamRole, ParamSource, WeightStore};
pub use qdq::{QdqAttr, QdqKind};
pub use scope::current_path;
pub use tensor::Tensor;
pub use trace::{trace, TraceInput};

#[cfg(feature = "macros")]
pub use mllm_dsl_macros::module;

/// Everything a model file needs.
pub mod prelude {
    #[cfg(feature = "macros")]
    pub use crate::module;
    pub use crate::nn::{Conv2d, Embedding, Linear, Param, RmsNorm};
    pub use crate::qdq;
    pub use crate::{
        trace, CausalLm, DType, Error, Module, ModuleList, ParamFormat, ParamRole, ParamSource, Result, Tensor,
        TraceInput,
    };
}

/// Support for generated code; not a public API.
#[doc(hidden)]
pub mod __private {
    pub use crate::module::{join_path, parent_path, Module, ParamSource};
    pub use crate::trace::{scoped, ModuleOutput};
    use crate::{CallSite, QdqKind, Result, Tensor};

    /// Generic so that `qdq!(expr?, ..)` works whether `expr` yields a `Tensor` or a `&Tensor`.
    #[track_caller]
    pub fn qdq<T: AsRef<Tensor>>(x: T, name: &str, kind: QdqKind) -> Result<Tensor> {
        crate::tensor::apply_qdq(x.as_ref(), name, kind, CallSite::here())
    }
}

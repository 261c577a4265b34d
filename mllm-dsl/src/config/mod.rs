//! Model configuration files read from checkpoint directories.
//!
//! Only the Hugging Face layout exists today ([`hf`]); it is kept in its own module because other
//! formats (mllm's QNN AOT JSON, for instance) describe different things and get their own parsers.

pub mod hf;

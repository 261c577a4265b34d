//! Configuration files: Hugging Face checkpoint configs ([`hf`]) and mllm's QNN AOT compiler
//! config ([`aot`]). They describe different things and get their own parsers.

pub mod aot;
pub mod hf;
pub mod run_sizes;

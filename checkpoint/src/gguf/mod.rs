//! GGUF files (llama.cpp's format) read and turned into Hugging Face checkpoint directories.
//!
//! ```no_run
//! let gguf = checkpoint::gguf::GgufFile::open("SmolLM2-135M-Instruct.Q4_1.gguf")?;
//! let arch = gguf.get_str("general.architecture")?;
//! let embedding: Vec<f32> = gguf.read_f32("token_embd.weight")?; // Q8_0 dequantized
//! checkpoint::gguf::convert_to_hf_dir(&gguf, "smollm2-hf".as_ref())?;
//! # Ok::<(), checkpoint::gguf::GgufError>(())
//! ```
//!
//! The reader ([`GgufFile`]) memory-maps the file and checks every count, size and offset
//! against the file before using it, so a corrupt or hostile file fails with a [`GgufError`]
//! naming the field or tensor rather than panicking or allocating without bound.
//! [`convert_to_hf_dir`] writes `model.safetensors` (f32, HF names, q/k rows un-permuted),
//! `config.json`, `generation_config.json`, `tokenizer.json` and `tokenizer_config.json`.

mod dequant;
mod error;
mod file;
mod to_hf;
mod tokenizer;
mod value;

pub use dequant::{GgmlType, SUPPORTED_TYPES};
pub use error::GgufError;
pub use file::{GgufFile, GgufTensorInfo};
pub use to_hf::{convert_to_hf_dir, hf_tensor_name, SpecialIds};
pub use tokenizer::{tokenizer_config_json, tokenizer_json};
pub use value::GgufValue;

#[cfg(test)]
mod tests;

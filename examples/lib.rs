//! Shared glue of the runnable examples: loading an HF checkpoint directory into a CPU model
//! (float, or fake-quant for quantized checkpoints: [`quant_pipeline::load_model`]), the Rust
//! quantization path ([`quant_pipeline`]), tokenization, and small output helpers.

pub mod quant_pipeline;

pub mod aot_pipeline;

pub mod aot_cli;

pub mod generate_cli;

pub mod text_quality;

use anyhow::{Context, Result};
use backend_cpu::{CheckpointStore, CpuBackend, CpuChunkModel};
use checkpoint::{write_safetensors_atomic, StDtype, TensorBytes};
use mllm_dsl::config::hf::HfConfig;
use mllm_dsl::module::ParamSource;
use mllm_dsl::BackendRef;
use std::collections::BTreeMap;
use std::path::Path;

/// A checkpoint loaded for eager CPU execution.
pub struct CpuModel {
    pub config: HfConfig,
    pub model: CpuChunkModel,
    /// Checkpoint tensors nothing asked for.
    pub unused: Vec<String>,
    /// QDQ points quantize (a quantized checkpoint run in fake-quant mode).
    pub fake_quant: bool,
}

/// Loads `dir` (config.json + safetensors) into the model file its `model_type` names, on `backend`.
pub fn load_cpu_model(dir: &Path, context_len: usize, backend: BackendRef) -> Result<CpuModel> {
    let config = HfConfig::from_dir(dir)?;
    let mut model = models::build(&config, context_len)?;
    let store = CheckpointStore::open(dir, backend.clone(), config.tie_word_embeddings)?;
    model.bind_params(&ParamSource::Store(&store)).with_context(|| format!("loading {}", dir.display()))?;
    let unused = store.unused_keys();
    Ok(CpuModel { config, model: CpuChunkModel::new(model, backend, context_len), unused, fake_quant: false })
}

/// Float CPU execution.
pub fn load_float(dir: &Path, context_len: usize) -> Result<CpuModel> {
    load_cpu_model(dir, context_len, CpuBackend::float())
}

/// Writes one f32 tensor into a safetensors file (atomically).
pub fn write_f32_safetensors(path: &Path, name: &str, shape: &[usize], data: &[f32]) -> Result<()> {
    let bytes: Vec<u8> = data.iter().flat_map(|v| v.to_le_bytes()).collect();
    let tensor: TensorBytes<'_> = (name, StDtype::F32, shape, &bytes);
    write_safetensors_atomic(path, &[tensor], &BTreeMap::new())?;
    Ok(())
}

/// Qwen3's chat template in non-thinking mode (`enable_thinking=False`), as mllm's runner applies it.
pub fn qwen3_chat_prompt(user: &str) -> String {
    format!("<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n")
}

//! mllm's QNN AOT config for a model, and the run's defaults.

use std::path::{Path, PathBuf};

use crate::error::{ensure, Result};
use compiler::aot_config::AotConfig;
use models::hf::HfConfig;

/// Chunk sizes mllm compiles for Qwen3: prefill 32, decode 1.
pub const DEFAULT_CHUNKS: [usize; 2] = [32, 1];
/// mllm's context length for the QNN AOT graphs.
pub const DEFAULT_CONTEXT_LEN: usize = 1024;
/// Rows of the RoPE tables a calibration writes (`mllm_qualcomm_max_length`).
pub const DEFAULT_MAX_POSITIONS: usize = 1024;

/// mllm's QNN AOT config from `path`, or the built-in W4A16KV8 one (block size 16) with the
/// model's layer count; plus its warnings. A config whose layer count differs from the model's,
/// or that keeps the lm_head off QNN, is an error.
pub fn load_aot_config(path: Option<&Path>, hf: &HfConfig) -> Result<(AotConfig, Vec<String>)> {
    let aot = match path {
        Some(p) => AotConfig::from_file(p)?,
        None => {
            let mut c = AotConfig::w4a16_kv8();
            c.quant_recipe.layers = hf.num_hidden_layers as u32;
            c
        }
    };
    // Checked against the model before any work (these used to fail after files were written).
    let name = path.map_or_else(|| "the built-in AOT config".to_string(), |p| p.display().to_string());
    ensure!(
        aot.quant_recipe.layers as usize == hf.num_hidden_layers,
        "{name}: `quant_recipe.layers` is {} but {} has num_hidden_layers {}",
        aot.quant_recipe.layers,
        hf.source.display(),
        hf.num_hidden_layers
    );
    ensure!(
        !aot.op_on_qnn.is_empty(),
        "{name}: `op_on_qnn` is []; the AOT flow lowers the whole model to QNN, so it must name the ops outside \
         the decoder graphs that run there too (mllm's configs: [\"lm_head\"])"
    );
    let warnings = aot.warnings();
    Ok((aot, warnings))
}

/// `<target dir>/<example>`: the target directory the running example binary was built into
/// (`<target>/<profile>/examples/<example>`), else `./target/<example>`.
pub fn default_out_dir(example: &str) -> PathBuf {
    let from_exe = std::env::current_exe().ok().and_then(|exe| {
        let examples = exe.parent()?;
        (examples.file_name()? == "examples").then_some(())?;
        Some(examples.parent()?.parent()?.join(example))
    });
    from_exe.unwrap_or_else(|| Path::new("target").join(example))
}

//! Where the real model lives: `scripts/fetch-smollm2` converts SmolLM2-135M-Instruct into
//! `${MLLM_DSL_CACHE:-$HOME/.cache/mllm-dsl}/smollm2-135m-instruct-hf`; `$MLLM_DSL_SMOLLM2_DIR`
//! points elsewhere. One owner for that path, so every real-model test and tool agrees with the script.

use std::path::PathBuf;

use crate::error::{bail, Result};

/// The converted SmolLM2-135M-Instruct directory, checked to hold `config.json` and
/// `model.safetensors`; the error names the script that makes it.
pub fn smollm2_dir() -> Result<PathBuf> {
    let dir = match std::env::var_os("MLLM_DSL_SMOLLM2_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => {
            let Some(cache) = mllm_dsl::files::project_cache() else {
                bail!("neither MLLM_DSL_CACHE nor HOME is set: cannot find SmolLM2-135M-Instruct")
            };
            cache.join("smollm2-135m-instruct-hf")
        }
    };
    if !(dir.join("config.json").is_file() && dir.join("model.safetensors").is_file()) {
        bail!(
            "{} has no converted SmolLM2-135M-Instruct: run scripts/fetch-smollm2 (or point MLLM_DSL_SMOLLM2_DIR at \
             its output)",
            dir.display()
        );
    }
    Ok(dir)
}

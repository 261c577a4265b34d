//! Where the real models live: `scripts/fetch-smollm2` converts SmolLM2-135M-Instruct into
//! `${MLLM_DSL_CACHE:-$HOME/.cache/mllm-dsl}/smollm2-135m-instruct-hf` (`$MLLM_DSL_SMOLLM2_DIR`
//! points elsewhere), `scripts/fetch-gemma3` Gemma 3 270M into `.../gemma3-270m-hf`
//! (`$MLLM_DSL_GEMMA3_DIR`). One owner for those paths, so every real-model test and tool agrees
//! with the scripts.

use std::path::PathBuf;

use crate::error::{bail, Result};

/// A real model's converted directory: where it is looked for and what makes it.
struct RealModel {
    name: &'static str,
    env: &'static str,
    cache_dir: &'static str,
    script: &'static str,
}

const SMOLLM2: RealModel = RealModel {
    name: "SmolLM2-135M-Instruct",
    env: "MLLM_DSL_SMOLLM2_DIR",
    cache_dir: "smollm2-135m-instruct-hf",
    script: "scripts/fetch-smollm2",
};

const GEMMA3: RealModel = RealModel {
    name: "Gemma 3 270M",
    env: "MLLM_DSL_GEMMA3_DIR",
    cache_dir: "gemma3-270m-hf",
    script: "scripts/fetch-gemma3",
};

/// The converted SmolLM2-135M-Instruct directory, checked to hold `config.json` and
/// `model.safetensors`; the error names the script that makes it.
pub fn smollm2_dir() -> Result<PathBuf> {
    SMOLLM2.dir()
}

/// The converted Gemma 3 270M directory (see [`smollm2_dir`]).
pub fn gemma3_dir() -> Result<PathBuf> {
    GEMMA3.dir()
}

impl RealModel {
    fn dir(&self) -> Result<PathBuf> {
        let dir = match std::env::var_os(self.env) {
            Some(dir) => PathBuf::from(dir),
            None => {
                let Some(cache) = mllm_dsl::files::project_cache() else {
                    bail!("neither MLLM_DSL_CACHE nor HOME is set: cannot find {}", self.name)
                };
                cache.join(self.cache_dir)
            }
        };
        if !(dir.join("config.json").is_file() && dir.join("model.safetensors").is_file()) {
            bail!(
                "{} has no converted {}: run {} (or point {} at its output)",
                dir.display(),
                self.name,
                self.script,
                self.env
            );
        }
        Ok(dir)
    }
}

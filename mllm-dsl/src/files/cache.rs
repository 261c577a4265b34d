//! The project's cache directory, where the fetch scripts (`scripts/fetch-*`) put what they
//! download: `$MLLM_DSL_CACHE`, else `$HOME/.cache/mllm-dsl` (the scripts use the same rule).

use std::path::PathBuf;

/// `$MLLM_DSL_CACHE` when set and not empty, else `$HOME/.cache/mllm-dsl`; `None` when neither
/// variable is set.
pub fn project_cache() -> Option<PathBuf> {
    let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
    match var("MLLM_DSL_CACHE") {
        Some(cache) => Some(PathBuf::from(cache)),
        None => Some(PathBuf::from(var("HOME")?).join(".cache/mllm-dsl")),
    }
}

//! Per-test scratch paths in the temp directory for the quantize tests.

use std::path::{Path, PathBuf};

/// `name` inside a fresh directory of its own (named after the test binary, the process and
/// `name`): an output's staging lock (`.<name>.lock`, kept beside it) lands there too, and
/// [`remove_scratch`] takes both away.
pub fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("mllm-{}-{}-{name}", env!("CARGO_CRATE_NAME"), std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// Removes what [`scratch`] made for `path`.
pub fn remove_scratch(path: &Path) {
    if let Some(dir) = path.parent() {
        let _ = std::fs::remove_dir_all(dir);
    }
}

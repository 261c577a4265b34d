//! Refusing outputs that would overwrite or remove an input.

use std::path::{Path, PathBuf};

use super::FileError;

/// Refuses `output` (a file or a directory to be replaced) when it is one of `inputs`, contains
/// one of them, or lies inside one of them that is a file. Paths are compared after resolving
/// links, so `out/../model` and symlinks do not slip through; inputs that do not exist are
/// skipped (their own reader reports them).
pub fn ensure_not_input<P: AsRef<Path>>(output: &Path, inputs: &[P]) -> Result<(), FileError> {
    let out = resolve(output)?;
    for input in inputs {
        let input = input.as_ref();
        let Ok(resolved) = input.canonicalize() else { continue };
        let input_is_file = resolved.is_file();
        if resolved.starts_with(&out) || (input_is_file && out.starts_with(&resolved)) {
            return Err(FileError::OutputIsInput { output: output.to_path_buf(), input: input.to_path_buf() });
        }
    }
    Ok(())
}

/// `path` with links resolved, also when it does not exist yet (its nearest existing ancestor is
/// resolved and the rest appended).
fn resolve(path: &Path) -> Result<PathBuf, FileError> {
    let absolute = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir().map_err(FileError::io("reading the current directory for", path))?.join(path)
    };
    let mut existing = absolute.as_path();
    let mut rest = Vec::new();
    loop {
        if let Ok(resolved) = existing.canonicalize() {
            let mut full = resolved;
            for part in rest.iter().rev() {
                full.push(part);
            }
            return Ok(full);
        }
        match (existing.parent(), existing.file_name()) {
            (Some(parent), Some(name)) => {
                rest.push(name.to_os_string());
                existing = parent;
            }
            _ => return Ok(absolute),
        }
    }
}

//! One file written atomically: a fresh temporary name next to it, then a rename.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

use super::FileError;

/// Writes `path` through `fill`: into a new temporary file in the same directory (unique name,
/// created exclusively, so a file or link planted there is never written through), flushed to
/// disk, then renamed over `path` (a link at `path` is replaced, not followed). Readers see the
/// old file or the complete new one; on any error the temporary file is removed.
pub fn write_atomic(path: &Path, fill: impl FnOnce(&mut dyn Write) -> std::io::Result<()>) -> Result<(), FileError> {
    let name = path.file_name().ok_or_else(|| FileError::NoFileName { path: path.to_path_buf() })?;
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let mut prefix = std::ffi::OsString::from(".");
    prefix.push(name);
    prefix.push(".");
    let mut builder = tempfile::Builder::new();
    builder.prefix(&prefix).suffix(".tmp");
    // A normal file once renamed, not a private temp file: the mode follows the umask.
    #[cfg(unix)]
    builder.permissions(std::os::unix::fs::PermissionsExt::from_mode(0o666));
    let tmp = builder.tempfile_in(dir).map_err(FileError::io("creating a temporary file for", path))?;
    let mut writer = BufWriter::with_capacity(1 << 20, tmp);
    fill(&mut writer).map_err(FileError::io("writing", path))?;
    let tmp = writer.into_inner().map_err(|e| FileError::io("writing", path)(e.into_error()))?;
    tmp.as_file().sync_all().map_err(FileError::io("flushing", path))?;
    tmp.persist(path).map_err(|e| FileError::io("renaming the temporary file to", path)(e.error))?;
    sync_dir(dir);
    Ok(())
}

/// [`write_atomic`] of a byte slice.
pub fn write_atomic_bytes(path: &Path, bytes: &[u8]) -> Result<(), FileError> {
    write_atomic(path, |w| w.write_all(bytes))
}

/// [`write_atomic`] of a JSON value, pretty-printed with a final newline (reports, configs).
pub fn write_json_atomic(path: &Path, value: &serde_json::Value) -> Result<(), FileError> {
    let mut text = serde_json::to_string_pretty(value).expect("JSON values serialize");
    text.push('\n');
    write_atomic_bytes(path, text.as_bytes())
}

/// Persists a rename; best effort, as not every platform can sync a directory.
pub(crate) fn sync_dir(dir: &Path) {
    let _ = File::open(dir).and_then(|d| d.sync_all());
}

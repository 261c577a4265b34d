//! Reading configs and JSON: regular files only, under a size limit.

use std::fs::{File, OpenOptions};
use std::io::Read;
use std::path::Path;

use super::error::kind_of;
use super::FileError;

/// Size limit for configuration and JSON files (HF configs, AOT configs, indexes): far above any
/// real one (a few KB to a few MB), far below what would exhaust memory.
pub const CONFIG_SIZE_LIMIT: u64 = 64 << 20;

/// Reads all of `path`, which must be a regular file (symlinks to one are fine) of at most
/// `limit` bytes. FIFOs and devices are refused before they are read, so `/dev/zero` or a named
/// pipe cannot exhaust memory or block the run; the limit is also enforced while reading, for
/// files whose size is not known in advance.
pub fn read_bounded(path: &Path, limit: u64) -> Result<Vec<u8>, FileError> {
    let file = open_regular(path)?;
    let mut bytes = Vec::new();
    file.take(limit.saturating_add(1)).read_to_end(&mut bytes).map_err(FileError::io("reading", path))?;
    if bytes.len() as u64 > limit {
        return Err(FileError::TooLarge { path: path.to_path_buf(), limit });
    }
    Ok(bytes)
}

/// [`read_bounded`] for UTF-8 text.
pub fn read_text_bounded(path: &Path, limit: u64) -> Result<String, FileError> {
    String::from_utf8(read_bounded(path, limit)?).map_err(|_| FileError::NotUtf8 { path: path.to_path_buf() })
}

/// Opens `path` for reading without blocking on a FIFO, then checks what was actually opened.
fn open_regular(path: &Path) -> Result<File, FileError> {
    let mut options = OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        // Opening a FIFO for reading blocks until a writer appears; non-blocking open returns at once.
        options.custom_flags(rustix::fs::OFlags::NONBLOCK.bits() as i32);
    }
    let file = options.open(path).map_err(FileError::io("opening", path))?;
    let file_type = file.metadata().map_err(FileError::io("reading the metadata of", path))?.file_type();
    if !file_type.is_file() {
        return Err(FileError::NotRegularFile { path: path.to_path_buf(), kind: kind_of(file_type) });
    }
    Ok(file)
}

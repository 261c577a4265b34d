use std::path::PathBuf;

/// Why a file could not be read or written safely. Every variant names the path.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("{action} {path}: {source}")]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is {kind}, expected a regular file")]
    NotRegularFile { path: PathBuf, kind: &'static str },
    #[error("{path} is larger than the {limit}-byte limit for this kind of file")]
    TooLarge { path: PathBuf, limit: u64 },
    #[error("{path} is not valid UTF-8 text")]
    NotUtf8 { path: PathBuf },
    #[error("output {path} is {kind}, expected a directory (or nothing) to replace")]
    OutputNotDirectory { path: PathBuf, kind: &'static str },
    #[error("output {output} would overwrite or remove the input {input}")]
    OutputIsInput { output: PathBuf, input: PathBuf },
    #[error("path {path} has no file name")]
    NoFileName { path: PathBuf },
}

impl FileError {
    pub(crate) fn io(action: &'static str, path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> FileError {
        let path = path.into();
        move |source| FileError::Io { action, path, source }
    }
}

/// What a non-regular file is, for error messages.
pub(crate) fn kind_of(file_type: std::fs::FileType) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if file_type.is_fifo() {
            return "a FIFO";
        }
        if file_type.is_char_device() || file_type.is_block_device() {
            return "a device";
        }
        if file_type.is_socket() {
            return "a socket";
        }
    }
    if file_type.is_dir() {
        "a directory"
    } else if file_type.is_symlink() {
        "a symbolic link"
    } else if file_type.is_file() {
        "a regular file"
    } else {
        "not a regular file"
    }
}

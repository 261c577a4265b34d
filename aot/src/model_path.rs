//! What a model argument may name, and the one place that turns it into an HF checkpoint
//! directory: a directory with `config.json` is used as it is; a GGUF file (llama.cpp's format,
//! recognised by its magic bytes, not its name) is converted once by [`checkpoint::gguf`] into
//! `<cache>/gguf/<file stem>-<identity>/` and that directory is used from then on. Anything else
//! is a [`ModelPathError`] saying what was found and what was expected.
//!
//! The identity is a 64-bit FNV-1a hash of the file's canonical path, size and modification
//! time, so a changed or replaced file is converted again and an unchanged one never is. The
//! conversion writes into a staging directory and renames it when complete
//! ([`checkpoint::gguf::convert_to_hf_dir`]), so a killed run leaves no half-written checkpoint.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

use checkpoint::gguf::{convert_to_hf_dir, GgufError, GgufFile};

/// The first bytes of every GGUF file.
pub const GGUF_MAGIC: &[u8; 4] = b"GGUF";

/// What the model arguments accept, for the errors.
const EXPECTED: &str = "expected an HF checkpoint directory (config.json + model.safetensors or shards) or a GGUF file";

/// A model path that is not a model.
#[derive(Debug, thiserror::Error)]
pub enum ModelPathError {
    #[error("model {path}: no such file or directory ({})", EXPECTED)]
    Missing { path: PathBuf },
    #[error("model {path}: a directory without config.json ({})", EXPECTED)]
    NoConfig { path: PathBuf },
    #[error(
        "model {path}: a file that is not GGUF (it starts with {start:?}, a GGUF file with \"GGUF\"; {})",
        EXPECTED
    )]
    NotGguf { path: PathBuf, start: String },
    #[error("model {path}: neither a file nor a directory ({})", EXPECTED)]
    NotFileOrDir { path: PathBuf },
    #[error("model {path}: cannot read it: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("model {path}: no cache directory for its conversion: neither MLLM_DSL_CACHE nor HOME is set")]
    NoCache { path: PathBuf },
    #[error("model {path}: converting the GGUF file into {dir}: {source}")]
    Convert {
        path: PathBuf,
        dir: PathBuf,
        #[source]
        source: Box<GgufError>,
    },
}

/// The HF checkpoint directory a model argument stands for: `path` itself when it is a directory
/// with `config.json`, the cached conversion of a GGUF file (converting it first if needed, into
/// [`mllm_dsl::files::project_cache`]); any other path is an error naming what it is and what was expected.
pub fn resolve_model(path: &Path) -> Result<PathBuf, ModelPathError> {
    match kind(path)? {
        Kind::HfDir => Ok(path.to_path_buf()),
        Kind::Gguf => {
            let cache =
                mllm_dsl::files::project_cache().ok_or_else(|| ModelPathError::NoCache { path: path.to_path_buf() })?;
            converted_gguf(path, &cache.join("gguf"))
        }
    }
}

enum Kind {
    HfDir,
    Gguf,
}

fn kind(path: &Path) -> Result<Kind, ModelPathError> {
    let io = |source| ModelPathError::Io { path: path.to_path_buf(), source };
    let meta = match std::fs::metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(ModelPathError::Missing { path: path.to_path_buf() })
        }
        Err(e) => return Err(io(e)),
    };
    if meta.is_dir() {
        return if path.join("config.json").is_file() {
            Ok(Kind::HfDir)
        } else {
            Err(ModelPathError::NoConfig { path: path.to_path_buf() })
        };
    }
    if !meta.is_file() {
        return Err(ModelPathError::NotFileOrDir { path: path.to_path_buf() });
    }
    let mut start = Vec::with_capacity(4);
    std::fs::File::open(path).and_then(|f| f.take(4).read_to_end(&mut start)).map_err(io)?;
    if start == GGUF_MAGIC {
        Ok(Kind::Gguf)
    } else {
        Err(ModelPathError::NotGguf { path: path.to_path_buf(), start: String::from_utf8_lossy(&start).into_owned() })
    }
}

/// The conversion of the GGUF file `path` under `root` (made now if it is not there yet).
pub fn converted_gguf(path: &Path, root: &Path) -> Result<PathBuf, ModelPathError> {
    let io = |source| ModelPathError::Io { path: path.to_path_buf(), source };
    let canonical = std::fs::canonicalize(path).map_err(io)?;
    let meta = std::fs::metadata(&canonical).map_err(io)?;
    let mtime = meta.modified().ok().and_then(|t| t.duration_since(UNIX_EPOCH).ok()).map_or(0, |d| d.as_nanos());
    let mut key = Vec::new();
    key.extend_from_slice(canonical.as_os_str().as_encoded_bytes());
    key.push(0);
    key.extend_from_slice(&meta.len().to_le_bytes());
    key.extend_from_slice(&mtime.to_le_bytes());
    let stem = canonical.file_stem().map_or_else(|| "model".into(), |s| s.to_string_lossy().into_owned());
    let dir = root.join(format!("{stem}-{:016x}", fnv1a64(&key)));
    if dir.join("config.json").is_file() {
        return Ok(dir);
    }
    let convert = |source: GgufError| ModelPathError::Convert {
        path: path.to_path_buf(),
        dir: dir.clone(),
        source: Box::new(source),
    };
    std::fs::create_dir_all(root).map_err(|e| convert(GgufError::Io { path: root.to_path_buf(), source: e }))?;
    eprintln!("converting {} (GGUF) into {} (once)", path.display(), dir.display());
    let result = GgufFile::open(&canonical).and_then(|gguf| convert_to_hf_dir(&gguf, &dir));
    match result {
        Ok(()) => Ok(dir),
        // Another process converted the same file meanwhile.
        Err(_) if dir.join("config.json").is_file() => Ok(dir),
        Err(e) => Err(convert(e)),
    }
}

/// FNV-1a, 64 bits: a stable hash (unlike std's `DefaultHasher`, whose algorithm may change).
fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixtures() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures")
    }

    fn temp(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("aot-model-path-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn fnv1a64_matches_the_published_test_vectors() {
        // From the FNV reference test suite (Fowler, Noll, Vo).
        assert_eq!(fnv1a64(b""), 0xcbf29ce484222325);
        assert_eq!(fnv1a64(b"a"), 0xaf63dc4c8601ec8c);
        assert_eq!(fnv1a64(b"foobar"), 0x85944171f73967e8);
    }

    #[test]
    fn a_directory_with_config_json_is_used_as_it_is() {
        let dir = fixtures().join("llama-dev-f32");
        assert_eq!(resolve_model(&dir).unwrap(), dir);
    }

    #[test]
    fn a_gguf_file_is_converted_once_and_reused() {
        let root = temp("cache");
        let gguf = fixtures().join("gguf-tiny/llama-tiny.gguf");
        let dir = converted_gguf(&gguf, &root).unwrap();
        assert!(dir.starts_with(&root) && dir.file_name().unwrap().to_str().unwrap().starts_with("llama-tiny-"));
        for f in ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"] {
            assert!(dir.join(f).is_file(), "{f} missing from {}", dir.display());
        }
        // The second call finds the conversion (a marker written into it survives).
        std::fs::write(dir.join("marker"), b"").unwrap();
        assert_eq!(converted_gguf(&gguf, &root).unwrap(), dir);
        assert!(dir.join("marker").is_file());
        // Nothing else was left in the cache: no staging directory, only the staging lock.
        let name = dir.file_name().unwrap().to_str().unwrap();
        let mut names: Vec<String> =
            std::fs::read_dir(&root).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        names.sort();
        assert_eq!(names, [format!(".{name}.lock"), name.to_string()]);
        // A different file (a copy has another path) gets its own directory.
        let copy = root.join("llama-tiny.gguf");
        std::fs::copy(&gguf, &copy).unwrap();
        assert_ne!(converted_gguf(&copy, &root).unwrap(), dir);
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn other_paths_say_what_was_expected() {
        let root = temp("errors");
        let text = |e: ModelPathError| e.to_string();
        let missing = root.join("nope");
        let err = text(resolve_model(&missing).unwrap_err());
        assert!(err.contains("no such file or directory") && err.contains("GGUF file"), "{err}");
        let err = text(resolve_model(&root).unwrap_err());
        assert!(err.contains("a directory without config.json") && err.contains(&root.display().to_string()), "{err}");
        let file = root.join("model.bin");
        std::fs::write(&file, b"PK\x03\x04 not a model").unwrap();
        let err = text(resolve_model(&file).unwrap_err());
        assert!(err.contains("a file that is not GGUF") && err.contains("model.bin"), "{err}");
        // A file that starts like GGUF but is cut short fails in the conversion, naming the file.
        let cut = root.join("cut.gguf");
        std::fs::write(&cut, b"GGUF\x03\x00").unwrap();
        let err = text(converted_gguf(&cut, &root.join("cache")).unwrap_err());
        assert!(err.contains("cut.gguf") && err.contains("converting the GGUF file"), "{err}");
        std::fs::remove_dir_all(&root).unwrap();
    }
}

//! [`SafetensorsCheckpoint`]: the tensors of an HF checkpoint directory (one file or shards),
//! memory-mapped and converted on demand, with tracking of which tensors a loader consumed.

use std::collections::{BTreeMap, HashMap};
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use super::convert::{self, LeScalar};
use super::mapped_file::{MappedBytes, MappedFile};
use super::near::near_matches;
use super::{CheckpointError, StDtype};

/// Single-file checkpoint name.
pub const SINGLE_FILE: &str = "model.safetensors";
/// Sharded checkpoint index (`weight_map`: tensor name -> shard file name).
pub const SHARD_INDEX: &str = "model.safetensors.index.json";

/// Source bytes converted between two page releases. Large enough to amortise the `madvise`
/// call, small enough that the mapped pages of a tensor never pile up next to its converted copy.
const CHUNK_BYTES: usize = 4 << 20;

struct Entry {
    name: String,
    file: usize,
    dtype: StDtype,
    shape: Vec<usize>,
    /// Absolute byte range in the file's mapping.
    start: usize,
    end: usize,
    used: AtomicBool,
}

/// The tensors of a safetensors checkpoint.
///
/// Files are memory-mapped, not read: opening costs only the headers. Each `read_*` converts
/// straight from the mapping into a fresh `Vec` and then advises the kernel (`MADV_DONTNEED`)
/// that the mapped pages it came from are no longer needed, chunk by chunk. Loading a whole model
/// therefore peaks near the size of the converted weights, not converted weights plus the whole
/// mapped file. (The pages stay in the page cache, which the kernel reclaims as it likes; a
/// second read of the same tensor simply faults them back in.)
///
/// Every successful read marks its tensor as used; [`SafetensorsCheckpoint::unused_keys`] lists
/// the others so loaders can warn about weights a model never asked for. Reads take `&self` and
/// the type is `Sync`, so layers may be loaded from several threads.
///
/// Tensors that `safetensors.torch.save_model` de-duplicated (recorded in the header metadata as
/// `removed name -> kept name`, e.g. by mllm's quantized export) are readable under both names.
pub struct SafetensorsCheckpoint {
    /// What was opened: the directory or the file (for error messages).
    root: PathBuf,
    files: Vec<MappedFile>,
    /// Sorted by name.
    entries: Vec<Entry>,
    by_name: HashMap<String, usize>,
    aliases: HashMap<String, usize>,
    metadata: BTreeMap<String, String>,
}

impl SafetensorsCheckpoint {
    /// Opens an HF checkpoint directory: `model.safetensors` if present (transformers' preference),
    /// else the shards listed by `model.safetensors.index.json`.
    pub fn open(dir: impl AsRef<Path>) -> Result<Self, CheckpointError> {
        let dir = dir.as_ref();
        let single = dir.join(SINGLE_FILE);
        if single.is_file() {
            let file = MappedFile::open(&single)?;
            return Self::assemble(dir, vec![file]);
        }
        let index = dir.join(SHARD_INDEX);
        if index.is_file() {
            return Self::open_sharded(dir, &index);
        }
        if !dir.is_dir() {
            return Err(CheckpointError::Io {
                path: dir.to_path_buf(),
                source: std::io::Error::new(std::io::ErrorKind::NotFound, "no such directory"),
            });
        }
        Err(CheckpointError::NotFound { dir: dir.to_path_buf() })
    }

    /// Opens one `.safetensors` file (any name), e.g. a reference-activations file.
    pub fn open_file(path: impl AsRef<Path>) -> Result<Self, CheckpointError> {
        let path = path.as_ref();
        let file = MappedFile::open(path)?;
        Self::assemble(path, vec![file])
    }

    fn open_sharded(dir: &Path, index: &Path) -> Result<Self, CheckpointError> {
        let bad = |reason: String| CheckpointError::BadIndex { path: index.to_path_buf(), reason };
        let text = mllm_dsl::files::read_text_bounded(index, mllm_dsl::files::CONFIG_SIZE_LIMIT)?;
        let root: serde_json::Value = serde_json::from_str(&text).map_err(|e| bad(format!("not valid JSON: {e}")))?;
        let weight_map = root
            .get("weight_map")
            .ok_or_else(|| bad("missing field `weight_map`".into()))?
            .as_object()
            .ok_or_else(|| bad("field `weight_map` must be an object".into()))?;

        let mut shard_of: Vec<(&str, &str)> = Vec::with_capacity(weight_map.len());
        for (key, shard) in weight_map {
            let shard = shard
                .as_str()
                .ok_or_else(|| bad(format!("`weight_map.{key}` must be a shard file name, found {shard}")))?;
            let relative = Path::new(shard);
            if !relative.components().all(|c| matches!(c, Component::Normal(_))) {
                return Err(bad(format!(
                    "`weight_map.{key}` names '{shard}', which is not a path inside {}",
                    dir.display()
                )));
            }
            shard_of.push((key, shard));
        }
        let mut shard_names: Vec<&str> = shard_of.iter().map(|&(_, s)| s).collect();
        shard_names.sort_unstable();
        shard_names.dedup();
        if shard_names.is_empty() {
            return Err(bad("`weight_map` is empty".into()));
        }

        let files = shard_names.iter().map(|name| MappedFile::open(&dir.join(name))).collect::<Result<Vec<_>, _>>()?;
        let checkpoint = Self::assemble(dir, files)?;
        for (key, shard) in shard_of {
            let listed_in = checkpoint.by_name.get(key).map(|&i| &checkpoint.files[checkpoint.entries[i].file].path);
            let shard_path = dir.join(shard);
            if listed_in != Some(&shard_path) {
                return Err(CheckpointError::ShardMissingTensor {
                    index: index.to_path_buf(),
                    key: key.to_string(),
                    shard: shard_path,
                });
            }
        }
        Ok(checkpoint)
    }

    fn assemble(root: &Path, files: Vec<MappedFile>) -> Result<Self, CheckpointError> {
        let mut entries = Vec::new();
        for (file_index, file) in files.iter().enumerate() {
            for (name, info) in &file.tensors {
                let (start, end) = file.range(info);
                entries.push(Entry {
                    name: name.clone(),
                    file: file_index,
                    dtype: info.dtype,
                    shape: info.shape.clone(),
                    start,
                    end,
                    used: AtomicBool::new(false),
                });
            }
        }
        entries.sort_by(|a, b| a.name.cmp(&b.name));
        if let Some(pair) = entries.windows(2).find(|w| w[0].name == w[1].name) {
            return Err(CheckpointError::DuplicateTensor {
                key: pair[0].name.clone(),
                first: files[pair[0].file].path.clone(),
                second: files[pair[1].file].path.clone(),
            });
        }
        let by_name: HashMap<String, usize> = entries.iter().enumerate().map(|(i, e)| (e.name.clone(), i)).collect();

        let mut metadata = BTreeMap::new();
        let mut aliases = HashMap::new();
        for file in &files {
            for (key, value) in &file.metadata {
                // save_model's shared-tensor record: a key that is no tensor, pointing at one.
                if let (None, Some(&target)) = (by_name.get(key), by_name.get(value)) {
                    aliases.insert(key.clone(), target);
                }
                metadata.entry(key.clone()).or_insert_with(|| value.clone());
            }
        }
        Ok(SafetensorsCheckpoint { root: root.to_path_buf(), files, entries, by_name, aliases, metadata })
    }

    /// The directory or file this checkpoint was opened from.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The `.safetensors` files backing this checkpoint.
    pub fn files(&self) -> impl Iterator<Item = &Path> {
        self.files.iter().map(|f| f.path.as_path())
    }

    /// Names of all stored tensors, sorted.
    pub fn keys(&self) -> Vec<&str> {
        self.entries.iter().map(|e| e.name.as_str()).collect()
    }

    /// Whether `key` names a stored tensor or an alias of one.
    pub fn contains(&self, key: &str) -> bool {
        self.lookup(key).is_some()
    }

    /// Header metadata (`__metadata__`) of all files merged; the first file wins on conflicts.
    pub fn metadata(&self) -> &BTreeMap<String, String> {
        &self.metadata
    }

    /// Stored dtype and shape of `key`. Does not mark it used.
    pub fn info(&self, key: &str) -> Result<(StDtype, &[usize]), CheckpointError> {
        let entry = self.entry(key)?;
        Ok((entry.dtype, &entry.shape))
    }

    /// Marks `key` as consumed without reading it (e.g. a buffer the model recomputes).
    pub fn mark_used(&self, key: &str) -> Result<(), CheckpointError> {
        self.entry(key)?.used.store(true, Ordering::Relaxed);
        Ok(())
    }

    /// Stored tensors no successful read (or [`Self::mark_used`]) has touched, sorted.
    pub fn unused_keys(&self) -> Vec<&str> {
        self.entries.iter().filter(|e| !e.used.load(Ordering::Relaxed)).map(|e| e.name.as_str()).collect()
    }

    /// The tensor as f32, converting f32/bf16/f16/f64, booleans and integer dtypes.
    pub fn read_f32(&self, key: &str) -> Result<Vec<f32>, CheckpointError> {
        let entry = self.entry(key)?;
        if !convert::converts_to_f32(entry.dtype) {
            return Err(CheckpointError::UnsupportedDtype {
                key: key.to_string(),
                path: self.files[entry.file].path.clone(),
                dtype: entry.dtype,
            });
        }
        let dtype = entry.dtype;
        self.read_converted(entry, |src, dst| convert::to_f32(dtype, src, dst))
    }

    /// A float parameter (a weight, a norm, a quantization scale) as f32: the stored dtype must be
    /// a float one (F32, BF16, F16, F64) and every value finite after the conversion to f32, so an
    /// integer or boolean tensor at a weight's key, or an `inf` scale, is an error naming the
    /// tensor instead of numbers silently used.
    pub fn read_float_param(&self, key: &str) -> Result<Vec<f32>, CheckpointError> {
        let entry = self.entry(key)?;
        if !matches!(entry.dtype, StDtype::F32 | StDtype::BF16 | StDtype::F16 | StDtype::F64) {
            return Err(CheckpointError::DtypeMismatch {
                key: key.to_string(),
                path: self.files[entry.file].path.clone(),
                expected: "a float dtype (F32, BF16, F16 or F64) for a float parameter".into(),
                found: entry.dtype,
            });
        }
        let values = self.read_f32(key)?;
        check_finite(key, &self.files[entry.file].path, &values)?;
        Ok(values)
    }

    /// A `U8` tensor (e.g. quantization scales stored as bytes).
    pub fn read_u8(&self, key: &str) -> Result<Vec<u8>, CheckpointError> {
        self.read_typed(key)
    }

    /// An `I8` tensor (e.g. int8/int4 quantized weights).
    pub fn read_i8(&self, key: &str) -> Result<Vec<i8>, CheckpointError> {
        self.read_typed(key)
    }

    /// A `U16` tensor (e.g. uint16 quantized norms or embeddings).
    pub fn read_u16(&self, key: &str) -> Result<Vec<u16>, CheckpointError> {
        self.read_typed(key)
    }

    /// An `I32` tensor (e.g. zero points).
    pub fn read_i32(&self, key: &str) -> Result<Vec<i32>, CheckpointError> {
        self.read_typed(key)
    }

    /// An `I64` tensor (e.g. token ids).
    pub fn read_i64(&self, key: &str) -> Result<Vec<i64>, CheckpointError> {
        self.read_typed(key)
    }

    /// The stored bytes of `key` as they are in the file (little-endian, any dtype), e.g. for a
    /// backend that embeds quantized weights without converting them.
    pub fn read_bytes(&self, key: &str) -> Result<Vec<u8>, CheckpointError> {
        let mut out = Vec::with_capacity(self.entry(key)?.end - self.entry(key)?.start);
        self.visit_bytes(key, |chunk| out.extend_from_slice(chunk))?;
        Ok(out)
    }

    /// Hands the stored bytes of `key` to `visit` in one piece straight from the mapping (no
    /// copy), releasing its pages afterwards. Returns the stored dtype.
    pub fn with_bytes(&self, key: &str, visit: impl FnOnce(&[u8])) -> Result<StDtype, CheckpointError> {
        let entry = self.entry(key)?;
        let file = &self.files[entry.file];
        visit(file.bytes(entry.start, entry.end));
        file.release(entry.start, entry.end);
        entry.used.store(true, Ordering::Relaxed);
        Ok(entry.dtype)
    }

    /// The stored bytes of `key` as an owned handle on the mapping (no copy; pages become
    /// resident as they are read). Returns the stored dtype too.
    pub fn mapped_bytes(&self, key: &str) -> Result<(StDtype, MappedBytes), CheckpointError> {
        let entry = self.entry(key)?;
        entry.used.store(true, Ordering::Relaxed);
        Ok((entry.dtype, self.files[entry.file].share(entry.start, entry.end)))
    }

    /// Hands the stored bytes of `key` to `visit` straight from the mapping, in chunks of whole
    /// elements, releasing each chunk's pages afterwards: a scan (a range check) costs no copy.
    /// Returns the stored dtype.
    pub fn visit_bytes(&self, key: &str, mut visit: impl FnMut(&[u8])) -> Result<StDtype, CheckpointError> {
        let entry = self.entry(key)?;
        let file = &self.files[entry.file];
        let element = convert::element_size(entry.dtype).unwrap_or(1);
        let chunk = (CHUNK_BYTES / element).max(1) * element;
        for start in (entry.start..entry.end).step_by(chunk) {
            let end = (start + chunk).min(entry.end);
            visit(file.bytes(start, end));
            file.release(start, end);
        }
        entry.used.store(true, Ordering::Relaxed);
        Ok(entry.dtype)
    }

    /// A tensor whose stored dtype is exactly `T`'s; any other dtype is an error.
    pub fn read_typed<T: LeScalar>(&self, key: &str) -> Result<Vec<T>, CheckpointError> {
        let entry = self.entry(key)?;
        if entry.dtype != T::DTYPE {
            return Err(CheckpointError::DtypeMismatch {
                key: key.to_string(),
                path: self.files[entry.file].path.clone(),
                expected: T::DTYPE.to_string(),
                found: entry.dtype,
            });
        }
        self.read_converted(entry, convert::copy_le::<T>)
    }

    fn lookup(&self, key: &str) -> Option<&Entry> {
        self.by_name.get(key).or_else(|| self.aliases.get(key)).map(|&i| &self.entries[i])
    }

    fn entry(&self, key: &str) -> Result<&Entry, CheckpointError> {
        self.lookup(key).ok_or_else(|| CheckpointError::MissingTensor {
            checkpoint: self.root.clone(),
            key: key.to_string(),
            requested_by: String::new(),
            near: near_matches(key, self.by_name.keys().map(String::as_str)),
        })
    }

    /// Converts `entry` chunk by chunk, releasing each chunk's mapped pages once converted.
    fn read_converted<T: Clone + Default>(
        &self,
        entry: &Entry,
        convert: impl Fn(&[u8], &mut [T]),
    ) -> Result<Vec<T>, CheckpointError> {
        let file = &self.files[entry.file];
        let element = convert::element_size(entry.dtype).ok_or_else(|| CheckpointError::UnsupportedDtype {
            key: entry.name.clone(),
            path: file.path.clone(),
            dtype: entry.dtype,
        })?;
        // The header was validated by safetensors, so the byte length matches the shape.
        let count = (entry.end - entry.start) / element;
        let mut out = vec![T::default(); count];
        let per_chunk = (CHUNK_BYTES / element).max(1);
        for (index, dst) in out.chunks_mut(per_chunk).enumerate() {
            let start = entry.start + index * per_chunk * element;
            let end = start + dst.len() * element;
            convert(file.bytes(start, end), dst);
            file.release(start, end);
        }
        entry.used.store(true, Ordering::Relaxed);
        Ok(out)
    }
}

/// Every value of the float tensor `key` is finite; the error names the first that is not.
fn check_finite(key: &str, path: &Path, values: &[f32]) -> Result<(), CheckpointError> {
    match values.iter().position(|v| !v.is_finite()) {
        None => Ok(()),
        Some(index) => Err(CheckpointError::NonFinite {
            key: key.to_string(),
            path: path.to_path_buf(),
            index,
            value: values[index],
        }),
    }
}

impl std::fmt::Debug for SafetensorsCheckpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SafetensorsCheckpoint")
            .field("root", &self.root)
            .field("files", &self.files.len())
            .field("tensors", &self.entries.len())
            .finish()
    }
}

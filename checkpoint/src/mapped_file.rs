//! One memory-mapped `.safetensors` file: header parsed and validated, tensor bytes served
//! straight from the mapping, pages handed back to the kernel once converted.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use memmap2::Mmap;
use safetensors::tensor::{Metadata, TensorInfo};
use safetensors::{SafeTensorError, SafeTensors};

use super::CheckpointError;

/// Byte size of the little-endian header length that starts every safetensors file.
const LEN_PREFIX: usize = 8;

pub(crate) struct MappedFile {
    pub(crate) path: PathBuf,
    /// Kept open for [`MappedBytes::read_at`].
    file: Arc<File>,
    mmap: Arc<Mmap>,
    /// Offset of the data section (after the length prefix and the JSON header).
    data_start: usize,
    pub(crate) metadata: HashMap<String, String>,
    pub(crate) tensors: Vec<(String, TensorInfo)>,
}

impl MappedFile {
    pub(crate) fn open(path: &Path) -> Result<Self, CheckpointError> {
        let io_err = |source| CheckpointError::Io { path: path.to_path_buf(), source };
        let file = File::open(path).map_err(io_err)?;
        // SAFETY: the mapping is read-only; as for every mmap-based loader, the checkpoint file
        // must not be truncated or rewritten while the checkpoint is open.
        let mmap = unsafe { Mmap::map(&file) }.map_err(io_err)?;
        let (header_len, metadata) = SafeTensors::read_metadata(&mmap).map_err(|e| CheckpointError::Corrupt {
            path: path.to_path_buf(),
            reason: describe_header_error(&mmap, &e),
        })?;
        let tensors = tensor_list(&metadata);
        Ok(MappedFile {
            path: path.to_path_buf(),
            data_start: LEN_PREFIX + header_len,
            metadata: metadata.metadata().clone().unwrap_or_default(),
            tensors,
            mmap: Arc::new(mmap),
            file: Arc::new(file),
        })
    }

    /// Absolute byte range of a tensor inside the mapping.
    pub(crate) fn range(&self, info: &TensorInfo) -> (usize, usize) {
        let (begin, end) = info.data_offsets;
        (self.data_start + begin, self.data_start + end)
    }

    pub(crate) fn bytes(&self, start: usize, end: usize) -> &[u8] {
        &self.mmap[start..end]
    }

    /// An owned handle on `start..end` of the mapping, valid after the checkpoint is dropped.
    pub(crate) fn share(&self, start: usize, end: usize) -> MappedBytes {
        MappedBytes { map: Arc::clone(&self.mmap), file: Arc::clone(&self.file), start, end }
    }

    /// Tells the kernel the mapped pages of `start..end` are no longer needed, so they leave
    /// this process's resident set right away instead of staying until memory pressure.
    ///
    /// Best effort: a refusal only costs memory, never correctness, so errors are ignored.
    pub(crate) fn release(&self, start: usize, end: usize) {
        if end <= start {
            return;
        }
        #[cfg(unix)]
        {
            use memmap2::UncheckedAdvice;
            // SAFETY: `Mmap::map` creates a shared, read-only, file-backed mapping. For such a
            // mapping MADV_DONTNEED only drops page-table entries: a later access faults the
            // page back in from the file with identical contents, so slices borrowed from the
            // mapping stay valid and unchanged. (memmap2 rounds `start` down to a page
            // boundary; touching a neighbour tensor's page is harmless for the same reason.)
            let _ = unsafe { self.mmap.unchecked_advise_range(UncheckedAdvice::DontNeed, start, end - start) };
        }
    }
}

/// One tensor's stored bytes, served from the checkpoint's memory map for as long as the handle
/// lives ([`SafetensorsCheckpoint::mapped_bytes`](crate::SafetensorsCheckpoint::mapped_bytes)).
///
/// Pages become resident as they are read through the mapping, a whole page-cache folio at a time;
/// bytes read a few scattered rows at a time (an embedding table) use [`MappedBytes::read_at`],
/// which copies the rows and keeps none of the table resident.
#[derive(Clone)]
pub struct MappedBytes {
    map: Arc<Mmap>,
    file: Arc<File>,
    start: usize,
    end: usize,
}

impl MappedBytes {
    /// Copies the bytes at `offset..offset + out.len()` (offsets into these bytes) into `out`
    /// with a positioned read of the file, leaving the mapping untouched.
    ///
    /// For bytes read a few scattered rows at a time (an embedding table): a page fault maps a
    /// whole folio of the page cache, and a kernel that keeps the file in large folios maps up
    /// to 2 MiB around each row read through the mapping (Linux 6.18: a 135M model's 57 MB
    /// uint16 table was 51 MB resident after 160 lookups); a read copies just the row.
    /// A failed read (a file truncated since it was mapped) falls back to the mapping.
    pub fn read_at(&self, offset: usize, out: &mut [u8]) {
        let range = offset..offset + out.len();
        assert!(range.end <= self.end - self.start, "read of {range:?} past {} bytes", self.end - self.start);
        #[cfg(unix)]
        {
            use std::os::unix::fs::FileExt;
            if self.file.read_exact_at(out, (self.start + offset) as u64).is_ok() {
                return;
            }
        }
        out.copy_from_slice(&self.as_ref()[range]);
    }
}

impl AsRef<[u8]> for MappedBytes {
    fn as_ref(&self) -> &[u8] {
        &self.map[self.start..self.end]
    }
}

impl std::fmt::Debug for MappedBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MappedBytes({} bytes)", self.end - self.start)
    }
}

fn tensor_list(metadata: &Metadata) -> Vec<(String, TensorInfo)> {
    metadata.tensors().into_iter().map(|(name, info)| (name, info.clone())).collect()
}

/// Turns the safetensors crate's terse header errors into what a person needs to act on.
fn describe_header_error(file: &[u8], err: &SafeTensorError) -> String {
    let header_len = file.get(..LEN_PREFIX).map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")));
    match err {
        SafeTensorError::HeaderTooSmall => {
            format!("file is {} bytes, shorter than the 8-byte header length prefix", file.len())
        }
        SafeTensorError::HeaderTooLarge => format!(
            "declared header length {} exceeds the 100 MB safetensors limit (not a safetensors \
             file?)",
            header_len.unwrap_or(0)
        ),
        SafeTensorError::InvalidHeaderLength => format!(
            "declared header length {} runs past the end of the {}-byte file (truncated?)",
            header_len.unwrap_or(0),
            file.len()
        ),
        SafeTensorError::InvalidHeader(e) => format!("header is not UTF-8: {e}"),
        SafeTensorError::InvalidHeaderDeserialization(e) => {
            format!("header is not valid safetensors JSON: {e}")
        }
        SafeTensorError::MetadataIncompleteBuffer => {
            let data_len = file.len() as u64 - LEN_PREFIX as u64 - header_len.unwrap_or(0);
            match declared_data_len(file) {
                Some(expected) if expected > data_len => format!(
                    "file is truncated: the header's tensors need {expected} data bytes, the \
                     file has {data_len}"
                ),
                Some(expected) => format!(
                    "file has {} bytes after the last tensor (the header's tensors need \
                     {expected} data bytes, the file has {data_len})",
                    data_len - expected
                ),
                None => "data section size does not match the header's tensor offsets".into(),
            }
        }
        SafeTensorError::InvalidOffset(name) => {
            format!("tensor '{name}' has data offsets that overlap or leave gaps")
        }
        SafeTensorError::TensorInvalidInfo => "a tensor's byte range does not match its shape and dtype".into(),
        other => other.to_string(),
    }
}

/// End of the last tensor according to the header, read leniently (only for error messages).
fn declared_data_len(file: &[u8]) -> Option<u64> {
    let n = usize::try_from(u64::from_le_bytes(file.get(..LEN_PREFIX)?.try_into().ok()?)).ok()?;
    let header: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(file.get(LEN_PREFIX..LEN_PREFIX.checked_add(n)?)?).ok()?;
    header
        .iter()
        .filter(|(k, _)| k.as_str() != "__metadata__")
        .filter_map(|(_, v)| v.get("data_offsets")?.get(1)?.as_u64())
        .max()
}

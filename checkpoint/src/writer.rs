//! Writing safetensors files atomically: readers see the old file or the complete new one.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;

use safetensors::tensor::{Metadata, TensorInfo};

use super::{CheckpointError, StDtype};

/// One tensor to write: name, dtype, shape and its little-endian bytes.
pub type TensorBytes<'a> = (&'a str, StDtype, &'a [usize], &'a [u8]);

/// Writes `tensors` and `metadata` (the header's `__metadata__`) as a safetensors file at `path`.
///
/// The file is written through [`mllm_dsl::files::write_atomic`] (a fresh temporary name, flushed,
/// then renamed over `path`), so a crash or an error never leaves a half-written `path`. Byte lengths are checked against shapes first.
/// Like the safetensors crate, tensors are laid out by decreasing dtype alignment, then name,
/// so every tensor stays aligned for readers that reinterpret the mapping in place.
pub fn write_safetensors_atomic(
    path: impl AsRef<Path>,
    tensors: &[TensorBytes<'_>],
    metadata: &BTreeMap<String, String>,
) -> Result<(), CheckpointError> {
    let path = path.as_ref();
    let fail = |reason: String| CheckpointError::Write { path: path.to_path_buf(), reason };

    let mut seen = HashSet::with_capacity(tensors.len());
    for &(name, dtype, shape, bytes) in tensors {
        if !seen.insert(name) {
            return Err(fail(format!("tensor '{name}' is given twice")));
        }
        let expected = expected_bytes(dtype, shape).ok_or_else(|| {
            fail(format!("tensor '{name}': {dtype} {shape:?} is not a whole number of bytes or overflows"))
        })?;
        if bytes.len() != expected {
            return Err(fail(format!(
                "tensor '{name}': {dtype} {shape:?} needs {expected} bytes, {} given",
                bytes.len()
            )));
        }
    }
    let mut ordered: Vec<&TensorBytes<'_>> = tensors.iter().collect();
    ordered.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    let header = header_bytes(&ordered, metadata, path)?;

    mllm_dsl::files::write_atomic(path, |w| {
        w.write_all(&header)?;
        ordered.iter().try_for_each(|t| w.write_all(t.3))
    })?;
    Ok(())
}

/// Length prefix + JSON header (serialised by the safetensors crate), space-padded to 8 bytes
/// so the data section starts aligned.
fn header_bytes(
    ordered: &[&TensorBytes<'_>],
    metadata: &BTreeMap<String, String>,
    path: &Path,
) -> Result<Vec<u8>, CheckpointError> {
    let fail =
        |e: &dyn std::fmt::Display| CheckpointError::Write { path: path.to_path_buf(), reason: format!("header: {e}") };
    let mut offset = 0;
    let infos = ordered
        .iter()
        .map(|&&(name, dtype, shape, bytes)| {
            let info = TensorInfo { dtype, shape: shape.to_vec(), data_offsets: (offset, offset + bytes.len()) };
            offset += bytes.len();
            (name.to_string(), info)
        })
        .collect();
    let header_metadata =
        (!metadata.is_empty()).then(|| metadata.iter().map(|(k, v)| (k.clone(), v.clone())).collect::<HashMap<_, _>>());
    let header = Metadata::new(header_metadata, infos).map_err(|e| fail(&e))?;
    let mut json = serde_json::to_vec(&header).map_err(|e| fail(&e))?;
    json.resize(json.len().div_ceil(8) * 8, b' ');
    let mut out = (json.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&json);
    Ok(out)
}

fn expected_bytes(dtype: StDtype, shape: &[usize]) -> Option<usize> {
    let elements = shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d))?;
    let bits = elements.checked_mul(dtype.bitsize())?;
    (bits & 7 == 0).then_some(bits / 8)
}

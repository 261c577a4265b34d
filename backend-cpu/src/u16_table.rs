//! [`U16Table`]: a per-tensor uint16-quantized table (pymllm's embedding export) kept as its codes.
//!
//! The value of code `q` is `(q - zero_point) * scale`. An embedding lookup dequantizes only the
//! rows it gathers, so the table costs 2 bytes per element instead of 4, and when it is served
//! from the checkpoint's memory map ([`U16Table::from_le_bytes`]) the lookups read their rows from
//! the file ([`TableBytes::read_at`]) and none of it becomes resident; any other op sees the f32
//! values in the table's logical layout.

use crate::kernels::KernelError;
use mllm_dsl::{BackendRef, DType, NativeData, Result, Storage, Tensor, TensorType};
use std::any::Any;
use std::sync::Arc;

/// Bytes a [`U16Table`]'s codes live in: owned, or a view of a memory-mapped checkpoint.
pub trait TableBytes: AsRef<[u8]> + Send + Sync + 'static {
    /// Copies the bytes at `offset..offset + out.len()` into `out` (a gathered row). A memory
    /// map reads them from the file instead ([`checkpoint::MappedBytes::read_at`]), so the
    /// lookups leave no part of the table resident.
    fn read_at(&self, offset: usize, out: &mut [u8]) {
        out.copy_from_slice(&self.as_ref()[offset..offset + out.len()]);
    }
}

impl TableBytes for Vec<u8> {}

impl TableBytes for checkpoint::MappedBytes {
    fn read_at(&self, offset: usize, out: &mut [u8]) {
        checkpoint::MappedBytes::read_at(self, offset, out);
    }
}

/// A row-major `[rows, cols]` table of uint16 codes with one scale and zero point.
#[derive(Clone)]
pub struct U16Table {
    /// Little-endian codes.
    codes: Arc<dyn TableBytes>,
    rows: usize,
    cols: usize,
    scale: f32,
    zero_point: i32,
}

impl std::fmt::Debug for U16Table {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (rows, cols, scale, zero_point) = (self.rows, self.cols, self.scale, self.zero_point);
        write!(f, "U16Table {{ rows: {rows}, cols: {cols}, scale: {scale}, zero_point: {zero_point} }}")
    }
}

impl PartialEq for U16Table {
    fn eq(&self, other: &U16Table) -> bool {
        (self.rows, self.cols, self.scale, self.zero_point) == (other.rows, other.cols, other.scale, other.zero_point)
            && self.le_bytes() == other.le_bytes()
    }
}

impl NativeData for U16Table {
    fn len(&self) -> usize {
        self.rows * self.cols
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl U16Table {
    /// `codes` must hold `rows * cols` values.
    pub fn new(codes: Vec<u16>, rows: usize, cols: usize, scale: f32, zero_point: i32) -> Result<Self, KernelError> {
        let bytes: Vec<u8> = codes.iter().flat_map(|q| q.to_le_bytes()).collect();
        U16Table::from_le_bytes(bytes, rows, cols, scale, zero_point)
    }

    /// A table over little-endian codes held by `bytes` (`2 * rows * cols` bytes), without a
    /// copy: a [`checkpoint::MappedBytes`] keeps the table in the checkpoint's memory map.
    pub fn from_le_bytes(
        bytes: impl TableBytes,
        rows: usize,
        cols: usize,
        scale: f32,
        zero_point: i32,
    ) -> Result<Self, KernelError> {
        // Two bytes per code: the byte count must be that of a `[rows, cols, 2]` array.
        crate::kernels::shape::check_len_of("u16_table", "code bytes", bytes.as_ref().len(), &[rows, cols, 2])?;
        Ok(U16Table { codes: Arc::new(bytes), rows, cols, scale, zero_point })
    }

    fn le_bytes(&self) -> &[u8] {
        (*self.codes).as_ref()
    }

    /// Dequantized values of the codes in `bytes` (little-endian pairs).
    fn values<'a>(&'a self, bytes: &'a [u8]) -> impl Iterator<Item = f32> + 'a {
        bytes.chunks_exact(2).map(|b| self.value(u16::from_le_bytes([b[0], b[1]])))
    }

    #[inline]
    fn value(&self, q: u16) -> f32 {
        (i32::from(q) - self.zero_point) as f32 * self.scale
    }

    /// An eager f32 tensor of `shape` (`rows * cols` elements) backed by this table.
    pub fn into_tensor(self, shape: Vec<usize>, backend: BackendRef) -> Result<Tensor> {
        Tensor::from_storage(TensorType::new(shape, DType::F32), Storage::Native(Arc::new(self)), backend)
    }

    /// Rows `ids` of the table, dequantized (an embedding lookup). Ids must lie in `0..rows`.
    pub fn gather_rows(&self, ids: &[i64]) -> Result<Vec<f32>, KernelError> {
        let mut out = Vec::with_capacity(ids.len() * self.cols);
        let mut row = vec![0u8; 2 * self.cols];
        for (position, &id) in ids.iter().enumerate() {
            let r = usize::try_from(id).ok().filter(|&r| r < self.rows).ok_or(KernelError::IndexOutOfRange {
                op: "gather_rows",
                index: id,
                position,
                dim: 0,
                bound: self.rows,
            })?;
            self.codes.read_at(2 * r * self.cols, &mut row);
            out.extend(self.values(&row));
        }
        Ok(out)
    }

    /// The whole table as f32, row-major.
    pub fn to_f32(&self) -> Vec<f32> {
        self.values(self.le_bytes()).collect()
    }

    /// The grid of its values.
    pub fn grid(&self) -> crate::kernels::Grid {
        crate::kernels::Grid { scale: self.scale, zero_point: self.zero_point }
    }

    /// Bytes held by the codes.
    pub fn bytes(&self) -> usize {
        self.le_bytes().len()
    }
}

/// The uint16 table behind `t`, if it has one.
pub fn u16_table_of(t: &Tensor) -> Option<&U16Table> {
    match t.storage()? {
        Storage::Native(data) => data.downcast_ref::<U16Table>(),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use checkpoint::{write_safetensors_atomic, SafetensorsCheckpoint, StDtype};
    use std::collections::BTreeMap;

    #[test]
    fn a_table_served_from_the_checkpoints_map_gathers_its_rows() {
        let (rows, cols, scale, zero_point) = (5, 3, 0.25f32, 32768);
        let codes: Vec<u16> = (0..(rows * cols) as u16).map(|i| 32760 + 3 * i).collect();
        let bytes: Vec<u8> = codes.iter().flat_map(|q| q.to_le_bytes()).collect();
        let dir = tempfile::tempdir().unwrap();
        // Another tensor beside the table in the file.
        let tensors = [("a", StDtype::U8, &[3usize][..], &[1u8, 2, 3][..]), ("t", StDtype::U16, &[rows, cols], &bytes)];
        write_safetensors_atomic(dir.path().join("model.safetensors"), &tensors, &BTreeMap::new()).unwrap();
        let ckpt = SafetensorsCheckpoint::open(dir.path()).unwrap();
        let (dtype, mapped) = ckpt.mapped_bytes("t").unwrap();
        drop(ckpt); // the handle keeps the mapping
        assert_eq!(dtype, StDtype::U16);
        let table = U16Table::from_le_bytes(mapped, rows, cols, scale, zero_point).unwrap();
        let want = |r: usize| -> Vec<f32> {
            codes[r * cols..(r + 1) * cols].iter().map(|&q| (f64::from(q) - 32768.0) as f32 * 0.25).collect()
        };
        assert_eq!(table.gather_rows(&[4, 0]).unwrap(), [want(4), want(0)].concat());
        assert_eq!(table.gather_rows(&[0, 4, 0]).unwrap(), [want(0), want(4), want(0)].concat());
        assert_eq!(table.to_f32(), (0..rows).flat_map(want).collect::<Vec<_>>());
        assert_eq!(table, U16Table::new(codes, rows, cols, scale, zero_point).unwrap());
        assert!(matches!(table.gather_rows(&[5]), Err(KernelError::IndexOutOfRange { index: 5, .. })));
    }

    /// Resident KiB of the mapping that holds `addr` (`/proc/self/smaps`).
    #[cfg(target_os = "linux")]
    fn resident_kib_at(addr: usize) -> usize {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let mut inside = false;
        for line in smaps.lines() {
            if let Some((range, _)) = line.split_once(' ').filter(|(r, _)| r.contains('-') && !r.ends_with(':')) {
                let (lo, hi) = range.split_once('-').unwrap();
                let (lo, hi) = (usize::from_str_radix(lo, 16).unwrap(), usize::from_str_radix(hi, 16).unwrap());
                inside = (lo..hi).contains(&addr);
            } else if inside && line.starts_with("Rss:") {
                return line.split_whitespace().nth(1).unwrap().parse().unwrap();
            }
        }
        panic!("no mapping holds {addr:#x}");
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn gathered_rows_of_a_mapped_table_do_not_stay_resident() {
        // 8 MiB of codes, every row gathered once: the whole table passes through the lookups.
        let (rows, cols) = (1024, 4096);
        let bytes: Vec<u8> = (0..rows * cols * 2).map(|i| (i % 251) as u8).collect();
        let dir = tempfile::tempdir().unwrap();
        let tensors = [("t", StDtype::U16, &[rows, cols][..], &bytes[..])];
        write_safetensors_atomic(dir.path().join("model.safetensors"), &tensors, &BTreeMap::new()).unwrap();
        let ckpt = SafetensorsCheckpoint::open(dir.path()).unwrap();
        let (_, mapped) = ckpt.mapped_bytes("t").unwrap();
        let addr = mapped.as_ref().as_ptr() as usize + rows * cols;
        let table = U16Table::from_le_bytes(mapped, rows, cols, 1.0, 0).unwrap();
        let ids: Vec<i64> = (0..rows as i64).collect();
        for chunk in ids.chunks(32) {
            let got = table.gather_rows(chunk).unwrap();
            assert_eq!(got.len(), chunk.len() * cols);
        }
        // Rows read through the mapping would leave all 8 MiB resident now (the test fails so
        // with `TableBytes::read_at`'s default, a copy from the mapping).
        let kib = resident_kib_at(addr);
        assert!(kib <= 64, "{kib} KiB of the table's mapping still resident after the lookups");
    }

    #[test]
    fn codes_of_the_wrong_length_are_refused() {
        let err = U16Table::from_le_bytes(vec![0u8; 7], 2, 2, 1.0, 0).unwrap_err();
        assert!(err.to_string().contains("code bytes has 7 elements but its shape [2, 2, 2] needs 8"), "{err}");
    }
}

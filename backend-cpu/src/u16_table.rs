//! [`U16Table`]: a per-tensor uint16-quantized table (pymllm's embedding export) kept as its codes.
//!
//! The value of code `q` is `(q - zero_point) * scale`. An embedding lookup dequantizes only the
//! rows it gathers, so the table costs 2 bytes per element in memory instead of 4; any other op
//! sees the f32 values in the table's logical layout.

use crate::kernels::KernelError;
use mllm_dsl::{BackendRef, DType, NativeData, Result, Storage, Tensor, TensorType};
use std::any::Any;
use std::sync::Arc;

/// A row-major `[rows, cols]` table of uint16 codes with one scale and zero point.
#[derive(Debug, Clone, PartialEq)]
pub struct U16Table {
    codes: Vec<u16>,
    rows: usize,
    cols: usize,
    scale: f32,
    zero_point: i32,
}

impl NativeData for U16Table {
    fn len(&self) -> usize {
        self.codes.len()
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl U16Table {
    /// `codes` must hold `rows * cols` values.
    pub fn new(codes: Vec<u16>, rows: usize, cols: usize, scale: f32, zero_point: i32) -> Result<Self, KernelError> {
        crate::kernels::shape::check_len_of("u16_table", "codes", codes.len(), &[rows, cols])?;
        Ok(U16Table { codes, rows, cols, scale, zero_point })
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
        for (position, &id) in ids.iter().enumerate() {
            let r = usize::try_from(id).ok().filter(|&r| r < self.rows).ok_or(KernelError::IndexOutOfRange {
                op: "gather_rows",
                index: id,
                position,
                dim: 0,
                bound: self.rows,
            })?;
            out.extend(self.codes[r * self.cols..(r + 1) * self.cols].iter().map(|&q| self.value(q)));
        }
        Ok(out)
    }

    /// The whole table as f32, row-major.
    pub fn to_f32(&self) -> Vec<f32> {
        self.codes.iter().map(|&q| self.value(q)).collect()
    }

    /// Bytes held by the codes.
    pub fn bytes(&self) -> usize {
        self.codes.len() * 2
    }
}

/// The uint16 table behind `t`, if it has one.
pub fn u16_table_of(t: &Tensor) -> Option<&U16Table> {
    match t.storage()? {
        Storage::Native(data) => data.downcast_ref::<U16Table>(),
        _ => None,
    }
}

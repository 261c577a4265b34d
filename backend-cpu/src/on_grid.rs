//! [`OnGrid`]: the storage of a QDQ point's output in fake-quant mode, its f32 values together
//! with the grid they lie on (`(u - zero_point) * scale`, `u` a 16-bit code).
//!
//! Every op reads the values as plain f32 ([`NativeData::dense_f32`]); a linear with int4 weights
//! reads the grid too and multiplies the codes in integers ([`kernels::linear_packed_on_grid`],
//! which checks each value against the grid before it trusts it).

use crate::kernels::{self, Grid};
use crate::u16_table::U16Table;
use mllm_dsl::{F32Buffer, NativeData, Storage, Tensor};
use std::any::Any;

#[derive(Debug, Clone)]
pub struct OnGrid {
    pub values: F32Buffer,
    pub grid: Grid,
}

impl NativeData for OnGrid {
    fn len(&self) -> usize {
        self.values.len()
    }

    fn as_any(&self) -> &dyn Any {
        self
    }

    fn dense_f32(&self) -> Option<&F32Buffer> {
        Some(&self.values)
    }
}

/// The 16-bit grid `t`'s values lie on, if its storage records one (a QDQ point's output or a
/// uint16 table).
pub fn grid_of(t: &Tensor) -> Option<Grid> {
    match t.storage()? {
        Storage::Native(data) => match (data.downcast_ref::<OnGrid>(), data.downcast_ref::<U16Table>()) {
            (Some(g), _) => Some(g.grid),
            (_, Some(table)) => Some(table.grid()),
            _ => None,
        },
        _ => None,
    }
}

/// The grid of a QDQ point's parameters, when its codes are exactly `0..=65535`: then a value
/// already on that grid comes out of the point unchanged.
pub fn u16_grid(scale: f32, zero_point: i32, qmin: i32, qmax: i32) -> Option<Grid> {
    (qmin == 0 && qmax == 65535).then_some(kernels::Grid { scale, zero_point })
}

//! Little-endian tensor bytes to Rust values, straight from the (possibly misaligned) mapping.
//!
//! safetensors stores elements little-endian with no alignment guarantee beyond what the writer
//! chose, so each conversion has a fast path that reinterprets the bytes in place when the host
//! is little-endian and the slice happens to be aligned (the normal case: writers pad the header
//! to 8 bytes), and a byte-wise path otherwise.

use half::slice::HalfFloatSliceExt;
use half::{bf16, f16};

use super::StDtype;

/// Bytes per element of `dtype`, or `None` for sub-byte float formats.
pub(crate) fn element_size(dtype: StDtype) -> Option<usize> {
    let bits = dtype.bitsize();
    // `bits & 7` rather than `is_multiple_of`, which is newer than the workspace MSRV.
    (bits & 7 == 0).then_some(bits / 8)
}

/// Whether [`to_f32`] can convert `dtype`.
pub(crate) fn converts_to_f32(dtype: StDtype) -> bool {
    matches!(
        dtype,
        StDtype::F32
            | StDtype::BF16
            | StDtype::F16
            | StDtype::F64
            | StDtype::BOOL
            | StDtype::U8
            | StDtype::I8
            | StDtype::U16
            | StDtype::I16
            | StDtype::U32
            | StDtype::I32
            | StDtype::U64
            | StDtype::I64
    )
}

/// Converts `src` (whole elements of `dtype`) into `dst`, one f32 per element.
/// Callers check [`converts_to_f32`] first; other dtypes leave `dst` untouched.
pub(crate) fn to_f32(dtype: StDtype, src: &[u8], dst: &mut [f32]) {
    match dtype {
        StDtype::F32 => copy_le(src, dst),
        StDtype::BF16 => match cast_in_place::<bf16>(src) {
            Some(halves) => halves.convert_to_f32_slice(dst),
            None => widen(src, dst, |b: [u8; 2]| bf16::from_bits(u16::from_le_bytes(b)).to_f32()),
        },
        StDtype::F16 => match cast_in_place::<f16>(src) {
            Some(halves) => halves.convert_to_f32_slice(dst),
            None => widen(src, dst, |b: [u8; 2]| f16::from_bits(u16::from_le_bytes(b)).to_f32()),
        },
        StDtype::F64 => widen(src, dst, |b: [u8; 8]| f64::from_le_bytes(b) as f32),
        StDtype::BOOL => widen(src, dst, |b: [u8; 1]| f32::from(u8::from(b[0] != 0))),
        StDtype::U8 => widen(src, dst, |b: [u8; 1]| f32::from(b[0])),
        StDtype::I8 => widen(src, dst, |b: [u8; 1]| f32::from(b[0] as i8)),
        StDtype::U16 => widen(src, dst, |b| f32::from(u16::from_le_bytes(b))),
        StDtype::I16 => widen(src, dst, |b| f32::from(i16::from_le_bytes(b))),
        StDtype::U32 => widen(src, dst, |b| u32::from_le_bytes(b) as f32),
        StDtype::I32 => widen(src, dst, |b| i32::from_le_bytes(b) as f32),
        StDtype::U64 => widen(src, dst, |b| u64::from_le_bytes(b) as f32),
        StDtype::I64 => widen(src, dst, |b| i64::from_le_bytes(b) as f32),
        _ => {}
    }
}

/// Plain little-endian numbers that can be read without conversion.
pub trait LeScalar: bytemuck::Pod + Default {
    /// The safetensors dtype that stores exactly this type.
    const DTYPE: StDtype;
    fn from_le(bytes: &[u8]) -> Self;
}

macro_rules! le_scalar {
    ($($t:ty => $dtype:ident),* $(,)?) => {$(
        impl LeScalar for $t {
            const DTYPE: StDtype = StDtype::$dtype;
            fn from_le(bytes: &[u8]) -> Self {
                <$t>::from_le_bytes(bytes.try_into().expect("caller passes one element"))
            }
        }
    )*};
}

le_scalar!(u8 => U8, i8 => I8, u16 => U16, i16 => I16, u32 => U32, i32 => I32, u64 => U64,
           i64 => I64, f32 => F32, f64 => F64, bf16 => BF16, f16 => F16);

/// Copies whole little-endian elements of `T` from `src` into `dst`.
pub(crate) fn copy_le<T: LeScalar>(src: &[u8], dst: &mut [T]) {
    match cast_in_place::<T>(src) {
        Some(values) => dst.copy_from_slice(values),
        None => {
            let size = std::mem::size_of::<T>();
            for (out, bytes) in dst.iter_mut().zip(src.chunks_exact(size)) {
                *out = T::from_le(bytes);
            }
        }
    }
}

/// `src` reinterpreted as `[T]` when that is valid: little-endian host and aligned bytes.
pub(crate) fn cast_in_place<T: bytemuck::Pod>(src: &[u8]) -> Option<&[T]> {
    if cfg!(target_endian = "little") {
        bytemuck::try_cast_slice(src).ok()
    } else {
        None
    }
}

fn widen<const N: usize>(src: &[u8], dst: &mut [f32], f: impl Fn([u8; N]) -> f32) {
    for (out, bytes) in dst.iter_mut().zip(src.chunks_exact(N)) {
        *out = f(bytes.try_into().expect("chunks_exact yields N bytes"));
    }
}

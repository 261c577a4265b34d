//! Tensor values as the interpreter holds them: fixed-point, integer and bool tensors as their
//! integer codes (exactly what the device buffers hold), float tensors as f32 (FLOAT_16 rounded
//! to half precision on every write).

use crate::dtype::DataType;
use crate::encoding::{Encoding, Int4Storage};
use crate::graph::QnnTensor;

use super::InterpError;

/// The element storage of a [`TensorValue`].
#[derive(Clone, Debug, PartialEq)]
pub enum Values {
    /// Float tensors.
    Real(Vec<f32>),
    /// Fixed-point, integer and bool tensors: the stored integers.
    Codes(Vec<i64>),
}

impl Values {
    pub fn len(&self) -> usize {
        match self {
            Values::Real(v) => v.len(),
            Values::Codes(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A tensor's contents with the metadata needed to interpret them.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorValue {
    pub dtype: DataType,
    pub dims: Vec<u32>,
    pub encoding: Encoding,
    pub values: Values,
}

impl TensorValue {
    /// Store real values into a tensor shaped like `meta`: quantized (round-half-even, saturating)
    /// for fixed-point types, truncated toward zero (saturating) for integer types, `!= 0` for
    /// BOOL_8, rounded to half precision for FLOAT_16.
    pub fn from_real(meta: &QnnTensor, values: &[f32]) -> Result<TensorValue, InterpError> {
        let numel = meta.numel() as usize;
        if values.len() != numel {
            return Err(InterpError::Value {
                tensor: meta.name.clone(),
                detail: format!("{} values for dims {:?} ({numel} elements)", values.len(), meta.dims),
            });
        }
        let values = store_real(meta, values)?;
        Ok(TensorValue { dtype: meta.dtype, dims: meta.dims.clone(), encoding: meta.encoding.clone(), values })
    }

    /// Wrap integer codes for a fixed-point / integer / bool tensor shaped like `meta`.
    pub fn from_codes(meta: &QnnTensor, codes: Vec<i64>) -> Result<TensorValue, InterpError> {
        let err = |detail: String| InterpError::Value { tensor: meta.name.clone(), detail };
        let range = meta
            .dtype
            .integer_range()
            .ok_or_else(|| err(format!("{} tensors hold real values, not codes", meta.dtype)))?;
        if codes.len() as u64 != meta.numel() {
            return Err(err(format!("{} codes for dims {:?}", codes.len(), meta.dims)));
        }
        if let Some((i, c)) = codes.iter().enumerate().find(|(_, &c)| c < range.0 || c > range.1) {
            return Err(err(format!("code {c} at {i} is outside {range:?} for {}", meta.dtype)));
        }
        Ok(TensorValue {
            dtype: meta.dtype,
            dims: meta.dims.clone(),
            encoding: meta.encoding.clone(),
            values: Values::Codes(codes),
        })
    }

    /// The value of a `STATIC` tensor, decoded from its bytes (4-bit per `int4`).
    pub fn from_static(meta: &QnnTensor, int4: Int4Storage) -> Result<TensorValue, InterpError> {
        let err = |detail: String| InterpError::Value { tensor: meta.name.clone(), detail };
        let data = meta.data.as_ref().ok_or_else(|| err("STATIC tensor has no data".into()))?;
        let bytes = data.bytes();
        let numel = meta.numel() as usize;
        let expected = meta.dtype.storage_bytes(numel as u64, int4);
        if expected != Some(bytes.len() as u64) {
            return Err(err(format!("{} bytes, expected {expected:?}", bytes.len())));
        }
        let values = match meta.dtype {
            DataType::Float32 => {
                Values::Real(bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
            }
            DataType::Float16 => {
                Values::Real(bytes.chunks_exact(2).map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32()).collect())
            }
            DataType::Float64 => Values::Real(
                bytes.chunks_exact(8).map(|c| f64::from_le_bytes(c.try_into().unwrap_or([0; 8])) as f32).collect(),
            ),
            _ => {
                let codes = StaticCodes::new(meta, int4)?;
                Values::Codes((0..numel).map(|i| codes.get(i)).collect())
            }
        };
        Ok(TensorValue { dtype: meta.dtype, dims: meta.dims.clone(), encoding: meta.encoding.clone(), values })
    }

    pub fn numel(&self) -> usize {
        self.values.len()
    }

    /// The integer codes, for fixed-point / integer / bool tensors.
    pub fn codes(&self) -> Option<&[i64]> {
        match &self.values {
            Values::Codes(c) => Some(c),
            Values::Real(_) => None,
        }
    }

    /// Real values: dequantized for fixed-point types (per the encoding), the integers
    /// themselves for integer and bool types, the floats for float types.
    pub fn to_real(&self) -> Result<Vec<f32>, InterpError> {
        match &self.values {
            Values::Real(v) => Ok(v.clone()),
            Values::Codes(c) if self.dtype.is_fixed_point() => self
                .encoding
                .dequantize(&self.dims, c)
                .map_err(|e| InterpError::Value { tensor: String::new(), detail: e.to_string() }),
            Values::Codes(c) => Ok(c.iter().map(|&v| v as f32).collect()),
        }
    }
}

/// Reads the integer code of element `i` straight from a static tensor's bytes.
pub(crate) struct StaticCodes<'a> {
    bytes: &'a [u8],
    kind: CodeKind,
}

#[derive(Clone, Copy)]
enum CodeKind {
    Int4 { storage: Int4Storage, signed: bool },
    Int { width: usize, signed: bool },
}

impl<'a> StaticCodes<'a> {
    /// For fixed-point, integer and bool static tensors whose byte count has been checked.
    pub(crate) fn new(meta: &'a QnnTensor, int4: Int4Storage) -> Result<StaticCodes<'a>, InterpError> {
        let err = |detail: String| InterpError::Value { tensor: meta.name.clone(), detail };
        let data = meta.data.as_ref().ok_or_else(|| err("STATIC tensor has no data".into()))?;
        let signed = meta.dtype.is_signed();
        let kind = match meta.dtype {
            DataType::SFixedPoint4 | DataType::UFixedPoint4 => CodeKind::Int4 { storage: int4, signed },
            d if d.is_float() => return Err(err(format!("{d} tensors hold reals, not codes"))),
            d => CodeKind::Int {
                width: d.element_bytes().ok_or_else(|| err(format!("{d} has no element size")))?,
                signed,
            },
        };
        let needed = meta.dtype.storage_bytes(meta.numel(), int4);
        if needed != Some(data.len() as u64) {
            return Err(err(format!("{} bytes, expected {needed:?}", data.len())));
        }
        Ok(StaticCodes { bytes: data.bytes(), kind })
    }

    #[inline]
    pub(crate) fn get(&self, i: usize) -> i64 {
        match self.kind {
            CodeKind::Int4 { storage, signed } => {
                let byte = match storage {
                    Int4Storage::Packed => self.bytes[i / 2] >> (4 * (i % 2)),
                    Int4Storage::LowNibble | Int4Storage::Int8Container => self.bytes[i],
                };
                match (storage, signed) {
                    (Int4Storage::Int8Container, true) => i64::from(byte as i8),
                    (Int4Storage::Int8Container, false) => i64::from(byte),
                    (_, signed) => {
                        let n = i64::from(byte & 0x0F);
                        if signed && n >= 8 {
                            n - 16
                        } else {
                            n
                        }
                    }
                }
            }
            CodeKind::Int { width, signed } => decode_int(&self.bytes[i * width..(i + 1) * width], signed),
        }
    }
}

fn decode_int(bytes: &[u8], signed: bool) -> i64 {
    let mut buf = [0u8; 8];
    buf[..bytes.len()].copy_from_slice(bytes);
    let raw = u64::from_le_bytes(buf);
    let bits = bytes.len() * 8;
    if signed && bits < 64 && raw >> (bits - 1) & 1 == 1 {
        (raw | (!0u64 << bits)) as i64
    } else {
        raw as i64
    }
}

/// Real values -> storage of `meta`'s type.
pub(crate) fn store_real(meta: &QnnTensor, values: &[f32]) -> Result<Values, InterpError> {
    let dtype = meta.dtype;
    if dtype.is_float() {
        return Ok(Values::Real(if dtype == DataType::Float16 {
            values.iter().map(|&v| half::f16::from_f32(v).to_f32()).collect()
        } else {
            values.to_vec()
        }));
    }
    let range = dtype.integer_range().ok_or_else(|| InterpError::Value {
        tensor: meta.name.clone(),
        detail: format!("cannot store values in a {dtype} tensor"),
    })?;
    if dtype.is_fixed_point() {
        return meta
            .encoding
            .quantize(&meta.dims, values, range)
            .map(Values::Codes)
            .map_err(|e| InterpError::Value { tensor: meta.name.clone(), detail: e.to_string() });
    }
    if dtype == DataType::Bool8 {
        return Ok(Values::Codes(values.iter().map(|&v| i64::from(v != 0.0)).collect()));
    }
    // C-style conversion: truncate toward zero, saturate at the type's range.
    Ok(Values::Codes(
        values
            .iter()
            .map(|&v| if v.is_nan() { 0 } else { (f64::from(v).trunc().clamp(range.0 as f64, range.1 as f64)) as i64 })
            .collect(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::TensorType;
    use crate::graph::StaticData;

    #[test]
    fn static_decoding_of_every_width() {
        let t = QnnTensor::new_static(
            "a",
            DataType::Int16,
            &[3],
            Encoding::Undefined,
            StaticData::new(vec![0xFF, 0xFF, 0x02, 0x00, 0x00, 0x80]),
        );
        let v = TensorValue::from_static(&t, Int4Storage::default()).unwrap();
        assert_eq!(v.codes().unwrap(), &[-1, 2, -32768]);
        let t = QnnTensor::new_static(
            "b",
            DataType::UFixedPoint16,
            &[2],
            Encoding::scale_offset(0.5, -2),
            StaticData::from_u16(&[65535, 2]),
        );
        let v = TensorValue::from_static(&t, Int4Storage::default()).unwrap();
        assert_eq!(v.codes().unwrap(), &[65535, 2]);
        assert_eq!(v.to_real().unwrap(), vec![0.5 * 65533.0, 0.0]);
        let t = QnnTensor::new_static(
            "c",
            DataType::Float16,
            &[2],
            Encoding::Undefined,
            StaticData::new(
                [half::f16::from_f32(1.5), half::f16::from_f32(-2.0)]
                    .iter()
                    .flat_map(|h| h.to_le_bytes())
                    .collect::<Vec<_>>(),
            ),
        );
        let v = TensorValue::from_static(&t, Int4Storage::default()).unwrap();
        assert_eq!(v.to_real().unwrap(), vec![1.5, -2.0]);
    }

    #[test]
    fn storing_reals() {
        let q =
            QnnTensor::new("q", TensorType::Native, DataType::UFixedPoint8, &[3], Encoding::scale_offset(0.5, -128));
        let v = TensorValue::from_real(&q, &[0.0, 0.75, 1000.0]).unwrap();
        // 0.75 / 0.5 = 1.5 -> 2 (half-even) + 128
        assert_eq!(v.codes().unwrap(), &[128, 130, 255]);
        let i = QnnTensor::new("i", TensorType::Native, DataType::Int8, &[3], Encoding::Undefined);
        let v = TensorValue::from_real(&i, &[-1.7, 2.9, 300.0]).unwrap();
        assert_eq!(v.codes().unwrap(), &[-1, 2, 127]);
        let h = QnnTensor::new("h", TensorType::Native, DataType::Float16, &[1], Encoding::Undefined);
        let v = TensorValue::from_real(&h, &[0.1]).unwrap();
        assert_eq!(v.to_real().unwrap(), vec![half::f16::from_f32(0.1).to_f32()]);
        assert!(TensorValue::from_real(&h, &[0.1, 0.2]).is_err());
        assert!(TensorValue::from_codes(&q, vec![0, 1, 256]).is_err());
    }
}

//! QNN element data types (`Qnn_DataType_t`) and tensor roles (`Qnn_TensorType_t`).
//!
//! The numeric values are the ones the QNN C API uses (`QnnTypes.h`: Qnn_DataType_t, Qnn_TensorType_t): the high byte of a
//! data type is its class (signed int, unsigned int, float, signed/unsigned fixed point, bool,
//! string) and the low byte spells the bit width in decimal digits (`0x0416` is a 16-bit unsigned
//! fixed-point type). A public Rust mirror got several of these wrong, so every value is asserted
//! in the tests below.
//!
//! Element sizes: every type occupies its bit width rounded up to whole bytes, except the two
//! 4-bit fixed-point types whose byte layout depends on the [`Int4Storage`] convention chosen for
//! the graph (see `encoding.rs` for why there are several conventions).

use crate::encoding::Int4Storage;

/// `Qnn_DataType_t`: the element type of a tensor or scalar parameter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u32)]
pub enum DataType {
    Int8 = 0x0008,
    Int16 = 0x0016,
    Int32 = 0x0032,
    Int64 = 0x0064,
    UInt8 = 0x0108,
    UInt16 = 0x0116,
    UInt32 = 0x0132,
    UInt64 = 0x0164,
    Float16 = 0x0216,
    Float32 = 0x0232,
    Float64 = 0x0264,
    SFixedPoint4 = 0x0304,
    SFixedPoint8 = 0x0308,
    SFixedPoint16 = 0x0316,
    SFixedPoint32 = 0x0332,
    UFixedPoint4 = 0x0404,
    UFixedPoint8 = 0x0408,
    UFixedPoint16 = 0x0416,
    UFixedPoint32 = 0x0432,
    Bool8 = 0x0508,
    String = 0x0608,
    Undefined = 0x7FFF_FFFF,
}

/// Every data type, in `Qnn_DataType_t` order (handy for tables and exhaustive tests).
pub const ALL_DATA_TYPES: [DataType; 22] = [
    DataType::Int8,
    DataType::Int16,
    DataType::Int32,
    DataType::Int64,
    DataType::UInt8,
    DataType::UInt16,
    DataType::UInt32,
    DataType::UInt64,
    DataType::Float16,
    DataType::Float32,
    DataType::Float64,
    DataType::SFixedPoint4,
    DataType::SFixedPoint8,
    DataType::SFixedPoint16,
    DataType::SFixedPoint32,
    DataType::UFixedPoint4,
    DataType::UFixedPoint8,
    DataType::UFixedPoint16,
    DataType::UFixedPoint32,
    DataType::Bool8,
    DataType::String,
    DataType::Undefined,
];

impl DataType {
    /// The `Qnn_DataType_t` value.
    pub const fn raw(self) -> u32 {
        self as u32
    }

    /// The data type with this `Qnn_DataType_t` value, if it is one we know.
    pub fn from_raw(raw: u32) -> Option<DataType> {
        ALL_DATA_TYPES.iter().copied().find(|d| d.raw() == raw)
    }

    /// The C enumerator name, e.g. `QNN_DATATYPE_UFIXED_POINT_16`.
    pub const fn c_name(self) -> &'static str {
        match self {
            DataType::Int8 => "QNN_DATATYPE_INT_8",
            DataType::Int16 => "QNN_DATATYPE_INT_16",
            DataType::Int32 => "QNN_DATATYPE_INT_32",
            DataType::Int64 => "QNN_DATATYPE_INT_64",
            DataType::UInt8 => "QNN_DATATYPE_UINT_8",
            DataType::UInt16 => "QNN_DATATYPE_UINT_16",
            DataType::UInt32 => "QNN_DATATYPE_UINT_32",
            DataType::UInt64 => "QNN_DATATYPE_UINT_64",
            DataType::Float16 => "QNN_DATATYPE_FLOAT_16",
            DataType::Float32 => "QNN_DATATYPE_FLOAT_32",
            DataType::Float64 => "QNN_DATATYPE_FLOAT_64",
            DataType::SFixedPoint4 => "QNN_DATATYPE_SFIXED_POINT_4",
            DataType::SFixedPoint8 => "QNN_DATATYPE_SFIXED_POINT_8",
            DataType::SFixedPoint16 => "QNN_DATATYPE_SFIXED_POINT_16",
            DataType::SFixedPoint32 => "QNN_DATATYPE_SFIXED_POINT_32",
            DataType::UFixedPoint4 => "QNN_DATATYPE_UFIXED_POINT_4",
            DataType::UFixedPoint8 => "QNN_DATATYPE_UFIXED_POINT_8",
            DataType::UFixedPoint16 => "QNN_DATATYPE_UFIXED_POINT_16",
            DataType::UFixedPoint32 => "QNN_DATATYPE_UFIXED_POINT_32",
            DataType::Bool8 => "QNN_DATATYPE_BOOL_8",
            DataType::String => "QNN_DATATYPE_STRING",
            DataType::Undefined => "QNN_DATATYPE_UNDEFINED",
        }
    }

    /// Short name without the `QNN_DATATYPE_` prefix (used in messages and summaries).
    pub fn short_name(self) -> &'static str {
        &self.c_name()["QNN_DATATYPE_".len()..]
    }

    /// The data type whose [`short_name`](Self::short_name) is `name`.
    pub fn from_short_name(name: &str) -> Option<DataType> {
        ALL_DATA_TYPES.iter().copied().find(|d| d.short_name() == name)
    }

    /// Number of value bits (4, 8, 16, 32 or 64); 0 for `String` and `Undefined`.
    pub const fn bit_width(self) -> u32 {
        match self {
            DataType::SFixedPoint4 | DataType::UFixedPoint4 => 4,
            DataType::Int8 | DataType::UInt8 | DataType::SFixedPoint8 | DataType::UFixedPoint8 | DataType::Bool8 => 8,
            DataType::Int16
            | DataType::UInt16
            | DataType::Float16
            | DataType::SFixedPoint16
            | DataType::UFixedPoint16 => 16,
            DataType::Int32
            | DataType::UInt32
            | DataType::Float32
            | DataType::SFixedPoint32
            | DataType::UFixedPoint32 => 32,
            DataType::Int64 | DataType::UInt64 | DataType::Float64 => 64,
            DataType::String | DataType::Undefined => 0,
        }
    }

    /// Fixed-point (quantized) types: the only ones that carry a quantization encoding.
    pub const fn is_fixed_point(self) -> bool {
        matches!(
            self,
            DataType::SFixedPoint4
                | DataType::SFixedPoint8
                | DataType::SFixedPoint16
                | DataType::SFixedPoint32
                | DataType::UFixedPoint4
                | DataType::UFixedPoint8
                | DataType::UFixedPoint16
                | DataType::UFixedPoint32
        )
    }

    /// Floating-point types (values held as real numbers, no encoding).
    pub const fn is_float(self) -> bool {
        matches!(self, DataType::Float16 | DataType::Float32 | DataType::Float64)
    }

    /// Plain integer types (no encoding; the stored value is the value).
    pub const fn is_integer(self) -> bool {
        matches!(
            self,
            DataType::Int8
                | DataType::Int16
                | DataType::Int32
                | DataType::Int64
                | DataType::UInt8
                | DataType::UInt16
                | DataType::UInt32
                | DataType::UInt64
        )
    }

    /// Types whose stored integer is signed (two's complement).
    pub const fn is_signed(self) -> bool {
        matches!(
            self,
            DataType::Int8
                | DataType::Int16
                | DataType::Int32
                | DataType::Int64
                | DataType::SFixedPoint4
                | DataType::SFixedPoint8
                | DataType::SFixedPoint16
                | DataType::SFixedPoint32
        )
    }

    /// The inclusive range of stored integers for integer, fixed-point and bool types.
    pub fn integer_range(self) -> Option<(i64, i64)> {
        if self == DataType::Bool8 {
            return Some((0, 1));
        }
        if !(self.is_fixed_point() || self.is_integer()) {
            return None;
        }
        let bits = self.bit_width();
        Some(if self.is_signed() {
            if bits == 64 {
                (i64::MIN, i64::MAX)
            } else {
                (-(1i64 << (bits - 1)), (1i64 << (bits - 1)) - 1)
            }
        } else if bits == 64 {
            // UINT_64 values above i64::MAX are not representable in the interpreter; the
            // validator never needs them (no op in the table takes UINT_64 data).
            (0, i64::MAX)
        } else {
            (0, (1i64 << bits) - 1)
        })
    }

    /// Bytes one element occupies in memory, for every type except the 4-bit ones (whose size
    /// depends on [`Int4Storage`]; use [`DataType::storage_bytes`]). `None` for 4-bit,
    /// `String` and `Undefined`.
    pub const fn element_bytes(self) -> Option<usize> {
        match self.bit_width() {
            8 => Some(1),
            16 => Some(2),
            32 => Some(4),
            64 => Some(8),
            _ => None,
        }
    }

    /// Bytes `numel` elements occupy in a static buffer.
    ///
    /// 4-bit types: [`Int4Storage::LowNibble`] and [`Int4Storage::Int8Container`] keep one value
    /// per byte (`numel` bytes); [`Int4Storage::Packed`] keeps two per byte, lower nibble first
    /// (`ceil(numel / 2)` bytes). `None` for `String` / `Undefined`.
    pub fn storage_bytes(self, numel: u64, int4: Int4Storage) -> Option<u64> {
        match self {
            DataType::SFixedPoint4 | DataType::UFixedPoint4 => Some(match int4 {
                Int4Storage::LowNibble | Int4Storage::Int8Container => numel,
                Int4Storage::Packed => numel.div_ceil(2),
            }),
            _ => self.element_bytes().map(|b| numel * b as u64),
        }
    }
}

impl std::fmt::Display for DataType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.short_name())
    }
}

/// `Qnn_TensorType_t`: the role a tensor plays in a graph.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u32)]
pub enum TensorType {
    /// Graph input written by the application.
    AppWrite = 0,
    /// Graph output read by the application.
    AppRead = 1,
    /// Graph input/output both written and read by the application.
    AppReadWrite = 2,
    /// Intermediate tensor owned by the backend.
    Native = 3,
    /// Constant data supplied at graph construction.
    Static = 4,
    /// Placeholder for an omitted optional input.
    Null = 5,
}

impl TensorType {
    /// The `Qnn_TensorType_t` value.
    pub const fn raw(self) -> u32 {
        self as u32
    }

    /// The C enumerator name, e.g. `QNN_TENSOR_TYPE_APP_WRITE`.
    pub const fn c_name(self) -> &'static str {
        match self {
            TensorType::AppWrite => "QNN_TENSOR_TYPE_APP_WRITE",
            TensorType::AppRead => "QNN_TENSOR_TYPE_APP_READ",
            TensorType::AppReadWrite => "QNN_TENSOR_TYPE_APP_READWRITE",
            TensorType::Native => "QNN_TENSOR_TYPE_NATIVE",
            TensorType::Static => "QNN_TENSOR_TYPE_STATIC",
            TensorType::Null => "QNN_TENSOR_TYPE_NULL",
        }
    }

    /// Short name without the `QNN_TENSOR_TYPE_` prefix.
    pub fn short_name(self) -> &'static str {
        &self.c_name()["QNN_TENSOR_TYPE_".len()..]
    }
}

impl std::fmt::Display for TensorType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.short_name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_type_values_match_qnn_types_h() {
        // Values of QnnTypes.h's Qnn_DataType_t, written out independently of the enum.
        let expected: [(DataType, u32); 22] = [
            (DataType::Int8, 0x0008),
            (DataType::Int16, 0x0016),
            (DataType::Int32, 0x0032),
            (DataType::Int64, 0x0064),
            (DataType::UInt8, 0x0108),
            (DataType::UInt16, 0x0116),
            (DataType::UInt32, 0x0132),
            (DataType::UInt64, 0x0164),
            (DataType::Float16, 0x0216),
            (DataType::Float32, 0x0232),
            (DataType::Float64, 0x0264),
            (DataType::SFixedPoint4, 0x0304),
            (DataType::SFixedPoint8, 0x0308),
            (DataType::SFixedPoint16, 0x0316),
            (DataType::SFixedPoint32, 0x0332),
            (DataType::UFixedPoint4, 0x0404),
            (DataType::UFixedPoint8, 0x0408),
            (DataType::UFixedPoint16, 0x0416),
            (DataType::UFixedPoint32, 0x0432),
            (DataType::Bool8, 0x0508),
            (DataType::String, 0x0608),
            (DataType::Undefined, 0x7FFF_FFFF),
        ];
        for (dtype, raw) in expected {
            assert_eq!(dtype.raw(), raw, "{dtype:?}");
            assert_eq!(DataType::from_raw(raw), Some(dtype));
        }
        // Decimal values quoted by onnxruntime's JSON dumps (Qualcomm's qnn-model-lib-generator docs).
        assert_eq!(DataType::Float32.raw(), 562);
        assert_eq!(DataType::UFixedPoint16.raw(), 1046);
        assert_eq!(DataType::from_raw(0x0208), None);
    }

    #[test]
    fn tensor_type_values_match_qnn_types_h() {
        assert_eq!(TensorType::AppWrite.raw(), 0);
        assert_eq!(TensorType::AppRead.raw(), 1);
        assert_eq!(TensorType::AppReadWrite.raw(), 2);
        assert_eq!(TensorType::Native.raw(), 3);
        assert_eq!(TensorType::Static.raw(), 4);
        assert_eq!(TensorType::Null.raw(), 5);
        assert_eq!(TensorType::Static.short_name(), "STATIC");
    }

    #[test]
    fn c_names_follow_the_class_and_width_of_the_value() {
        for dtype in ALL_DATA_TYPES {
            if matches!(dtype, DataType::Undefined | DataType::String) {
                continue;
            }
            let width = dtype.bit_width();
            assert!(dtype.c_name().ends_with(&format!("_{width}")), "{dtype:?}");
            // Low byte is the width written in decimal digits.
            assert_eq!(format!("{:x}", dtype.raw() & 0xFF), width.to_string(), "{dtype:?}");
        }
    }

    #[test]
    fn integer_ranges() {
        assert_eq!(DataType::UFixedPoint16.integer_range(), Some((0, 65535)));
        assert_eq!(DataType::UFixedPoint8.integer_range(), Some((0, 255)));
        assert_eq!(DataType::SFixedPoint4.integer_range(), Some((-8, 7)));
        assert_eq!(DataType::UFixedPoint4.integer_range(), Some((0, 15)));
        assert_eq!(DataType::SFixedPoint8.integer_range(), Some((-128, 127)));
        assert_eq!(DataType::Int32.integer_range(), Some((i32::MIN as i64, i32::MAX as i64)));
        assert_eq!(DataType::Bool8.integer_range(), Some((0, 1)));
        assert_eq!(DataType::Float32.integer_range(), None);
    }

    #[test]
    fn storage_sizes() {
        assert_eq!(DataType::Float32.storage_bytes(6, Int4Storage::default()), Some(24));
        assert_eq!(DataType::UFixedPoint16.storage_bytes(6, Int4Storage::default()), Some(12));
        assert_eq!(DataType::SFixedPoint4.storage_bytes(5, Int4Storage::LowNibble), Some(5));
        assert_eq!(DataType::SFixedPoint4.storage_bytes(5, Int4Storage::Int8Container), Some(5));
        assert_eq!(DataType::SFixedPoint4.storage_bytes(5, Int4Storage::Packed), Some(3));
        assert_eq!(DataType::String.storage_bytes(5, Int4Storage::Packed), None);
    }
}

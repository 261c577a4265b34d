//! Element types and devices of tensors, with the names the IR prints.

use std::fmt;
use std::str::FromStr;

/// The element type of a tensor.
///
/// Besides plain numeric types there are the quantized types of mllm's QNN flow: activations flow as
/// uint16 per-tensor asymmetric, the KV cache as uint8 "symmetric" (zero point 128), and linear
/// weights as LPBQ int4 (stored one value per byte).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    F32,
    F16,
    BF16,
    I32,
    I64,
    I8,
    U8,
    U16,
    Bool,
    /// uint16 per-tensor asymmetric (mllm `kUInt16PerTensorAsy`): activations, norm/embedding weights.
    U16Asym,
    /// uint8 per-tensor "symmetric" with zero point 128 (mllm `kUInt8PerTensorSym`): the KV cache.
    U8Sym,
    /// LPBQ int4 weights (values −7..7 in an 8-bit container, two-level block scales).
    I4Lpbq,
}

impl DType {
    /// All dtypes, in a fixed order (used by the parser and tests).
    pub const ALL: [DType; 12] = [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::I32,
        DType::I64,
        DType::I8,
        DType::U8,
        DType::U16,
        DType::Bool,
        DType::U16Asym,
        DType::U8Sym,
        DType::I4Lpbq,
    ];

    /// The name the IR prints. Unlike mllm's printer these names are lossless, so a printed
    /// program parses back to the same dtypes.
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "Float32",
            DType::F16 => "Float16",
            DType::BF16 => "BFloat16",
            DType::I32 => "Int32",
            DType::I64 => "Int64",
            DType::I8 => "Int8",
            DType::U8 => "UInt8",
            DType::U16 => "UInt16",
            DType::Bool => "Bool",
            DType::U16Asym => "UInt16PerTensorAsy",
            DType::U8Sym => "UInt8PerTensorSym",
            DType::I4Lpbq => "Int4LPBQ",
        }
    }

    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F16 | DType::BF16)
    }

    /// Integer index types (token ids, positions).
    pub fn is_index(self) -> bool {
        matches!(self, DType::I32 | DType::I64)
    }

    /// Quantized types carry a scale / zero point from a QDQ point.
    pub fn is_quantized(self) -> bool {
        matches!(self, DType::U16Asym | DType::U8Sym | DType::I4Lpbq)
    }

    /// Types that hold real-valued data (float or quantized): the operands of arithmetic.
    pub fn is_numeric(self) -> bool {
        self.is_float() || self.is_quantized()
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A dtype or device name that is not one of the printed IR's (`Float32`, `CPU`, ...).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} '{found}'")]
pub struct UnknownName {
    /// `dtype` or `device`.
    pub what: &'static str,
    pub found: String,
}

impl FromStr for DType {
    type Err = UnknownName;
    fn from_str(s: &str) -> Result<Self, UnknownName> {
        DType::ALL
            .iter()
            .copied()
            .find(|d| d.name() == s)
            .ok_or_else(|| UnknownName { what: "dtype", found: s.to_string() })
    }
}

/// Where a value lives. Traced programs are on the CPU until passes mark them for QNN.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub enum Device {
    #[default]
    Cpu,
    Qnn,
}

impl Device {
    pub fn name(self) -> &'static str {
        match self {
            Device::Cpu => "CPU",
            Device::Qnn => "QNN",
        }
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Device {
    type Err = UnknownName;
    fn from_str(s: &str) -> Result<Self, UnknownName> {
        match s {
            "CPU" => Ok(Device::Cpu),
            "QNN" => Ok(Device::Qnn),
            _ => Err(UnknownName { what: "device", found: s.to_string() }),
        }
    }
}

/// Shape, dtype and device of a tensor: the type of an IR value.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TensorType {
    pub shape: Vec<usize>,
    pub dtype: DType,
    pub device: Device,
}

impl TensorType {
    pub fn new(shape: impl Into<Vec<usize>>, dtype: DType) -> Self {
        TensorType { shape: shape.into(), dtype, device: Device::Cpu }
    }

    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    pub fn rank(&self) -> usize {
        self.shape.len()
    }
}

impl fmt::Display for TensorType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "tensor<{}, {}, {}>", fmt_shape(&self.shape), self.dtype, self.device)
    }
}

/// `[1, 4, 64]`
pub fn fmt_shape(shape: &[usize]) -> String {
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    format!("[{}]", dims.join(", "))
}

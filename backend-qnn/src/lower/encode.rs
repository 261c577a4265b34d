//! IR value types to QNN data types and quantization encodings (mllm/backends/qnn/QNNUtils.cpp; mllm's parseQnnQuantizeParamFromIR).
//!
//! | IR dtype | spec | QNN dtype | encoding |
//! |---|---|---|---|
//! | `UInt16PerTensorAsy` | `AsymPerTensor(0, 65535, UInt16)` | `UFIXED_POINT_16` | `SCALE_OFFSET`, offset = -zero_point |
//! | `UInt8PerTensorSym` | `SymPerTensor(0, 255, UInt8)` | `UFIXED_POINT_8` | `SCALE_OFFSET`, offset = -128 |
//! | `Int4LPBQ` | `LPBQ` | per [`Int4Storage`] | `BLOCKWISE_EXPANSION` (see `weights.rs`) |
//! | `Int32` / `Float32` / `Float16` / `Bool` / `Int8` / `UInt8` | `Raw` | `INT_32` / `FLOAT_32` / `FLOAT_16` / `BOOL_8` / `INT_8` / `UINT_8` | undefined |
//!
//! Plain `UInt16`, `Int64` and `BFloat16` have no QNN type here (mllm aborts on the first two):
//! a model must retag such values (`qdq!`) before lowering. A spec that does not fit its value's
//! dtype, or one PTQ left unsolved, is an error.

use mllm_dsl::ir::{Program, QuantSpecKind, SpecParams, ValueId};
use mllm_dsl::DType;

use crate::dtype::DataType;
use crate::encoding::{Encoding, ScaleOffset};

/// Why an IR value (or scalar constant) has no QNN tensor type, encoding or data.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum EncodeError {
    #[error("{dtype} value has no quantization spec (run LLMQuantRecipe and PTQ)")]
    NoSpec { dtype: DType },
    #[error("{dtype} value has spec {spec}, expected a per-tensor {quant_to} spec over {min}..={max}")]
    NotPerTensor { dtype: DType, spec: QuantSpecKind, quant_to: DType, min: i32, max: i32 },
    #[error("spec {spec} is not solved (run PTQ)")]
    Unsolved { spec: QuantSpecKind },
    #[error("{dtype} value has the quantization spec {spec}; only Raw fits a {qnn} tensor")]
    NotRaw { dtype: DType, spec: QuantSpecKind, qnn: DataType },
    #[error("UInt16PerTensorAsy value has spec {spec}; QNN lowers only asymmetric uint16")]
    NotAsymmetricU16 { spec: String },
    #[error("uint8 symmetric value has zero point {zero_point}; QNN's offset -128 needs 128")]
    U8ZeroPoint { zero_point: i32 },
    #[error("Int4LPBQ values are weights; only registered parameters can be LPBQ")]
    LpbqValue,
    #[error(
        "{dtype} has no QNN data type (mllm aborts on plain UInt16 and Int64): retag it with a QDQ \
         annotation or cast it before lowering"
    )]
    NoQnnType { dtype: DType },
    #[error("dims {shape:?}: QNN dims must be in 1..=u32::MAX")]
    Dims { shape: Vec<usize> },
    #[error("is not a constant")]
    NotConstant,
    #[error("quantized code {code} does not fit {storage}")]
    CodeRange { code: i64, storage: &'static str },
    #[error(
        "constant {value} of QNN type {qnn} with quantized code {code:?}: expected a PTQ-quantized code for \
         fixed-point constants (run PTQ) or a Float32 constant"
    )]
    ConstantType { value: f32, qnn: DataType, code: Option<i64> },
}

/// The QNN dtype and encoding of a non-weight value (LPBQ weights are built with their data).
pub(super) fn value_type(p: &Program, v: ValueId) -> Result<(DataType, Encoding), EncodeError> {
    let def = p.value(v);
    let spec = p.value_spec(v);
    let dtype = def.ty.dtype;
    let per_tensor = |quant_to: DType, (min, max): (i32, i32)| -> Result<(f32, i32), EncodeError> {
        let spec = spec.ok_or(EncodeError::NoSpec { dtype })?;
        let ok = match &spec.kind {
            QuantSpecKind::AsymPerTensor { quant_min, quant_max, quant_to: to, .. }
            | QuantSpecKind::SymPerTensor { quant_min, quant_max, quant_to: to, .. } => {
                *to == quant_to && (*quant_min, *quant_max) == (min, max)
            }
            _ => false,
        };
        if !ok {
            return Err(EncodeError::NotPerTensor { dtype, spec: spec.kind.clone(), quant_to, min, max });
        }
        match &spec.params {
            Some(SpecParams::PerTensor { scale, zero_point, .. }) => Ok((*scale, *zero_point)),
            _ => Err(EncodeError::Unsolved { spec: spec.kind.clone() }),
        }
    };
    let raw = |qnn: DataType| -> Result<(DataType, Encoding), EncodeError> {
        match spec.map(|s| &s.kind) {
            None | Some(QuantSpecKind::Raw { .. }) => Ok((qnn, Encoding::Undefined)),
            Some(kind) => Err(EncodeError::NotRaw { dtype, spec: kind.clone(), qnn }),
        }
    };
    match dtype {
        DType::U16Asym => {
            if !matches!(spec.map(|s| &s.kind), Some(QuantSpecKind::AsymPerTensor { .. }) | None) {
                let spec = spec.map(|s| s.kind.to_string()).unwrap_or_default();
                return Err(EncodeError::NotAsymmetricU16 { spec });
            }
            let (scale, zero_point) = per_tensor(DType::U16, (0, 65535))?;
            Ok((DataType::UFixedPoint16, Encoding::from_zero_point(scale, zero_point)))
        }
        DType::U8Sym => {
            let (scale, zero_point) = per_tensor(DType::U8, (0, 255))?;
            // QNN spells uint8 "symmetric" as the fixed offset -128 (mllm asserts zp 128 in QDQ_KV).
            if zero_point != 128 {
                return Err(EncodeError::U8ZeroPoint { zero_point });
            }
            Ok((DataType::UFixedPoint8, Encoding::ScaleOffset(ScaleOffset::uint8_symmetric(scale))))
        }
        DType::I32 => raw(DataType::Int32),
        DType::F32 => raw(DataType::Float32),
        DType::F16 => raw(DataType::Float16),
        DType::Bool => raw(DataType::Bool8),
        DType::I8 => raw(DataType::Int8),
        DType::U8 => raw(DataType::UInt8),
        DType::I4Lpbq => Err(EncodeError::LpbqValue),
        DType::U16 | DType::I64 | DType::BF16 => Err(EncodeError::NoQnnType { dtype }),
    }
}

/// Row-major dims as QNN's `uint32_t` dims; zero or oversized dims are errors.
pub(super) fn dims(shape: &[usize]) -> Result<Vec<u32>, EncodeError> {
    shape
        .iter()
        .map(|&d| match u32::try_from(d) {
            Ok(0) | Err(_) => Err(EncodeError::Dims { shape: shape.to_vec() }),
            Ok(d) => Ok(d),
        })
        .collect()
}

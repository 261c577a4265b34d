//! Typed reads of a node's params, falling back to the op definition's defaults.
//!
//! Used by the validator (after it has checked param kinds and dtypes) and by the interpreter,
//! so both read the same values the same way.

use crate::graph::{Param, QnnNode, Scalar};
use crate::opdef::ParamDefault;

/// A param could not be read as the requested type (the validator reports these first).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamReadError {
    pub param: String,
    pub detail: String,
}

fn err(param: &str, detail: impl Into<String>) -> ParamReadError {
    ParamReadError { param: param.to_string(), detail: detail.into() }
}

fn default_of(node: &QnnNode, name: &str) -> Result<ParamDefault, ParamReadError> {
    node.op_type
        .def()
        .param(name)
        .map(|spec| spec.default)
        .ok_or_else(|| err(name, format!("is not a param of {}", node.op_type)))
}

/// A scalar param as an integer, or its default. `LastAxis` defaults resolve with `rank`.
pub fn int(node: &QnnNode, name: &str, rank: usize) -> Result<i64, ParamReadError> {
    match node.param(name) {
        Some(Param::Scalar(s)) => {
            s.as_i64().ok_or_else(|| err(name, format!("expected an integer scalar, found {s:?}")))
        }
        Some(Param::Tensor(_)) => Err(err(name, "expected a scalar, found a tensor")),
        None => match default_of(node, name)? {
            ParamDefault::Scalar(s) => s.as_i64().ok_or_else(|| err(name, "default is not an integer")),
            ParamDefault::LastAxis => Ok(rank as i64 - 1),
            ParamDefault::Required => Err(err(name, "mandatory param is missing")),
            ParamDefault::U32s(_) => Err(err(name, "default is a tensor")),
        },
    }
}

/// A `BOOL_8` scalar param, or its default.
pub fn flag(node: &QnnNode, name: &str) -> Result<bool, ParamReadError> {
    Ok(int(node, name, 0)? != 0)
}

/// A float scalar param, or its default.
pub fn float(node: &QnnNode, name: &str) -> Result<f32, ParamReadError> {
    match node.param(name) {
        Some(Param::Scalar(s)) => {
            s.as_f64().map(|v| v as f32).ok_or_else(|| err(name, format!("expected a float scalar, found {s:?}")))
        }
        Some(Param::Tensor(_)) => Err(err(name, "expected a scalar, found a tensor")),
        None => match default_of(node, name)? {
            ParamDefault::Scalar(Scalar::Float32(v)) => Ok(v),
            ParamDefault::Required => Err(err(name, "mandatory param is missing")),
            _ => Err(err(name, "default is not a float")),
        },
    }
}

fn tensor_words(node: &QnnNode, name: &str) -> Result<Option<Vec<[u8; 4]>>, ParamReadError> {
    match node.param(name) {
        Some(Param::Tensor(t)) => {
            let data = t.data.as_ref().ok_or_else(|| err(name, "tensor param has no static data"))?;
            if data.len() % 4 != 0 {
                return Err(err(name, format!("{} bytes is not a whole number of 32-bit values", data.len())));
            }
            Ok(Some(data.bytes().chunks_exact(4).map(|c| [c[0], c[1], c[2], c[3]]).collect()))
        }
        Some(Param::Scalar(_)) => Err(err(name, "expected a tensor, found a scalar")),
        None => Ok(None),
    }
}

/// A `UINT_32` tensor param's values, or its default.
pub fn u32s(node: &QnnNode, name: &str) -> Result<Vec<u32>, ParamReadError> {
    match tensor_words(node, name)? {
        Some(words) => Ok(words.into_iter().map(u32::from_le_bytes).collect()),
        None => match default_of(node, name)? {
            ParamDefault::U32s(v) => Ok(v.to_vec()),
            ParamDefault::Required => Err(err(name, "mandatory param is missing")),
            _ => Err(err(name, "default is not a tensor")),
        },
    }
}

/// An `INT_32` tensor param's values (no op in the table gives these a default).
pub fn i32s(node: &QnnNode, name: &str) -> Result<Vec<i32>, ParamReadError> {
    match tensor_words(node, name)? {
        Some(words) => Ok(words.into_iter().map(i32::from_le_bytes).collect()),
        None => Err(err(name, "mandatory param is missing")),
    }
}

/// A `[2]` tensor param as an array.
pub fn pair(node: &QnnNode, name: &str) -> Result<[u32; 2], ParamReadError> {
    let v = u32s(node, name)?;
    <[u32; 2]>::try_from(v.as_slice()).map_err(|_| err(name, format!("expected 2 values, found {}", v.len())))
}

/// Conv2d's `pad_amount` (`[[top, bottom], [left, right]]`).
pub fn pad_amount(node: &QnnNode) -> Result<[[u32; 2]; 2], ParamReadError> {
    let v = u32s(node, "pad_amount")?;
    if v.len() != 4 {
        return Err(err("pad_amount", format!("expected 4 values, found {}", v.len())));
    }
    Ok([[v[0], v[1]], [v[2], v[3]]])
}

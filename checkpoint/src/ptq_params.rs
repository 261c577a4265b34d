//! A safetensors checkpoint as PTQ's [`QuantParamProvider`]: QDQ scales and zero points, the
//! per-tensor parameters of norm and embedding weights, and the metadata and code ranges of LPBQ
//! weights of a pymllm export. Metadata comes from the header; only scales, zero points and
//! range-checked codes are read.

use crate::convert::LeScalar;
use crate::{SafetensorsCheckpoint, StDtype};
use compiler::passes::{ParamError, QuantParamProvider, StoredTensor};
use mllm_dsl::DType;

fn dtype_of(d: StDtype) -> Option<DType> {
    Some(match d {
        StDtype::F32 => DType::F32,
        StDtype::F16 => DType::F16,
        StDtype::BF16 => DType::BF16,
        StDtype::I8 => DType::I8,
        StDtype::U8 => DType::U8,
        StDtype::U16 => DType::U16,
        StDtype::I32 => DType::I32,
        StDtype::I64 => DType::I64,
        StDtype::BOOL => DType::Bool,
        _ => return None,
    })
}

/// `(min, max)` of the little-endian `T`s in `bytes` folded into `acc`.
fn fold_min_max<T: LeScalar + Ord + Copy + Into<i64>>(bytes: &[u8], acc: &mut Option<(i64, i64)>) {
    fn fold<T: Ord + Copy>(mut values: impl Iterator<Item = T>) -> Option<(T, T)> {
        let first = values.next()?;
        Some(values.fold((first, first), |(lo, hi), x| (lo.min(x), hi.max(x))))
    }
    // Aligned little-endian data is read as `[T]` in place (the common case: a vectorized scan).
    let found = match crate::convert::cast_in_place::<T>(bytes) {
        Some(values) => fold(values.iter().copied()),
        None => fold(bytes.chunks_exact(std::mem::size_of::<T>()).map(T::from_le)),
    };
    let Some((lo, hi)) = found else { return };
    let (lo, hi) = (lo.into(), hi.into());
    *acc = Some(acc.map_or((lo, hi), |(a, b)| (a.min(lo), b.max(hi))));
}

impl QuantParamProvider for SafetensorsCheckpoint {
    fn name(&self) -> String {
        format!("checkpoint {}", self.root().display())
    }

    fn tensor(&self, key: &str) -> Result<Option<StoredTensor>, ParamError> {
        if !self.contains(key) {
            return Ok(None);
        }
        let (dtype, shape) = self.info(key).map_err(|e| self.error(key, e.to_string()))?;
        let dtype = dtype_of(dtype).ok_or_else(|| self.error(key, format!("unsupported stored dtype {dtype}")))?;
        Ok(Some(StoredTensor { dtype, shape: shape.to_vec() }))
    }

    fn read_f32(&self, key: &str) -> Result<Vec<f32>, ParamError> {
        SafetensorsCheckpoint::read_f32(self, key).map_err(|e| self.error(key, e.to_string()))
    }

    fn read_i32(&self, key: &str) -> Result<Vec<i32>, ParamError> {
        SafetensorsCheckpoint::read_i32(self, key).map_err(|e| self.error(key, e.to_string()))
    }

    fn read_bytes(&self, key: &str) -> Result<Vec<u8>, ParamError> {
        SafetensorsCheckpoint::read_bytes(self, key).map_err(|e| self.error(key, e.to_string()))
    }

    fn with_stored_bytes(&self, key: &str, visit: &mut dyn FnMut(&[u8])) -> Result<(), ParamError> {
        self.with_bytes(key, visit).map(|_| ()).map_err(|e| self.error(key, e.to_string()))
    }

    fn int_range(&self, key: &str) -> Result<Option<(i64, i64)>, ParamError> {
        let (dtype, _) = self.info(key).map_err(|e| self.error(key, e.to_string()))?;
        let fold: fn(&[u8], &mut Option<(i64, i64)>) = match dtype {
            StDtype::I8 => fold_min_max::<i8>,
            StDtype::U8 => fold_min_max::<u8>,
            StDtype::U16 => fold_min_max::<u16>,
            StDtype::I32 => fold_min_max::<i32>,
            StDtype::I64 => fold_min_max::<i64>,
            other => return Err(self.error(key, format!("a range check needs an integer tensor, found {other}"))),
        };
        // Scanned in place in the mapping: a range check of the 311 MB LM head copies nothing.
        let mut range = None;
        self.visit_bytes(key, |chunk| fold(chunk, &mut range)).map_err(|e| self.error(key, e.to_string()))?;
        // An empty tensor has no values out of range.
        Ok(Some(range.unwrap_or((0, 0))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn fixture() -> SafetensorsCheckpoint {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fixtures/pymllm-qwen3-dev-f32");
        SafetensorsCheckpoint::open(dir).unwrap()
    }

    #[test]
    fn reads_qdq_params_and_weight_metadata_of_a_pymllm_export() {
        let ckpt = fixture();
        let p: &dyn QuantParamProvider = &ckpt;
        let zp = p.scalar_i32("model.layers.0.self_attn.k_cast_to_int8_qdq.fake_quant.zero_point").unwrap();
        assert_eq!(zp, 128);
        let s = p.scalar_f32("model.layers.0.mlp.sigmoid_output_qdq.fake_quant.scale").unwrap();
        assert_eq!(s, 1.0 / 65536.0);
        let w = p.tensor("model.layers.0.mlp.up_proj.weight").unwrap().unwrap();
        assert_eq!(w, StoredTensor { dtype: DType::I8, shape: vec![1, 1, 32, 64] });
        assert!(p.tensor("model.layers.0.mlp.nothing").unwrap().is_none());
        // Stored codes are nibbles; level-0 scales are 1..=16.
        let (lo, hi) = p.int_range("model.layers.0.mlp.up_proj.weight").unwrap().unwrap();
        assert!(lo >= 0 && hi <= 15 && hi > lo, "{lo}..{hi}");
        let (lo, hi) = p.int_range("model.layers.0.mlp.up_proj.scale1").unwrap().unwrap();
        assert!(lo >= 1 && hi <= 16, "{lo}..{hi}");
        let err = p.int_range("model.norm.scale").unwrap_err().to_string();
        assert!(err.contains("model.norm.scale") && err.contains("integer"), "{err}");
        // Raw bytes are the stored little-endian values.
        let bytes = p.read_bytes("model.norm.weight").unwrap();
        let words: Vec<u16> = bytes.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]])).collect();
        assert_eq!(words, ckpt.read_u16("model.norm.weight").unwrap());
        let err = p.scalar_f32("model.missing_qdq.fake_quant.scale").unwrap_err().to_string();
        assert!(err.contains("model.missing_qdq.fake_quant.scale"), "{err}");
    }
}

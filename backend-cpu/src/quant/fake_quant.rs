//! [`FakeQuantHook`]: each QDQ point quantizes, clamps and dequantizes its tensor with torch's
//! `fake_quantize_per_tensor_affine` ([`FakeQuantizer`]), using the point's parameters.
//!
//! Together with a [`CheckpointStore`](crate::CheckpointStore) that decodes the stored weights
//! (LPBQ `q * scale1 * scale2`, uint16 norms / embedding / RoPE tables `(q - zp) * scale`), this
//! is what the deployed graph computes, up to float summation order: mllm's "deployed
//! simulation". RoPE points apply to tables already decoded with the same parameters, where
//! fake-quant is the identity.

use std::collections::HashMap;

use mllm_dsl::quant::{FakeQuantizer, QuantParams};
use mllm_dsl::QdqAttr;
use rayon::prelude::*;

use super::params::QdqParams;
use crate::executor::QdqHook;

/// Elements per parallel task.
const PAR_CHUNK: usize = 1 << 15;

pub struct FakeQuantHook {
    quantizers: HashMap<String, (QdqAttr, FakeQuantizer)>,
}

impl FakeQuantHook {
    pub fn new(params: &QdqParams) -> Self {
        let quantizers =
            params.iter().map(|(point, p)| (point.key.clone(), (point.clone(), FakeQuantizer::new(p)))).collect();
        FakeQuantHook { quantizers }
    }

    /// The parameters this hook applies at `key`.
    pub fn params(&self, key: &str) -> Option<&QuantParams> {
        self.quantizers.get(key).map(|(_, fq)| fq.params())
    }
}

impl QdqHook for FakeQuantHook {
    fn apply(&self, point: &QdqAttr, x: &[f32], _shape: &[usize]) -> Result<Option<Vec<f32>>, String> {
        let (known, fq) = self.quantizers.get(&point.key).ok_or_else(|| {
            format!(
                "QDQ point `{}` has no parameters: it was not among the points traced from the model file",
                point.key
            )
        })?;
        if known.kind != point.kind {
            return Err(format!("QDQ point `{}` is {point} here but was traced as {known}", point.key));
        }
        let mut out = vec![0f32; x.len()];
        out.par_chunks_mut(PAR_CHUNK).zip(x.par_chunks(PAR_CHUNK)).for_each(|(o, i)| {
            for (o, &v) in o.iter_mut().zip(i) {
                *o = fq.fake(v);
            }
        });
        Ok(Some(out))
    }
}

//! The naive baseline every quantization recipe must beat: weight-only round-to-nearest (RTN).
//!
//! Every linear weight (the layers the W4A16 recipe makes LPBQ int4, the LM head included) is cut
//! along its input dimension into blocks of `block` values; each block gets one float scale
//! `max|w| / qmax` (`qmax = 2^(bits-1) - 1`, symmetric, zero point 0) and its values become
//! `clamp(round(w / scale), -qmax, qmax) * scale`, rounding
//! halves to even as torch does (dequantized GGUF weights sit on a grid, so ties are common). Norms, the embedding, RoPE tables and every
//! activation stay float: run the model on a float backend ([`CpuBackend::float`](crate::CpuBackend::float)).
//!
//! ```no_run
//! # use backend_cpu::quant::RtnWeights;
//! # use backend_cpu::{CheckpointStore, CpuBackend};
//! # use mllm_dsl::module::ParamSource;
//! # use mllm_dsl::CausalLm;
//! # fn demo(dir: &std::path::Path, tie: bool, model: &mut dyn CausalLm) -> Result<(), Box<dyn std::error::Error>> {
//! let store = CheckpointStore::open(dir, CpuBackend::float(), tie)?;
//! let rtn = RtnWeights::new(&store, 4, 16)?;
//! model.bind_params(&ParamSource::Store(&rtn))?;
//! # Ok(())
//! # }
//! ```

use mllm_dsl::module::{ParamRequest, ParamRole, WeightStore};
use mllm_dsl::{BackendRef, Result as DslResult, Tensor};

use super::calibrate::transpose;
use super::error::QuantizationError;
use crate::store::CheckpointStore;

/// `w` (`rows x cols` row-major) RTN-quantized in place: blocks of `block` along each row.
pub fn rtn_quantize_rows(w: &mut [f32], cols: usize, bits: u32, block: usize) {
    let qmax = ((1u32 << (bits - 1)) - 1) as f32;
    for row in w.chunks_exact_mut(cols) {
        for blk in row.chunks_mut(block) {
            let amax = blk.iter().fold(0f32, |m, &x| m.max(x.abs()));
            if amax == 0.0 {
                continue;
            }
            let scale = amax / qmax;
            for x in blk {
                *x = (*x / scale).round_ties_even().clamp(-qmax, qmax) * scale;
            }
        }
    }
}

/// A [`WeightStore`] that serves a float checkpoint with its linear weights RTN-quantized.
pub struct RtnWeights<'a> {
    store: &'a CheckpointStore,
    bits: u32,
    block: usize,
}

impl<'a> RtnWeights<'a> {
    /// Symmetric `bits`-bit RTN in blocks of `block` input values (2..=8 bits, block >= 1).
    pub fn new(store: &'a CheckpointStore, bits: u32, block: usize) -> Result<Self, QuantizationError> {
        if !(2..=8).contains(&bits) {
            return Err(QuantizationError::Param {
                key: "rtn bits".into(),
                problem: format!("{bits} bits; RTN supports 2 to 8"),
            });
        }
        if block == 0 {
            return Err(QuantizationError::BlockSize("RTN block size 0; it must be at least 1".into()));
        }
        Ok(RtnWeights { store, bits, block })
    }
}

impl WeightStore for RtnWeights<'_> {
    fn load(&self, req: &ParamRequest<'_>) -> DslResult<Tensor> {
        let (n_out, n_in, hwio) = match (req.role, req.shape) {
            (ParamRole::Conv2dWeight, &[1, 1, n_in, n_out]) => (n_out, n_in, true),
            (ParamRole::LinearWeight, &[n_out, n_in]) => (n_out, n_in, false),
            _ => return self.store.load(req),
        };
        let t = self.store.load(req)?;
        let data = crate::executor::real_values(&t)
            .ok_or_else(|| mllm_dsl::Error::msg(format!("`{}` has no real-valued data", req.key)))?;
        let out = if hwio {
            // HWIO [1, 1, In, Out] -> [Out][In] rows, quantize, back.
            let mut w = transpose(req, &data, n_in, n_out)?;
            rtn_quantize_rows(&mut w, n_in, self.bits, self.block);
            transpose(req, &w, n_out, n_in)?
        } else {
            let mut w = data.into_owned();
            rtn_quantize_rows(&mut w, n_in, self.bits, self.block);
            w
        };
        Tensor::from_f32(out, req.shape.to_vec(), self.store.backend())
    }

    fn contains(&self, key: &str) -> bool {
        self.store.contains(key)
    }

    fn backend(&self) -> BackendRef {
        self.store.backend()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rtn_by_hand() {
        // One row of 6 in blocks of 4: [7, -3, 1, 0.5 | 14, -3].
        // Block 1: scale 1 -> 7, -3, 1, and 0.5 rounds to even: 0.
        // Block 2: scale 2 -> 7, -1.5 rounds to even -2, i.e. -4.
        let mut w = [7.0, -3.0, 1.0, 0.5, 14.0, -3.0];
        rtn_quantize_rows(&mut w, 6, 4, 4);
        assert_eq!(w, [7.0, -3.0, 1.0, 0.0, 14.0, -4.0]);
        // An all-zero block stays zero.
        let mut z = [0.0f32; 4];
        rtn_quantize_rows(&mut z, 4, 4, 16);
        assert_eq!(z, [0.0; 4]);
    }
}

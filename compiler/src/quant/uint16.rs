//! Per-tensor u16 weights of RMSNorm and Embedding, as pymllm's `QRMSNorm` / `QEmbedding` export them.
//!
//! The parameters come from a MinMax observer over the whole weight (affine, 0..=65535,
//! eps 1e-4/65535). The export (`convert_to_deploy`) then computes
//! `clamp(round(w / scale + zero_point), 0, 65535)` in `f32`: a true division, then the zero point
//! added in `f32`, then round half to even. That is not torch's fake-quant rounding
//! (`round(w * (1/scale)) + zero_point`): with a zero point near 32768 the `f32` sum loses the
//! fraction's low bits and a few codes differ by one. [`export_u16`] reproduces the export;
//! [`fake_quant`](super::fake_quant) reproduces calibration. RoPE tables are exported the same
//! way (`convert_rope_for_deploy`).

use rayon::prelude::*;

use super::fake_quant::dequantize_slice_u16;
use super::observer::{MinMaxObserver, ObserverScheme};
use super::rounding::round_half_even;
use super::spec::{QuantParams, StorageType};
use super::QuantError;

/// Elements per parallel task; small tensors stay on one thread.
const PAR_CHUNK: usize = 1 << 16;

/// A u16 weight with its per-tensor parameters (`<op>.weight`, `.scale`, `.zero_point`).
#[derive(Clone, Debug, PartialEq)]
pub struct U16Weight {
    pub codes: Vec<u16>,
    pub params: QuantParams,
}

impl U16Weight {
    /// The deployed values `(q - zero_point) * scale`.
    pub fn decode(&self) -> Vec<f32> {
        decode_u16(&self.codes, &self.params)
    }
}

/// Observes the whole weight once and exports it, as `freeze_weight` + `convert_to_deploy` do.
pub fn quantize_u16_weight(weight: &[f32]) -> Result<U16Weight, QuantError> {
    if let Some(i) = weight.iter().position(|x| !x.is_finite()) {
        return Err(QuantError::NonFinite { what: "u16 weight", index: i, value: weight[i] });
    }
    let mut observer = MinMaxObserver::new(ObserverScheme::activation_u16());
    observer.observe(weight);
    let params = observer.qparams()?;
    Ok(U16Weight { codes: export_u16(weight, &params)?, params })
}

/// pymllm's export rounding: `clamp(round(w / scale + zero_point), qmin, qmax)` in `f32`.
///
/// Non-finite inputs are rejected (torch's cast of NaN to uint16 is undefined).
pub fn export_u16(values: &[f32], params: &QuantParams) -> Result<Vec<u16>, QuantError> {
    if !params.fits(StorageType::U16) {
        return Err(QuantError::StorageRange { params: *params, storage: StorageType::U16 });
    }
    let scale = params.scale;
    let zp = params.zero_point as f32;
    let (lo, hi) = (params.qmin as f32, params.qmax as f32);
    let mut codes = vec![0u16; values.len()];
    codes.par_chunks_mut(PAR_CHUNK).zip(values.par_chunks(PAR_CHUNK)).enumerate().try_for_each(|(c, (out, xs))| {
        for (k, (q, &x)) in out.iter_mut().zip(xs).enumerate() {
            if !x.is_finite() {
                return Err(QuantError::NonFinite { what: "u16 export input", index: c * PAR_CHUNK + k, value: x });
            }
            *q = round_half_even(x / scale + zp).clamp(lo, hi) as u16;
        }
        Ok(())
    })?;
    Ok(codes)
}

/// The deployed values of u16 codes: `(q - zero_point) * scale`.
pub fn decode_u16(codes: &[u16], params: &QuantParams) -> Vec<f32> {
    dequantize_slice_u16(codes, params)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::fake_quant::quantize_slice_u16;

    #[test]
    fn export_divides_then_adds_the_zero_point_in_f32() {
        let p = QuantParams::u16_affine(0.1, 32768).unwrap();
        // Find a value where the two roundings differ and check each path keeps its own.
        let mut seen_difference = false;
        for k in 0..100_000 {
            let x = -3.0 + k as f32 * 6.1e-5;
            let export = export_u16(&[x], &p).unwrap()[0];
            let expect = ((x / 0.1f32 + 32768.0f32).round_ties_even()).clamp(0.0, 65535.0) as u16;
            assert_eq!(export, expect, "x = {x}");
            let fq = quantize_slice_u16(&[x], &p).unwrap()[0];
            seen_difference |= fq != export;
        }
        assert!(seen_difference, "export and fake-quant rounding never differed");
    }

    #[test]
    fn norm_of_ones_gets_the_full_scale() {
        // min = max = 1 -> range [0, 1], scale 1/65535, zp 0, every code 65535.
        let w = quantize_u16_weight(&[1.0; 8]).unwrap();
        assert_eq!(w.params.scale, 1.0f32 / 65535.0);
        assert_eq!(w.params.zero_point, 0);
        assert_eq!(w.codes, vec![65535; 8]);
        assert!(w.decode().iter().all(|&v| (v - 1.0).abs() < 1e-6));
    }

    #[test]
    fn clamps_and_rejects_bad_inputs() {
        let p = QuantParams::u16_affine(1.0, 10).unwrap();
        assert_eq!(export_u16(&[-100.0, 1e9], &p).unwrap(), vec![0, 65535]);
        assert!(matches!(export_u16(&[0.0, f32::NAN], &p), Err(QuantError::NonFinite { index: 1, .. })));
        assert!(quantize_u16_weight(&[1.0, f32::INFINITY]).is_err());
        assert_eq!(quantize_u16_weight(&[]), Err(QuantError::Unobserved));
        let kv = QuantParams::new(1.0, 0, -5, 5).unwrap();
        assert!(export_u16(&[0.0], &kv).is_err());
    }

    #[test]
    fn large_inputs_split_across_chunks_keep_their_indices() {
        let mut v = vec![0.25f32; PAR_CHUNK * 2 + 5];
        let p = QuantParams::u16_affine(0.5, 0).unwrap();
        let codes = export_u16(&v, &p).unwrap();
        // 0.25 / 0.5 = 0.5 -> ties to even -> 0
        assert!(codes.iter().all(|&c| c == 0));
        v[PAR_CHUNK + 3] = f32::NAN;
        match export_u16(&v, &p) {
            Err(QuantError::NonFinite { index, .. }) => assert_eq!(index, PAR_CHUNK + 3),
            other => panic!("unexpected {other:?}"),
        }
    }
}

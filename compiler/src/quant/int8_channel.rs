//! Per-channel symmetric int8 linear weights: the 8-bit alternative to LPBQ int4 for the linears a
//! mixed-precision recipe raises (QNN's `AXIS_SCALE_OFFSET` encoding on the output channel with
//! offset 0, `SFIXED_POINT_8` codes).
//!
//! One f32 scale per output channel, `scale = max|w| / 127`; codes `round(w / scale)` in
//! `-127..=127` (−128 is never used, so the grid is symmetric). In a checkpoint the codes are
//! `<op>.weight` i8 HWIO `[1, 1, In, Out]` and the scales `<op>.scale` f32 `[Out]`; an int8
//! linear has no `<op>.scale1` (that marks LPBQ).

use super::QuantError;

/// The largest code magnitude.
pub const INT8_CODE_MAX: i8 = 127;

/// A per-channel int8 weight: `value[i][o] = codes_hwio[i * out + o] * scales[o]`.
#[derive(Clone, Debug, PartialEq)]
pub struct Int8Channel {
    pub out_features: usize,
    pub in_features: usize,
    /// HWIO `[1, 1, In, Out]` codes in `-127..=127`.
    pub codes_hwio: Vec<i8>,
    /// One positive finite scale per output channel.
    pub scales: Vec<f32>,
}

impl Int8Channel {
    /// Rounds a row-major `[Out][In]` weight to nearest on each channel's grid. An all-zero
    /// channel gets scale 1 (its codes are 0 either way).
    pub fn quantize(weight: &[f32], out_features: usize, in_features: usize) -> Result<Self, QuantError> {
        if out_features == 0 || in_features == 0 {
            return Err(QuantError::EmptyShape { what: "int8 weight", out_features, in_features });
        }
        let n = out_features * in_features;
        if weight.len() != n {
            return Err(QuantError::LengthMismatch { what: "int8 weight", expected: n, found: weight.len() });
        }
        if let Some(i) = weight.iter().position(|v| !v.is_finite()) {
            return Err(QuantError::NonFinite { what: "int8 weight", index: i, value: weight[i] });
        }
        let scales: Vec<f32> = weight
            .chunks_exact(in_features)
            .map(|row| {
                let max = row.iter().fold(0f32, |m, v| m.max(v.abs()));
                if max > 0.0 {
                    max / f32::from(INT8_CODE_MAX)
                } else {
                    1.0
                }
            })
            .collect();
        let max = f32::from(INT8_CODE_MAX);
        let mut codes_hwio = vec![0i8; n];
        for (o, row) in weight.chunks_exact(in_features).enumerate() {
            for (i, &w) in row.iter().enumerate() {
                codes_hwio[i * out_features + o] = (w / scales[o]).round().clamp(-max, max) as i8;
            }
        }
        Ok(Int8Channel { out_features, in_features, codes_hwio, scales })
    }

    /// Stored codes and scales, checked: `In * Out` codes in `-127..=127`, `Out` positive finite scales.
    pub fn from_parts(
        out_features: usize,
        in_features: usize,
        codes_hwio: Vec<i8>,
        scales: Vec<f32>,
    ) -> Result<Self, QuantError> {
        let n = out_features * in_features;
        if codes_hwio.len() != n {
            return Err(QuantError::LengthMismatch { what: "int8 codes", expected: n, found: codes_hwio.len() });
        }
        if scales.len() != out_features {
            return Err(QuantError::LengthMismatch {
                what: "int8 channel scales",
                expected: out_features,
                found: scales.len(),
            });
        }
        if let Some(i) = codes_hwio.iter().position(|&c| c < -INT8_CODE_MAX) {
            let (min, max) = (-i64::from(INT8_CODE_MAX), i64::from(INT8_CODE_MAX));
            return Err(QuantError::CodeOutOfRange {
                what: "int8 codes",
                index: i,
                value: codes_hwio[i].into(),
                min,
                max,
            });
        }
        if let Some(i) = scales.iter().position(|&s| !(s.is_finite() && s > 0.0)) {
            return Err(QuantError::BadScale { what: "int8 channel scales", index: i, value: scales[i] });
        }
        Ok(Int8Channel { out_features, in_features, codes_hwio, scales })
    }

    /// The deployed values, row-major `[Out][In]`.
    pub fn decode(&self) -> Vec<f32> {
        let (out, inp) = (self.out_features, self.in_features);
        let mut rows = vec![0f32; out * inp];
        for (i, codes) in self.codes_hwio.chunks_exact(out).enumerate() {
            for (o, (&c, &s)) in codes.iter().zip(&self.scales).enumerate() {
                rows[o * inp + i] = f32::from(c) * s;
            }
        }
        rows
    }

    /// The deployed values in HWIO order `[In][Out]`.
    pub fn decode_hwio(&self) -> Vec<f32> {
        let out = self.out_features;
        self.codes_hwio.iter().enumerate().map(|(j, &c)| f32::from(c) * self.scales[j % out]).collect()
    }

    /// Bytes on the device: one per code, four per channel scale.
    pub fn device_bytes(out_features: usize, in_features: usize) -> usize {
        out_features * in_features + 4 * out_features
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::test_data::cubed;

    #[test]
    fn rounds_each_channel_to_its_own_grid_and_decodes_in_both_layouts() {
        let (out, inp) = (6, 40);
        let mut w = cubed(out * inp, 7, 0.3);
        w[inp..2 * inp].iter_mut().for_each(|v| *v = 0.0); // an all-zero channel
        let q = Int8Channel::quantize(&w, out, inp).unwrap();
        assert_eq!(q.scales[1], 1.0);
        let rows = q.decode();
        for o in 0..out {
            let row = &w[o * inp..(o + 1) * inp];
            let max = row.iter().fold(0f32, |m, v| m.max(v.abs()));
            // The largest weight lands on code ±127 exactly; every error is at most half a step.
            assert!(q.codes_hwio.iter().skip(o).step_by(out).any(|c| c.abs() == 127) || max == 0.0);
            for i in 0..inp {
                assert!((rows[o * inp + i] - row[i]).abs() <= 0.5 * q.scales[o] + 1e-7);
            }
        }
        let hwio = q.decode_hwio();
        for o in 0..out {
            for i in 0..inp {
                assert_eq!(hwio[i * out + o], rows[o * inp + i]);
            }
        }
        assert_eq!(Int8Channel::from_parts(out, inp, q.codes_hwio.clone(), q.scales.clone()).unwrap(), q);
    }

    #[test]
    fn bad_input_and_stored_data_are_refused_by_name() {
        assert!(matches!(Int8Channel::quantize(&[1.0; 4], 2, 3), Err(QuantError::LengthMismatch { .. })));
        assert!(matches!(Int8Channel::quantize(&[f32::NAN; 4], 2, 2), Err(QuantError::NonFinite { index: 0, .. })));
        assert!(matches!(Int8Channel::quantize(&[], 0, 2), Err(QuantError::EmptyShape { .. })));
        let e = Int8Channel::from_parts(1, 2, vec![-128, 0], vec![1.0]).unwrap_err();
        assert!(matches!(e, QuantError::CodeOutOfRange { index: 0, value: -128, .. }), "{e}");
        let e = Int8Channel::from_parts(1, 2, vec![1, 0], vec![0.0]).unwrap_err();
        assert!(matches!(e, QuantError::BadScale { index: 0, .. }), "{e}");
        let e = Int8Channel::from_parts(2, 2, vec![1, 0, 0, 0], vec![1.0]).unwrap_err();
        assert!(e.to_string().contains("channel scales"), "{e}");
    }
}

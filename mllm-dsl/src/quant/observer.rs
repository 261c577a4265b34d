//! Min/max observers with torch's `calculate_qparams` semantics.
//!
//! pymllm calibrates by running data through torch `MinMaxObserver`s (running min and max over
//! everything seen) and turning the final range into parameters with
//! `UniformQuantizationObserverBase._calculate_qparams`. All of it runs on `f32` tensors:
//!
//! - the range is widened to contain 0: `min_neg = min(min, 0)`, `max_pos = max(max, 0)`;
//! - affine (activations, u16 weights): `scale = max((max_pos - min_neg) / (qmax - qmin), eps)`,
//!   `zero_point = clamp(qmin - round(min_neg / scale), qmin, qmax)` (round half to even);
//! - symmetric with dtype uint8 and no custom range (the KV cache): the range is 0..=255,
//!   `scale = max(max(-min_neg, max_pos) / 127.5, eps)` and the zero point is 128.
//!
//! [`ConcatObserver`] reproduces pymllm's `ConcatObserver`, which makes the two inputs of
//! rotate_half's concatenation share one range.

use super::rounding::round_half_even;
use super::spec::{QuantParams, EPS_16BIT, KV_ZERO_POINT, U16_QMAX, U16_QMIN, U8_QMAX, U8_QMIN};
use super::QuantError;

/// How an observer's range becomes parameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ObserverScheme {
    /// torch `per_tensor_affine` with a custom range `qmin..=qmax`.
    Affine { qmin: i32, qmax: i32, eps: f32 },
    /// torch `per_tensor_symmetric` with dtype `uint8` and no custom range: 0..=255, zero point 128.
    KvSymmetricU8 { eps: f32 },
}

impl ObserverScheme {
    /// `ActivationQDQ(bits=16)` and the u16 weight observers: 0..=65535, eps 1e-4/65535.
    pub fn activation_u16() -> Self {
        ObserverScheme::Affine { qmin: U16_QMIN, qmax: U16_QMAX, eps: EPS_16BIT }
    }
}

/// torch's `_calculate_qparams` for one per-tensor range.
///
/// Errors instead of guessing when the range is not finite or inverted; torch would assert or
/// produce an infinite scale.
pub fn calculate_qparams(scheme: ObserverScheme, min: f32, max: f32) -> Result<QuantParams, QuantError> {
    if !(min.is_finite() && max.is_finite()) || min > max {
        return Err(QuantError::NonFiniteObservation { min, max });
    }
    let min_neg = min.min(0.0);
    let max_pos = max.max(0.0);
    match scheme {
        ObserverScheme::Affine { qmin, qmax, eps } => {
            // `float(quant_max - quant_min)` becomes an f32 operand of the tensor division.
            let scale = ((max_pos - min_neg) / (qmax - qmin) as f32).max(eps);
            let zero_point = qmin - round_half_even(min_neg / scale) as i32;
            QuantParams::new(scale, zero_point.clamp(qmin, qmax), qmin, qmax)
        }
        ObserverScheme::KvSymmetricU8 { eps } => {
            let amax = (-min_neg).max(max_pos);
            let half_range = (U8_QMAX - U8_QMIN) as f32 / 2.0;
            let scale = (amax / half_range).max(eps);
            QuantParams::new(scale, KV_ZERO_POINT, U8_QMIN, U8_QMAX)
        }
    }
}

/// Running min/max of everything observed (torch `MinMaxObserver`).
#[derive(Clone, Debug, PartialEq)]
pub struct MinMaxObserver {
    scheme: ObserverScheme,
    range: Option<(f32, f32)>,
    saw_nan: bool,
}

impl MinMaxObserver {
    pub fn new(scheme: ObserverScheme) -> Self {
        Self { scheme, range: None, saw_nan: false }
    }

    pub fn scheme(&self) -> ObserverScheme {
        self.scheme
    }

    /// Widens the running range by `xs`. An empty slice changes nothing, as in torch.
    pub fn observe(&mut self, xs: &[f32]) {
        if let Some((lo, hi, nan)) = min_max(xs) {
            self.saw_nan |= nan;
            self.widen(lo, hi);
        }
    }

    /// Widens the running range by an already reduced `min..=max`.
    pub fn observe_range(&mut self, min: f32, max: f32) {
        self.saw_nan |= min.is_nan() || max.is_nan();
        self.widen(min, max);
    }

    fn widen(&mut self, lo: f32, hi: f32) {
        self.range = Some(match self.range {
            None => (lo, hi),
            Some((a, b)) => (a.min(lo), b.max(hi)),
        });
    }

    /// The running range, if anything has been observed.
    pub fn range(&self) -> Option<(f32, f32)> {
        self.range
    }

    /// Replaces the running range, as pymllm's `ConcatObserver` does to the observers it links.
    pub fn set_range(&mut self, min: f32, max: f32) {
        self.saw_nan = min.is_nan() || max.is_nan();
        self.range = Some((min, max));
    }

    /// Parameters for the range observed so far.
    ///
    /// torch falls back to scale 1.0 / zero point 0 with a warning when nothing was observed;
    /// here that is an error, since such parameters would silently ruin a deployed model.
    pub fn qparams(&self) -> Result<QuantParams, QuantError> {
        let (min, max) = self.range.ok_or(QuantError::Unobserved)?;
        if self.saw_nan {
            return Err(QuantError::NonFiniteObservation { min: f32::NAN, max: f32::NAN });
        }
        calculate_qparams(self.scheme, min, max)
    }
}

/// pymllm's `ConcatObserver`: the running range of a concatenation's output, forced onto the
/// observers of its inputs so they all end up with the same parameters.
///
/// In Qwen3's rotate_half, the concatenation `cat(-x2, x1)` links the observers of
/// `q/k_norm_output_qdq` (x1's producer) and `q/k_rope_neg_half_qdq`. Each forward first lets those
/// observers widen their own ranges, then the concat observer overwrites both with its own
/// running range; the last overwrite is what calibration keeps.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ConcatObserver {
    range: Option<(f32, f32)>,
    saw_nan: bool,
}

impl ConcatObserver {
    pub fn new() -> Self {
        Self::default()
    }

    /// Observes the concatenation output and overwrites the ranges of the `linked` observers.
    pub fn observe(&mut self, concat_output: &[f32], linked: &mut [&mut MinMaxObserver]) {
        if let Some((lo, hi, nan)) = min_max(concat_output) {
            self.saw_nan |= nan;
            self.range = Some(match self.range {
                None => (lo, hi),
                Some((a, b)) => (a.min(lo), b.max(hi)),
            });
        }
        if let Some((lo, hi)) = self.range {
            for observer in linked.iter_mut() {
                observer.range = Some((lo, hi));
                observer.saw_nan = self.saw_nan;
            }
        }
    }

    pub fn range(&self) -> Option<(f32, f32)> {
        self.range
    }
}

/// Min, max and whether a NaN was present; `None` for an empty slice.
///
/// Eight independent lanes let the compiler use packed min/max instructions.
fn min_max(xs: &[f32]) -> Option<(f32, f32, bool)> {
    if xs.is_empty() {
        return None;
    }
    const LANES: usize = 8;
    let mut lo = [f32::INFINITY; LANES];
    let mut hi = [f32::NEG_INFINITY; LANES];
    let mut nan = [false; LANES];
    let chunks = xs.chunks_exact(LANES);
    let tail = chunks.remainder();
    for chunk in chunks {
        for j in 0..LANES {
            let x = chunk[j];
            lo[j] = if x < lo[j] { x } else { lo[j] };
            hi[j] = if x > hi[j] { x } else { hi[j] };
            nan[j] |= x.is_nan();
        }
    }
    for (j, &x) in tail.iter().enumerate() {
        lo[j] = if x < lo[j] { x } else { lo[j] };
        hi[j] = if x > hi[j] { x } else { hi[j] };
        nan[j] |= x.is_nan();
    }
    let lo = lo.iter().copied().fold(f32::INFINITY, f32::min);
    let hi = hi.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let nan = nan.iter().any(|&n| n);
    // An all-NaN slice leaves the lanes at +-inf; report NaN rather than a fake range.
    if nan && lo > hi {
        return Some((f32::NAN, f32::NAN, true));
    }
    Some((lo, hi, nan))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::spec::EPS_8BIT;

    fn act() -> MinMaxObserver {
        MinMaxObserver::new(ObserverScheme::activation_u16())
    }

    #[test]
    fn affine_params_by_hand() {
        // Range [-1, 3]: scale = 4/65535 (f32), zp = -round(-1/scale) = round(16383.75) = 16384.
        let mut o = act();
        o.observe(&[0.5, -1.0, 3.0, 2.0]);
        let p = o.qparams().unwrap();
        assert_eq!(p.scale, 4.0f32 / 65535.0f32);
        assert_eq!(p.zero_point, 16384);
        assert_eq!((p.qmin, p.qmax), (0, 65535));
    }

    #[test]
    fn all_zero_tensor_gets_the_eps_scale() {
        let mut o = act();
        o.observe(&[0.0; 17]);
        let p = o.qparams().unwrap();
        assert_eq!(p.scale, EPS_16BIT);
        assert_eq!(p.zero_point, 0);
        let mut kv = MinMaxObserver::new(ObserverScheme::KvSymmetricU8 { eps: EPS_8BIT });
        kv.observe(&[0.0, -0.0]);
        let p = kv.qparams().unwrap();
        assert_eq!((p.scale, p.zero_point), (EPS_8BIT, 128));
    }

    #[test]
    fn negative_only_range_includes_zero() {
        // [-2, -1] widens to [-2, 0]: scale 2/65535, zp = -round(-2/scale) = 65535.
        let mut o = act();
        o.observe(&[-1.0, -2.0, -1.5]);
        let p = o.qparams().unwrap();
        assert_eq!(p.scale, 2.0f32 / 65535.0);
        assert_eq!(-2.0f32 / p.scale, -65535.0);
        assert_eq!(p.zero_point, 65535);
        // Positive-only: zp 0.
        let mut o = act();
        o.observe(&[1.0, 5.0]);
        let p = o.qparams().unwrap();
        assert_eq!((p.scale, p.zero_point), (5.0f32 / 65535.0, 0));
    }

    #[test]
    fn zero_point_rounds_half_to_even() {
        // Pick min/max so min_neg/scale lands exactly on a half: min = -2.5 * s, s = 1/8 ->
        // (max - min) = 65535/8, max = 65535/8 - 2.5/8.
        let s = 0.125f32;
        let min = -2.5 * s;
        let max = 65535.0 * s + min;
        let p = calculate_qparams(ObserverScheme::activation_u16(), min, max).unwrap();
        assert_eq!(p.scale, s);
        assert_eq!(min / p.scale, -2.5);
        assert_eq!(p.zero_point, 2, "-round(-2.5) with ties to even is 2");
        let min = -3.5 * s;
        let max = 65535.0 * s + min;
        let p = calculate_qparams(ObserverScheme::activation_u16(), min, max).unwrap();
        assert_eq!(p.zero_point, 4, "-round(-3.5) with ties to even is 4");
    }

    #[test]
    fn symmetric_u8_uses_half_range_and_zero_point_128() {
        let mut kv = MinMaxObserver::new(ObserverScheme::KvSymmetricU8 { eps: EPS_8BIT });
        kv.observe(&[-3.0, 1.0]);
        kv.observe(&[2.0]);
        let p = kv.qparams().unwrap();
        assert_eq!(p.scale, 3.0f32 / 127.5);
        assert_eq!((p.zero_point, p.qmin, p.qmax), (128, 0, 255));
        let mut kv = MinMaxObserver::new(ObserverScheme::KvSymmetricU8 { eps: EPS_8BIT });
        kv.observe(&[0.5, 4.0]);
        assert_eq!(kv.qparams().unwrap().scale, 4.0f32 / 127.5);
    }

    #[test]
    fn running_range_accumulates_across_batches() {
        let mut o = act();
        o.observe(&[]);
        assert_eq!(o.range(), None);
        assert_eq!(o.qparams(), Err(QuantError::Unobserved));
        o.observe(&[1.0, 2.0]);
        o.observe(&[-0.5]);
        o.observe_range(0.0, 7.0);
        assert_eq!(o.range(), Some((-0.5, 7.0)));
        let long: Vec<f32> = (0..1001).map(|i| (i as f32 - 500.0) * 0.01).collect();
        o.observe(&long);
        assert_eq!(o.range(), Some((-5.0, 7.0)));
    }

    #[test]
    fn non_finite_observations_are_errors() {
        let mut o = act();
        o.observe(&[1.0, f32::NAN, 2.0]);
        assert!(matches!(o.qparams(), Err(QuantError::NonFiniteObservation { .. })));
        let mut o = act();
        o.observe(&[f32::NAN]);
        assert!(o.qparams().is_err());
        let mut o = act();
        o.observe(&[1.0, f32::INFINITY]);
        assert!(o.qparams().is_err());
    }

    #[test]
    fn concat_observer_overwrites_linked_ranges() {
        let mut x1_obs = act();
        let mut neg_obs = act();
        let mut cat = ConcatObserver::new();
        // Forward 1: x = [-1, 4 | 2, 3]; x1 = [-1, 4], -x2 = [-2, -3].
        x1_obs.observe(&[-1.0, 4.0, 2.0, 3.0]);
        neg_obs.observe(&[-2.0, -3.0]);
        cat.observe(&[-2.0, -3.0, -1.0, 4.0], &mut [&mut x1_obs, &mut neg_obs]);
        assert_eq!(x1_obs.range(), Some((-3.0, 4.0)));
        assert_eq!(neg_obs.range(), Some((-3.0, 4.0)));
        // Forward 2: x widens x1's own range to 9, but the concat output only reaches 1.
        x1_obs.observe(&[0.0, 1.0, 9.0, 0.5]);
        neg_obs.observe(&[-9.0, -0.5]);
        cat.observe(&[-9.0, -0.5, 0.0, 1.0], &mut [&mut x1_obs, &mut neg_obs]);
        assert_eq!(cat.range(), Some((-9.0, 4.0)));
        assert_eq!(x1_obs.range(), Some((-9.0, 4.0)));
        assert_eq!(x1_obs.qparams(), neg_obs.qparams());
    }
}

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
//! [`ConcatObserver`] makes the QDQ points feeding one concatenation share a range, either as
//! pymllm's `ConcatObserver` ends up doing it ([`ConcatSharing::Pymllm`], aliasing included) or as
//! the plain union of what they saw ([`ConcatSharing::Union`]).

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
        if let Some((lo, hi, nan)) = mllm_dsl::simd::min_max::<8>(xs) {
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

/// How the QDQ points feeding one concatenation come to share a range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConcatSharing {
    /// What pymllm's `ConcatObserver` computes, tensor aliasing included.
    ///
    /// `ConcatObserver.forward` observes the concatenation's output and then *assigns* its own
    /// `min_val` / `max_val` tensors to the linked observers. From then on the three share one
    /// tensor object, and torch's `MinMaxObserver.forward` updates its range in place
    /// (`self.min_val.copy_(...)`), so every later observation of a linked point widens the shared
    /// range with that point's whole input. In the first forward the linked observers still own
    /// their buffers, and what they saw is discarded by the assignment. The final range is
    /// therefore: the first concatenation output, widened by everything the linked points see in
    /// all later forwards (for Qwen3: `cat(-x2, x1)` of the first sequence, then the whole `q`
    /// and `-x2` of every other sequence).
    Pymllm,
    /// Every linked point gets the union of everything any of them saw, over all forwards: the
    /// smallest shared range that represents each point's whole tensor.
    Union,
}

/// Observers of the QDQ points feeding one concatenation, which must end with one shared range
/// (mllm's compiler gives a Concat one encoding for all inputs).
///
/// Each forward, every linked point reports what its QDQ saw ([`observe`](Self::observe)): the
/// range of its whole tensor and the range of the part that enters the concatenation (a slice of
/// it, or all of it). Once all points have reported, the concatenation itself is observed.
#[derive(Clone, Debug, PartialEq)]
pub struct ConcatObserver {
    sharing: ConcatSharing,
    scheme: ObserverScheme,
    /// Ranges the points own before the link is made (pymllm's first forward).
    own: Vec<Option<(f32, f32)>>,
    /// What each point contributed to the concatenation of the current forward.
    pending: Vec<Option<(f32, f32)>>,
    /// The concatenation observer's running range, shared by every point once linked.
    shared: Option<(f32, f32)>,
    saw_nan: bool,
}

impl ConcatObserver {
    /// Links `points` QDQ points whose parameters follow `scheme`.
    pub fn new(points: usize, sharing: ConcatSharing, scheme: ObserverScheme) -> Self {
        Self { sharing, scheme, own: vec![None; points], pending: vec![None; points], shared: None, saw_nan: false }
    }

    pub fn points(&self) -> usize {
        self.own.len()
    }

    /// Point `point` saw a tensor spanning `whole`, of which `into_concat` enters the concatenation.
    ///
    /// # Panics
    /// If `point` is not below [`points`](Self::points).
    pub fn observe(&mut self, point: usize, whole: (f32, f32), into_concat: (f32, f32)) {
        self.saw_nan |= [whole.0, whole.1, into_concat.0, into_concat.1].iter().any(|v| v.is_nan());
        match self.sharing {
            ConcatSharing::Union => self.shared = Some(widen(self.shared, whole)),
            ConcatSharing::Pymllm => {
                match self.shared {
                    // Linked: the point's observer writes into the shared tensor.
                    Some(shared) => self.shared = Some(widen(Some(shared), whole)),
                    None => self.own[point] = Some(widen(self.own[point], whole)),
                }
                self.pending[point] = Some(widen(self.pending[point], into_concat));
                if self.pending.iter().all(Option::is_some) {
                    let cat = self.pending.iter().flatten().fold(None, |acc, &r| Some(widen(acc, r)));
                    if let Some(cat) = cat {
                        self.shared = Some(widen(self.shared, cat));
                    }
                    self.pending.iter_mut().for_each(|p| *p = None);
                }
            }
        }
    }

    /// The range point `point`'s observer holds now.
    pub fn range(&self, point: usize) -> Option<(f32, f32)> {
        self.shared.or(self.own[point])
    }

    /// Parameters of point `point` (all points agree once the concatenation was observed).
    pub fn qparams(&self, point: usize) -> Result<QuantParams, QuantError> {
        let (min, max) = self.range(point).ok_or(QuantError::Unobserved)?;
        if self.saw_nan {
            return Err(QuantError::NonFiniteObservation { min: f32::NAN, max: f32::NAN });
        }
        calculate_qparams(self.scheme, min, max)
    }
}

fn widen(acc: Option<(f32, f32)>, (lo, hi): (f32, f32)) -> (f32, f32) {
    match acc {
        None => (lo, hi),
        Some((a, b)) => (a.min(lo), b.max(hi)),
    }
}

/// Min and max of `xs`, or `None` for an empty slice; a NaN anywhere makes both NaN.
pub fn min_max_of(xs: &[f32]) -> Option<(f32, f32)> {
    mllm_dsl::simd::min_max::<8>(xs).map(|(lo, hi, nan)| if nan { (f32::NAN, f32::NAN) } else { (lo, hi) })
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
    fn concat_observer_reproduces_pymllm_aliasing() {
        let scheme = ObserverScheme::activation_u16();
        let mut cat = ConcatObserver::new(2, ConcatSharing::Pymllm, scheme);
        // Point 0 is x's QDQ (x1 = first half of x enters the concat), point 1 is -x2's.
        // Forward 1: x = [-1, 4 | 2, 9]: whole x spans [-1, 9], x1 = [-1, 4], -x2 = [-9, -2].
        cat.observe(0, (-1.0, 9.0), (-1.0, 4.0));
        assert_eq!(cat.range(0), Some((-1.0, 9.0)), "before the concat a point owns its range");
        cat.observe(1, (-9.0, -2.0), (-9.0, -2.0));
        // The first concat output [-9, 4] replaces both ranges; x's own 9 is lost.
        assert_eq!(cat.range(0), Some((-9.0, 4.0)));
        assert_eq!(cat.range(1), Some((-9.0, 4.0)));
        // Forward 2: x's whole tensor (its second half too) now widens the shared range.
        cat.observe(0, (0.0, 6.0), (0.0, 1.0));
        assert_eq!(cat.range(1), Some((-9.0, 6.0)), "linked observers write into the shared range");
        cat.observe(1, (-6.0, -5.0), (-6.0, -5.0));
        assert_eq!(cat.range(0), Some((-9.0, 6.0)));
        assert_eq!(cat.qparams(0), cat.qparams(1));
        assert_eq!(cat.qparams(0).unwrap(), calculate_qparams(scheme, -9.0, 6.0).unwrap());
    }

    #[test]
    fn concat_union_keeps_every_whole_tensor() {
        let mut cat = ConcatObserver::new(2, ConcatSharing::Union, ObserverScheme::activation_u16());
        assert_eq!(cat.qparams(0), Err(QuantError::Unobserved));
        cat.observe(0, (-1.0, 9.0), (-1.0, 4.0));
        cat.observe(1, (-9.0, -2.0), (-9.0, -2.0));
        assert_eq!(cat.range(0), Some((-9.0, 9.0)), "x's second half must stay representable");
        cat.observe(1, (f32::NAN, 0.0), (f32::NAN, 0.0));
        assert!(matches!(cat.qparams(1), Err(QuantError::NonFiniteObservation { .. })));
    }

    #[test]
    fn min_max_of_reports_nan_and_empty() {
        assert_eq!(min_max_of(&[]), None);
        assert_eq!(min_max_of(&[3.0, -1.0, 2.0]), Some((-1.0, 3.0)));
        let (lo, hi) = min_max_of(&[1.0, f32::NAN]).unwrap();
        assert!(lo.is_nan() && hi.is_nan());
    }
}

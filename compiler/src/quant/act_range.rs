//! How an observed activation (or KV cache) point turns what it saw into a range: pymllm's
//! min/max, a percentile, or the clipping range with the least quantization error.
//!
//! ```
//! # use compiler::quant::act_range::{ActRanges, RangeObserver};
//! # use compiler::quant::{min_max_of, ObserverScheme};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let ranges: ActRanges = "act=mse,kv=percentile:99.99".parse()?; // or "mse" for both
//! let mut obs = RangeObserver::new(ObserverScheme::activation_u16(), ranges.activations);
//! let batch = [0.25f32, -1.5, 3.0, 0.0];
//! obs.observe(&batch, min_max_of(&batch).ok_or("an empty batch")?);
//! let params = obs.qparams()?;
//! assert!(params.scale > 0.0);
//! # Ok(())
//! # }
//! ```
//!
//! | method | range | memory |
//! |---|---|---|
//! | [`ActRange::MinMax`] | everything seen (torch `MinMaxObserver`, pymllm) | two floats |
//! | [`ActRange::Percentile`] | `[P(100 - p), P(p)]` of the values, numpy's linear percentile on a [`RangeHistogram`] | one histogram |
//! | [`ActRange::Mse`] | the range minimizing `sum (x - clamp(x))^2 + N_in * scale^2 / 12` (clipping plus rounding noise) over a grid of clipping fractions | one histogram |
//!
//! The chosen range goes through the same [`calculate_qparams`] as min/max (zero included, eps).
//! Constants and RoPE tables are data, not samples: they always keep min/max.

use super::histogram::{ClipTable, RangeHistogram};
use super::observer::{calculate_qparams, MinMaxObserver, ObserverScheme};
use super::spec::{QuantParams, U8_QMAX, U8_QMIN};
use super::QuantError;

/// Clipping fractions of the extreme tried by [`ActRange::Mse`] (`k / MSE_STEPS`, `k = 1..=MSE_STEPS`).
pub const MSE_STEPS: usize = 200;
/// Rounds of alternating lower/upper bound search for affine ranges.
const MSE_ROUNDS: usize = 3;

/// A range method (module docs).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub enum ActRange {
    #[default]
    MinMax,
    /// Keep the central `p` percent of each tail: `p` in `(50, 100]`.
    Percentile(f64),
    Mse,
}

impl ActRange {
    /// Whether the method needs a histogram (anything but min/max).
    pub fn needs_histogram(self) -> bool {
        self != ActRange::MinMax
    }
}

impl std::fmt::Display for ActRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ActRange::MinMax => write!(f, "minmax"),
            ActRange::Percentile(p) => write!(f, "percentile:{p}"),
            ActRange::Mse => write!(f, "mse"),
        }
    }
}

/// A malformed `--act-range` value (an [`ActRange`] or [`ActRanges`] spelling).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ActRangeParseError {
    #[error("unknown activation range method `{0}`; expected minmax, mse or percentile:P (e.g. percentile:99.99)")]
    UnknownMethod(String),
    #[error("`{0}`: the percentile must be a number above 50 and at most 100, e.g. 99.99")]
    Percentile(String),
    #[error("`{part}` in `{text}`: expected KIND=METHOD with KIND act or kv (e.g. act=mse,kv=percentile:99.99)")]
    NotKindMethod { part: String, text: String },
    #[error("`{kind}` in `{text}`: unknown point kind; expected act or kv")]
    UnknownKind { kind: String, text: String },
    #[error("`{kind}` in `{text}`: {source}")]
    Method {
        kind: String,
        text: String,
        #[source]
        source: Box<ActRangeParseError>,
    },
}

impl std::str::FromStr for ActRange {
    type Err = ActRangeParseError;
    fn from_str(s: &str) -> Result<Self, ActRangeParseError> {
        match s {
            "minmax" => Ok(ActRange::MinMax),
            "mse" => Ok(ActRange::Mse),
            _ => {
                let Some(p) = s.strip_prefix("percentile:") else {
                    return Err(ActRangeParseError::UnknownMethod(s.to_string()));
                };
                match p.parse::<f64>() {
                    Ok(v) if v > 50.0 && v <= 100.0 => Ok(ActRange::Percentile(v)),
                    _ => Err(ActRangeParseError::Percentile(s.to_string())),
                }
            }
        }
    }
}

/// The range method of each observed point kind.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ActRanges {
    /// u16 activations.
    pub activations: ActRange,
    /// The u8 KV cache.
    pub kv_cache: ActRange,
}

impl ActRanges {
    pub fn is_min_max(&self) -> bool {
        *self == ActRanges::default()
    }
}

impl std::fmt::Display for ActRanges {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.activations == self.kv_cache {
            write!(f, "{}", self.activations)
        } else {
            write!(f, "act={},kv={}", self.activations, self.kv_cache)
        }
    }
}

impl std::str::FromStr for ActRanges {
    type Err = ActRangeParseError;
    /// `METHOD` (both kinds) or `act=METHOD,kv=METHOD` (either may be left out: min/max).
    fn from_str(s: &str) -> Result<Self, ActRangeParseError> {
        if !s.contains('=') {
            let m: ActRange = s.parse()?;
            return Ok(ActRanges { activations: m, kv_cache: m });
        }
        let mut out = ActRanges::default();
        for part in s.split(',') {
            let text = || s.to_string();
            let (kind, method) = part
                .split_once('=')
                .ok_or_else(|| ActRangeParseError::NotKindMethod { part: part.to_string(), text: text() })?;
            let method = method.parse().map_err(|e| ActRangeParseError::Method {
                kind: kind.to_string(),
                text: text(),
                source: Box::new(e),
            })?;
            match kind {
                "act" => out.activations = method,
                "kv" => out.kv_cache = method,
                _ => return Err(ActRangeParseError::UnknownKind { kind: kind.to_string(), text: text() }),
            }
        }
        Ok(out)
    }
}

/// An observer that keeps min/max and, when its method needs one, a histogram.
#[derive(Clone, Debug, PartialEq)]
pub struct RangeObserver {
    method: ActRange,
    min_max: MinMaxObserver,
    histogram: Option<Box<RangeHistogram>>,
}

impl RangeObserver {
    pub fn new(scheme: ObserverScheme, method: ActRange) -> Self {
        let histogram = method.needs_histogram().then(|| Box::new(RangeHistogram::new()));
        RangeObserver { method, min_max: MinMaxObserver::new(scheme), histogram }
    }

    /// Adds `xs`; `range` is their min/max, already reduced by the caller.
    pub fn observe(&mut self, xs: &[f32], range: (f32, f32)) {
        self.min_max.observe_range(range.0, range.1);
        if let Some(h) = &mut self.histogram {
            h.observe(xs);
        }
    }

    /// Adds a range without values (only meaningful for min/max).
    pub fn observe_range(&mut self, min: f32, max: f32) {
        self.min_max.observe_range(min, max);
    }

    /// The min/max range seen so far.
    pub fn min_max_range(&self) -> Option<(f32, f32)> {
        self.min_max.range()
    }

    /// The range the method chose.
    pub fn range(&self) -> Result<(f32, f32), QuantError> {
        // Min/max first: it reports unobserved and non-finite data the same way for every method.
        self.min_max.qparams()?;
        let whole = self.min_max.range().ok_or(QuantError::Unobserved)?;
        match (&self.histogram, self.method) {
            (Some(h), ActRange::Percentile(p)) => {
                h.check_finite()?;
                if h.total() == 0 {
                    return Ok(whole);
                }
                Ok((h.percentile(100.0 - p)?, h.percentile(p)?))
            }
            (Some(h), ActRange::Mse) => {
                h.check_finite()?;
                if h.total() == 0 {
                    return Ok(whole);
                }
                Ok(mse_range(h, self.min_max.scheme(), whole))
            }
            _ => Ok(whole),
        }
    }

    pub fn qparams(&self) -> Result<QuantParams, QuantError> {
        let (min, max) = self.range()?;
        calculate_qparams(self.min_max.scheme(), min, max)
    }
}

/// Clipping plus rounding error of quantizing the histogram's data to `[lo, hi]` with `levels` steps.
fn range_error(t: &ClipTable<'_>, lo: f64, hi: f64, levels: f64) -> f64 {
    let step = (hi - lo) / levels;
    t.clip_error(lo, hi) + t.count_within(lo, hi) * step * step / 12.0
}

/// [`ActRange::Mse`]: the candidate range (zero included, as the parameters will include it) with
/// the least [`range_error`].
fn mse_range(h: &RangeHistogram, scheme: ObserverScheme, (min, max): (f32, f32)) -> (f32, f32) {
    let (min, max) = (f64::from(min.min(0.0)), f64::from(max.max(0.0)));
    let h = &h.clip_table();
    let fractions = (1..=MSE_STEPS).map(|k| k as f64 / MSE_STEPS as f64);
    match scheme {
        ObserverScheme::Affine { qmin, qmax, .. } => {
            let levels = f64::from(qmax - qmin);
            let (mut lo, mut hi) = (min, max);
            for _ in 0..MSE_ROUNDS {
                hi = best(fractions.clone().map(|f| f * max), |b| range_error(h, lo, b, levels)).unwrap_or(hi);
                lo = best(fractions.clone().map(|f| f * min), |a| range_error(h, a, hi, levels)).unwrap_or(lo);
            }
            (lo as f32, hi as f32)
        }
        ObserverScheme::KvSymmetricU8 { .. } => {
            // Symmetric: 255 steps over [-c, c] (the zero point is fixed at 128).
            let amax = max.max(-min);
            let levels = f64::from(U8_QMAX - U8_QMIN);
            let c = best(fractions.map(|f| f * amax), |c| range_error(h, -c, c, levels)).unwrap_or(amax);
            ((-c).max(min) as f32, c.min(max) as f32)
        }
    }
}

/// The candidate with the least error (the first of equals); `None` without candidates.
fn best(candidates: impl Iterator<Item = f64>, error: impl Fn(f64) -> f64) -> Option<f64> {
    candidates.map(|c| (error(c), c)).min_by(|a, b| a.0.total_cmp(&b.0)).map(|(_, c)| c)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::spec::EPS_8BIT;

    #[test]
    fn options_parse_and_refuse_malformed_input() {
        assert_eq!("minmax".parse::<ActRange>().unwrap(), ActRange::MinMax);
        assert_eq!("percentile:99.99".parse::<ActRange>().unwrap(), ActRange::Percentile(99.99));
        let both: ActRanges = "mse".parse().unwrap();
        assert_eq!(both, ActRanges { activations: ActRange::Mse, kv_cache: ActRange::Mse });
        let split: ActRanges = "kv=percentile:99.9".parse().unwrap();
        assert_eq!(split, ActRanges { activations: ActRange::MinMax, kv_cache: ActRange::Percentile(99.9) });
        assert_eq!(split.to_string(), "act=minmax,kv=percentile:99.9");
        for (bad, says) in [
            ("max", "unknown activation range method `max`"),
            ("percentile:", "percentile must be a number"),
            ("percentile:40", "above 50"),
            ("percentile:101", "at most 100"),
            ("act=mse,weights=mse", "unknown point kind"),
            ("act=mse,kv", "expected KIND=METHOD"),
            ("kv=percentile:abc", "`kv` in `kv=percentile:abc`"),
        ] {
            let e = bad.parse::<ActRanges>().unwrap_err().to_string();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn percentile_range_clips_the_tails() {
        let mut o = RangeObserver::new(ObserverScheme::activation_u16(), ActRange::Percentile(99.0));
        let xs: Vec<f32> = (0..=1000).map(|i| i as f32 / 10.0 - 50.0).collect(); // -50..=50
        o.observe(&xs, (-50.0, 50.0));
        let (lo, hi) = o.range().unwrap();
        // numpy.percentile(np.arange(1001) / 10 - 50, [1, 99]) = [-49.0, 49.0]
        assert!((lo + 49.0).abs() < 0.06 && (hi - 49.0).abs() < 0.06, "{lo} {hi}");
        assert_eq!(o.min_max_range(), Some((-50.0, 50.0)));
    }

    #[test]
    fn mse_clips_a_lone_outlier_for_u8_but_not_a_massive_cluster() {
        // 200,000 values in [-1, 1] and one at 10. Clipping to c costs (10 - c)^2, the rounding
        // noise is 200,000 * (2c/255)^2 / 12: least at c = 10 / (1 + 800,000 / (12 * 255^2)) = 4.94.
        let mut xs: Vec<f32> = (0..200_000).map(|i| ((i * 7919) % 2001) as f32 / 1000.0 - 1.0).collect();
        xs.push(10.0);
        let mut kv = RangeObserver::new(ObserverScheme::KvSymmetricU8 { eps: EPS_8BIT }, ActRange::Mse);
        kv.observe(&xs, (-1.0, 10.0));
        let (_, c) = kv.range().unwrap();
        assert!((c - 4.94).abs() < 0.1, "the outlier should be clipped to ~4.94, got {c}");
        // The chosen range beats min/max on the error it minimizes, by brute force on the values.
        let err = |c: f32| -> f64 {
            let s = c / 127.5;
            xs.iter().map(|&x| f64::from(x - ((x / s).round().clamp(-128.0, 127.0) * s)).powi(2)).sum()
        };
        assert!(err(c) < err(10.0), "{} vs {}", err(c), err(10.0));
        // u16 with a cluster of 50 values at 40 (a massive activation): keep it whole.
        xs.extend(std::iter::repeat_n(40.0, 50));
        let mut act = RangeObserver::new(ObserverScheme::activation_u16(), ActRange::Mse);
        act.observe(&xs, (-1.0, 40.0));
        let (_, hi) = act.range().unwrap();
        assert!(hi > 39.0, "a cluster of 50 massive values must not be clipped, got {hi}");
    }

    #[test]
    fn unobserved_and_non_finite_are_errors_for_every_method() {
        for m in [ActRange::MinMax, ActRange::Mse, ActRange::Percentile(99.9)] {
            let o = RangeObserver::new(ObserverScheme::activation_u16(), m);
            assert_eq!(o.qparams(), Err(QuantError::Unobserved));
            let mut o = RangeObserver::new(ObserverScheme::activation_u16(), m);
            o.observe(&[1.0, f32::NAN], (f32::NAN, f32::NAN));
            assert!(matches!(o.qparams(), Err(QuantError::NonFiniteObservation { .. })), "{m}");
        }
    }
}

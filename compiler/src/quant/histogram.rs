//! A bounded histogram of everything a QDQ point sees, for range choices that need more than the
//! minimum and maximum (percentiles, clipping-error search; see [`act_range`](super::act_range)).
//!
//! ```
//! # use compiler::quant::histogram::RangeHistogram;
//! # fn main() -> Result<(), compiler::quant::QuantError> {
//! let (batch_1, batch_2) = ([0.5f32, -1.0, 2.0], [8.0f32, -4.0]);
//! let mut h = RangeHistogram::new();
//! h.observe(&batch_1);
//! h.observe(&batch_2); // wider data re-bins, memory stays HISTOGRAM_BINS bins
//! let p = h.percentile(99.99)?; // numpy's linear percentile, within one bin width
//! let e = h.clip_table().clip_error(-2.0, 2.0); // sum of (x - clamp(x, lo, hi))^2 over the data
//! assert!(p <= 8.0 && e > 0.0);
//! # Ok(())
//! # }
//! ```
//!
//! Memory is fixed: [`HISTOGRAM_BINS`] equal bins, each with the count, sum and sum of squares of
//! its values (so the clipping error of bins entirely outside a range is exact). The bins cover
//! the running range; when a batch falls outside it, the bin width doubles (adjacent bins merge)
//! and the covered interval grows to the left, the right or both, until the batch fits. The exact
//! minimum and maximum are kept beside the bins.

use super::QuantError;

/// Bins of every histogram (a multiple of 4, so a doubling can stay centred).
pub const HISTOGRAM_BINS: usize = 2048;

/// The bounded histogram (module docs).
#[derive(Clone, Debug, PartialEq)]
pub struct RangeHistogram {
    /// Left edge of bin 0; bins cover `[lo, lo + HISTOGRAM_BINS * width)`.
    lo: f64,
    width: f64,
    count: Vec<u64>,
    sum: Vec<f64>,
    sum_sq: Vec<f64>,
    /// Exact extremes, `None` before the first value.
    extremes: Option<(f32, f32)>,
    /// A NaN or an infinity was seen.
    non_finite: Option<f32>,
}

impl Default for RangeHistogram {
    fn default() -> Self {
        Self::new()
    }
}

impl RangeHistogram {
    pub fn new() -> Self {
        RangeHistogram {
            lo: 0.0,
            width: 0.0,
            count: vec![0; HISTOGRAM_BINS],
            sum: vec![0.0; HISTOGRAM_BINS],
            sum_sq: vec![0.0; HISTOGRAM_BINS],
            extremes: None,
            non_finite: None,
        }
    }

    /// Adds every value of `xs`. Non-finite values are not binned; they make
    /// [`check_finite`](Self::check_finite) fail.
    pub fn observe(&mut self, xs: &[f32]) {
        let Some((min, max)) = finite_extremes(xs, &mut self.non_finite) else { return };
        self.cover(min, max);
        let (lo, inv) = (self.lo, 1.0 / self.width);
        let last = HISTOGRAM_BINS - 1;
        for &x in xs.iter().filter(|x| x.is_finite()) {
            let v = f64::from(x);
            let i = (((v - lo) * inv) as usize).min(last);
            self.count[i] += 1;
            self.sum[i] += v;
            self.sum_sq[i] += v * v;
        }
    }

    /// Grows the bins until `[min, max]` fits.
    fn cover(&mut self, min: f32, max: f32) {
        let (min, max) = (f64::from(min), f64::from(max));
        self.extremes = Some(match self.extremes {
            None => {
                // A degenerate first batch still gets a non-zero width relative to its magnitude.
                let span = (max - min).max(max.abs().max(min.abs()) * 1e-6).max(1e-30);
                self.lo = min;
                self.width = span * (1.0 + 1e-9) / HISTOGRAM_BINS as f64;
                (min as f32, max as f32)
            }
            Some((a, b)) => (a.min(min as f32), b.max(max as f32)),
        });
        loop {
            let hi = self.lo + self.width * HISTOGRAM_BINS as f64;
            let (left, right) = (min < self.lo, max >= hi);
            if !left && !right {
                return;
            }
            // Shift by an even number of old bins so pairs merge exactly.
            let shift = match (left, right) {
                (true, true) => HISTOGRAM_BINS / 2,
                (true, false) => HISTOGRAM_BINS,
                _ => 0,
            };
            self.double(shift);
        }
    }

    /// Doubles the bin width; the new bin 0 starts `shift` old bins left of the old one.
    fn double(&mut self, shift: usize) {
        let mut count = vec![0u64; HISTOGRAM_BINS];
        let mut sum = vec![0f64; HISTOGRAM_BINS];
        let mut sum_sq = vec![0f64; HISTOGRAM_BINS];
        for m in 0..HISTOGRAM_BINS {
            let k = (m + shift) / 2;
            count[k] += self.count[m];
            sum[k] += self.sum[m];
            sum_sq[k] += self.sum_sq[m];
        }
        self.lo -= shift as f64 * self.width;
        self.width *= 2.0;
        (self.count, self.sum, self.sum_sq) = (count, sum, sum_sq);
    }

    /// Values binned so far.
    pub fn total(&self) -> u64 {
        self.count.iter().sum()
    }

    /// Exact minimum and maximum of the finite values, if any.
    pub fn extremes(&self) -> Option<(f32, f32)> {
        self.extremes
    }

    /// Width of one bin now: the resolution of [`percentile`](Self::percentile).
    pub fn bin_width(&self) -> f64 {
        self.width
    }

    /// Fails when a non-finite value was observed (its range would be meaningless).
    pub fn check_finite(&self) -> Result<(), QuantError> {
        match self.non_finite {
            Some(v) => Err(QuantError::NonFiniteObservation { min: v, max: v }),
            None => Ok(()),
        }
    }

    /// numpy's `percentile(x, q)` (linear interpolation between order statistics), located in its
    /// bin by rank and interpolated as if the bin's values were evenly spread: within one
    /// [`bin_width`](Self::bin_width) of the exact value, and inside the exact extremes.
    pub fn percentile(&self, q: f64) -> Result<f32, QuantError> {
        self.check_finite()?;
        let (min, max) = self.extremes.ok_or(QuantError::Unobserved)?;
        let n = self.total();
        let rank = (q.clamp(0.0, 100.0) / 100.0) * (n - 1) as f64;
        let mut before = 0u64;
        for (i, &c) in self.count.iter().enumerate() {
            if c > 0 && (before + c) as f64 > rank {
                let within = (rank - before as f64 + 0.5) / c as f64;
                let v = self.lo + self.width * (i as f64 + within.clamp(0.0, 1.0));
                return Ok((v as f32).clamp(min, max));
            }
            before += c;
        }
        Ok(max)
    }

    /// Cumulative sums for clipping-error queries in constant time.
    pub fn clip_table(&self) -> ClipTable<'_> {
        let mut cum = Vec::with_capacity(HISTOGRAM_BINS + 1);
        let mut acc = (0f64, 0f64, 0f64);
        cum.push(acc);
        for i in 0..HISTOGRAM_BINS {
            acc = (acc.0 + self.count[i] as f64, acc.1 + self.sum[i], acc.2 + self.sum_sq[i]);
            cum.push(acc);
        }
        ClipTable { h: self, cum }
    }

    /// Left edge of bin `i`.
    fn edge(&self, i: usize) -> f64 {
        self.lo + self.width * i as f64
    }
}

/// [`RangeHistogram::clip_table`]: prefix sums of count, sum and sum of squares over the bins.
pub struct ClipTable<'a> {
    h: &'a RangeHistogram,
    /// `cum[i]`: totals of bins `0..i`.
    cum: Vec<(f64, f64, f64)>,
}

impl ClipTable<'_> {
    /// The bin containing `t`, clamped to the bins (`HISTOGRAM_BINS` when `t` is past the end).
    fn bin_of(&self, t: f64) -> usize {
        let i = ((t - self.h.lo) / self.h.width).floor();
        if i < 0.0 {
            0
        } else {
            (i as usize).min(HISTOGRAM_BINS)
        }
    }

    /// Totals of bins `a..b`.
    fn span(&self, a: usize, b: usize) -> (f64, f64, f64) {
        let (x, y) = (self.cum[a], self.cum[b]);
        (y.0 - x.0, y.1 - x.1, y.2 - x.2)
    }

    /// The part of bin `i` on one side of `t`: totals scaled by `frac`.
    fn part(&self, i: usize, frac: f64) -> (f64, f64, f64) {
        let h = self.h;
        if i >= HISTOGRAM_BINS {
            return (0.0, 0.0, 0.0);
        }
        (h.count[i] as f64 * frac, h.sum[i] * frac, h.sum_sq[i] * frac)
    }

    /// The fraction of bin `i`'s values below `t`, as if spread evenly over the part of the bin
    /// inside the exact extremes.
    fn fraction_below(&self, i: usize, t: f64) -> f64 {
        let (min, max) = self.h.extremes.map_or((0.0, 0.0), |(a, b)| (f64::from(a), f64::from(b)));
        let a = self.h.edge(i).max(min);
        let b = (self.h.edge(i) + self.h.width).min(max);
        if b <= a {
            return if t > a { 1.0 } else { 0.0 };
        }
        ((t - a) / (b - a)).clamp(0.0, 1.0)
    }

    /// `sum (x - clamp(x, lo, hi))^2` over the observed values: exact for bins entirely outside
    /// `[lo, hi]`; a bin cut by a bound counts the part beyond it in proportion to its width.
    pub fn clip_error(&self, lo: f64, hi: f64) -> f64 {
        let sq = |(n, s, s2): (f64, f64, f64), t: f64| (s2 - 2.0 * t * s + t * t * n).max(0.0);
        let (i, j) = (self.bin_of(lo), self.bin_of(hi));
        sq(self.span(0, i), lo)
            + sq(self.part(i, self.fraction_below(i, lo)), lo)
            + sq(self.span((j + 1).min(HISTOGRAM_BINS), HISTOGRAM_BINS), hi)
            + sq(self.part(j, 1.0 - self.fraction_below(j, hi)), hi)
    }

    /// Values inside `[lo, hi]`, counting a cut bin in proportion to its width inside.
    pub fn count_within(&self, lo: f64, hi: f64) -> f64 {
        if hi <= lo {
            return 0.0;
        }
        let total = self.cum[HISTOGRAM_BINS].0;
        let (i, j) = (self.bin_of(lo), self.bin_of(hi));
        let below = self.span(0, i).0 + self.part(i, self.fraction_below(i, lo)).0;
        let above =
            self.span((j + 1).min(HISTOGRAM_BINS), HISTOGRAM_BINS).0 + self.part(j, 1.0 - self.fraction_below(j, hi)).0;
        (total - below - above).max(0.0)
    }
}

/// Min and max of the finite values of `xs`; the first non-finite value is recorded.
fn finite_extremes(xs: &[f32], non_finite: &mut Option<f32>) -> Option<(f32, f32)> {
    let mut ext: Option<(f32, f32)> = None;
    for &x in xs {
        if !x.is_finite() {
            non_finite.get_or_insert(x);
            continue;
        }
        ext = Some(match ext {
            None => (x, x),
            Some((a, b)) => (a.min(x), b.max(x)),
        });
    }
    ext
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fixed heavy-tailed sample (LCG, cubed uniforms).
    fn sample(n: usize, seed: u32) -> Vec<f32> {
        crate::quant::test_data::cubed(n, seed, 64.0)
    }

    /// numpy.percentile's default (linear) method, exact.
    fn exact_percentile(xs: &[f32], q: f64) -> f64 {
        let mut v: Vec<f64> = xs.iter().map(|&x| f64::from(x)).collect();
        v.sort_by(f64::total_cmp);
        let rank = q / 100.0 * (v.len() - 1) as f64;
        let (i, f) = (rank.floor() as usize, rank - rank.floor());
        v[i] + (v[(i + 1).min(v.len() - 1)] - v[i]) * f
    }

    #[test]
    fn rebinning_keeps_counts_sums_and_extremes() {
        let xs = sample(10_000, 3);
        let mut h = RangeHistogram::new();
        // Small first batch, then wider batches on both sides.
        h.observe(&[0.01, 0.02]);
        for chunk in xs.chunks(777) {
            h.observe(chunk);
        }
        assert_eq!(h.total(), 10_002);
        let min = xs.iter().copied().fold(0.01f32, f32::min);
        let max = xs.iter().copied().fold(0.02f32, f32::max);
        assert_eq!(h.extremes(), Some((min, max)));
        let sum: f64 = xs.iter().map(|&x| f64::from(x)).sum::<f64>() + 0.03f32 as f64;
        assert!((h.sum.iter().sum::<f64>() - sum).abs() < 1e-6 * sum.abs().max(1.0));
        assert!(h.bin_width() * HISTOGRAM_BINS as f64 >= f64::from(max - min));
        assert!(h.bin_width() * HISTOGRAM_BINS as f64 <= 4.0 * f64::from(max - min));
    }

    /// `numpy.percentile(x.astype(np.float64), q)` of `sample(50_000, 17)` (numpy 2.4.6; the
    /// sample rebuilt in numpy float32 arithmetic, first values -1.0907377, 2.1076071, -0.00422816).
    const NUMPY_PERCENTILES: [(f64, f64); 8] = [
        (0.01, -7.995017164373398),
        (1.0, -7.530427026748657),
        (25.0, -0.9889507591724396),
        (50.0, 1.3734814956478658e-06),
        (99.0, 7.553798370361331),
        (99.9, 7.953448972225195),
        (99.99, 7.995243103122711),
        (100.0, 7.999599456787109),
    ];

    #[test]
    fn percentiles_match_numpy_within_a_bin() {
        let xs = sample(50_000, 17);
        for (x, numpy) in xs.iter().zip([-1.090_737_7f32, 2.107_607_1, -0.004_228_16]) {
            assert!((x - numpy).abs() < 1e-7, "the sample is not numpy's: {x} vs {numpy}");
        }
        let mut h = RangeHistogram::new();
        for chunk in xs.chunks(4096) {
            h.observe(chunk);
        }
        for (q, numpy) in NUMPY_PERCENTILES {
            let got = f64::from(h.percentile(q).unwrap());
            assert!((got - numpy).abs() <= h.bin_width(), "q {q}: {got} vs numpy {numpy} (bin {})", h.bin_width());
            assert!((exact_percentile(&xs, q) - numpy).abs() < 1e-9, "the sorted-sample percentile is numpy's");
        }
    }

    #[test]
    fn clip_error_is_exact_at_bin_edges_and_zero_inside() {
        let xs = sample(20_000, 5);
        let mut h = RangeHistogram::new();
        h.observe(&xs);
        let (min, max) = h.extremes().unwrap();
        let t = h.clip_table();
        assert!(t.clip_error(f64::from(min), f64::from(max)) < 1e-9);
        let (lo, hi) = (h.lo + h.width * 300.0, h.lo + h.width * 1700.0);
        let exact: f64 = xs
            .iter()
            .map(|&x| {
                let v = f64::from(x);
                (v - v.clamp(lo, hi)).powi(2)
            })
            .sum();
        let got = t.clip_error(lo, hi);
        assert!((got - exact).abs() <= 1e-6 * exact, "{got} vs {exact}");
        let inside = xs.iter().filter(|&&x| f64::from(x) >= lo && f64::from(x) < hi).count() as f64;
        assert!((t.count_within(lo, hi) - inside).abs() < 1e-6);
    }

    #[test]
    fn empty_and_non_finite_data_are_errors() {
        let mut h = RangeHistogram::new();
        h.observe(&[]);
        assert_eq!(h.percentile(50.0), Err(QuantError::Unobserved));
        h.observe(&[1.0, f32::NAN, 2.0]);
        assert_eq!(h.total(), 2);
        assert!(matches!(h.percentile(50.0), Err(QuantError::NonFiniteObservation { .. })));
        let mut h = RangeHistogram::new();
        h.observe(&[3.0; 5]);
        assert_eq!(h.percentile(50.0).unwrap(), 3.0);
    }
}

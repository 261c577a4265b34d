//! Choosing the next token from a row of logits: greedy argmax, or seeded temperature / top-k /
//! top-p sampling.
//!
//! Greedy follows `torch.argmax` (ties go to the lowest index). Sampling applies the Hugging Face
//! warpers in their order: temperature, then top-k, then top-p (the smallest set of most likely
//! tokens whose cumulative probability reaches `top_p`, never fewer than one), then draws from the
//! renormalized distribution. Candidates are ordered by (logit descending, index ascending), so a
//! tie at the top-k boundary keeps the lowest indices (HF keeps every tied token there) and
//! `top_k = 1` is exactly greedy. The RNG is ChaCha20 seeded from a `u64`: the same seed and the
//! same logits give the same tokens on every platform.

use rand_chacha::rand_core::{RngCore, SeedableRng};
use rand_chacha::ChaCha20Rng;

use super::error::RuntimeError;

/// How to pick tokens.
#[derive(Debug, Clone, PartialEq)]
pub enum Sampling {
    /// Argmax; ties go to the lowest index.
    Greedy,
    /// Random sampling after temperature / top-k / top-p.
    Random(RandomSampling),
}

/// Parameters of [`Sampling::Random`].
#[derive(Debug, Clone, PartialEq)]
pub struct RandomSampling {
    /// Logits are divided by this (> 0, finite).
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens; 0 disables (as in Hugging Face).
    pub top_k: usize,
    /// Keep the smallest set whose probability reaches `top_p`, in `(0, 1]`; 1 disables.
    pub top_p: f32,
    /// RNG seed.
    pub seed: u64,
}

impl Default for RandomSampling {
    fn default() -> Self {
        Self { temperature: 1.0, top_k: 0, top_p: 1.0, seed: 0 }
    }
}

/// Index of the largest logit, the lowest index among ties. Fails on NaN or empty logits.
pub fn argmax(logits: &[f32]) -> Result<usize, RuntimeError> {
    // Two branch-free passes the compiler vectorizes (a vocabulary of 150k logits is read once per
    // decoded token): the largest value and whether there is a NaN, then the first index holding
    // that value. `-0.0 == 0.0`, so ties between zeros also go to the lower index.
    let Some((_, max, any_nan)) = mllm_dsl::simd::widest(
        #[inline(always)]
        || mllm_dsl::simd::min_max::<LANES>(logits),
    ) else {
        return Err(RuntimeError::BadLogits { reason: "the logits row is empty".into() });
    };
    if any_nan {
        let i = logits.iter().position(|v| v.is_nan()).unwrap_or(0);
        return Err(RuntimeError::BadLogits { reason: format!("NaN at vocabulary index {i}") });
    }
    let first = mllm_dsl::simd::widest(
        #[inline(always)]
        || first_equal(logits, max),
    );
    Ok(first.unwrap_or(0))
}

/// Lanes the argmax passes work in (one AVX-512 register of `f32`).
const LANES: usize = 16;

/// The first index of `x` holding `value`.
#[inline(always)]
fn first_equal(x: &[f32], value: f32) -> Option<usize> {
    let chunks = x.chunks_exact(LANES);
    let tail_start = x.len() - chunks.remainder().len();
    for (n, c) in chunks.enumerate() {
        if c.iter().fold(false, |hit, &v| hit | (v == value)) {
            return c.iter().position(|&v| v == value).map(|j| n * LANES + j);
        }
    }
    x[tail_start..].iter().position(|&v| v == value).map(|j| tail_start + j)
}

/// A token picker with its own RNG state; create one per generation for reproducible output.
#[derive(Debug, Clone)]
pub struct Sampler {
    mode: Mode,
    /// Candidate sort keys (see `candidate_key`), reused across calls.
    order: Vec<u64>,
    /// Unnormalized probabilities of the candidates in `order`.
    weights: Vec<f64>,
}

#[derive(Debug, Clone)]
enum Mode {
    Greedy,
    Random { params: RandomSampling, rng: Box<ChaCha20Rng> },
}

impl Sampler {
    /// Validates `sampling` and seeds the RNG.
    pub fn new(sampling: &Sampling) -> Result<Self, RuntimeError> {
        let mode = match sampling {
            Sampling::Greedy => Mode::Greedy,
            Sampling::Random(p) => {
                if !(p.temperature.is_finite() && p.temperature > 0.0) {
                    return Err(RuntimeError::InvalidSampling {
                        field: "temperature",
                        value: p.temperature.to_string(),
                        expected: "a finite value > 0 (use greedy sampling for temperature 0)",
                    });
                }
                if !(p.top_p > 0.0 && p.top_p <= 1.0) {
                    return Err(RuntimeError::InvalidSampling {
                        field: "top_p",
                        value: p.top_p.to_string(),
                        expected: "a value in (0, 1]",
                    });
                }
                Mode::Random { params: p.clone(), rng: Box::new(ChaCha20Rng::seed_from_u64(p.seed)) }
            }
        };
        Ok(Self { mode, order: Vec::new(), weights: Vec::new() })
    }

    /// Picks the next token from one logits row.
    pub fn sample(&mut self, logits: &[f32]) -> Result<u32, RuntimeError> {
        let index = match &mut self.mode {
            Mode::Greedy => argmax(logits)?,
            Mode::Random { params, rng } => {
                let u = unit_f64(rng);
                sample_random(logits, params, u, &mut self.order, &mut self.weights)?
            }
        };
        u32::try_from(index).map_err(|_| RuntimeError::BadLogits {
            reason: format!("vocabulary index {index} does not fit a u32 token id"),
        })
    }
}

/// Uniform in `[0, 1)` with 53 random bits.
fn unit_f64(rng: &mut ChaCha20Rng) -> f64 {
    (rng.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

/// Temperature, top-k, top-p, then the draw `u` in `[0, 1)` picks from the kept candidates.
fn sample_random(
    logits: &[f32],
    p: &RandomSampling,
    u: f64,
    order: &mut Vec<u64>,
    weights: &mut Vec<f64>,
) -> Result<usize, RuntimeError> {
    if u32::try_from(logits.len()).is_err() {
        return Err(RuntimeError::BadLogits {
            reason: format!("{} logits exceed the u32 token id range", logits.len()),
        });
    }
    if let Some(i) = logits.iter().position(|v| v.is_nan() || *v == f32::INFINITY) {
        return Err(RuntimeError::BadLogits { reason: format!("{} at vocabulary index {i}", logits[i]) });
    }
    let vocab = logits.len();
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if vocab == 0 || max == f32::NEG_INFINITY {
        return Err(RuntimeError::BadLogits {
            reason: if vocab == 0 { "the logits row is empty".into() } else { "every logit is -inf".into() },
        });
    }
    // softmax(l / T) up to normalization: exp((l - max) / T), in f64 for the cumulative sums.
    let inv_t = 1.0 / f64::from(p.temperature);
    let weight = |i: usize| ((f64::from(logits[i]) - f64::from(max)) * inv_t).exp();
    let top_k = if p.top_k == 0 { vocab } else { p.top_k.min(vocab) };

    if top_k == vocab && p.top_p >= 1.0 {
        // Nothing is cut: draw in index order, no sorting needed.
        weights.clear();
        weights.extend((0..vocab).map(weight));
        order.clear();
        order.extend(0..vocab as u64);
        return Ok(draw(order, weights, u));
    }

    // The candidates are the most likely tokens, ordered by (logit desc, index asc). Without top-k
    // the nucleus is usually small: sort a growing prefix until it reaches top_p of the total.
    let total_all: f64 = if top_k == vocab { (0..vocab).map(weight).sum() } else { 0.0 };
    let mut k = if top_k < vocab { top_k } else { vocab.min(256) };
    loop {
        select_most_likely(logits, k, order);
        weights.clear();
        weights.extend(order.iter().map(|&key| weight(key_index(key))));
        if p.top_p >= 1.0 {
            break;
        }
        let total = if top_k < vocab { weights.iter().sum() } else { total_all };
        let target = f64::from(p.top_p) * total;
        let mut cum = 0.0;
        if let Some(n) = weights.iter().position(|w| {
            cum += w;
            cum >= target
        }) {
            weights.truncate(n + 1);
            order.truncate(n + 1);
            break;
        }
        if k == top_k {
            break; // rounding kept the sum just short of the target: keep every candidate
        }
        k = (k * 4).min(top_k);
    }
    Ok(draw(order, weights, u))
}

/// Fills `order` with the keys of the `k` largest logits, sorted by (logit desc, index asc).
fn select_most_likely(logits: &[f32], k: usize, order: &mut Vec<u64>) {
    order.clear();
    order.extend(logits.iter().enumerate().map(|(i, &l)| candidate_key(l, i)));
    if k < order.len() {
        order.select_nth_unstable(k - 1);
        order.truncate(k);
    }
    order.sort_unstable();
}

/// A u64 whose ascending order is (logit descending, index ascending): the high half is the
/// logit's bits flipped into descending total order, the low half the index. Sorting plain
/// integers is several times faster than sorting indices through a comparator.
fn candidate_key(logit: f32, index: usize) -> u64 {
    // +0.0 folds -0.0 into 0.0, so they tie like in `argmax`. NaN was rejected earlier.
    let bits = (logit + 0.0).to_bits();
    let ascending = if bits & 0x8000_0000 != 0 { !bits } else { bits | 0x8000_0000 };
    (u64::from(!ascending) << 32) | index as u64
}

/// Token index of a candidate key.
fn key_index(key: u64) -> usize {
    (key & 0xFFFF_FFFF) as usize
}

/// Picks the token of `order[n]` where `u * sum(weights)` falls in the `n`-th cumulative interval.
fn draw(order: &[u64], weights: &[f64], u: f64) -> usize {
    let threshold = u * weights.iter().sum::<f64>();
    let mut cum = 0.0;
    for (n, w) in weights.iter().enumerate() {
        cum += w;
        if threshold < cum {
            return key_index(order[n]);
        }
    }
    // Rounding left `threshold` at the very top: take the last candidate with nonzero weight.
    let last = weights.iter().rposition(|w| *w > 0.0).unwrap_or(0);
    key_index(order[last])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn random(temperature: f32, top_k: usize, top_p: f32, seed: u64) -> Sampling {
        Sampling::Random(RandomSampling { temperature, top_k, top_p, seed })
    }

    /// Deterministic pseudo-random logits (no ties in practice).
    fn logits(seed: u64, n: usize) -> Vec<f32> {
        let mut rng = ChaCha20Rng::seed_from_u64(seed);
        (0..n).map(|_| (unit_f64(&mut rng) * 8.0 - 4.0) as f32).collect()
    }

    fn frequencies(sampling: &Sampling, logits: &[f32], draws: usize) -> Vec<f64> {
        let mut s = Sampler::new(sampling).unwrap();
        let mut counts = vec![0usize; logits.len()];
        for _ in 0..draws {
            counts[s.sample(logits).unwrap() as usize] += 1;
        }
        counts.iter().map(|&c| c as f64 / draws as f64).collect()
    }

    /// Naive softmax of `logits / t`, in f64.
    fn softmax(logits: &[f32], t: f64) -> Vec<f64> {
        let e: Vec<f64> = logits.iter().map(|&l| (f64::from(l) / t).exp()).collect();
        let s: f64 = e.iter().sum();
        e.iter().map(|v| v / s).collect()
    }

    #[test]
    fn argmax_ties_go_to_lowest_index() {
        assert_eq!(argmax(&[1.0, 3.0, 3.0, 2.0]).unwrap(), 1);
        assert_eq!(argmax(&[f32::NEG_INFINITY; 3]).unwrap(), 0);
        assert_eq!(argmax(&[-0.0, 0.0]).unwrap(), 0);
        assert!(argmax(&[1.0, f32::NAN]).is_err());
        assert!(argmax(&[]).is_err());
        // Lengths around the vector width, the winner and a NaN at every place.
        for len in [1, 15, 16, 17, 31, 33, 100] {
            for at in 0..len {
                let mut row: Vec<f32> = (0..len).map(|i| -((i * 7 % 13) as f32)).collect();
                row[at] = 1.0;
                assert_eq!(argmax(&row).unwrap(), at, "len {len}");
                row.push(1.0);
                assert_eq!(argmax(&row).unwrap(), at, "a later tie, len {len}");
                row[at] = f32::NAN;
                let err = argmax(&row).unwrap_err().to_string();
                assert!(err.contains(&format!("NaN at vocabulary index {at}")), "{err}");
            }
        }
    }

    #[test]
    fn same_seed_same_tokens_different_seed_different_tokens() {
        let l = logits(1, 64);
        let draw = |seed| {
            let mut s = Sampler::new(&random(1.5, 0, 1.0, seed)).unwrap();
            (0..100).map(|_| s.sample(&l).unwrap()).collect::<Vec<_>>()
        };
        assert_eq!(draw(7), draw(7));
        assert_ne!(draw(7), draw(8));
    }

    #[test]
    fn top_k_one_and_tiny_top_p_equal_greedy() {
        for seed in 0..50 {
            let l = logits(100 + seed, 257);
            let greedy = argmax(&l).unwrap() as u32;
            let mut k1 = Sampler::new(&random(2.0, 1, 1.0, seed)).unwrap();
            let mut p0 = Sampler::new(&random(2.0, 0, 1e-6, seed)).unwrap();
            for _ in 0..5 {
                assert_eq!(k1.sample(&l).unwrap(), greedy);
                assert_eq!(p0.sample(&l).unwrap(), greedy);
            }
        }
        // top_k = 1 keeps the lowest index among tied maxima, like argmax.
        let tied = [0.5, 2.0, 2.0, 1.0];
        let mut s = Sampler::new(&random(1.0, 1, 1.0, 3)).unwrap();
        assert!((0..20).all(|_| s.sample(&tied).unwrap() == 1));
    }

    #[test]
    fn distribution_matches_softmax() {
        let l = [0.0, 1.0, 2.0];
        for t in [1.0, 0.5] {
            let f = frequencies(&random(t, 0, 1.0, 42), &l, 40_000);
            let expected = softmax(&l, f64::from(t));
            for (got, want) in f.iter().zip(&expected) {
                assert!((got - want).abs() < 0.015, "t={t}: {f:?} vs {expected:?}");
            }
        }
    }

    #[test]
    fn top_k_restricts_support_and_renormalizes() {
        let l = [0.3, 2.0, -1.0, 1.5, 0.0];
        let f = frequencies(&random(1.0, 2, 1.0, 5), &l, 40_000);
        let kept = softmax(&[2.0, 1.5], 1.0);
        assert_eq!((f[0], f[2], f[4]), (0.0, 0.0, 0.0), "{f:?}");
        assert!((f[1] - kept[0]).abs() < 0.015 && (f[3] - kept[1]).abs() < 0.015, "{f:?}");
    }

    #[test]
    fn top_p_keeps_smallest_set_reaching_p() {
        // Probabilities 0.5, 0.3, 0.2 (as logits ln p).
        let l = [0.3f32.ln(), 0.5f32.ln(), 0.2f32.ln()];
        let f = frequencies(&random(1.0, 0, 0.45, 9), &l, 2_000);
        assert_eq!(f, [0.0, 1.0, 0.0]);
        let f = frequencies(&random(1.0, 0, 0.75, 9), &l, 40_000);
        assert_eq!(f[2], 0.0, "{f:?}");
        assert!((f[1] - 0.625).abs() < 0.015 && (f[0] - 0.375).abs() < 0.015, "{f:?}");
        let f = frequencies(&random(1.0, 0, 0.85, 9), &l, 40_000);
        for (got, want) in f.iter().zip([0.3, 0.5, 0.2]) {
            assert!((got - want).abs() < 0.015, "{f:?}");
        }
    }

    #[test]
    fn order_is_temperature_then_top_k_then_top_p() {
        // At t = 0.25 the probabilities of [2, 1.5, 0, ...] become ~[0.88, 0.12, ...]; top_p 0.8
        // then keeps one token. At t = 4 they flatten and top_p 0.8 keeps both top-k survivors.
        let l = [0.0, 2.0, 1.5, -1.0];
        let f = frequencies(&random(0.25, 2, 0.8, 1), &l, 2_000);
        assert_eq!(f, [0.0, 1.0, 0.0, 0.0]);
        let f = frequencies(&random(4.0, 2, 0.8, 1), &l, 40_000);
        let kept = softmax(&[2.0, 1.5], 4.0);
        assert_eq!((f[0], f[3]), (0.0, 0.0));
        assert!((f[1] - kept[0]).abs() < 0.015, "{f:?} vs {kept:?}");
    }

    /// Naive top-p: full sort, cut where the cumulative weight reaches top_p of the total.
    fn naive_top_p(logits: &[f32], t: f64, top_p: f64, u: f64) -> usize {
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let w = |i: usize| ((f64::from(logits[i]) - f64::from(max)) / t).exp();
        let total: f64 = (0..logits.len()).map(w).sum();
        let mut idx: Vec<usize> = (0..logits.len()).collect();
        idx.sort_by(|&a, &b| logits[b].partial_cmp(&logits[a]).unwrap().then(a.cmp(&b)));
        let mut cum = 0.0;
        let mut kept = Vec::new();
        for &i in &idx {
            kept.push(i);
            cum += w(i);
            if cum >= top_p * total {
                break;
            }
        }
        let sum: f64 = kept.iter().map(|&i| w(i)).sum();
        let mut acc = 0.0;
        for &i in &kept {
            acc += w(i);
            if u * sum < acc {
                return i;
            }
        }
        *kept.last().unwrap()
    }

    #[test]
    fn large_vocab_top_p_matches_full_sort() {
        // 1000 near-flat logits: a 0.9 nucleus holds hundreds of tokens, more than the first
        // 256-candidate pass, so the candidate prefix has to grow.
        let l = logits(77, 1000).iter().map(|x| x / 4.0).collect::<Vec<_>>();
        for (t, top_p) in [(1.0, 0.9), (0.7, 0.5), (1.0, 0.02)] {
            let params = RandomSampling { temperature: t, top_k: 0, top_p, seed: 0 };
            let (mut order, mut weights) = (Vec::new(), Vec::new());
            for n in 0..500 {
                let u = (n as f64 + 0.5) / 500.0;
                let got = sample_random(&l, &params, u, &mut order, &mut weights).unwrap();
                let want = naive_top_p(&l, f64::from(t), f64::from(top_p), u);
                assert_eq!(got, want, "t={t} top_p={top_p} u={u}");
            }
            if top_p == 0.9 {
                assert!(order.len() > 256, "nucleus of {} tokens", order.len());
            }
        }
    }

    #[test]
    fn rejects_bad_parameters_and_logits() {
        assert!(Sampler::new(&random(0.0, 0, 1.0, 0)).is_err());
        assert!(Sampler::new(&random(f32::NAN, 0, 1.0, 0)).is_err());
        assert!(Sampler::new(&random(1.0, 0, 0.0, 0)).is_err());
        assert!(Sampler::new(&random(1.0, 0, 1.5, 0)).is_err());
        let mut s = Sampler::new(&random(1.0, 0, 1.0, 0)).unwrap();
        assert!(s.sample(&[0.0, f32::NAN]).is_err());
        assert!(s.sample(&[0.0, f32::INFINITY]).is_err());
        assert!(s.sample(&[f32::NEG_INFINITY; 2]).is_err());
        assert!(s.sample(&[]).is_err());
        // -inf entries are simply never drawn.
        let l = [f32::NEG_INFINITY, 0.0, f32::NEG_INFINITY];
        assert!((0..50).all(|_| s.sample(&l).unwrap() == 1));
    }
}

//! Orthogonal matrices for rotations folded into weights ([`super::rotation`]): a randomized
//! Hadamard matrix `diag(±1) · H / √n` of any order that is a Kronecker product of Sylvester
//! (2) and Paley (I: `p + 1` for a prime `p ≡ 3 mod 4`, II: `2(q + 1)` for a prime `q ≡ 1 mod 4`)
//! Hadamard matrices, else a seeded random orthogonal matrix.
//!
//! ```
//! use backend_cpu::quant::hadamard::{orthogonal, OrthogonalKind};
//! let q = orthogonal(576, 7);
//! assert!(matches!(q.kind, OrthogonalKind::Hadamard { .. }));
//! ```
//!
//! Random signs and the fallback come from a fixed seed, so a rotation is reproducible.

use std::collections::HashMap;

/// A row-major `n × n` orthogonal matrix and how it was made.
#[derive(Clone, Debug, PartialEq)]
pub struct Orthogonal {
    pub n: usize,
    /// Row-major, `n * n`.
    pub data: Vec<f32>,
    pub kind: OrthogonalKind,
}

/// How an [`Orthogonal`] was constructed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OrthogonalKind {
    /// Randomized Hadamard, the Kronecker product of Hadamard matrices of these orders.
    Hadamard { factors: Vec<usize> },
    /// No Hadamard construction known for this order: Gram-Schmidt of a seeded Gaussian matrix.
    RandomOrthogonal,
}

impl OrthogonalKind {
    pub fn describe(&self) -> String {
        match self {
            OrthogonalKind::Hadamard { factors } => {
                let f: Vec<String> = factors.iter().map(usize::to_string).collect();
                format!("randomized Hadamard ({})", f.join(" ⊗ "))
            }
            OrthogonalKind::RandomOrthogonal => "seeded random orthogonal (no Hadamard construction known)".into(),
        }
    }
}

/// A randomized Hadamard matrix of order `n` when one can be built, else a random orthogonal one;
/// both from `seed`.
pub fn orthogonal(n: usize, seed: u64) -> Orthogonal {
    let mut rng = SplitMix64(seed);
    match hadamard(n) {
        Some((h, factors)) => {
            let norm = 1.0 / (n as f64).sqrt();
            let mut data = vec![0.0f32; n * n];
            for i in 0..n {
                let sign = if rng.next() & 1 == 0 { norm } else { -norm };
                for j in 0..n {
                    data[i * n + j] = (f64::from(h[i * n + j]) * sign) as f32;
                }
            }
            Orthogonal { n, data, kind: OrthogonalKind::Hadamard { factors } }
        }
        None => Orthogonal { n, data: random_orthogonal(n, &mut rng), kind: OrthogonalKind::RandomOrthogonal },
    }
}

/// A ±1 Hadamard matrix of order `n` (row-major) and the orders of its Kronecker factors, when
/// `n` factors into orders this module can build.
pub fn hadamard(n: usize) -> Option<(Vec<i8>, Vec<usize>)> {
    let factors = factorize(n, &mut HashMap::new())?;
    let mut h = vec![1i8];
    let mut order = 1;
    for &f in &factors {
        h = kron(&h, order, &base_hadamard(f)?, f);
        order *= f;
    }
    Some((h, factors))
}

/// Orders of base matrices whose product is `n` (largest first), memoized by `n`.
fn factorize(n: usize, memo: &mut HashMap<usize, Option<Vec<usize>>>) -> Option<Vec<usize>> {
    if n == 1 {
        return Some(Vec::new());
    }
    if let Some(known) = memo.get(&n) {
        return known.clone();
    }
    let mut found = None;
    // Largest base first: fewer, larger factors mix more channels per Kronecker level.
    for m in (2..=n).rev().filter(|&m| n.is_multiple_of(m) && base_construction(m).is_some()) {
        if let Some(mut rest) = factorize(n / m, memo) {
            rest.insert(0, m);
            found = Some(rest);
            break;
        }
    }
    memo.insert(n, found.clone());
    found
}

/// The base constructions: Sylvester's order 2 (powers of two come from its Kronecker powers),
/// Paley I and Paley II over a prime field.
#[derive(Clone, Copy, Debug)]
enum Base {
    Two,
    PaleyI(usize),
    PaleyII(usize),
}

fn base_construction(m: usize) -> Option<Base> {
    if m == 2 {
        return Some(Base::Two);
    }
    if m >= 4 && m.is_multiple_of(4) && is_prime(m - 1) && (m - 1) % 4 == 3 {
        return Some(Base::PaleyI(m - 1));
    }
    if m.is_multiple_of(4) && m / 2 >= 6 && is_prime(m / 2 - 1) && (m / 2 - 1) % 4 == 1 {
        return Some(Base::PaleyII(m / 2 - 1));
    }
    None
}

fn base_hadamard(m: usize) -> Option<Vec<i8>> {
    Some(match base_construction(m)? {
        Base::Two => vec![1, 1, 1, -1],
        Base::PaleyI(q) => paley_i(q),
        Base::PaleyII(q) => paley_ii(q),
    })
}

fn is_prime(p: usize) -> bool {
    p >= 2 && (2..).take_while(|d| d * d <= p).all(|d| !p.is_multiple_of(d))
}

/// Quadratic character of `a` modulo the prime `q`: 0, 1 or -1.
fn chi(a: usize, q: usize) -> i8 {
    let a = a % q;
    if a == 0 {
        return 0;
    }
    // Euler's criterion: a^((q-1)/2) is 1 for a square, q - 1 otherwise.
    let (mut result, mut base, mut exp) = (1u64, a as u64, (q as u64 - 1) / 2);
    while exp > 0 {
        if exp & 1 == 1 {
            result = result * base % q as u64;
        }
        base = base * base % q as u64;
        exp >>= 1;
    }
    if result == 1 {
        1
    } else {
        -1
    }
}

/// `[[0, 1ᵀ], [±1, Q]]` with the Jacobsthal matrix `Q[i][j] = χ(j − i)`; `first_column` is the
/// sign of the first column below the corner.
fn conference(q: usize, first_column: i8) -> Vec<i8> {
    let m = q + 1;
    let residues: Vec<i8> = (0..q).map(|a| chi(a, q)).collect();
    let mut c = vec![0i8; m * m];
    for j in 1..m {
        c[j] = 1;
        c[j * m] = first_column;
    }
    for i in 0..q {
        for j in 0..q {
            c[(i + 1) * m + j + 1] = residues[(j + q - i) % q];
        }
    }
    c
}

/// Paley I, order `q + 1` for a prime `q ≡ 3 mod 4`: `I + S` with the skew conference matrix `S`.
fn paley_i(q: usize) -> Vec<i8> {
    let m = q + 1;
    let mut h = conference(q, -1);
    for i in 0..m {
        h[i * m + i] += 1;
    }
    h
}

/// Paley II, order `2(q + 1)` for a prime `q ≡ 1 mod 4`: the symmetric conference matrix with
/// 0 → `[[1, −1], [−1, −1]]` and ±1 → ±`[[1, 1], [1, −1]]`.
fn paley_ii(q: usize) -> Vec<i8> {
    let m = q + 1;
    let c = conference(q, 1);
    let mut h = vec![0i8; 4 * m * m];
    for i in 0..m {
        for j in 0..m {
            let block: [i8; 4] = match c[i * m + j] {
                0 => [1, -1, -1, -1],
                s => [s, s, s, -s],
            };
            for (k, v) in block.into_iter().enumerate() {
                h[(2 * i + k / 2) * 2 * m + 2 * j + k % 2] = v;
            }
        }
    }
    h
}

/// Kronecker product of `a` (`n × n`) and `b` (`m × m`).
fn kron(a: &[i8], n: usize, b: &[i8], m: usize) -> Vec<i8> {
    let size = n * m;
    let mut out = vec![0i8; size * size];
    for i in 0..n {
        for j in 0..n {
            for k in 0..m {
                for l in 0..m {
                    out[(i * m + k) * size + j * m + l] = a[i * n + j] * b[k * m + l];
                }
            }
        }
    }
    out
}

/// Modified Gram-Schmidt on the rows of a Gaussian matrix, in f64.
fn random_orthogonal(n: usize, rng: &mut SplitMix64) -> Vec<f32> {
    let mut rows: Vec<Vec<f64>> = Vec::with_capacity(n);
    while rows.len() < n {
        let mut v: Vec<f64> = (0..n).map(|_| rng.gaussian()).collect();
        for r in &rows {
            let dot: f64 = v.iter().zip(r).map(|(a, b)| a * b).sum();
            v.iter_mut().zip(r).for_each(|(a, b)| *a -= dot * b);
        }
        let norm = v.iter().map(|a| a * a).sum::<f64>().sqrt();
        // A draw (almost) inside the span of the rows so far is redrawn.
        if norm > 1e-6 {
            rows.push(v.into_iter().map(|a| a / norm).collect());
        }
    }
    rows.into_iter().flatten().map(|a| a as f32).collect()
}

/// SplitMix64: a small, fixed, well-mixed generator (signs and the Gaussian fallback only).
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in (0, 1].
    fn uniform(&mut self) -> f64 {
        ((self.next() >> 11) + 1) as f64 / (1u64 << 53) as f64
    }

    /// Standard normal (Box-Muller).
    fn gaussian(&mut self) -> f64 {
        let (u, v) = (self.uniform(), self.uniform());
        (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// max |Q Qᵀ − I|
    fn orthogonality_error(q: &Orthogonal) -> f64 {
        let n = q.n;
        let mut worst = 0.0f64;
        for i in 0..n {
            for j in 0..n {
                let dot: f64 = (0..n).map(|k| f64::from(q.data[i * n + k]) * f64::from(q.data[j * n + k])).sum();
                worst = worst.max((dot - if i == j { 1.0 } else { 0.0 }).abs());
            }
        }
        worst
    }

    fn is_hadamard(h: &[i8], n: usize) -> bool {
        (0..n).all(|i| {
            (0..n).all(|j| {
                let dot: i32 = (0..n).map(|k| i32::from(h[i * n + k]) * i32::from(h[j * n + k])).sum();
                dot == if i == j { n as i32 } else { 0 }
            })
        })
    }

    #[test]
    fn paley_and_sylvester_orders_are_hadamard() {
        // 12 = Paley I (11), 20 = Paley I (19), 28 = Paley II (13), 36 = Paley II (17),
        // 64 = 2^6, 576 = 48 ⊗ 12, 1536 = intermediate size of SmolLM2.
        for n in [2, 4, 8, 12, 20, 24, 28, 36, 64, 72, 576] {
            let (h, factors) = hadamard(n).unwrap_or_else(|| panic!("no Hadamard of order {n}"));
            assert_eq!(factors.iter().product::<usize>(), n);
            assert!(is_hadamard(&h, n), "order {n} ({factors:?}) is not Hadamard");
        }
        assert_eq!(hadamard(1536).map(|h| h.1.iter().product::<usize>()), Some(1536));
    }

    #[test]
    fn orders_without_a_construction_fall_back_to_random_orthogonal() {
        // 6 and 10 have no Hadamard matrix at all (orders > 2 are multiples of 4).
        for n in [3, 6, 10] {
            let q = orthogonal(n, 1);
            assert_eq!(q.kind, OrthogonalKind::RandomOrthogonal);
            assert!(orthogonality_error(&q) < 1e-6, "order {n}");
        }
    }

    #[test]
    fn randomized_hadamard_is_orthogonal_seeded_and_flat() {
        let q = orthogonal(576, 7);
        assert!(orthogonality_error(&q) < 1e-5);
        assert_eq!(q, orthogonal(576, 7), "same seed, same matrix");
        assert_ne!(q.data, orthogonal(576, 8).data, "the seed picks the signs");
        // Every entry is ±1/24: a single outlier channel spreads evenly over all 576.
        assert!(q.data.iter().all(|&v| (v.abs() - 1.0 / 24.0).abs() < 1e-7));
    }
}

//! SplitMix64, the one small seeded generator of the project: where numbers only need to be fixed
//! by a seed and well spread (a rotation's random signs, benchmark weights), not cryptographic.
//!
//! ```
//! let mut rng = backend_cpu::rng::SplitMix64::new(7);
//! let x = rng.uniform_pm1();
//! assert!((-1.0..1.0).contains(&x));
//! ```

/// Steele, Lea and Flood's SplitMix64: a 64-bit counter through a bijective mixer.
#[derive(Clone, Debug)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    pub fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    #[allow(clippy::should_implement_trait)] // not an iterator: it never ends
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [-1, 1), f32.
    pub fn uniform_pm1(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }

    /// Uniform in (0, 1], f64.
    pub fn uniform(&mut self) -> f64 {
        ((self.next() >> 11) + 1) as f64 / (1u64 << 53) as f64
    }

    /// Standard normal (Box-Muller), f64.
    pub fn gaussian(&mut self) -> f64 {
        let (u, v) = (self.uniform(), self.uniform());
        (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
    }
}

//! Shared by the kernel test binaries: a tiny deterministic generator of test inputs.

#![allow(dead_code)]

/// Knuth's MMIX LCG; values uniform in [-scale, scale).
pub struct Lcg(pub u64);

impl Lcg {
    pub fn next_f32(&mut self, scale: f32) -> f32 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let unit = (self.0 >> 40) as f32 / (1u64 << 24) as f32;
        (unit * 2.0 - 1.0) * scale
    }

    /// `len` values in [-scale, scale).
    pub fn vec(&mut self, len: usize, scale: f32) -> Vec<f32> {
        (0..len).map(|_| self.next_f32(scale)).collect()
    }

    /// Values for a tensor of `shape`.
    pub fn shaped(&mut self, shape: &[usize], scale: f32) -> Vec<f32> {
        self.vec(shape.iter().product(), scale)
    }
}

//! Round-half-to-even on `f32`, the rounding of C's `nearbyint` and of `torch.round`.
//!
//! `f32::round_ties_even` becomes a library call on baseline x86-64 (no SSE4.1), which is slow
//! inside per-element loops. Adding and subtracting 1.5 * 2^23 makes the FPU round to an integer
//! in its default round-to-nearest-even mode; that is exact for |x| < 2^22 and vectorizes.

/// 1.5 * 2^23: sums with |x| < 2^22 land in [2^23, 2^24), where the float spacing is exactly 1.
const MAGIC: f32 = 12_582_912.0;
/// Below this magnitude the [`MAGIC`] trick is exact.
const MAGIC_LIMIT: f32 = 4_194_304.0;

/// Rounds to the nearest integer, ties to even (C `nearbyint`, `torch.round`). NaN stays NaN.
/// Small negative inputs may round to `+0.0` instead of `-0.0`; callers convert to integers.
#[inline(always)]
pub(crate) fn round_half_even(x: f32) -> f32 {
    if x.abs() < MAGIC_LIMIT {
        (x + MAGIC) - MAGIC
    } else {
        // Magnitudes of 2^23 and above are integers already; the band in between and NaN
        // go through the exact library routine.
        x.round_ties_even()
    }
}

/// [`round_half_even`] for `|x| <= 2^22`, without the branch (so loops over it vectorize). NaN
/// stays NaN; larger magnitudes give wrong results.
#[inline(always)]
pub(crate) fn round_half_even_within_limit(x: f32) -> f32 {
    (x + MAGIC) - MAGIC
}

#[cfg(test)]
mod tests {
    use super::{round_half_even, round_half_even_within_limit, MAGIC_LIMIT};

    #[test]
    fn matches_library_round_ties_even() {
        let probes = [
            0.0f32,
            -0.0,
            0.5,
            1.5,
            2.5,
            -0.5,
            -1.5,
            -2.5,
            0.49999997,
            1.4999999,
            7.5,
            -7.5,
            3.0,
            65534.5,
            65535.5,
            4_194_303.5,
            4_194_304.5,
            8_388_607.5,
            1e20,
            -1e20,
        ];
        for x in probes {
            assert_eq!(round_half_even(x), x.round_ties_even(), "rounding {x} (bits {:#x})", x.to_bits());
        }
        assert!(round_half_even(f32::NAN).is_nan());
        assert_eq!(round_half_even(f32::INFINITY), f32::INFINITY);
    }

    #[test]
    fn matches_library_on_a_dense_sweep() {
        // Every float in [-8, 8] with a coarse stride of bit patterns, plus half-integers.
        let mut bits = 0u32;
        while bits < 0x4100_0000 {
            for x in [f32::from_bits(bits), -f32::from_bits(bits)] {
                assert_eq!(round_half_even(x), x.round_ties_even(), "x = {x}");
            }
            bits += 997;
        }
        for k in -200_000i32..200_000 {
            let x = k as f32 + 0.5;
            assert_eq!(round_half_even(x), x.round_ties_even(), "x = {x}");
        }
        for x in [MAGIC_LIMIT, -MAGIC_LIMIT, MAGIC_LIMIT - 0.5, -MAGIC_LIMIT + 0.5, 2_097_152.5, -2_097_151.5] {
            assert_eq!(round_half_even_within_limit(x), x.round_ties_even(), "x = {x}");
        }
    }
}

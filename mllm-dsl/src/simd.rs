//! Running a hot loop with the widest SIMD the CPU has ([`widest`]).
//!
//! The default x86-64 target assumes only SSE2, so plain Rust loops vectorize four `f32` wide and
//! `f32::round_ties_even` becomes a library call. [`widest`] compiles the closure it is given again
//! with AVX-512 or AVX2 enabled and picks one at run time. Without fast-math the compiler neither
//! fuses multiplies and adds nor reorders sums, so every width gives bitwise the same results; only
//! the speed differs.
//!
//! ```
//! let x: Vec<f32> = (0..1000).map(|i| i as f32 * 0.5).collect();
//! let doubled: Vec<f32> = mllm_dsl::simd::widest(#[inline(always)] || x.iter().map(|v| v * 2.0).collect());
//! assert_eq!(doubled[3], 3.0);
//! ```
//!
//! Only what is inlined into the closure, and the closure into the wrapper, gets the wider
//! instructions: mark the closure `#[inline(always)]` (LLVM otherwise may keep a closure whose
//! body is a loop as a function of its own, compiled for SSE2: it did for the fake quantizer's
//! loop), and call it inside the per-row or per-chunk work, not around a parallel iterator.

/// Runs `f` compiled for the widest vector extension the running CPU supports.
#[inline(always)]
pub fn widest<R>(f: impl FnOnce() -> R) -> R {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU supports AVX-512F (checked just above).
            return unsafe { x86::avx512(f) };
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU supports AVX2 (checked just above).
            return unsafe { x86::avx2(f) };
        }
    }
    f()
}

/// Min, max and whether a NaN was present; `None` for an empty slice. An all-NaN slice gives
/// NaN for both.
///
/// `LANES` independent lanes let the compiler use packed min/max instructions (16 fill an
/// AVX-512 register); call it inside [`widest`] for the wide ones. Only the sign of a zero
/// extreme can depend on `LANES`.
#[inline(always)]
pub fn min_max<const LANES: usize>(xs: &[f32]) -> Option<(f32, f32, bool)> {
    if xs.is_empty() {
        return None;
    }
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

#[cfg(target_arch = "x86_64")]
mod x86 {
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn avx512<R>(f: impl FnOnce() -> R) -> R {
        f()
    }

    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn avx2<R>(f: impl FnOnce() -> R) -> R {
        f()
    }
}

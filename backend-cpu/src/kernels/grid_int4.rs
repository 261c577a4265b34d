//! Activation rows on an integer grid times LPBQ int4 panels, in integers.
//!
//! A QDQ point's output is exactly `x[k] = (u[k] - zp) as f32 * scale` with `u` a 16-bit code.
//! When a linear's input rows are such rows ([`Grid`]), their product with an int4 matrix needs no
//! float widening of the weights:
//!
//! `y[c] = scale * scale2[c] * Σ_b scale1[b, c] * Σ_{k in b} (u[k] - zp) * q[k, c]`
//!
//! The inner sums are exact 32-bit integers. With `v = u - o` for an offset `o` that keeps every
//! `v` within i16 (`o = zp` whenever the row allows it), `Σ (u - zp) q = Σ v q + (o - zp) Σ q`,
//! and `Σ_b scale1 Σ_{k in b} q` is a per-column constant of the matrix
//! ([`super::Int4Panels::code_sums`]). AVX-512 VNNI's `vpdpwssd` multiplies pairs of i16 and adds
//! them to i32 lanes: one instruction does 32 products, where the f32 tile widens every code
//! (`vpermps`) for 16. A `vpermb` puts the code bytes of two consecutive rows of one column side
//! by side in a 32-bit lane, each in the high byte of its 16-bit word, where an arithmetic shift
//! right by 12 sign-extends the high nibble (and, after a shift left by 4, the low one).
//!
//! A tile of several activation rows (a prefill chunk) lays out each group of four panel rows
//! once and feeds it to every row's `vpdpwssd`: 64 products per row and group where the f32 tile
//! issues 128 separate multiply-adds, so the integer tile does the same sums in half the
//! arithmetic instructions (and `vpdpwssd` issues at the rate of `vfmadd`).
//!
//! The rows are coded only if every value round-trips: `(u - zp) as f32 * scale` must give back
//! the very f32 (the formula of `compiler::quant::FakeQuantizer::fake`). Otherwise, or on a CPU
//! without VNNI and VBMI, the caller keeps the f32 tile; the results agree up to f32 rounding
//! order either way. Blocks are at most [`MAX_BLOCK`] rows, so a block's sum stays within i32.

use super::packed::PANEL;
use super::packed_int4::{sign_extend, Int4Panel, INT4_ROW_BYTES};
use super::packed_tile::store_row;

/// The largest block the integer sums allow: `|u - offset| <= 32768` times `|q| <= 8` is at most
/// `2^18`, so a block's sum stays within `2^30` (8192 rows could reach `2^31`, one past i32).
pub(crate) const MAX_BLOCK: usize = 4096;

/// Activation rows per integer tile: 16 of the 32 zmm registers hold their block sums.
const TILE_ROWS: usize = 8;

/// The grid a row's values lie on: `x = (u - zero_point) as f32 * scale`, `u` in `0..=65535`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Grid {
    pub scale: f32,
    pub zero_point: i32,
}

/// Rows coded for the integer products.
pub(crate) struct GridRows {
    /// `u - offset`, row after row, `k` values each.
    v: Vec<i16>,
    k: usize,
    /// `offset - zero_point` (one offset serves every row).
    shift: f32,
    scale: f32,
}

impl GridRows {
    /// Codes the `m` rows of `x` on `grid` for blocks of `block` (a multiple of 4, at most
    /// [`MAX_BLOCK`]) rows; `None` if a value is not on the grid.
    pub(crate) fn new(x: &[f32], m: usize, grid: Grid, block: usize) -> Option<GridRows> {
        let k = x.len() / m.max(1);
        if !(grid.scale.is_finite() && grid.scale > 0.0)
            || m == 0
            || x.len() != m * k
            || block == 0
            || !block.is_multiple_of(4)
            || block > MAX_BLOCK
            || !k.is_multiple_of(block)
        {
            return None;
        }
        let zp = grid.zero_point;
        // v = u - zp, wrapped to i16; lo..=hi the range of u - zp.
        let mut v = vec![0i16; x.len()];
        #[cfg(target_arch = "x86_64")]
        // SAFETY: rows are only coded where the tile runs, on a CPU with AVX-512 (`available`).
        let (lo, hi, on_grid) = unsafe { avx512::code(x, grid.scale, &mut v) };
        #[cfg(not(target_arch = "x86_64"))]
        let (lo, hi, on_grid) = code(x, grid.scale, &mut v);
        let (lo, hi) = (i64::from(lo) + i64::from(zp), i64::from(hi) + i64::from(zp));
        if !on_grid || lo < 0 || hi > 65535 {
            return None;
        }
        // Every u - offset in i16: offset in [hi - 32767, lo + 32768], as close to zp as allowed.
        let offset = i64::from(zp).clamp(hi - 32767, lo + 32768) as i32;
        if offset != zp {
            // (u - zp) - (offset - zp) is exact in wrapping i16 arithmetic: the result fits.
            let d = (offset - zp) as i16;
            v.iter_mut().for_each(|v| *v = v.wrapping_sub(d));
        }
        Some(GridRows { v, k, shift: (offset - zp) as f32, scale: grid.scale })
    }

    /// Rows coded.
    pub(crate) fn rows(&self) -> usize {
        self.v.len() / self.k
    }
}

/// `v[i] = round(x[i] / scale)` wrapped to i16, with the codes' range and whether every value
/// round-trips (`code as f32 * scale` gives back the very f32, the formula of
/// `compiler::quant::FakeQuantizer::fake`).
#[cfg(not(target_arch = "x86_64"))]
fn code(x: &[f32], scale: f32, v: &mut [i16]) -> (i32, i32, bool) {
    let (mut lo, mut hi, mut on_grid) = (i32::MAX, i32::MIN, true);
    for (v, &x) in v.iter_mut().zip(x) {
        // `as` saturates a huge or NaN value, which then fails the round trip or the range.
        let q = (x / scale).round_ties_even() as i32;
        on_grid &= (q as f32 * scale).to_bits() == x.to_bits();
        (lo, hi, *v) = (lo.min(q), hi.max(q), q as i16);
    }
    (lo, hi, on_grid)
}

/// Whether this CPU runs the integer tile.
pub(crate) fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static OK: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *OK.get_or_init(|| {
            std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("avx512bw")
                && std::arch::is_x86_feature_detected!("avx512vbmi")
                && std::arch::is_x86_feature_detected!("avx512vnni")
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// The environment variable that picks how a decode row's tile prefetches the panels ahead
/// ([`DecodePrefetch`]): `nta`, `t0`, `t0+t1` or `t1+t0`; unset, `nta` on AMD and `t1+t0` on others.
pub const DECODE_PREFETCH_ENV: &str = "MLLM_CPU_DECODE_PREFETCH";

/// How a decode row's tile asks for the panels ahead of the one it multiplies.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum DecodePrefetch {
    /// 4 KiB ahead, non-temporally (AMD: the panels then do not push the KV cache and
    /// activations, which the step reads again, out of the caches).
    NonTemporal,
    /// 4 KiB ahead into every cache level. On Intel a decode step's 1-row linears (Qwen3-0.6B,
    /// 2 threads, Xeon VM) took 14.8-16.1 ms with it against 16.9-18.9 ms non-temporally, in the
    /// same rounds (docs/cpu.md).
    T0,
    /// As [`DecodePrefetch::T0`], and [`FAR_PREFETCH_ROWS`] ahead into L2, within the panels
    /// the call multiplies, to keep more of the stream in flight. On a 2-core Xeon VM (Granite
    /// Rapids) a decode row at two threads streams at 80-85 % of their read pass where one
    /// thread alone reaches 92-97 % of its own (`bench_int4`); int4 decode there, alternating
    /// runs: Qwen3-0.6B 1.6-3.2 % faster (higher in 11 of 12 pairs); SmolLM2-135M, whose
    /// 576-wide matrices come in chunks of one to three panels, unchanged.
    T0FarT1,
    /// 4 KiB ahead into L2 only, and [`NEAR_PREFETCH_ROWS`] ahead into every level (likely: the
    /// L2's queue keeps more of the stream in flight than the L1's few fill buffers, and the near
    /// prefetch moves lines that are in L2 by then on into L1). On a 2-core Xeon VM (AMX,
    /// AVX512-FP16; 480 MiB of L3 listed), alternating bench children: Qwen3-0.6B int4 decode
    /// 1.06x [`DecodePrefetch::T0FarT1`] (higher in 5 of 5 rounds), SmolLM2-135M 1.02x (4 of 5);
    /// the decode row of `bench_int4` streamed 25.7-26.2 GB/s with the L2 prefetch alone
    /// against 23.7-24.4 (docs/cpu.md).
    T1NearT0,
}

/// Panel rows ahead of the tile that [`DecodePrefetch::T0FarT1`] asks the L2 for: 12 KiB of
/// codes, running on into the call's next panels where a panel is shorter.
#[cfg(target_arch = "x86_64")]
const FAR_PREFETCH_ROWS: usize = 768;

/// Panel rows ahead of the tile that [`DecodePrefetch::T1NearT0`] asks the L1 for: 1 KiB.
#[cfg(target_arch = "x86_64")]
const NEAR_PREFETCH_ROWS: usize = 64;

/// This process's [`DecodePrefetch`] ([`DECODE_PREFETCH_ENV`], [`crate::knobs`]).
#[cfg(target_arch = "x86_64")]
fn decode_prefetch() -> DecodePrefetch {
    use DecodePrefetch::*;
    static PREFETCH: crate::knobs::Cached = crate::knobs::Cached::new();
    let choices = [("nta", NonTemporal), ("t0", T0), ("t0+t1", T0FarT1), ("t1+t0", T1NearT0)];
    PREFETCH.get(&choices.map(|c| c.1), || {
        super::vendor::hint_from_env(DECODE_PREFETCH_ENV, &choices, NonTemporal, T1NearT0)
    })
}

/// `c[r, 0..cols] = init + rows[r0 + r] @ panel` for `r` in `0..m`, tile by tile.
///
/// # Safety
/// [`available`]; `p` is a panel of the matrix `rows` was coded for (its `k` and block size);
/// `r0 + m <= rows.rows()`; `c` points at `m` rows (stride `ldc`) with `cols <= PANEL` writable
/// f32 each, not aliased during the call. `reads_rows` is how many panel rows from this panel's
/// start the caller multiplies in this run (this panel and the ones after it): a decode row's
/// far prefetch stays inside them (a prefetch never faults, so it only bounds waste).
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn panel_product(
    rows: &GridRows,
    r0: usize,
    m: usize,
    p: Int4Panel<'_>,
    c: *mut f32,
    ldc: usize,
    cols: usize,
    init: &[f32; PANEL],
    reads_rows: usize,
) {
    debug_assert!(r0 + m <= rows.rows());
    let mut r = 0;
    while r < m {
        let mr = TILE_ROWS.min(m - r);
        let c = c.add(r * ldc);
        #[cfg(target_arch = "x86_64")]
        match mr {
            1 => avx512::tile::<1>(rows, r0 + r, p, c, ldc, cols, init, reads_rows),
            2 => avx512::tile::<2>(rows, r0 + r, p, c, ldc, cols, init, reads_rows),
            3 => avx512::tile::<3>(rows, r0 + r, p, c, ldc, cols, init, reads_rows),
            4 => avx512::tile::<4>(rows, r0 + r, p, c, ldc, cols, init, reads_rows),
            5 => avx512::tile::<5>(rows, r0 + r, p, c, ldc, cols, init, reads_rows),
            6 => avx512::tile::<6>(rows, r0 + r, p, c, ldc, cols, init, reads_rows),
            7 => avx512::tile::<7>(rows, r0 + r, p, c, ldc, cols, init, reads_rows),
            _ => avx512::tile::<TILE_ROWS>(rows, r0 + r, p, c, ldc, cols, init, reads_rows),
        }
        #[cfg(not(target_arch = "x86_64"))]
        for i in 0..mr {
            let _ = reads_rows;
            portable(rows, r0 + r + i, p, c.add(i * ldc), cols, init);
        }
        r += mr;
    }
}

/// Row `r`'s sums in plain Rust (the tests' reference for the tile).
#[cfg_attr(target_arch = "x86_64", allow(dead_code))]
pub(crate) fn portable(rows: &GridRows, r: usize, p: Int4Panel<'_>, c: *mut f32, cols: usize, init: &[f32; PANEL]) {
    let (bs, k) = (p.block(), rows.k);
    let v = &rows.v[r * k..(r + 1) * k];
    let mut acc = [0f32; PANEL];
    for b in 0..k / bs {
        let mut sums = [0i32; PANEL];
        for kk in b * bs..(b + 1) * bs {
            let bytes = p.code_row(kk);
            let v = i32::from(v[kk]);
            for j in 0..INT4_ROW_BYTES {
                sums[j] += v * sign_extend(bytes[j]);
                sums[INT4_ROW_BYTES + j] += v * sign_extend(bytes[j] >> 4);
            }
        }
        for (j, a) in acc.iter_mut().enumerate() {
            *a += sums[j] as f32 * f32::from(p.scale1_of(b)[j]);
        }
    }
    let mut out = [0f32; PANEL];
    for j in 0..PANEL {
        let y = acc[j] + rows.shift * p.code_sums()[j] as f32;
        out[j] = y * (rows.scale * p.scale2()[j]) + init[j];
    }
    // SAFETY: the caller's contract.
    unsafe { store_row(&out, c, cols) };
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::{DecodePrefetch, GridRows, Int4Panel, FAR_PREFETCH_ROWS, INT4_ROW_BYTES, NEAR_PREFETCH_ROWS, PANEL};
    use crate::kernels::packed_int4::PREFETCH_ROWS;
    use std::arch::x86_64::*;

    /// Byte indices of a `vpermb` taking panel rows `2t, 2t + 1` of four (16 bytes each) to the
    /// high bytes of words `2j + t`: lane `j` then holds column `j`'s two codes (and `16 + j`'s
    /// in the high nibbles). Even (low) bytes are zeroed by the mask.
    const fn pair_index(pair: usize) -> [u8; 64] {
        let mut idx = [0u8; 64];
        let mut j = 0;
        while j < 16 {
            let mut t = 0;
            while t < 2 {
                idx[2 * (2 * j + t) + 1] = (32 * pair + 16 * t + j) as u8;
                t += 1;
            }
            j += 1;
        }
        idx
    }
    const PAIR0: [u8; 64] = pair_index(0);
    const PAIR1: [u8; 64] = pair_index(1);

    /// [`super::code`] for AVX-512: `vcvtps2dq` rounds to nearest even (the default rounding
    /// mode) and gives `i32::MIN` for NaN and out-of-range values, which fail the range check.
    ///
    /// # Safety
    /// AVX-512 F and BW; `v` is as long as `x`.
    #[target_feature(enable = "avx512f,avx512bw")]
    pub(super) unsafe fn code(x: &[f32], scale: f32, v: &mut [i16]) -> (i32, i32, bool) {
        debug_assert_eq!(x.len(), v.len());
        let s = _mm512_set1_ps(scale);
        let (mut lo, mut hi) = (_mm512_set1_epi32(i32::MAX), _mm512_set1_epi32(i32::MIN));
        let mut off: u16 = 0;
        let n = x.len();
        let mut i = 0;
        while i < n {
            let mask: u16 = if n - i >= 16 { u16::MAX } else { (1u16 << (n - i)) - 1 };
            let xs = _mm512_maskz_loadu_ps(mask, x.as_ptr().add(i));
            let q = _mm512_cvtps_epi32(_mm512_div_ps(xs, s));
            let back = _mm512_mul_ps(_mm512_cvtepi32_ps(q), s);
            off |= _mm512_mask_cmpneq_epi32_mask(mask, _mm512_castps_si512(back), _mm512_castps_si512(xs));
            lo = _mm512_mask_min_epi32(lo, mask, lo, q);
            hi = _mm512_mask_max_epi32(hi, mask, hi, q);
            _mm256_mask_storeu_epi16(v.as_mut_ptr().add(i), mask, _mm512_cvtepi32_epi16(q));
            i += 16;
        }
        (_mm512_reduce_min_epi32(lo), _mm512_reduce_max_epi32(hi), off == 0)
    }

    /// `$acc += Σ pairs of $w * x` (`vpdpwssd`), `x` the two i16 at `$p` broadcast to every lane
    /// by the instruction's own memory operand (`{1to16}`), as the one instruction. LLVM's generic
    /// x86 tuning rewrites the intrinsic into `vpmaddwd` + `vpaddd`, two instructions where the
    /// point of the tile is one (with the rewrite, prefill rows ran no faster than the f32 tile);
    /// and a separate `vbroadcastss` per row and pair cost the 32-row tile 12 % on Zen 4
    /// (`bench_int4 --threads 2 --matrices 100 --repeats 3`, four alternating runs: 155-170
    /// against 170-192 G multiply-adds/s). A macro, so it is compiled with the tile's features.
    ///
    /// # Safety
    /// `$p` points to 4 readable bytes.
    macro_rules! dpwssd {
        ($acc:expr, $w:expr, $p:expr) => {
            std::arch::asm!(
                "vpdpwssd {acc}, {w}, dword ptr [{p}]{{1to16}}",
                acc = inout(zmm_reg) $acc,
                w = in(zmm_reg) $w,
                p = in(reg) $p,
                options(pure, readonly, nostack, preserves_flags),
            )
        };
    }

    /// `MR` rows from `r0` times the panel.
    ///
    /// # Safety
    /// See [`super::panel_product`] (with `r0 + MR <= rows.rows()`).
    #[target_feature(enable = "avx512f,avx512bw,avx512vbmi,avx512vnni")]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn tile<const MR: usize>(
        rows: &GridRows,
        r0: usize,
        p: Int4Panel<'_>,
        c: *mut f32,
        ldc: usize,
        cols: usize,
        init: &[f32; PANEL],
        reads_rows: usize,
    ) {
        let (idx0, idx1) = (_mm512_loadu_si512(PAIR0.as_ptr().cast()), _mm512_loadu_si512(PAIR1.as_ptr().cast()));
        let high_bytes = 0xAAAA_AAAA_AAAA_AAAAu64;
        let (codes, k, bs) = (p.codes().as_ptr(), rows.k, p.block());
        let v = rows.v.as_ptr().add(r0 * k);
        // The block scales are a second stream, fetched as far ahead as the codes.
        let s1_ahead = PREFETCH_ROWS / bs * PANEL;
        // Taller tiles (prefill chunks) reuse each panel row and run at arithmetic's pace.
        let prefetch = if MR == 1 { super::decode_prefetch() } else { DecodePrefetch::T0 };
        // The far prefetch stays inside the panels this call multiplies: past them lie panels
        // the other thread takes, or that this one, taking a product's items from the back
        // (`read_ahead`), has already read.
        let far_end = reads_rows.saturating_sub(FAR_PREFETCH_ROWS);
        let mut acc = [[_mm512_setzero_ps(); 2]; MR];
        for b in 0..k / bs {
            let mut s = [[_mm512_setzero_si512(); 2]; MR];
            for kk in (b * bs..(b + 1) * bs).step_by(4) {
                let ahead = codes.wrapping_add((kk + PREFETCH_ROWS) * INT4_ROW_BYTES) as *const i8;
                match prefetch {
                    DecodePrefetch::NonTemporal => _mm_prefetch::<_MM_HINT_NTA>(ahead),
                    DecodePrefetch::T0 => _mm_prefetch::<_MM_HINT_T0>(ahead),
                    DecodePrefetch::T1NearT0 => {
                        _mm_prefetch::<_MM_HINT_T1>(ahead);
                        let near = codes.wrapping_add((kk + NEAR_PREFETCH_ROWS) * INT4_ROW_BYTES);
                        _mm_prefetch::<_MM_HINT_T0>(near as *const i8);
                    }
                    DecodePrefetch::T0FarT1 => {
                        _mm_prefetch::<_MM_HINT_T0>(ahead);
                        if kk < far_end {
                            let far = codes.wrapping_add((kk + FAR_PREFETCH_ROWS) * INT4_ROW_BYTES);
                            _mm_prefetch::<_MM_HINT_T1>(far as *const i8);
                        }
                    }
                }
                let raw = _mm512_loadu_si512(codes.add(kk * INT4_ROW_BYTES).cast());
                for (pair, idx) in [(0, idx0), (2, idx1)] {
                    let w = _mm512_maskz_permutexvar_epi8(high_bytes, idx, raw);
                    let w_lo = _mm512_srai_epi16::<12>(_mm512_slli_epi16::<4>(w));
                    let w_hi = _mm512_srai_epi16::<12>(w);
                    for (r, s) in s.iter_mut().enumerate() {
                        let xp = v.add(r * k + kk + pair);
                        dpwssd!(s[0], w_lo, xp);
                        dpwssd!(s[1], w_hi, xp);
                    }
                }
            }
            let s1 = p.scale1_of(b).as_ptr();
            _mm_prefetch::<_MM_HINT_T0>(s1.wrapping_add(s1_ahead) as *const i8);
            let s1_lo = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(s1.cast())));
            let s1_hi = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(s1.add(16).cast())));
            for (acc, s) in acc.iter_mut().zip(&s) {
                acc[0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[0]), s1_lo, acc[0]);
                acc[1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[1]), s1_hi, acc[1]);
            }
        }
        let (t, s2) = (p.code_sums().as_ptr(), p.scale2().as_ptr());
        let (shift, scale) = (_mm512_set1_ps(rows.shift), _mm512_set1_ps(rows.scale));
        // Masked stores of the row's `cols` columns (a copy call per panel and row through a
        // buffer cost a decode step about 60 µs).
        let mask = |h: usize| -> __mmask16 {
            let n = cols.saturating_sub(h).min(16);
            ((1u32 << n) - 1) as __mmask16
        };
        for (r, acc) in acc.iter().enumerate() {
            for (h, acc) in [(0, acc[0]), (16, acc[1])] {
                let y = _mm512_fmadd_ps(shift, _mm512_cvtepi32_ps(_mm512_loadu_si512(t.add(h).cast())), acc);
                let s = _mm512_mul_ps(scale, _mm512_loadu_ps(s2.add(h)));
                let out = _mm512_fmadd_ps(y, s, _mm512_loadu_ps(init.as_ptr().add(h)));
                _mm512_mask_storeu_ps(c.add(r * ldc + h), mask(h), out);
            }
        }
    }
}

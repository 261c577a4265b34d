//! One activation row on an integer grid times LPBQ int4 panels, in integers.
//!
//! A QDQ point's output is exactly `x[k] = (u[k] - zp) as f32 * scale` with `u` a 16-bit code.
//! When a linear's input row is such a row ([`Grid`]), its product with an int4 matrix needs no
//! float widening of the weights:
//!
//! `y[c] = scale * scale2[c] * Σ_b scale1[b, c] * Σ_{k in b} (u[k] - zp) * q[k, c]`
//!
//! The inner sums are exact 32-bit integers. With `v = u - o` for an offset `o` that keeps every
//! `v` within i16 (`o = zp` whenever the row allows it), `Σ (u - zp) q = Σ v q + (o - zp) Σ q`,
//! and `Σ_b scale1 Σ_{k in b} q` is a per-column constant of the matrix
//! ([`super::Int4Panels::code_sums`]). AVX-512 VNNI's `vpdpwssd` multiplies pairs of i16 and adds
//! them to i32 lanes: one instruction does 32 products, where the f32 tile widens every code
//! (`vpermps`) for 16. The nibbles are taken XOR 8 (`q + 8`, non-negative) and `8 Σ_{k in b} v`
//! subtracted per block, which saves sign-extending them; a `vpermb` puts the codes of two
//! consecutive rows of one column side by side in a 32-bit lane.
//!
//! The row is coded only if every value round-trips: `(u - zp) as f32 * scale` must give back
//! the very f32 (the formula of `compiler::quant::FakeQuantizer::fake`). Otherwise, or on a CPU
//! without VNNI and VBMI, the caller keeps the f32 tile; the results agree up to f32 rounding
//! order either way.

use super::packed::PANEL;
use super::packed_int4::{Int4Panel, INT4_ROW_BYTES};
use super::packed_tile::store_row;

/// The grid a row's values lie on: `x = (u - zero_point) as f32 * scale`, `u` in `0..=65535`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Grid {
    pub scale: f32,
    pub zero_point: i32,
}

/// A row coded for the integer products.
pub(crate) struct GridRow {
    /// `u - offset`, padded to a multiple of 4.
    v: Vec<i16>,
    /// `8 * Σ_{k in b} v[k]` per block of the matrix.
    block_sums8: Vec<i32>,
    /// `offset - zero_point`.
    shift: f32,
    scale: f32,
}

impl GridRow {
    /// Codes `x` on `grid` for blocks of `block` rows; `None` if a value is not on the grid.
    pub(crate) fn new(x: &[f32], grid: Grid, block: usize) -> Option<GridRow> {
        if !(grid.scale.is_finite() && grid.scale > 0.0) || block == 0 || !x.len().is_multiple_of(block) {
            return None;
        }
        let (scale, zp) = (grid.scale, grid.zero_point);
        let mut u = vec![0i32; x.len()];
        // Branch-free, so it vectorizes: one pass codes, checks and bounds the row.
        let (lo, hi, off_grid) = mllm_dsl::simd::widest(|| {
            let (mut lo, mut hi, mut off) = (i32::MAX, i32::MIN, 0u32);
            for (u, &x) in u.iter_mut().zip(x) {
                // `as` saturates a huge or NaN value, which then fails the round trip.
                let q = ((x / scale).round_ties_even() as i32).wrapping_add(zp);
                off |= u32::from((q.wrapping_sub(zp) as f32 * scale).to_bits() != x.to_bits());
                (lo, hi, *u) = (lo.min(q), hi.max(q), q);
            }
            (lo, hi, off)
        });
        if off_grid != 0 || lo < 0 || hi > 65535 {
            return None;
        }
        // Every u - offset in i16: offset in [hi - 32767, lo + 32768], as close to zp as allowed.
        let offset = grid.zero_point.clamp(hi - 32767, lo + 32768);
        let mut v: Vec<i16> = u.iter().map(|&q| (q - offset) as i16).collect();
        let block_sums8 = v.chunks(block).map(|b| 8 * b.iter().map(|&v| i32::from(v)).sum::<i32>()).collect();
        v.resize(x.len().next_multiple_of(4), 0);
        Some(GridRow { v, block_sums8, shift: (offset - grid.zero_point) as f32, scale: grid.scale })
    }
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

/// `c[0..cols] = init + row @ panel` for a panel whose blocks are a multiple of 4 rows.
///
/// # Safety
/// [`available`]; `p` is a panel of a matrix with `k` rows, `row` was coded for its block size
/// and `k`; `c` has `cols <= PANEL` writable f32.
pub(crate) unsafe fn panel_product(
    row: &GridRow,
    k: usize,
    p: Int4Panel<'_>,
    c: *mut f32,
    cols: usize,
    init: &[f32; PANEL],
) {
    #[cfg(target_arch = "x86_64")]
    avx512::tile(row, k, p, c, cols, init);
    #[cfg(not(target_arch = "x86_64"))]
    portable(row, k, p, c, cols, init);
}

/// The same sums in plain Rust (the tests' reference for the tile).
#[cfg_attr(target_arch = "x86_64", allow(dead_code))]
pub(crate) fn portable(row: &GridRow, k: usize, p: Int4Panel<'_>, c: *mut f32, cols: usize, init: &[f32; PANEL]) {
    let bs = p.block();
    let mut acc = [0f32; PANEL];
    for b in 0..k / bs {
        let mut sums = [0i32; PANEL];
        for kk in b * bs..(b + 1) * bs {
            let bytes = p.code_row(kk);
            let v = i32::from(row.v[kk]);
            for j in 0..INT4_ROW_BYTES {
                sums[j] += v * i32::from((bytes[j] ^ 0x88) & 15);
                sums[INT4_ROW_BYTES + j] += v * i32::from((bytes[j] ^ 0x88) >> 4);
            }
        }
        for (j, a) in acc.iter_mut().enumerate() {
            *a += (sums[j] - row.block_sums8[b]) as f32 * f32::from(p.scale1_of(b)[j]);
        }
    }
    let mut out = [0f32; PANEL];
    for j in 0..PANEL {
        let y = acc[j] + row.shift * p.code_sums()[j] as f32;
        out[j] = y * (row.scale * p.scale2()[j]) + init[j];
    }
    // SAFETY: the caller's contract.
    unsafe { store_row(&out, c, cols) };
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::{store_row, GridRow, Int4Panel, INT4_ROW_BYTES, PANEL};
    use crate::kernels::packed_int4::PREFETCH_ROWS;
    use std::arch::x86_64::*;

    /// Byte indices of a `vpermb` taking panel rows `2t, 2t + 1` of four (16 bytes each) to
    /// words `2j + t`: lane `j` then holds column `j`'s two codes (and `16 + j`'s in the high
    /// nibbles). Odd bytes are zeroed by the mask.
    const fn pair_index(pair: usize) -> [u8; 64] {
        let mut idx = [0u8; 64];
        let mut j = 0;
        while j < 16 {
            let mut t = 0;
            while t < 2 {
                idx[2 * (2 * j + t)] = (32 * pair + 16 * t + j) as u8;
                t += 1;
            }
            j += 1;
        }
        idx
    }
    const PAIR0: [u8; 64] = pair_index(0);
    const PAIR1: [u8; 64] = pair_index(1);

    /// # Safety
    /// See [`super::panel_product`].
    #[target_feature(enable = "avx512f,avx512bw,avx512vbmi,avx512vnni")]
    pub(super) unsafe fn tile(
        row: &GridRow,
        k: usize,
        p: Int4Panel<'_>,
        c: *mut f32,
        cols: usize,
        init: &[f32; PANEL],
    ) {
        let (idx0, idx1) = (_mm512_loadu_si512(PAIR0.as_ptr().cast()), _mm512_loadu_si512(PAIR1.as_ptr().cast()));
        let even = 0x5555_5555_5555_5555u64;
        let (bias, low) = (_mm512_set1_epi8(0x88u8 as i8), _mm512_set1_epi16(15));
        let (codes, v, bs) = (p.codes().as_ptr(), row.v.as_ptr(), p.block());
        let (mut acc_lo, mut acc_hi) = (_mm512_setzero_ps(), _mm512_setzero_ps());
        for b in 0..k / bs {
            let (mut s_lo, mut s_hi) = (_mm512_setzero_si512(), _mm512_setzero_si512());
            for kk in (b * bs..(b + 1) * bs).step_by(4) {
                let ahead = codes.wrapping_add((kk + PREFETCH_ROWS) * INT4_ROW_BYTES) as *const i8;
                _mm_prefetch::<_MM_HINT_T0>(ahead);
                let raw = _mm512_xor_si512(_mm512_loadu_si512(codes.add(kk * INT4_ROW_BYTES).cast()), bias);
                for (pair, idx) in [(0, idx0), (2, idx1)] {
                    let w = _mm512_maskz_permutexvar_epi8(even, idx, raw);
                    let x = _mm512_set1_epi32((v.add(kk + pair) as *const i32).read_unaligned());
                    s_lo = _mm512_dpwssd_epi32(s_lo, x, _mm512_and_si512(w, low));
                    s_hi = _mm512_dpwssd_epi32(s_hi, x, _mm512_srli_epi16::<4>(w));
                }
            }
            let sums8 = _mm512_set1_epi32(row.block_sums8[b]);
            let s1 = p.scale1_of(b).as_ptr();
            // The block scales are a second stream: fetched as far ahead as the codes.
            _mm_prefetch::<_MM_HINT_T0>(s1.wrapping_add(PREFETCH_ROWS / bs * PANEL) as *const i8);
            let s1_lo = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(s1.cast())));
            let s1_hi = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(s1.add(16).cast())));
            acc_lo = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(s_lo, sums8)), s1_lo, acc_lo);
            acc_hi = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(s_hi, sums8)), s1_hi, acc_hi);
        }
        let (t, s2) = (p.code_sums().as_ptr(), p.scale2().as_ptr());
        let (shift, scale) = (_mm512_set1_ps(row.shift), _mm512_set1_ps(row.scale));
        let mut out = [0f32; PANEL];
        for (h, acc) in [(0, acc_lo), (16, acc_hi)] {
            let y = _mm512_fmadd_ps(shift, _mm512_cvtepi32_ps(_mm512_loadu_si512(t.add(h).cast())), acc);
            let s = _mm512_mul_ps(scale, _mm512_loadu_ps(s2.add(h)));
            _mm512_storeu_ps(out.as_mut_ptr().add(h), _mm512_fmadd_ps(y, s, _mm512_loadu_ps(init.as_ptr().add(h))));
        }
        store_row(&out, c, cols);
    }
}

//! Register tiles of the packed linear kernels: up to [`MAX_ROWS`] rows of `x` times one panel of
//! [`PANEL`] columns, over the whole `K`, accumulated in f32 registers and stored once.
//!
//! Three versions, chosen at run time ([`detect`]): AVX-512 (a tile of 12 rows keeps 24 of the 32
//! zmm registers as accumulators; one 64-byte load gives a bf16 panel row, widened by a shift for
//! the even slots and a mask for the odd ones), AVX2+FMA (2 rows, 16 registers), and portable Rust
//! for any other CPU. All three compute each output as `init + Σ_k x[k] * w[k]` in k order, in f32
//! (fused multiply-adds in the SIMD versions).

use super::packed::{PanelRef, PANEL};

/// The largest tile height of any version.
pub(crate) const MAX_ROWS: usize = 12;

/// How far ahead of its panel row the AVX-512 tile prefetches: 8 KiB (128 bf16 rows, 64 f32 rows).
/// Prefetching at all was 3-8 % faster than the hardware prefetcher alone when the weights come from
/// DRAM, neutral when they are cached. 8 KiB rather than 2 KiB ahead streams a bf16 decode row
/// faster on the Intel VM (`bench_int4 --weights bf16 --matrices 100 --repeats 3`, five
/// alternating runs: 30.8-34.4 against 28.1-31.8 GB/s) and left f32 rows as they were.
#[cfg(target_arch = "x86_64")]
const PREFETCH_BYTES: usize = 8 << 10;

/// An instruction set the packed kernels can run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isa {
    Avx512,
    Avx2,
    Portable,
}

impl Isa {
    /// All versions, fastest first.
    pub const ALL: [Isa; 3] = [Isa::Avx512, Isa::Avx2, Isa::Portable];

    /// Whether this CPU can run the version.
    pub fn available(self) -> bool {
        match self {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => std::arch::is_x86_feature_detected!("avx512f"),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma"),
            Isa::Portable => true,
            #[allow(unreachable_patterns)]
            _ => false,
        }
    }

    /// Tile height of this version.
    pub(crate) fn rows(self) -> usize {
        match self {
            Isa::Avx512 => MAX_ROWS,
            Isa::Avx2 => 2,
            Isa::Portable => 4,
        }
    }
}

/// The fastest version this CPU runs.
pub(crate) fn detect() -> Isa {
    static BEST: std::sync::OnceLock<Isa> = std::sync::OnceLock::new();
    *BEST.get_or_init(|| Isa::ALL.into_iter().find(|i| i.available()).unwrap_or(Isa::Portable))
}

/// `c[r, 0..cols] = init[0..cols] + a[r, :] @ panel` for `r` in `0..rows`, tile by tile.
///
/// `a` is row-major with `k` values per row, read in place: a tile broadcasts one value of each of
/// its rows per step, so it walks its rows side by side, each front to back (a few streams the
/// prefetcher follows; packing them first cost a serial copy per product).
///
/// # Safety
/// `isa` is available; `a` points at `rows` rows of `k` f32; `panel` holds `k * PANEL` elements;
/// `c` points at `rows` rows (stride `ldc`) with `cols <= PANEL` writable f32 each, not aliased by
/// anything else during the call.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn panel_product(
    isa: Isa,
    a: *const f32,
    rows: usize,
    k: usize,
    panel: PanelRef<'_>,
    c: *mut f32,
    ldc: usize,
    cols: usize,
    init: &[f32; PANEL],
) {
    let (b, bf16) = match panel {
        PanelRef::Bf16(v) => (v.as_ptr() as *const u8, true),
        PanelRef::F32(v) => (v.as_ptr() as *const u8, false),
        PanelRef::Int4(p) => return super::packed_int4::panel_product(isa, a, rows, k, p, c, ldc, cols, init),
    };
    let mut r = 0;
    while r < rows {
        let mr = isa.rows().min(rows - r);
        let (a, c) = (a.add(r * k), c.add(r * ldc));
        macro_rules! tile {
            ($m:ident, [$($n:literal),*]) => {
                match (mr, bf16) {
                    $( ($n, true) => $m::tile::<$n, true>(a, k, b, c, ldc, cols, init), )*
                    $( ($n, false) => $m::tile::<$n, false>(a, k, b, c, ldc, cols, init), )*
                    _ => unreachable!("tile height {mr} exceeds {isa:?}'s"),
                }
            };
        }
        match isa {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => tile!(avx512, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => tile!(avx2, [1, 2]),
            _ => tile!(portable, [1, 2, 3, 4]),
        }
        r += mr;
    }
}

/// Stores a finished tile row: straight when the panel is full, else through a buffer.
///
/// # Safety
/// `dst` has `cols <= PANEL` writable elements.
#[inline(always)]
pub(crate) unsafe fn store_row(row: &[f32; PANEL], dst: *mut f32, cols: usize) {
    std::ptr::copy_nonoverlapping(row.as_ptr(), dst, cols);
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::{store_row, PANEL, PREFETCH_BYTES};
    use std::arch::x86_64::*;

    /// # Safety
    /// See [`super::panel_product`]; `b` is the panel (`k * PANEL` bf16 or f32 as `BF16` says).
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn tile<const MR: usize, const BF16: bool>(
        a: *const f32,
        k: usize,
        b: *const u8,
        c: *mut f32,
        ldc: usize,
        cols: usize,
        init: &[f32; PANEL],
    ) {
        let mut lo = [_mm512_loadu_ps(init.as_ptr()); MR];
        let mut hi = [_mm512_loadu_ps(init.as_ptr().add(16)); MR];
        let high_half = _mm512_set1_epi32(0xFFFF_0000u32 as i32);
        let row_bytes = if BF16 { PANEL * 2 } else { PANEL * 4 };
        for kk in 0..k {
            // The panel comes from DRAM on its first tile: ask for it ahead of the hardware
            // prefetcher (a prefetch past the panel's end is harmless).
            let ahead = b.wrapping_add(kk * row_bytes + PREFETCH_BYTES) as *const i8;
            _mm_prefetch::<_MM_HINT_T0>(ahead);
            if !BF16 {
                _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(64));
            }
            let (b0, b1) = if BF16 {
                // Slots 2c / 2c+1 = columns c / 16+c: low / high half of each 32-bit lane.
                let v = _mm512_loadu_si512(b.add(kk * PANEL * 2) as *const _);
                (_mm512_castsi512_ps(_mm512_slli_epi32::<16>(v)), _mm512_castsi512_ps(_mm512_and_si512(v, high_half)))
            } else {
                let p = b.add(kk * PANEL * 4) as *const f32;
                (_mm512_loadu_ps(p), _mm512_loadu_ps(p.add(16)))
            };
            for r in 0..MR {
                let x = _mm512_set1_ps(*a.add(r * k + kk));
                lo[r] = _mm512_fmadd_ps(x, b0, lo[r]);
                hi[r] = _mm512_fmadd_ps(x, b1, hi[r]);
            }
        }
        for r in 0..MR {
            let dst = c.add(r * ldc);
            if cols == PANEL {
                _mm512_storeu_ps(dst, lo[r]);
                _mm512_storeu_ps(dst.add(16), hi[r]);
            } else {
                let mut row = [0.0f32; PANEL];
                _mm512_storeu_ps(row.as_mut_ptr(), lo[r]);
                _mm512_storeu_ps(row.as_mut_ptr().add(16), hi[r]);
                store_row(&row, dst, cols);
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{store_row, PANEL};
    use std::arch::x86_64::*;

    /// # Safety
    /// See [`super::panel_product`].
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn tile<const MR: usize, const BF16: bool>(
        a: *const f32,
        k: usize,
        b: *const u8,
        c: *mut f32,
        ldc: usize,
        cols: usize,
        init: &[f32; PANEL],
    ) {
        // acc[r][q] holds columns 8q..8q+8.
        let i = init.as_ptr();
        let mut acc =
            [[_mm256_loadu_ps(i), _mm256_loadu_ps(i.add(8)), _mm256_loadu_ps(i.add(16)), _mm256_loadu_ps(i.add(24))];
                MR];
        let high_half = _mm256_set1_epi32(0xFFFF_0000u32 as i32);
        for kk in 0..k {
            let w: [__m256; 4] = if BF16 {
                // Slots 0..16 hold columns 0..8 (low halves) and 16..24 (high halves); slots
                // 16..32 hold columns 8..16 and 24..32.
                let p = b.add(kk * PANEL * 2) as *const __m256i;
                let (v0, v1) = (_mm256_loadu_si256(p), _mm256_loadu_si256(p.add(1)));
                [
                    _mm256_castsi256_ps(_mm256_slli_epi32::<16>(v0)),
                    _mm256_castsi256_ps(_mm256_slli_epi32::<16>(v1)),
                    _mm256_castsi256_ps(_mm256_and_si256(v0, high_half)),
                    _mm256_castsi256_ps(_mm256_and_si256(v1, high_half)),
                ]
            } else {
                let p = b.add(kk * PANEL * 4) as *const f32;
                [_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8)), _mm256_loadu_ps(p.add(16)), _mm256_loadu_ps(p.add(24))]
            };
            for (r, acc) in acc.iter_mut().enumerate() {
                let x = _mm256_set1_ps(*a.add(r * k + kk));
                for q in 0..4 {
                    acc[q] = _mm256_fmadd_ps(x, w[q], acc[q]);
                }
            }
        }
        for (r, acc) in acc.iter().enumerate() {
            let mut row = [0.0f32; PANEL];
            for (q, v) in acc.iter().enumerate() {
                _mm256_storeu_ps(row.as_mut_ptr().add(8 * q), *v);
            }
            store_row(&row, c.add(r * ldc), cols);
        }
    }
}

mod portable {
    use super::{store_row, PANEL};

    /// # Safety
    /// See [`super::panel_product`].
    pub(super) unsafe fn tile<const MR: usize, const BF16: bool>(
        a: *const f32,
        k: usize,
        b: *const u8,
        c: *mut f32,
        ldc: usize,
        cols: usize,
        init: &[f32; PANEL],
    ) {
        let mut acc = [*init; MR];
        let mut w = [0.0f32; PANEL];
        for kk in 0..k {
            if BF16 {
                let p = (b as *const u16).add(kk * PANEL);
                for (col, w) in w.iter_mut().enumerate() {
                    let slot = if col < PANEL / 2 { 2 * col } else { 2 * (col - PANEL / 2) + 1 };
                    *w = f32::from_bits(u32::from(*p.add(slot)) << 16);
                }
            } else {
                std::ptr::copy_nonoverlapping((b as *const f32).add(kk * PANEL), w.as_mut_ptr(), PANEL);
            }
            for (r, acc) in acc.iter_mut().enumerate() {
                let x = *a.add(r * k + kk);
                // Not `mul_add`: without hardware FMA that is a slow library call.
                for (o, &w) in acc.iter_mut().zip(&w) {
                    *o += x * w;
                }
            }
        }
        for (r, acc) in acc.iter().enumerate() {
            store_row(acc, c.add(r * ldc), cols);
        }
    }
}

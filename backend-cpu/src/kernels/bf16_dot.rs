//! bf16 products: the rows of `x` rounded to bf16 and multiplied with a bf16 panel by
//! `vdpbf16ps` (AVX-512 BF16), which sums two bf16 products into each f32 lane, 32 products an
//! instruction against the 16 of an f32 FMA. Each product of two bf16 is exact in f32; the sums
//! are f32. The instruction treats bf16 denormals (below 1.2e-38) as zero.
//!
//! [`super::linear_packed_bf16`] chooses this tile on AMD CPUs (and for AMX's decode rows); on
//! others it rounds `x` the same way and runs the f32 tiles ([`super::Bf16Tile::detect`]).

use super::packed::PANEL;
use std::arch::x86_64::*;

/// Tile height: 24 of the 32 zmm registers hold sums, as in the f32 tile.
const ROWS: usize = 12;

/// Panel rows the tile prefetches ahead (4 KiB of a bf16 panel).
const PREFETCH_ROWS: usize = 64;

/// The columns in the 32-bit lanes of `vpunpcklwd` of two bf16 panel rows: 128-bit lane `l`
/// takes words 0-3 of each row's lane `l`, the slots of columns `4l, 16 + 4l, 4l + 1, 17 + 4l`.
pub(super) const UNPACKED_LO: [usize; 16] = [0, 16, 1, 17, 4, 20, 5, 21, 8, 24, 9, 25, 12, 28, 13, 29];
/// The same of `vpunpckhwd` (words 4-7): columns `4l + 2, 18 + 4l, 4l + 3, 19 + 4l`.
pub(super) const UNPACKED_HI: [usize; 16] = [2, 18, 3, 19, 6, 22, 7, 23, 10, 26, 11, 27, 14, 30, 15, 31];

/// `vpermt2ps` indices taking columns `0..16` (then `16..32`) from sums in the lane orders of
/// [`UNPACKED_LO`] (indices `0..16`) and [`UNPACKED_HI`] (`16..32`).
const TO_COLUMNS_LO: [u32; 16] = to_columns(0);
const TO_COLUMNS_HI: [u32; 16] = to_columns(16);

const fn to_columns(first: usize) -> [u32; 16] {
    let mut out = [0u32; 16];
    let mut i = 0;
    while i < 16 {
        let mut lane = 0;
        while lane < 16 {
            if UNPACKED_LO[lane] == first + i {
                out[i] = lane as u32;
            }
            if UNPACKED_HI[lane] == first + i {
                out[i] = 16 + lane as u32;
            }
            lane += 1;
        }
        i += 1;
    }
    out
}

/// What a tile prefetches as it goes.
#[derive(Clone, Copy)]
enum Ahead {
    /// Its own panel, [`PREFETCH_ROWS`] rows ahead, into L1.
    Panel,
    /// `lines` cache lines a step of the next panel from `at` on, into L2.
    Next {
        at: *const i8,
        lines: usize,
    },
    Nothing,
}

/// Whether this CPU runs [`panel_product`].
pub(crate) fn available() -> bool {
    static AVAILABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512bf16")
    })
}

/// The `m` rows of `x` (`k` values each) rounded to bf16 in pairs: pair `j` of a row holds
/// `x[2j]` in its low half and `x[2j + 1]` (zero past `k`) in its high half, `k.div_ceil(2)`
/// pairs a row, then `pad_rows` rows of zeros (tiles that read whole 16-row blocks).
///
/// # Safety
/// [`available`]; `x` holds `m * k` values.
pub(crate) unsafe fn pairs(x: &[f32], m: usize, k: usize, pad_rows: usize) -> Vec<u32> {
    let kp = k.div_ceil(2);
    let mut out = vec![0u32; (m + pad_rows) * kp];
    if k > 0 {
        for (row, dst) in x.chunks_exact(k).zip(out.chunks_exact_mut(kp)).take(m) {
            row_pairs(row, dst);
        }
    }
    out
}

/// One row of [`pairs`]: 32 values at a time with `vcvtne2ps2bf16` (round to nearest even, as
/// `half::bf16::from_f32`), the rest one pair at a time.
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn row_pairs(row: &[f32], dst: &mut [u32]) {
    let mut chunks = row.chunks_exact(32);
    let mut j = 0;
    for c in chunks.by_ref() {
        let lo = _mm512_loadu_ps(c.as_ptr());
        let hi = _mm512_loadu_ps(c.as_ptr().add(16));
        let v: __m512i = std::mem::transmute(_mm512_cvtne2ps_pbh(hi, lo));
        _mm512_storeu_si512(dst.as_mut_ptr().add(j).cast(), v);
        j += 16;
    }
    for (i, pair) in chunks.remainder().chunks(2).enumerate() {
        let bits = |v: f32| u32::from(half::bf16::from_f32(v).to_bits());
        dst[j + i] = bits(pair[0]) | (pair.get(1).map_or(0, |&v| bits(v)) << 16);
    }
}

/// `c[r, 0..cols] = init[0..cols] + x[r, :] @ panel` for `r` in `0..rows`, `x` given as
/// [`pairs`] (`k.div_ceil(2)` a row) and `panel` a bf16 panel (`k` rows in the slot order of
/// [`super::packed`]).
///
/// The first tile reads the panel from DRAM and asks for it ahead of its loads; the later tiles
/// find it in L2 and ask instead for `next` (the panel this thread multiplies next, if any), each
/// for its share, so that the next panel's first tile finds it in L2 too.
///
/// # Safety
/// [`available`]; `x` holds `rows` rows of pairs, `panel` `k * PANEL` bf16, `c` `rows` rows of
/// stride `ldc` with `cols <= PANEL` writable f32 each, not aliased during the call.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn panel_product(
    x: *const u32,
    rows: usize,
    k: usize,
    panel: *const u16,
    next: Option<*const u16>,
    c: *mut f32,
    ldc: usize,
    cols: usize,
    init: &[f32; PANEL],
) {
    let kp = k.div_ceil(2);
    let later_tiles = rows.div_ceil(ROWS).saturating_sub(1);
    // Each later tile's share of the next panel, in cache lines per pair of panel rows.
    let share = (k * PANEL * 2).div_ceil(later_tiles.max(1));
    let lines = share.div_ceil(64 * kp.max(1));
    let mut r = 0;
    while r < rows {
        let mr = ROWS.min(rows - r);
        let (x, c) = (x.add(r * kp), c.add(r * ldc));
        let ahead = match (r / ROWS, next) {
            (0, _) => Ahead::Panel,
            (t, Some(next)) => Ahead::Next { at: next.cast::<i8>().wrapping_add((t - 1) * share), lines },
            (_, None) => Ahead::Nothing,
        };
        macro_rules! tiles {
            ($($n:literal),*) => {
                match mr {
                    $( $n => tile::<$n>(x, k, panel, ahead, c, ldc, cols, init), )*
                    _ => unreachable!("tile height {mr} exceeds {ROWS}"),
                }
            };
        }
        tiles!(1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12);
        r += mr;
    }
}

/// `MR` rows times the panel. A bf16 panel row holds columns `c` and `16 + c` in 32-bit lane `c`;
/// `vdpbf16ps` wants one column at two rows `k` in a lane. Interleaving the words of two panel
/// rows (`vpunpcklwd` / `vpunpckhwd`, one instruction each) gives such lanes, the columns in the
/// order of [`UNPACKED_LO`] / [`UNPACKED_HI`]; the sums are put back in column order once, at the end.
#[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
#[allow(clippy::too_many_arguments)]
unsafe fn tile<const MR: usize>(
    x: *const u32,
    k: usize,
    panel: *const u16,
    ahead: Ahead,
    c: *mut f32,
    ldc: usize,
    cols: usize,
    init: &[f32; PANEL],
) {
    let kp = k.div_ceil(2);
    let mut lo = [_mm512_setzero_ps(); MR];
    let mut hi = [_mm512_setzero_ps(); MR];
    macro_rules! step {
        ($j:expr, $a:expr, $b:expr) => {{
            let (j, a, b) = ($j, $a, $b);
            let p: __m512bh = std::mem::transmute(_mm512_unpacklo_epi16(a, b));
            let q: __m512bh = std::mem::transmute(_mm512_unpackhi_epi16(a, b));
            for r in 0..MR {
                let xr: __m512bh = std::mem::transmute(_mm512_set1_epi32(*x.add(r * kp + j) as i32));
                lo[r] = _mm512_dpbf16_ps(lo[r], xr, p);
                hi[r] = _mm512_dpbf16_ps(hi[r], xr, q);
            }
        }};
    }
    for j in 0..k / 2 {
        // (A prefetch past the panel's end is harmless.)
        match ahead {
            Ahead::Panel => {
                let at = panel.add(2 * j * PANEL).cast::<i8>().wrapping_add(PREFETCH_ROWS * PANEL * 2);
                _mm_prefetch::<_MM_HINT_T0>(at);
                _mm_prefetch::<_MM_HINT_T0>(at.wrapping_add(64));
            }
            Ahead::Next { at, lines } => {
                for l in 0..lines {
                    _mm_prefetch::<_MM_HINT_T1>(at.wrapping_add((j * lines + l) * 64));
                }
            }
            Ahead::Nothing => {}
        }
        step!(
            j,
            _mm512_loadu_si512(panel.add(2 * j * PANEL).cast::<__m512i>()),
            _mm512_loadu_si512(panel.add((2 * j + 1) * PANEL).cast::<__m512i>())
        );
    }
    if k % 2 == 1 {
        // The last row pairs with zeros (its pairs' high halves are zero too).
        step!(k / 2, _mm512_loadu_si512(panel.add((k - 1) * PANEL).cast::<__m512i>()), _mm512_setzero_si512());
    }
    for r in 0..MR {
        store_row(lo[r], hi[r], c.add(r * ldc), cols, init);
    }
}

/// One output row from its sums in the lane orders of [`UNPACKED_LO`] (`lo`) and
/// [`UNPACKED_HI`] (`hi`): back in column order, plus `init`, columns `0..cols` into `dst`.
///
/// # Safety
/// AVX-512F; `dst` has `cols <= PANEL` writable f32.
#[target_feature(enable = "avx512f")]
#[inline]
pub(super) unsafe fn store_row(lo: __m512, hi: __m512, dst: *mut f32, cols: usize, init: &[f32; PANEL]) {
    let mask = |h: usize| -> __mmask16 { ((1u32 << cols.saturating_sub(h).min(16)) - 1) as __mmask16 };
    let (to_lo, to_hi) =
        (_mm512_loadu_si512(TO_COLUMNS_LO.as_ptr().cast()), _mm512_loadu_si512(TO_COLUMNS_HI.as_ptr().cast()));
    let (init_lo, init_hi) = (_mm512_loadu_ps(init.as_ptr()), _mm512_loadu_ps(init.as_ptr().add(16)));
    _mm512_mask_storeu_ps(dst, mask(0), _mm512_add_ps(init_lo, _mm512_permutex2var_ps(lo, to_lo, hi)));
    _mm512_mask_storeu_ps(dst.add(16), mask(16), _mm512_add_ps(init_hi, _mm512_permutex2var_ps(lo, to_hi, hi)));
}

//! LPBQ int4 weights kept 4-bit in memory, and the W4A16 register tiles that multiply them.
//!
//! An LPBQ weight is `W[k, c] = q[k, c] * scale1[c][k / bs] * scale2[c]` with `q` a signed 4-bit
//! code, `scale1` a small unsigned integer per block of `bs` input rows and column, and `scale2` an
//! f32 per column. [`Int4Packer`] repacks the checkpoint's codes into panels of [`PANEL`] columns
//! (the layout of [`super::PackedMatrix`]): a panel row is 16 bytes, byte `j` holding column `j`
//! in its low nibble and column `16 + j` in its high nibble, and the panel's `scale1` values are
//! stored block by block, 32 bytes (one per column) each.
//!
//! The tiles compute `init + scale2 * Σ_blocks scale1 * Σ_k x[k] * q[k]`: the codes are widened
//! to f32 in registers (exact), one block's `scale1` values stay in registers while its rows
//! stream past, and `scale2` is applied once per output. Tiles of up to four rows keep a
//! per-block sum and scale it once per block; taller tiles scale the widened codes instead
//! (`q * scale1` is an exact small integer), which needs no second set of accumulators. The
//! products equal those with the decoded f32 weights up to f32 rounding order.
//!
//! AVX-512 widens 16 codes with one `vpermps` from a 16-entry table (it reads only an index's
//! low four bits, so the high nibble needs just a shift); AVX2 builds the float `2^23 + q + 8`
//! from the nibble's bits and subtracts `2^23 + 8`; the portable version sign-extends in Rust.

use super::packed::{PackedMatrix, PANEL};
use super::packed_tile::{store_row, Isa};
use super::weight_memory::WeightBuf;
use super::KernelError;

/// Bytes of one panel row: [`PANEL`] nibbles.
pub const INT4_ROW_BYTES: usize = PANEL / 2;

/// Tiles up to this height keep per-block sums (see the module docs).
#[cfg(target_arch = "x86_64")]
const BLOCK_SUM_ROWS: usize = 4;

/// Panel rows the AVX-512 tile prefetches ahead (4 KiB of codes): a decode row streams its
/// weights from DRAM at several bytes a cycle, and 512 bytes ahead hid too little of the latency
/// (measured single-threaded on Qwen3-0.6B's shapes: 1.3-1.4x the throughput of 512 bytes ahead,
/// and 2 KiB gained less).
#[cfg(target_arch = "x86_64")]
pub(crate) const PREFETCH_ROWS: usize = 256;

/// The value of a 4-bit two's-complement code (`0..=15` → `-8..=7`).
#[inline(always)]
pub(crate) fn sign_extend(nibble: u8) -> i32 {
    (i32::from(nibble & 15) ^ 8) - 8
}

/// The int4 codes and scales of a packed LPBQ matrix (see the module docs).
#[derive(Clone, PartialEq)]
pub struct Int4Panels {
    block: usize,
    /// Blocks per column: `K / block`.
    blocks: usize,
    /// `panels * K * INT4_ROW_BYTES`.
    codes: WeightBuf<u8>,
    /// `panels * blocks * PANEL`, zero for padding columns.
    scale1: WeightBuf<u8>,
    /// `panels * PANEL`, zero for padding columns.
    scale2: Vec<f32>,
    /// `panels * PANEL`: `Σ_k q[k, c] * scale1[k / block, c]` (for [`super::grid_int4`]).
    code_sums: Vec<i32>,
}

impl Int4Panels {
    /// Input rows per block.
    pub fn block_size(&self) -> usize {
        self.block
    }

    /// Bytes held (codes and both scales).
    pub(crate) fn bytes(&self) -> usize {
        self.codes.len() + self.scale1.len() + (self.scale2.len() + self.code_sums.len()) * 4
    }

    /// `W[kk, c]` as the decoded LPBQ value `(q * scale1) * scale2` (one rounding, as the f32
    /// decoder computes it).
    pub(crate) fn get(&self, k: usize, kk: usize, c: usize) -> f32 {
        let (p, j) = (c / PANEL, c % PANEL);
        let byte = self.codes[(p * k + kk) * INT4_ROW_BYTES + j % INT4_ROW_BYTES];
        let nibble = if j < INT4_ROW_BYTES { byte } else { byte >> 4 };
        let s1 = i32::from(self.scale1[(p * self.blocks + kk / self.block) * PANEL + j]);
        (sign_extend(nibble) * s1) as f32 * self.scale2[c]
    }

    /// The bytes a product streams: the codes, then the block scales.
    pub(crate) fn streamed(&self) -> [&[u8]; 2] {
        [&self.codes, &self.scale1]
    }

    pub(crate) fn panel(&self, k: usize, p: usize) -> Int4Panel<'_> {
        let (codes, scales) = (k * INT4_ROW_BYTES, self.blocks * PANEL);
        Int4Panel {
            codes: &self.codes[p * codes..(p + 1) * codes],
            scale1: &self.scale1[p * scales..(p + 1) * scales],
            scale2: &self.scale2[p * PANEL..(p + 1) * PANEL],
            code_sums: &self.code_sums[p * PANEL..(p + 1) * PANEL],
            block: self.block,
        }
    }
}

/// One panel of an [`Int4Panels`].
#[derive(Clone, Copy)]
pub(crate) struct Int4Panel<'a> {
    codes: &'a [u8],
    scale1: &'a [u8],
    scale2: &'a [f32],
    code_sums: &'a [i32],
    block: usize,
}

impl<'a> Int4Panel<'a> {
    /// Input rows per block.
    pub(crate) fn block(&self) -> usize {
        self.block
    }

    /// The panel's codes, row after row.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(crate) fn codes(&self) -> &'a [u8] {
        self.codes
    }

    /// The 16 bytes of panel row `kk` (the panel's rows follow one another).
    pub(crate) fn code_row(&self, kk: usize) -> &'a [u8] {
        &self.codes[kk * INT4_ROW_BYTES..(kk + 1) * INT4_ROW_BYTES]
    }

    /// The [`PANEL`] `scale1` values of block `b`.
    pub(crate) fn scale1_of(&self, b: usize) -> &'a [u8] {
        &self.scale1[b * PANEL..(b + 1) * PANEL]
    }

    pub(crate) fn scale2(&self) -> &'a [f32] {
        self.scale2
    }

    /// `Σ_k q[k, c] * scale1[k / block, c]` per column.
    pub(crate) fn code_sums(&self) -> &'a [i32] {
        self.code_sums
    }
}

/// Builds a [`PackedMatrix`] of int4 codes from a row-major `[K, N]` tensor of bytes holding one
/// code's low nibble each (`0..=15`, the layout of a pymllm LPBQ Conv2D weight `[1, 1, In, Out]`),
/// fed in pieces of any size ([`Int4Packer::push`]) so a checkpoint can be read in chunks.
pub struct Int4Packer {
    k: usize,
    n: usize,
    block: usize,
    codes: WeightBuf<u8>,
    /// Elements pushed so far.
    pos: usize,
}

impl Int4Packer {
    const OP: &'static str = "pack_int4";

    /// A packer for `[k, n]` codes in blocks of `block` rows (`block` must divide `k`).
    pub fn new(k: usize, n: usize, block: usize) -> Result<Self, KernelError> {
        if k == 0 || n == 0 || block == 0 || !k.is_multiple_of(block) {
            return Err(KernelError::InvalidArgument {
                op: Self::OP,
                reason: format!("[K {k}, N {n}] in blocks of {block} rows: blocks must tile a non-empty K"),
            });
        }
        let codes = WeightBuf::zeroed(n.div_ceil(PANEL) * k * INT4_ROW_BYTES);
        Ok(Int4Packer { k, n, block, codes, pos: 0 })
    }

    /// Appends the next `bytes` of the row-major `[K, N]` codes; a byte above 15 is an error
    /// naming its element index.
    pub fn push(&mut self, bytes: &[u8]) -> Result<(), KernelError> {
        let (k, n) = (self.k, self.n);
        if bytes.len() > k * n - self.pos {
            return Err(KernelError::InvalidArgument {
                op: Self::OP,
                reason: format!("more than the {} codes of [K {k}, N {n}]", k * n),
            });
        }
        let (mut kk, mut c) = (self.pos / n, self.pos % n);
        for (i, &b) in bytes.iter().enumerate() {
            if b > 15 {
                return Err(KernelError::InvalidArgument {
                    op: Self::OP,
                    reason: format!("element {} is {b}, not a 4-bit code's nibble (0..=15)", self.pos + i),
                });
            }
            let (p, j) = (c / PANEL, c % PANEL);
            let dst = &mut self.codes[(p * k + kk) * INT4_ROW_BYTES + j % INT4_ROW_BYTES];
            *dst |= if j < INT4_ROW_BYTES { b } else { b << 4 };
            c += 1;
            if c == n {
                c = 0;
                kk += 1;
            }
        }
        self.pos += bytes.len();
        Ok(())
    }

    /// The packed matrix, given `scale1` channel-major `[N][K / block]` and `scale2` `[N]`.
    pub fn finish(self, scale1: &[u8], scale2: &[f32]) -> Result<PackedMatrix, KernelError> {
        let (k, n, block) = (self.k, self.n, self.block);
        if self.pos != k * n {
            return Err(KernelError::InvalidArgument {
                op: Self::OP,
                reason: format!("got {} codes, [K {k}, N {n}] needs {}", self.pos, k * n),
            });
        }
        let blocks = k / block;
        super::shape::check_len_of(Self::OP, "scale1", scale1.len(), &[n, blocks])?;
        super::shape::check_len_of(Self::OP, "scale2", scale2.len(), &[n])?;
        let panels = n.div_ceil(PANEL);
        let mut s1 = WeightBuf::zeroed(panels * blocks * PANEL);
        let mut s2 = vec![0f32; panels * PANEL];
        for c in 0..n {
            let (p, j) = (c / PANEL, c % PANEL);
            for b in 0..blocks {
                s1[(p * blocks + b) * PANEL + j] = scale1[c * blocks + b];
            }
            s2[c] = scale2[c];
        }
        let mut code_sums = vec![0i32; panels * PANEL];
        for (p, sums) in code_sums.chunks_mut(PANEL).enumerate() {
            for kk in 0..k {
                let row = &self.codes[(p * k + kk) * INT4_ROW_BYTES..][..INT4_ROW_BYTES];
                let s = &s1[(p * blocks + kk / block) * PANEL..][..PANEL];
                for (j, &byte) in row.iter().enumerate() {
                    sums[j] += sign_extend(byte) * i32::from(s[j]);
                    sums[INT4_ROW_BYTES + j] += sign_extend(byte >> 4) * i32::from(s[INT4_ROW_BYTES + j]);
                }
            }
        }
        let panels = Int4Panels { block, blocks, codes: self.codes, scale1: s1, scale2: s2, code_sums };
        Ok(PackedMatrix::from_int4(k, n, panels))
    }
}

/// [`super::packed_tile::panel_product`] for an int4 panel.
///
/// # Safety
/// As [`super::packed_tile::panel_product`]; `p` is a panel of a matrix with `k` rows.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn panel_product(
    isa: Isa,
    a: *const f32,
    rows: usize,
    k: usize,
    p: Int4Panel<'_>,
    c: *mut f32,
    ldc: usize,
    cols: usize,
    init: &[f32; PANEL],
) {
    let mut r = 0;
    while r < rows {
        let mr = isa.rows().min(rows - r);
        let (a, c) = (a.add(r * k), c.add(r * ldc));
        macro_rules! tile {
            ($m:ident, [$($n:literal),*]) => {
                match mr {
                    $( $n => $m::tile::<$n>(a, k, p, c, ldc, cols, init), )*
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

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::{store_row, Int4Panel, BLOCK_SUM_ROWS, INT4_ROW_BYTES, PANEL, PREFETCH_ROWS};
    use std::arch::x86_64::*;

    /// 16 bytes widened to 32-bit lanes (a macro, so it is compiled with the tile's features).
    macro_rules! widen {
        ($p:expr) => {
            _mm512_cvtepu8_epi32(_mm_loadu_si128($p as *const __m128i))
        };
    }

    /// # Safety
    /// See [`super::panel_product`].
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn tile<const MR: usize>(
        a: *const f32,
        k: usize,
        p: Int4Panel<'_>,
        c: *mut f32,
        ldc: usize,
        cols: usize,
        init: &[f32; PANEL],
    ) {
        // Entry n is the value of the 4-bit code n.
        let table =
            _mm512_setr_ps(0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, -8.0, -7.0, -6.0, -5.0, -4.0, -3.0, -2.0, -1.0);
        let mut lo = [_mm512_setzero_ps(); MR];
        let mut hi = [_mm512_setzero_ps(); MR];
        let (codes, bs) = (p.codes.as_ptr(), p.block);
        for b in 0..k / bs {
            let s = p.scale1.as_ptr().add(b * PANEL);
            let s_lo = _mm512_cvtepi32_ps(widen!(s));
            let s_hi = _mm512_cvtepi32_ps(widen!(s.add(16)));
            let mut blo = [_mm512_setzero_ps(); MR];
            let mut bhi = [_mm512_setzero_ps(); MR];
            for kk in b * bs..(b + 1) * bs {
                if kk % 4 == 0 {
                    let ahead = codes.wrapping_add((kk + PREFETCH_ROWS) * INT4_ROW_BYTES) as *const i8;
                    _mm_prefetch::<_MM_HINT_T0>(ahead);
                }
                let v = widen!(codes.add(kk * INT4_ROW_BYTES));
                let q0 = _mm512_permutexvar_ps(v, table);
                let q1 = _mm512_permutexvar_ps(_mm512_srli_epi32::<4>(v), table);
                if MR <= BLOCK_SUM_ROWS {
                    for r in 0..MR {
                        let x = _mm512_set1_ps(*a.add(r * k + kk));
                        blo[r] = _mm512_fmadd_ps(x, q0, blo[r]);
                        bhi[r] = _mm512_fmadd_ps(x, q1, bhi[r]);
                    }
                } else {
                    let (w0, w1) = (_mm512_mul_ps(q0, s_lo), _mm512_mul_ps(q1, s_hi));
                    for r in 0..MR {
                        let x = _mm512_set1_ps(*a.add(r * k + kk));
                        lo[r] = _mm512_fmadd_ps(x, w0, lo[r]);
                        hi[r] = _mm512_fmadd_ps(x, w1, hi[r]);
                    }
                }
            }
            if MR <= BLOCK_SUM_ROWS {
                for (l, b) in lo.iter_mut().zip(&blo) {
                    *l = _mm512_fmadd_ps(*b, s_lo, *l);
                }
                for (h, b) in hi.iter_mut().zip(&bhi) {
                    *h = _mm512_fmadd_ps(*b, s_hi, *h);
                }
            }
        }
        let s2 = p.scale2.as_ptr();
        let (s2_lo, s2_hi) = (_mm512_loadu_ps(s2), _mm512_loadu_ps(s2.add(16)));
        let (i_lo, i_hi) = (_mm512_loadu_ps(init.as_ptr()), _mm512_loadu_ps(init.as_ptr().add(16)));
        for r in 0..MR {
            let mut row = [0.0f32; PANEL];
            _mm512_storeu_ps(row.as_mut_ptr(), _mm512_fmadd_ps(lo[r], s2_lo, i_lo));
            _mm512_storeu_ps(row.as_mut_ptr().add(16), _mm512_fmadd_ps(hi[r], s2_hi, i_hi));
            store_row(&row, c.add(r * ldc), cols);
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{store_row, Int4Panel, INT4_ROW_BYTES, PANEL};
    use std::arch::x86_64::*;

    /// 8 bytes widened to 32-bit lanes (a macro, so it is compiled with the tile's features).
    macro_rules! widen {
        ($p:expr) => {
            _mm256_cvtepu8_epi32(_mm_loadl_epi64($p as *const __m128i))
        };
    }

    /// # Safety
    /// See [`super::panel_product`].
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn tile<const MR: usize>(
        a: *const f32,
        k: usize,
        p: Int4Panel<'_>,
        c: *mut f32,
        ldc: usize,
        cols: usize,
        init: &[f32; PANEL],
    ) {
        // A nibble n (in a lane's low bits) XOR 0x4B00_0008 is the float 2^23 + (n ^ 8), and
        // n ^ 8 = value(n) + 8: subtracting 2^23 + 8 leaves the code's value, exactly.
        let magic = _mm256_set1_epi32(0x4B00_0008);
        let offset = _mm256_set1_ps(8_388_616.0);
        let low = _mm256_set1_epi32(15);
        // (A macro, not a closure: a closure would not be compiled with this function's features.)
        macro_rules! value {
            ($n:expr) => {
                _mm256_sub_ps(_mm256_castsi256_ps(_mm256_xor_si256($n, magic)), offset)
            };
        }
        // acc[r][q] holds columns 8q..8q+8.
        let mut acc = [[_mm256_setzero_ps(); 4]; MR];
        let (codes, bs) = (p.codes.as_ptr(), p.block);
        for b in 0..k / bs {
            let s1 = p.scale1.as_ptr().add(b * PANEL);
            let s = [
                _mm256_cvtepi32_ps(widen!(s1)),
                _mm256_cvtepi32_ps(widen!(s1.add(8))),
                _mm256_cvtepi32_ps(widen!(s1.add(16))),
                _mm256_cvtepi32_ps(widen!(s1.add(24))),
            ];
            for kk in b * bs..(b + 1) * bs {
                // Bytes 0..8 hold columns 0..8 (low nibbles) and 16..24 (high); bytes 8..16
                // columns 8..16 and 24..32.
                let row = codes.add(kk * INT4_ROW_BYTES);
                let (v0, v1) = (widen!(row), widen!(row.add(8)));
                let w = [
                    _mm256_mul_ps(value!(_mm256_and_si256(v0, low)), s[0]),
                    _mm256_mul_ps(value!(_mm256_and_si256(v1, low)), s[1]),
                    _mm256_mul_ps(value!(_mm256_srli_epi32::<4>(v0)), s[2]),
                    _mm256_mul_ps(value!(_mm256_srli_epi32::<4>(v1)), s[3]),
                ];
                for (r, acc) in acc.iter_mut().enumerate() {
                    let x = _mm256_set1_ps(*a.add(r * k + kk));
                    for q in 0..4 {
                        acc[q] = _mm256_fmadd_ps(x, w[q], acc[q]);
                    }
                }
            }
        }
        for (r, acc) in acc.iter().enumerate() {
            let mut row = [0.0f32; PANEL];
            for (q, v) in acc.iter().enumerate() {
                let s2 = _mm256_loadu_ps(p.scale2.as_ptr().add(8 * q));
                let i = _mm256_loadu_ps(init.as_ptr().add(8 * q));
                _mm256_storeu_ps(row.as_mut_ptr().add(8 * q), _mm256_fmadd_ps(*v, s2, i));
            }
            store_row(&row, c.add(r * ldc), cols);
        }
    }
}

mod portable {
    use super::{sign_extend, store_row, Int4Panel, INT4_ROW_BYTES, PANEL};

    /// # Safety
    /// See [`super::panel_product`].
    pub(super) unsafe fn tile<const MR: usize>(
        a: *const f32,
        k: usize,
        p: Int4Panel<'_>,
        c: *mut f32,
        ldc: usize,
        cols: usize,
        init: &[f32; PANEL],
    ) {
        let mut acc = [[0.0f32; PANEL]; MR];
        let mut w = [0.0f32; PANEL];
        let bs = p.block;
        for b in 0..k / bs {
            let s = &p.scale1[b * PANEL..(b + 1) * PANEL];
            for kk in b * bs..(b + 1) * bs {
                let row = &p.codes[kk * INT4_ROW_BYTES..(kk + 1) * INT4_ROW_BYTES];
                for (j, &byte) in row.iter().enumerate() {
                    w[j] = (sign_extend(byte) * i32::from(s[j])) as f32;
                    w[INT4_ROW_BYTES + j] = (sign_extend(byte >> 4) * i32::from(s[INT4_ROW_BYTES + j])) as f32;
                }
                for (r, acc) in acc.iter_mut().enumerate() {
                    let x = *a.add(r * k + kk);
                    // Not `mul_add`: without hardware FMA that is a slow library call.
                    for (o, &w) in acc.iter_mut().zip(&w) {
                        *o += x * w;
                    }
                }
            }
        }
        for (r, acc) in acc.iter().enumerate() {
            let mut row = [0.0f32; PANEL];
            for (j, o) in row.iter_mut().enumerate() {
                *o = acc[j] * p.scale2[j] + init[j];
            }
            store_row(&row, c.add(r * ldc), cols);
        }
    }
}

//! LPBQ (low-power blockwise quantization) of linear weights, as pymllm's `QLinearLPBQ` does it.
//!
//! A linear weight `W[Out][In]` (HF layout) is cut into blocks of `block_size` along the input
//! dimension. Each block gets a symmetric fp32 scale and int4 codes in -7..=7 (torchao's
//! `choose_qparams_affine` with `MappingType.SYMMETRIC` and `_quantize_affine`):
//!
//! ```text
//! s[o][b] = max(max_i |W[o][i]| / 7, eps)          eps = f32(1e-4 / 65535)
//! q[o][i] = clamp(round(W[o][i] * (1 / s[o][b])), -7, 7)   round half to even, all in f32
//! ```
//!
//! Calibration and mllm's fake-quant run with `q * s` ([`LpbqBlockQuant::fake_quant_weights`]).
//! The export then quantizes the block scales per output channel:
//!
//! ```text
//! scale2[o]    = max_b s[o][b] / 16
//! scale1[o][b] = clamp(round(s[o][b] / scale2[o]), 1, 16)  as u8
//! ```
//!
//! so the deployed weight is `q * scale1 * scale2`, which is not the scale the codes were
//! rounded with ([`decode_lpbq`]). The exported weight is the Conv2D HWIO tensor `[1, 1, In, Out]`
//! of int8 whose values are the int4 codes' low nibbles (`q & 0x0F`, 0..=15); `scale1` is
//! `[Out * In/bs]` channel-major and `scale2` is `[Out]`.

use rayon::prelude::*;

use super::rounding::round_half_even;
use super::spec::EPS_16BIT;
use super::QuantError;

/// Smallest int4 code pymllm uses (the range is symmetric, so -8 never occurs).
pub const LPBQ_QMIN: i8 = -7;
/// Largest int4 code.
pub const LPBQ_QMAX: i8 = 7;
/// eps of `PerBlockParamFakeQuantize` in `QLinearLPBQ` (`0.0001 / 65535`).
pub const LPBQ_EPS: f32 = EPS_16BIT;
/// Steps of the 4-bit level-1 scale: `scale2 = max / 16`, and `scale1` reaches 16 itself.
pub const SCALE1_STEPS: u8 = 16;

/// Dimensions of an LPBQ linear weight; only [`LpbqShape::new`] makes one, so the blocks always
/// tile the input dimension.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LpbqShape {
    out_features: usize,
    in_features: usize,
    block_size: usize,
}

impl LpbqShape {
    /// Validates that the blocks tile the input dimension exactly (pymllm asserts the same).
    pub fn new(out_features: usize, in_features: usize, block_size: usize) -> Result<Self, QuantError> {
        if block_size == 0 {
            return Err(QuantError::ZeroBlockSize);
        }
        if out_features == 0 || in_features == 0 {
            return Err(QuantError::EmptyShape { what: "LPBQ weight", out_features, in_features });
        }
        if !in_features.is_multiple_of(block_size) {
            return Err(QuantError::BlockSizeDoesNotDivide { block_size, in_features });
        }
        Ok(Self { out_features, in_features, block_size })
    }

    pub fn out_features(&self) -> usize {
        self.out_features
    }

    pub fn in_features(&self) -> usize {
        self.in_features
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn blocks_per_channel(&self) -> usize {
        self.in_features / self.block_size
    }

    pub fn num_weights(&self) -> usize {
        self.out_features * self.in_features
    }

    pub fn num_blocks(&self) -> usize {
        self.out_features * self.blocks_per_channel()
    }

    fn check_len(&self, what: &'static str, expected: usize, found: usize) -> Result<(), QuantError> {
        if expected == found {
            Ok(())
        } else {
            Err(QuantError::LengthMismatch { what, expected, found })
        }
    }
}

/// First stage: int4 codes with their fp32 block scales (what calibration and fake-quant use).
#[derive(Clone, Debug, PartialEq)]
pub struct LpbqBlockQuant {
    pub shape: LpbqShape,
    /// `[Out][In]` codes in -7..=7.
    pub codes: Vec<i8>,
    /// `[Out][In/bs]` fp32 block scales.
    pub block_scales: Vec<f32>,
}

/// Second stage: the tensors pymllm exports (`<linear>.weight`, `.scale1`, `.scale2`).
#[derive(Clone, Debug, PartialEq)]
pub struct LpbqExport {
    pub shape: LpbqShape,
    /// HWIO `[1, 1, In, Out]` int8, each value an int4 code's low nibble (0..=15).
    pub weight_hwio: Vec<i8>,
    /// `[Out * In/bs]` channel-major level-1 scales in 1..=16.
    pub scale1: Vec<u8>,
    /// `[Out]` level-2 fp32 scales.
    pub scale2: Vec<f32>,
}

/// Quantizes a row-major `[Out][In]` weight into int4 codes and fp32 block scales.
///
/// Parallel over output channels. Fails on a length mismatch or a non-finite weight.
pub fn lpbq_block_quantize(weight: &[f32], shape: LpbqShape) -> Result<LpbqBlockQuant, QuantError> {
    shape.check_len("LPBQ weight [Out][In]", shape.num_weights(), weight.len())?;
    let mut codes = vec![0i8; shape.num_weights()];
    let mut block_scales = vec![0f32; shape.num_blocks()];
    let n_in = shape.in_features;
    let bs = shape.block_size;
    codes
        .par_chunks_mut(n_in)
        .zip(block_scales.par_chunks_mut(shape.blocks_per_channel()))
        .zip(weight.par_chunks(n_in))
        .enumerate()
        .with_min_len(8)
        .try_for_each(|(o, ((code_row, scale_row), w_row))| {
            for (b, ((codes, scale), w)) in
                code_row.chunks_exact_mut(bs).zip(scale_row.iter_mut()).zip(w_row.chunks_exact(bs)).enumerate()
            {
                let (absmax, finite) = block_absmax(w);
                if !finite {
                    let i = w.iter().position(|x| !x.is_finite()).unwrap_or(0);
                    return Err(QuantError::NonFinite {
                        what: "LPBQ weight [Out][In]",
                        index: o * n_in + b * bs + i,
                        value: w[i],
                    });
                }
                *scale = block_scale(absmax);
                quantize_block(w, *scale, codes);
            }
            Ok(())
        })?;
    Ok(LpbqBlockQuant { shape, codes, block_scales })
}

/// `max |x|` of a block and whether every element is finite. Lanes keep it vectorizable.
#[inline]
fn block_absmax(block: &[f32]) -> (f32, bool) {
    const LANES: usize = 8;
    let mut m = [0f32; LANES];
    let mut finite = [true; LANES];
    let chunks = block.chunks_exact(LANES);
    let tail = chunks.remainder();
    for chunk in chunks {
        for j in 0..LANES {
            let a = chunk[j].abs();
            m[j] = if a > m[j] { a } else { m[j] };
            finite[j] &= a <= f32::MAX;
        }
    }
    for (j, &x) in tail.iter().enumerate() {
        let a = x.abs();
        m[j] = if a > m[j] { a } else { m[j] };
        finite[j] &= a <= f32::MAX;
    }
    (m.iter().copied().fold(0.0, f32::max), finite.iter().all(|&f| f))
}

/// torchao symmetric scale: `max(-min_neg, max_pos) / ((qmax - qmin) / 2)`, clamped to eps.
/// `max(-min(min, 0), max(max, 0))` is exactly `max |x|` (with 0 included).
#[inline(always)]
fn block_scale(absmax: f32) -> f32 {
    let half_range = (LPBQ_QMAX as i32 - LPBQ_QMIN as i32) as f32 / 2.0;
    (absmax / half_range).max(LPBQ_EPS)
}

/// torchao `_quantize_affine`: `clamp(round(x * (1.0 / scale)) + 0, -7, 7)`.
#[inline(always)]
fn quantize_block(w: &[f32], scale: f32, out: &mut [i8]) {
    // Python's `1.0 / scale` on a tensor is `scale.reciprocal() * 1.0`: one f32 division.
    let inv = 1.0f32 / scale;
    for (q, &x) in out.iter_mut().zip(w) {
        // |x * inv| <= 7 (plus rounding error) because the scale is at least max|x| / 7, far
        // inside the range where adding 1.5 * 2^23 rounds half to even exactly. The sum's low
        // mantissa bits are then the integer itself, which avoids a float-to-int conversion.
        let biased = (x * inv + ROUNDING_MAGIC).to_bits() as i32 - ROUNDING_MAGIC_BITS;
        *q = biased.clamp(i32::from(LPBQ_QMIN), i32::from(LPBQ_QMAX)) as i8;
    }
}

/// 1.5 * 2^23 and its bit pattern (see [`quantize_block`]).
const ROUNDING_MAGIC: f32 = 12_582_912.0;
const ROUNDING_MAGIC_BITS: i32 = 0x4B40_0000;

impl LpbqBlockQuant {
    /// mllm's fake-quant weights `[Out][In]`: `q * s` with the fp32 block scale.
    pub fn fake_quant_weights(&self) -> Vec<f32> {
        let bs = self.shape.block_size;
        let mut out = vec![0f32; self.codes.len()];
        out.par_chunks_mut(self.shape.in_features)
            .zip(self.codes.par_chunks(self.shape.in_features))
            .zip(self.block_scales.par_chunks(self.shape.blocks_per_channel()))
            .with_min_len(8)
            .for_each(|((out_row, code_row), scale_row)| {
                for ((o, q), &s) in out_row.chunks_exact_mut(bs).zip(code_row.chunks_exact(bs)).zip(scale_row) {
                    for (v, &c) in o.iter_mut().zip(q) {
                        *v = f32::from(c) * s;
                    }
                }
            });
        out
    }

    /// Quantizes the block scales per channel and lays the codes out as HWIO nibbles.
    pub fn to_export(&self) -> LpbqExport {
        let shape = self.shape;
        let nb = shape.blocks_per_channel();
        let mut scale1 = vec![0u8; shape.num_blocks()];
        let mut scale2 = vec![0f32; shape.out_features];
        scale1
            .par_chunks_mut(nb)
            .zip(scale2.par_iter_mut())
            .zip(self.block_scales.par_chunks(nb))
            .with_min_len(64)
            .for_each(|((s1, s2), s)| {
                *s2 = s.iter().copied().fold(f32::NEG_INFINITY, f32::max) / f32::from(SCALE1_STEPS);
                for (q, &v) in s1.iter_mut().zip(s) {
                    *q = round_half_even(v / *s2).clamp(1.0, f32::from(SCALE1_STEPS)) as u8;
                }
            });
        LpbqExport { shape, weight_hwio: transpose_to_hwio_nibbles(&self.codes, shape), scale1, scale2 }
    }
}

impl LpbqExport {
    /// The export of `[Out][In]` codes in -7..=7 with already chosen two-level scales (what
    /// [`lpbq_search`](super::lpbq_search) and GPTQ-style rounding produce). Fails on lengths
    /// that do not fit `shape` or on values outside the format's ranges.
    pub fn from_codes(shape: LpbqShape, codes: &[i8], scale1: Vec<u8>, scale2: Vec<f32>) -> Result<Self, QuantError> {
        shape.check_len("LPBQ codes [Out][In]", shape.num_weights(), codes.len())?;
        if let Some((index, &c)) = codes.iter().enumerate().find(|(_, &c)| !(LPBQ_QMIN..=LPBQ_QMAX).contains(&c)) {
            return Err(QuantError::CodeOutOfRange {
                what: "LPBQ codes [Out][In]",
                index,
                value: i64::from(c),
                min: i64::from(LPBQ_QMIN),
                max: i64::from(LPBQ_QMAX),
            });
        }
        let export = LpbqExport { shape, weight_hwio: transpose_to_hwio_nibbles(codes, shape), scale1, scale2 };
        export.validate()?;
        Ok(export)
    }
}

/// `[Out][In]` int4 codes to `[In][Out]` low nibbles, parallel over groups of `In` rows.
///
/// The bulk moves 8x8 byte tiles through registers ([`transpose_8x8`]); ragged edges (a
/// dimension not a multiple of 8) go element by element.
fn transpose_to_hwio_nibbles(codes: &[i8], shape: LpbqShape) -> Vec<i8> {
    const ROWS_PER_TASK: usize = 64;
    const NIBBLES: u64 = 0x0F0F_0F0F_0F0F_0F0F;
    let (n_out, n_in) = (shape.out_features, shape.in_features);
    let mut hwio = vec![0i8; codes.len()];
    hwio.par_chunks_mut(n_out * ROWS_PER_TASK).enumerate().for_each(|(t, dst)| {
        let i_start = t * ROWS_PER_TASK;
        let rows = dst.len() / n_out;
        let full_i = rows - rows % 8;
        let full_o = n_out - n_out % 8;
        // Channel blocks outermost: each reads 8 whole cache lines of codes once, and the
        // 64 destination rows it writes into stay in L1 for the next block.
        for o0 in (0..full_o).step_by(8) {
            for di in (0..full_i).step_by(8) {
                let i0 = i_start + di;
                let mut tile = [0u64; 8];
                for (r, word) in tile.iter_mut().enumerate() {
                    let at = (o0 + r) * n_in + i0;
                    *word = load_u64(&codes[at..at + 8]);
                }
                let tile = transpose_8x8(tile);
                for (c, word) in tile.iter().enumerate() {
                    let at = (di + c) * n_out + o0;
                    store_u64(&mut dst[at..at + 8], word & NIBBLES);
                }
            }
        }
        // Ragged edges: output channels past the last full tile, input rows past it.
        for di in 0..rows {
            let o_from = if di < full_i { full_o } else { 0 };
            for o in o_from..n_out {
                dst[di * n_out + o] = codes[o * n_in + i_start + di] & 0x0F;
            }
        }
    });
    hwio
}

fn load_u64(bytes: &[i8]) -> u64 {
    let mut b = [0u8; 8];
    for (d, &s) in b.iter_mut().zip(bytes) {
        *d = s as u8;
    }
    u64::from_le_bytes(b)
}

fn store_u64(bytes: &mut [i8], word: u64) {
    for (d, s) in bytes.iter_mut().zip(word.to_le_bytes()) {
        *d = s as i8;
    }
}

/// Transposes an 8x8 byte matrix held as eight little-endian rows: out row `c`, byte `r` is
/// in row `r`, byte `c`. Three rounds swap 1-, 2- and 4-byte sub-blocks across the diagonal.
#[inline(always)]
fn transpose_8x8(mut m: [u64; 8]) -> [u64; 8] {
    const ROUNDS: [(usize, u32, u64); 3] =
        [(1, 8, 0x00FF_00FF_00FF_00FF), (2, 16, 0x0000_FFFF_0000_FFFF), (4, 32, 0x0000_0000_FFFF_FFFF)];
    for (step, shift, mask) in ROUNDS {
        for r in 0..8 {
            if r & step == 0 {
                let t = ((m[r] >> shift) ^ m[r + step]) & mask;
                m[r + step] ^= t;
                m[r] ^= t << shift;
            }
        }
    }
    m
}

/// Quantizes a row-major `[Out][In]` weight all the way to pymllm's export tensors.
pub fn quantize_lpbq(weight: &[f32], shape: LpbqShape) -> Result<LpbqExport, QuantError> {
    Ok(lpbq_block_quantize(weight, shape)?.to_export())
}

/// Sign-extends a 4-bit two's-complement nibble (the low 4 bits of `v`).
#[inline(always)]
pub fn sign_extend_nibble(v: i8) -> i8 {
    ((v as u8) << 4) as i8 >> 4
}

impl LpbqExport {
    /// Checks lengths and value ranges the way mllm's PTQ pass does (nibbles 0..=15, scale1
    /// 0..=16) and that every `scale2` is finite and positive.
    pub fn validate(&self) -> Result<(), QuantError> {
        validate_export(&self.weight_hwio, &self.scale1, &self.scale2, self.shape)
    }

    /// The deployed weight `[Out][In]` (see [`decode_lpbq`]); validates first.
    pub fn decode(&self) -> Result<Vec<f32>, QuantError> {
        self.validate()?;
        Ok(decode_unchecked(&self.weight_hwio, &self.scale1, &self.scale2, self.shape))
    }

    /// The same deployed weight in the 1x1 conv's HWIO layout `[In][Out]`; validates first.
    pub fn decode_hwio(&self) -> Result<Vec<f32>, QuantError> {
        self.validate()?;
        Ok(decode_hwio_unchecked(&self.weight_hwio, &self.scale1, &self.scale2, self.shape))
    }
}

fn validate_export(weight_hwio: &[i8], scale1: &[u8], scale2: &[f32], shape: LpbqShape) -> Result<(), QuantError> {
    shape.check_len("LPBQ weight [1,1,In,Out]", shape.num_weights(), weight_hwio.len())?;
    shape.check_len("LPBQ scale1 [Out*In/bs]", shape.num_blocks(), scale1.len())?;
    shape.check_len("LPBQ scale2 [Out]", shape.out_features, scale2.len())?;
    if let Some(i) = weight_hwio.iter().position(|&v| !(0..=15).contains(&v)) {
        return Err(QuantError::CodeOutOfRange {
            what: "LPBQ weight [1,1,In,Out]",
            index: i,
            value: i64::from(weight_hwio[i]),
            min: 0,
            max: 15,
        });
    }
    if let Some(i) = scale1.iter().position(|&v| v > SCALE1_STEPS) {
        return Err(QuantError::CodeOutOfRange {
            what: "LPBQ scale1 [Out*In/bs]",
            index: i,
            value: i64::from(scale1[i]),
            min: 0,
            max: i64::from(SCALE1_STEPS),
        });
    }
    if let Some(i) = scale2.iter().position(|&v| !(v.is_finite() && v > 0.0)) {
        return Err(QuantError::BadScale { what: "LPBQ scale2 [Out]", index: i, value: scale2[i] });
    }
    Ok(())
}

/// The deployed weight `[Out][In]` of exported LPBQ tensors:
/// `W[o][i] = signext4(weight[0,0,i,o]) * scale1[o][i / bs] * scale2[o]`.
///
/// `q * scale1` is an exact small integer, so each value is rounded once (when multiplying by
/// `scale2`). Fails on inconsistent lengths or out-of-range values.
pub fn decode_lpbq(
    weight_nibbles: &[i8],
    scale1: &[u8],
    scale2: &[f32],
    in_features: usize,
    out_features: usize,
    block_size: usize,
) -> Result<Vec<f32>, QuantError> {
    let shape = LpbqShape::new(out_features, in_features, block_size)?;
    validate_export(weight_nibbles, scale1, scale2, shape)?;
    Ok(decode_unchecked(weight_nibbles, scale1, scale2, shape))
}

/// [`decode_lpbq`]'s values in the 1x1 conv's HWIO layout, `[In][Out]`: `W[i][o]`, the same
/// numbers without a transpose. `shape` must be valid for the tensors ([`LpbqExport::decode_hwio`]
/// checks).
fn decode_hwio_unchecked(weight_nibbles: &[i8], scale1: &[u8], scale2: &[f32], shape: LpbqShape) -> Vec<f32> {
    let (n_out, bs, nb) = (shape.out_features, shape.block_size, shape.blocks_per_channel());
    let mut out = vec![0f32; shape.num_weights()];
    out.par_chunks_mut(n_out).enumerate().with_min_len(8).for_each(|(i, row)| {
        let (codes, b) = (&weight_nibbles[i * n_out..(i + 1) * n_out], i / bs);
        for (o, (v, &q)) in row.iter_mut().zip(codes).enumerate() {
            let (q, s1) = (i32::from(sign_extend_nibble(q)), i32::from(scale1[o * nb + b]));
            *v = (q * s1) as f32 * scale2[o];
        }
    });
    out
}

fn decode_unchecked(weight_hwio: &[i8], scale1: &[u8], scale2: &[f32], shape: LpbqShape) -> Vec<f32> {
    let (n_out, n_in, bs) = (shape.out_features, shape.in_features, shape.block_size);
    let nb = shape.blocks_per_channel();
    let mut out = vec![0f32; shape.num_weights()];
    out.par_chunks_mut(n_in).enumerate().with_min_len(8).for_each(|(o, row)| {
        let s2 = scale2[o];
        for (b, block) in row.chunks_exact_mut(bs).enumerate() {
            let s1 = i32::from(scale1[o * nb + b]);
            for (k, v) in block.iter_mut().enumerate() {
                let i = b * bs + k;
                let q = i32::from(sign_extend_nibble(weight_hwio[i * n_out + o]));
                *v = (q * s1) as f32 * s2;
            }
        }
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deterministic pseudo-random weights with a spread of block magnitudes.
    fn synthetic(n: usize, seed: u32) -> Vec<f32> {
        let mut state = seed.wrapping_mul(747_796_405).wrapping_add(2_891_336_453);
        (0..n)
            .map(|i| {
                state ^= state << 13;
                state ^= state >> 17;
                state ^= state << 5;
                let u = (state >> 8) as f32 / (1u32 << 24) as f32 - 0.5;
                u * (1.0 + (i % 37) as f32 * 0.1)
            })
            .collect()
    }

    /// Naive reference: straight from the formulas, no lanes, no parallelism, library rounding.
    fn naive(w: &[f32], out: usize, inp: usize, bs: usize) -> (Vec<i8>, Vec<f32>, Vec<u8>, Vec<f32>) {
        let nb = inp / bs;
        let mut codes = vec![0i8; out * inp];
        let mut scales = vec![0f32; out * nb];
        for o in 0..out {
            for b in 0..nb {
                let blk = &w[o * inp + b * bs..o * inp + (b + 1) * bs];
                let mn = blk.iter().copied().fold(f32::INFINITY, f32::min).min(0.0);
                let mx = blk.iter().copied().fold(f32::NEG_INFINITY, f32::max).max(0.0);
                let s = ((-mn).max(mx) / 7.0).max(LPBQ_EPS);
                scales[o * nb + b] = s;
                let inv = 1.0 / s;
                for k in 0..bs {
                    let q = (blk[k] * inv).round_ties_even().clamp(-7.0, 7.0);
                    codes[o * inp + b * bs + k] = q as i8;
                }
            }
        }
        let mut s1 = vec![0u8; out * nb];
        let mut s2 = vec![0f32; out];
        for o in 0..out {
            let m = scales[o * nb..(o + 1) * nb].iter().copied().fold(0.0f32, f32::max) / 16.0;
            s2[o] = m;
            for b in 0..nb {
                s1[o * nb + b] = (scales[o * nb + b] / m).round_ties_even().clamp(1.0, 16.0) as u8;
            }
        }
        (codes, scales, s1, s2)
    }

    #[test]
    fn matches_a_naive_transcription() {
        for (out, inp, bs) in [(3, 16, 16), (5, 48, 16), (70, 96, 32), (130, 64, 8), (2, 12, 4)] {
            let w = synthetic(out * inp, (out * inp) as u32);
            let shape = LpbqShape::new(out, inp, bs).unwrap();
            let bq = lpbq_block_quantize(&w, shape).unwrap();
            let (codes, scales, s1, s2) = naive(&w, out, inp, bs);
            assert_eq!(bq.codes, codes);
            assert_eq!(bq.block_scales, scales);
            let ex = bq.to_export();
            assert_eq!(ex.scale1, s1);
            assert_eq!(ex.scale2, s2);
            for o in 0..out {
                for i in 0..inp {
                    assert_eq!(ex.weight_hwio[i * out + o], codes[o * inp + i] & 0x0F);
                }
            }
            ex.validate().unwrap();
            let fq = bq.fake_quant_weights();
            for (k, v) in fq.iter().enumerate() {
                assert_eq!(*v, codes[k] as f32 * scales[(k / inp) * (inp / bs) + (k % inp) / bs]);
            }
        }
    }

    #[test]
    fn hand_computed_block() {
        // One block of 4: max |x| = 1.75 -> s = 0.25; x / s = [4, -2.5, 1.5, 7] -> [4, -2, 2, 7]
        // (ties to even).
        let w = [1.0f32, -0.625, 0.375, 1.75];
        let shape = LpbqShape::new(1, 4, 4).unwrap();
        let bq = lpbq_block_quantize(&w, shape).unwrap();
        assert_eq!(bq.block_scales, vec![0.25]);
        assert_eq!(bq.codes, vec![4, -2, 2, 7]);
        assert_eq!(bq.fake_quant_weights(), vec![1.0, -0.5, 0.5, 1.75]);
        let ex = bq.to_export();
        assert_eq!(ex.weight_hwio, vec![4, 14, 2, 7]);
        // One block: scale2 = s / 16, scale1 = 16.
        assert_eq!(ex.scale2, vec![0.25 / 16.0]);
        assert_eq!(ex.scale1, vec![16]);
    }

    #[test]
    fn zero_block_gets_eps_and_scale1_floor_of_one() {
        // Block 0 is all zeros (scale eps), block 1 is large: scale1 of block 0 clamps up to 1.
        let mut w = vec![0f32; 8];
        w[4..].copy_from_slice(&[7.0, -3.0, 1.0, 0.0]);
        let bq = lpbq_block_quantize(&w, LpbqShape::new(1, 8, 4).unwrap()).unwrap();
        assert_eq!(bq.block_scales, vec![LPBQ_EPS, 1.0]);
        assert_eq!(bq.codes, vec![0, 0, 0, 0, 7, -3, 1, 0]);
        let ex = bq.to_export();
        assert_eq!(ex.scale2, vec![1.0 / 16.0]);
        assert_eq!(ex.scale1, vec![1, 16]);
    }

    #[test]
    fn decode_uses_the_requantized_scales() {
        let w = synthetic(8 * 32, 7);
        let ex = quantize_lpbq(&w, LpbqShape::new(8, 32, 16).unwrap()).unwrap();
        let dec = decode_lpbq(&ex.weight_hwio, &ex.scale1, &ex.scale2, 32, 8, 16).unwrap();
        let hwio = ex.decode_hwio().unwrap();
        assert!((0..8).all(|o| (0..32).all(|i| hwio[i * 8 + o].to_bits() == dec[o * 32 + i].to_bits())));
        assert_eq!(dec, ex.decode().unwrap());
        for o in 0..8 {
            for i in 0..32 {
                let q = sign_extend_nibble(ex.weight_hwio[i * 8 + o]) as f32;
                let expect = q * f32::from(ex.scale1[o * 2 + i / 16]) * ex.scale2[o];
                assert_eq!(dec[o * 32 + i], expect);
            }
        }
    }

    #[test]
    fn transpose_handles_full_tiles_and_ragged_edges() {
        for (out, inp) in [(8, 8), (16, 64), (13, 24), (24, 12), (5, 7), (70, 130), (1, 200)] {
            let codes: Vec<i8> = (0..out * inp).map(|k| ((k * 7 + k / 3) % 15) as i8 - 7).collect();
            let shape = LpbqShape { out_features: out, in_features: inp, block_size: 1 };
            let hwio = transpose_to_hwio_nibbles(&codes, shape);
            for o in 0..out {
                for i in 0..inp {
                    assert_eq!(hwio[i * out + o], codes[o * inp + i] & 0x0F, "{out}x{inp} [{o}][{i}]");
                }
            }
        }
    }

    #[test]
    fn nibble_sign_extension() {
        for q in -7i8..=7 {
            assert_eq!(sign_extend_nibble(q & 0x0F), q);
        }
        assert_eq!(sign_extend_nibble(8), -8);
    }

    #[test]
    fn bad_inputs_are_errors() {
        assert_eq!(LpbqShape::new(4, 32, 0), Err(QuantError::ZeroBlockSize));
        assert_eq!(
            LpbqShape::new(4, 40, 16),
            Err(QuantError::BlockSizeDoesNotDivide { block_size: 16, in_features: 40 })
        );
        assert!(LpbqShape::new(0, 16, 16).is_err());
        let shape = LpbqShape::new(2, 16, 16).unwrap();
        assert!(matches!(lpbq_block_quantize(&[0.0; 31], shape), Err(QuantError::LengthMismatch { .. })));
        let mut w = vec![0.5f32; 32];
        w[21] = f32::NAN;
        match lpbq_block_quantize(&w, shape).unwrap_err() {
            QuantError::NonFinite { index, .. } => assert_eq!(index, 21),
            e => panic!("unexpected {e}"),
        }
        w[21] = f32::NEG_INFINITY;
        assert!(lpbq_block_quantize(&w, shape).is_err());
        assert!(decode_lpbq(&[16; 32], &[1, 1], &[1.0, 1.0], 16, 2, 16).is_err());
        assert!(decode_lpbq(&[0; 32], &[17, 1], &[1.0, 1.0], 16, 2, 16).is_err());
        assert!(decode_lpbq(&[0; 32], &[1, 1], &[0.0, 1.0], 16, 2, 16).is_err());
        assert!(decode_lpbq(&[0; 31], &[1, 1], &[1.0, 1.0], 16, 2, 16).is_err());
    }
}

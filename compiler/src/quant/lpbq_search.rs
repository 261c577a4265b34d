//! LPBQ scales chosen by error search instead of by each block's maximum (the `mse` weight
//! method; [`lpbq`](super::lpbq) is pymllm's round-to-nearest).
//!
//! ```no_run
//! # use compiler::quant::lpbq_search::lpbq_mse_search;
//! # use compiler::quant::LpbqShape;
//! # fn demo(w: &[f32], out: usize, inp: usize, input_energy: &[f32]) -> Result<(), compiler::quant::QuantError> {
//! let shape = LpbqShape::new(out, inp, 16)?;
//! let rounded = lpbq_mse_search(w, shape, Some(input_energy))?; // E[x_i^2] per input channel
//! let export = rounded.to_export()?; // pymllm's weight / scale1 / scale2
//! # Ok(())
//! # }
//! ```
//!
//! pymllm rounds each block with its own fp32 scale `max|w| / 7` and only afterwards squeezes the
//! scales onto the deployed grid `scale1 (1..=16) * scale2`, so the deployed weight is not what
//! the codes were rounded for. Here the search works on the deployed grid directly, per output
//! channel:
//! 1. `scale2 = gamma * max_b(max|w_b|) / (7 * 16)` for each `gamma` of [`SCALE2_GRID`]
//!    (`gamma < 1` clips the channel's largest block and makes the scale1 steps finer);
//! 2. each block picks the `scale1` near its round-to-nearest value that minimizes
//!    `sum_i h_i (w_i - q_i * scale1 * scale2)^2` with `q_i = clamp(round(w_i / (scale1 * scale2)), -7, 7)`;
//!    `h_i` is the input channel's energy on calibration data (`E[x_i^2]`, the diagonal of the
//!    layer's Hessian), or 1 without it;
//! 3. the channel keeps the `gamma` with the lowest total error.
//!
//! The codes are then exactly the deployed weight's codes, so decoding the export gives the
//! weight whose error was minimized.

use rayon::prelude::*;

use super::lpbq::{LpbqExport, LpbqShape, LPBQ_QMAX, LPBQ_QMIN, SCALE1_STEPS};
use super::QuantError;

/// Fractions of the channel maximum tried for `scale2`.
pub const SCALE2_GRID: [f32; 4] = [1.0, 0.94, 0.87, 0.8];
/// How far below its round-to-nearest value a block's `scale1` is searched (clipping the block).
pub const SCALE1_BELOW: u8 = 4;

/// Codes and two-level scales on the deployed grid, `[Out][In]` codes.
#[derive(Clone, Debug, PartialEq)]
pub struct LpbqRounded {
    pub shape: LpbqShape,
    /// `[Out][In]` codes in -7..=7.
    pub codes: Vec<i8>,
    /// `[Out * In/bs]` channel-major level-1 scales in 1..=16.
    pub scale1: Vec<u8>,
    /// `[Out]` level-2 scales.
    pub scale2: Vec<f32>,
}

impl LpbqRounded {
    /// The deployed weight `[Out][In]`, `(q * scale1) * scale2` as [`decode_lpbq`](super::decode_lpbq) computes it.
    pub fn deployed_weights(&self) -> Vec<f32> {
        let (inp, bs) = (self.shape.in_features(), self.shape.block_size());
        let nb = self.shape.blocks_per_channel();
        let mut out = vec![0f32; self.codes.len()];
        out.par_chunks_mut(inp).zip(self.codes.par_chunks(inp)).enumerate().for_each(|(o, (row, codes))| {
            for (i, (v, &q)) in row.iter_mut().zip(codes).enumerate() {
                let s1 = self.scale1[o * nb + i / bs];
                *v = f32::from(i16::from(q) * i16::from(s1)) * self.scale2[o];
            }
        });
        out
    }

    /// pymllm's export tensors for these codes and scales.
    pub fn to_export(&self) -> Result<LpbqExport, QuantError> {
        LpbqExport::from_codes(self.shape, &self.codes, self.scale1.clone(), self.scale2.clone())
    }
}

/// Round-to-nearest code of `w` for the deployed step `step = scale1 * scale2`.
#[inline(always)]
pub fn lpbq_code(w: f32, step: f32) -> i8 {
    code_with_inverse(w, 1.0 / step)
}

/// `clamp(round_half_even(w * inv), -7, 7)`. The product is clamped to +-8 first, far inside the
/// range where adding 1.5 * 2^23 rounds half to even exactly, so the sum's low mantissa bits are
/// the integer (no float-to-int conversion or libm call in the search's inner loop).
#[inline(always)]
fn code_with_inverse(w: f32, inv: f32) -> i8 {
    const MAGIC: f32 = 12_582_912.0;
    const MAGIC_BITS: i32 = 0x4B40_0000;
    let x = (w * inv).clamp(-8.0, 8.0);
    let q = (x + MAGIC).to_bits() as i32 - MAGIC_BITS;
    q.clamp(i32::from(LPBQ_QMIN), i32::from(LPBQ_QMAX)) as i8
}

/// How the error of a block's deployed weights is weighed.
#[derive(Clone, Copy, Debug)]
pub enum BlockWeights<'a> {
    /// `sum_i d_i^2`.
    Uniform,
    /// `sum_i h_i d_i^2`: one non-negative weight per input channel (`E[x_i^2]`).
    Diagonal(&'a [f32]),
    /// `d_b^T H_bb d_b`: `H_bb` is the block's `[bs][bs]` diagonal block of the row-major
    /// `[In][In]` `H = X^T X / N`, so the error is the block's share of `||X d||^2 / N`
    /// ([`seqmse`](super::seqmse)).
    BlockHessian(&'a [f32]),
}

/// The level-1 scales tried for a block whose round-to-nearest value is `nearest`:
/// `nearest - 4 ..= nearest + 1` within `1..=16` (below `nearest` clips the block's largest values).
pub fn scale1_candidates(nearest: u8) -> std::ops::RangeInclusive<u8> {
    nearest.saturating_sub(SCALE1_BELOW).max(1)..=(nearest + 1).min(SCALE1_STEPS)
}

/// Error of block `b` (input columns `b * bs ..`) of a row at level-1 scale `s1`, and its codes
/// when `codes` is given. `in_features` is the row width (the stride of a [`BlockWeights::BlockHessian`]).
#[inline]
fn block_error(
    w: &[f32],
    weights: BlockWeights<'_>,
    (b, in_features): (usize, usize),
    s1: u8,
    scale2: f32,
    codes: Option<&mut [i8]>,
) -> f64 {
    let bs = w.len();
    let inv = 1.0 / (f32::from(s1) * scale2);
    let diff = |x: f32| x - f32::from(i16::from(code_with_inverse(x, inv)) * i16::from(s1)) * scale2;
    let mut err = 0f32;
    match weights {
        BlockWeights::Uniform => w.iter().for_each(|&x| err += diff(x) * diff(x)),
        BlockWeights::Diagonal(h) => {
            for (&x, &hi) in w.iter().zip(&h[b * bs..(b + 1) * bs]) {
                let e = diff(x);
                err += e * e * hi;
            }
        }
        BlockWeights::BlockHessian(h) => {
            let mut buf = [0f32; MAX_HESSIAN_BLOCK];
            let mut heap = Vec::new();
            let d: &mut [f32] = if bs <= MAX_HESSIAN_BLOCK {
                &mut buf[..bs]
            } else {
                heap.resize(bs, 0f32);
                &mut heap
            };
            d.iter_mut().zip(w).for_each(|(d, &x)| *d = diff(x));
            for (i, &di) in d.iter().enumerate() {
                let row = &h[(b * bs + i) * in_features + b * bs..][..bs];
                err += di * row.iter().zip(d.iter()).map(|(a, b)| a * b).sum::<f32>();
            }
        }
    }
    if let Some(c) = codes {
        for (c, &x) in c.iter_mut().zip(w) {
            *c = code_with_inverse(x, inv);
        }
    }
    f64::from(err)
}

/// Widest block whose differences [`block_error`] keeps on the stack.
const MAX_HESSIAN_BLOCK: usize = 64;

/// The module docs' search for a row-major `[Out][In]` weight. `importance`, when given, holds
/// one non-negative weight per input channel. Parallel over output channels.
pub fn lpbq_mse_search(
    weight: &[f32],
    shape: LpbqShape,
    importance: Option<&[f32]>,
) -> Result<LpbqRounded, QuantError> {
    if let Some(h) = importance {
        if h.len() != shape.in_features() {
            return Err(QuantError::LengthMismatch {
                what: "LPBQ input importance [In]",
                expected: shape.in_features(),
                found: h.len(),
            });
        }
        if let Some(i) = h.iter().position(|x| !(x.is_finite() && *x >= 0.0)) {
            return Err(QuantError::NonFinite { what: "LPBQ input importance [In]", index: i, value: h[i] });
        }
    }
    lpbq_grid_search(weight, shape, importance.map_or(BlockWeights::Uniform, BlockWeights::Diagonal), &SCALE2_GRID)
}

/// The search with `scale2 = gamma * max|w| / (7 * 16)` for each `gamma` of `grid`, each block's
/// `scale1` from [`scale1_candidates`] and errors weighed by `weights`, whose sizes the caller
/// has checked against `shape`.
pub fn lpbq_grid_search(
    weight: &[f32],
    shape: LpbqShape,
    weights: BlockWeights<'_>,
    grid: &[f32],
) -> Result<LpbqRounded, QuantError> {
    let (inp, bs, nb) = (shape.in_features(), shape.block_size(), shape.blocks_per_channel());
    if weight.len() != shape.num_weights() {
        return Err(QuantError::LengthMismatch {
            what: "LPBQ weight [Out][In]",
            expected: shape.num_weights(),
            found: weight.len(),
        });
    }
    if let Some(i) = weight.iter().position(|x| !x.is_finite()) {
        return Err(QuantError::NonFinite { what: "LPBQ weight [Out][In]", index: i, value: weight[i] });
    }
    if grid.is_empty() {
        return Err(QuantError::LengthMismatch { what: "LPBQ scale2 grid", expected: 1, found: 0 });
    }
    if let Some(i) = grid.iter().position(|g| !(g.is_finite() && *g > 0.0)) {
        return Err(QuantError::BadScale { what: "LPBQ scale2 grid", index: i, value: grid[i] });
    }
    let mut codes = vec![0i8; shape.num_weights()];
    let mut scale1 = vec![0u8; shape.num_blocks()];
    let mut scale2 = vec![0f32; shape.out_features()];
    // Per-channel weights laid out for the lane search (the same for every row).
    let lanes = match weights {
        BlockWeights::Uniform => Some(LaneLayout::new(None, bs, nb)),
        BlockWeights::Diagonal(h) => Some(LaneLayout::new(Some(h), bs, nb)),
        BlockWeights::BlockHessian(_) => None,
    };
    codes
        .par_chunks_mut(inp)
        .zip(scale1.par_chunks_mut(nb))
        .zip(scale2.par_iter_mut())
        .zip(weight.par_chunks(inp))
        .with_min_len(4)
        .for_each(|(((code_row, s1_row), s2), w_row)| {
            let absmax: Vec<f32> = w_row.chunks_exact(bs).map(|b| b.iter().fold(0f32, |m, x| m.max(x.abs()))).collect();
            let row_max = absmax.iter().copied().fold(0f32, f32::max);
            if row_max == 0.0 {
                // An all-zero channel: any scale decodes to zero; keep pymllm's eps-sized one.
                *s2 = super::lpbq::LPBQ_EPS / f32::from(SCALE1_STEPS);
                s1_row.fill(1);
                code_row.fill(0);
                return;
            }
            let (best_s2, picks) = match &lanes {
                Some(layout) => layout.search_row(w_row, &absmax, row_max, grid),
                None => search_row_by_block(w_row, &absmax, row_max, weights, grid, inp),
            };
            *s2 = best_s2;
            for (b, (w, c)) in w_row.chunks_exact(bs).zip(code_row.chunks_exact_mut(bs)).enumerate() {
                block_error(w, BlockWeights::Uniform, (b, inp), picks[b], best_s2, Some(c));
            }
            s1_row.copy_from_slice(&picks);
        });
    Ok(LpbqRounded { shape, codes, scale1, scale2 })
}

/// The `scale2` candidate for `gamma` of a row whose largest weight is `row_max`.
#[inline]
fn scale2_candidate(gamma: f32, row_max: f32) -> f32 {
    gamma * row_max / (f32::from(LPBQ_QMAX) * f32::from(SCALE1_STEPS))
}

/// The round-to-nearest level-1 scale of a block whose largest weight is `absmax`.
#[inline]
fn nearest_scale1(absmax: f32, scale2: f32) -> u8 {
    (absmax / f32::from(LPBQ_QMAX) / scale2).round().clamp(1.0, 16.0) as u8
}

/// One row's search, block by block with [`block_error`]: `(scale2, scale1 per block)`.
fn search_row_by_block(
    w_row: &[f32],
    absmax: &[f32],
    row_max: f32,
    weights: BlockWeights<'_>,
    grid: &[f32],
    inp: usize,
) -> (f32, Vec<u8>) {
    let (nb, bs) = (absmax.len(), w_row.len() / absmax.len());
    let mut best: Option<(f64, f32, Vec<u8>)> = None;
    for &gamma in grid {
        let cand_s2 = scale2_candidate(gamma, row_max);
        let mut total = 0f64;
        let mut picks = Vec::with_capacity(nb);
        for (b, w) in w_row.chunks_exact(bs).enumerate() {
            let (e, s) = scale1_candidates(nearest_scale1(absmax[b], cand_s2))
                .map(|s| (block_error(w, weights, (b, inp), s, cand_s2, None), s))
                .min_by(|a, b| a.0.total_cmp(&b.0))
                .expect("at least one scale1 candidate");
            total += e;
            picks.push(s);
        }
        if best.as_ref().is_none_or(|(e, _, _)| total < *e) {
            best = Some((total, cand_s2, picks));
        }
    }
    let (_, s2, picks) = best.expect("the scale2 grid is not empty");
    (s2, picks)
}

/// Blocks evaluated side by side by the lane search.
const LANES: usize = 16;

/// The per-channel weights of a `Uniform` / `Diagonal` search laid out for [`LaneLayout::search_row`]:
/// element `i` of block `b` at `[i][b]`, blocks padded to a multiple of [`LANES`].
///
/// The lane search gives bit for bit [`search_row_by_block`]'s answer: each lane (one block)
/// performs the same `f32` operations in the same order as [`block_error`] (a weight of 1 for
/// `Uniform` multiplies exactly), candidates are tried in the same order and the first smallest
/// error wins, as `min_by` picks it. Only the blocks run side by side, which the compiler turns
/// into vector instructions instead of one long chain of dependent additions per block.
struct LaneLayout {
    bs: usize,
    nb: usize,
    /// Blocks rounded up to a multiple of [`LANES`].
    padded: usize,
    /// `[bs][padded]` per-channel weights (0 in the padding).
    h: Vec<f32>,
}

impl LaneLayout {
    fn new(h: Option<&[f32]>, bs: usize, nb: usize) -> LaneLayout {
        let padded = nb.div_ceil(LANES) * LANES;
        let mut t = vec![0f32; bs * padded];
        for b in 0..nb {
            for i in 0..bs {
                t[i * padded + b] = h.map_or(1.0, |h| h[b * bs + i]);
            }
        }
        LaneLayout { bs, nb, padded, h: t }
    }

    /// One row's search: `(scale2, scale1 per block)`.
    fn search_row(&self, w_row: &[f32], absmax: &[f32], row_max: f32, grid: &[f32]) -> (f32, Vec<u8>) {
        mllm_dsl::simd::widest(
            #[inline(always)]
            || self.search_row_here(w_row, absmax, row_max, grid),
        )
    }

    #[inline(always)]
    fn search_row_here(&self, w_row: &[f32], absmax: &[f32], row_max: f32, grid: &[f32]) -> (f32, Vec<u8>) {
        let (bs, nb, padded) = (self.bs, self.nb, self.padded);
        let mut w = vec![0f32; bs * padded];
        for (b, blk) in w_row.chunks_exact(bs).enumerate() {
            for (i, &x) in blk.iter().enumerate() {
                w[i * padded + b] = x;
            }
        }
        let mut lo = vec![1u8; padded];
        let mut hi = vec![0u8; padded];
        let mut best_err = vec![0f32; padded];
        let mut pick = vec![0u8; padded];
        let mut best: Option<(f64, f32, Vec<u8>)> = None;
        for &gamma in grid {
            let cand_s2 = scale2_candidate(gamma, row_max);
            for b in 0..nb {
                let range = scale1_candidates(nearest_scale1(absmax[b], cand_s2));
                (lo[b], hi[b]) = (*range.start(), *range.end());
            }
            for k in 0..=SCALE1_BELOW + 1 {
                for g in (0..padded).step_by(LANES) {
                    let s1: [u8; LANES] = std::array::from_fn(|l| lo[g + l] + k);
                    let err = self.lane_errors(&w, g, &s1, cand_s2);
                    for l in 0..LANES {
                        let b = g + l;
                        if s1[l] > hi[b] {
                            continue;
                        }
                        if k == 0 || err[l] < best_err[b] {
                            (best_err[b], pick[b]) = (err[l], s1[l]);
                        }
                    }
                }
            }
            let total: f64 = best_err[..nb].iter().map(|&e| f64::from(e)).sum();
            if best.as_ref().is_none_or(|(e, _, _)| total < *e) {
                best = Some((total, cand_s2, pick[..nb].to_vec()));
            }
        }
        let (_, s2, picks) = best.expect("the scale2 grid is not empty");
        (s2, picks)
    }

    /// [`block_error`] of blocks `g..g + LANES` at level-1 scales `s1`, side by side.
    #[inline(always)]
    fn lane_errors(&self, w: &[f32], g: usize, s1: &[u8; LANES], scale2: f32) -> [f32; LANES] {
        let inv: [f32; LANES] = std::array::from_fn(|l| 1.0 / (f32::from(s1[l]) * scale2));
        let s1: [i32; LANES] = std::array::from_fn(|l| i32::from(s1[l]));
        let mut err = [0f32; LANES];
        for i in 0..self.bs {
            let row = i * self.padded + g;
            let (x, h) = (&w[row..row + LANES], &self.h[row..row + LANES]);
            for l in 0..LANES {
                let q = i32::from(code_with_inverse(x[l], inv[l]));
                let e = x[l] - (q * s1[l]) as f32 * scale2;
                err[l] += e * e * h[l];
            }
        }
        err
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::lpbq::quantize_lpbq;

    fn synthetic(n: usize, seed: u32) -> Vec<f32> {
        // Heavy-ish tails: a few large values per block, like trained weights.
        crate::quant::test_data::cubed(n, seed, 8.0)
    }

    fn sq_err(a: &[f32], b: &[f32], h: Option<&[f32]>, inp: usize) -> f64 {
        a.iter()
            .zip(b)
            .enumerate()
            .map(|(k, (x, y))| f64::from(x - y).powi(2) * h.map_or(1.0, |h| f64::from(h[k % inp])))
            .sum()
    }

    #[test]
    fn search_beats_pymllm_rounding_and_decodes_to_its_own_weights() {
        let (out, inp) = (24, 64);
        let w = synthetic(out * inp, 7);
        let shape = LpbqShape::new(out, inp, 16).unwrap();
        let rtn = quantize_lpbq(&w, shape).unwrap().decode().unwrap();
        let found = lpbq_mse_search(&w, shape, None).unwrap();
        let export = found.to_export().unwrap();
        assert_eq!(export.decode().unwrap(), found.deployed_weights());
        let (e_rtn, e_mse) = (sq_err(&w, &rtn, None, inp), sq_err(&w, &found.deployed_weights(), None, inp));
        assert!(e_mse < 0.9 * e_rtn, "search {e_mse} vs round-to-nearest {e_rtn}");
    }

    #[test]
    fn importance_moves_error_to_unimportant_channels() {
        let (out, inp) = (16, 32);
        let w = synthetic(out * inp, 11);
        let shape = LpbqShape::new(out, inp, 16).unwrap();
        let h: Vec<f32> = (0..inp).map(|i| if i % 16 < 4 { 100.0 } else { 0.01 }).collect();
        let plain = lpbq_mse_search(&w, shape, None).unwrap().deployed_weights();
        let weighted = lpbq_mse_search(&w, shape, Some(&h)).unwrap().deployed_weights();
        assert!(sq_err(&w, &weighted, Some(&h), inp) <= sq_err(&w, &plain, Some(&h), inp));
    }

    #[test]
    fn lane_search_picks_exactly_what_the_block_by_block_search_picks() {
        // 37 blocks: two full lane groups and a padded one; weights with ties and heavy tails.
        let (bs, nb) = (16, 37);
        let inp = bs * nb;
        let importance: Vec<f32> =
            synthetic(inp, 5).iter().enumerate().map(|(i, x)| if i % 7 == 0 { 0.0 } else { x.abs() }).collect();
        for (seed, h) in [(1, None), (2, Some(importance.as_slice())), (3, Some(&importance[..]))] {
            let mut w = synthetic(8 * inp, seed);
            // A block of equal magnitudes, and an all-zero block whose candidates all have error 0,
            // where the first candidate must win.
            w[..bs].iter_mut().enumerate().for_each(|(i, x)| *x = if i % 2 == 0 { 0.5 } else { -0.5 });
            w[bs..2 * bs].fill(0.0);
            let weights = h.map_or(BlockWeights::Uniform, BlockWeights::Diagonal);
            let layout = LaneLayout::new(h, bs, nb);
            for row in w.chunks_exact(inp) {
                let absmax: Vec<f32> =
                    row.chunks_exact(bs).map(|b| b.iter().fold(0f32, |m, x| m.max(x.abs()))).collect();
                let row_max = absmax.iter().copied().fold(0f32, f32::max);
                let by_block = search_row_by_block(row, &absmax, row_max, weights, &SCALE2_GRID, inp);
                assert_eq!(layout.search_row(row, &absmax, row_max, &SCALE2_GRID), by_block, "seed {seed}");
            }
        }
    }

    #[test]
    fn zero_channels_and_bad_inputs() {
        let shape = LpbqShape::new(2, 16, 16).unwrap();
        let mut w = vec![0f32; 32];
        w[20] = 1.0;
        let r = lpbq_mse_search(&w, shape, None).unwrap();
        assert!(r.codes[..16].iter().all(|&c| c == 0));
        assert_eq!(r.deployed_weights()[20], 1.0);
        assert!(lpbq_mse_search(&w[..31], shape, None).is_err());
        w[3] = f32::NAN;
        assert!(matches!(lpbq_mse_search(&w, shape, None), Err(QuantError::NonFinite { index: 3, .. })));
        assert!(lpbq_mse_search(&[0.0; 32], shape, Some(&[1.0; 15])).is_err());
    }
}

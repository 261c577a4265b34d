//! GPTQ-style error-compensating rounding of LPBQ codes (Frantar et al., 2022), on the scales a
//! search already fixed on the deployed grid.
//!
//! ```no_run
//! # use backend_cpu::quant::gptq::{gptq_lpbq, HessianFactors};
//! # use backend_cpu::quant::LinearStats;
//! # use compiler::quant::lpbq_search::lpbq_mse_search;
//! # use compiler::quant::LpbqShape;
//! # fn demo(w: &[f32], shape: LpbqShape, stats: &LinearStats) -> Result<(), Box<dyn std::error::Error>> {
//! let scales = lpbq_mse_search(w, shape, Some(stats.diagonal()))?;
//! let rounded = gptq_lpbq(w, &scales, &HessianFactors::new(stats)?)?; // same scales, GPTQ codes
//! # Ok(())
//! # }
//! ```
//!
//! For each output channel the input columns are rounded in order; the error of column `i`
//! (divided by `U[i][i]`) is spread over the not yet rounded columns through row `i` of `U`, the
//! upper Cholesky factor of `H^-1` with `H = X^T X / N + damp` from calibration data. This
//! minimizes `|| X (w - w_q) ||^2` column by column instead of `|| w - w_q ||^2`.
//!
//! Because the scales are fixed beforehand (`scale1 * scale2`, the deployed steps), the codes are
//! exactly what the NPU multiplies: no second rounding of scales undoes the compensation.
//!
//! Columns go in "act order" (most input energy first). Cost: `H^-1`'s factor is `O(In^3)`, once
//! per distinct input ([`HessianFactors`]); inputs wider than [`MAX_HESSIAN_BLOCK`] are split into
//! diagonal blocks (error feedback stays inside a block), which keeps `down_proj`-sized inputs
//! cheap. The feedback itself is `O(Out * In * block)`, parallel over output channels.

use rayon::prelude::*;

use compiler::quant::lpbq_search::{lpbq_code, LpbqRounded};
use compiler::quant::QuantError;

use super::input_stats::LinearStats;

/// Why GPTQ could not round a weight.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum GptqError {
    #[error(transparent)]
    Shape(#[from] QuantError),
    #[error("the damped input Hessian is not positive definite at input column {column}")]
    NotPositiveDefinite { column: usize },
}

/// Fraction of the mean diagonal added to `H`'s diagonal (GPTQ's `percdamp`).
pub const DAMP: f64 = 0.01;
/// Widest diagonal block of `H` that is factorized as one.
pub const MAX_HESSIAN_BLOCK: usize = 768;
/// Output channels rounded together, sharing each row of `U` (identical results, less memory traffic).
const ROWS_PER_PASS: usize = 8;

/// The upper Cholesky factor `U` of `H^-1` (`H^-1 = U^T U`), `[n][n]` row-major f32, for the
/// `n x n` block of the symmetric `h` (stride `stride`) starting at `start`.
///
/// `H = V V^T` with `V = U^-1` upper triangular is a Cholesky factorization in reversed index
/// order, so `U` is the reversed inverse of the ordinary Cholesky factor of reversed `H`.
fn inverse_upper_factor(h: &[f32], stride: usize, cols: &[usize]) -> Result<Vec<f32>, GptqError> {
    mllm_dsl::simd::widest(
        #[inline(always)]
        || inverse_upper_factor_here(h, stride, cols),
    )
}

#[inline(always)]
fn inverse_upper_factor_here(h: &[f32], stride: usize, cols: &[usize]) -> Result<Vec<f32>, GptqError> {
    let n = cols.len();
    let rev = |i: usize| cols[n - 1 - i];
    // Reversed, damped H in f64.
    let mut a = vec![0f64; n * n];
    let mean_diag = cols.iter().map(|&c| f64::from(h[c * stride + c])).sum::<f64>() / n as f64;
    let damp = DAMP * mean_diag.max(f64::MIN_POSITIVE);
    for i in 0..n {
        for j in 0..n {
            a[i * n + j] = f64::from(h[rev(i) * stride + rev(j)]);
        }
        if a[i * n + i] <= 0.0 {
            a[i * n + i] = 1.0; // a dead input: no signal, any code is as good
        }
        a[i * n + i] += damp;
    }
    // Lower Cholesky in place (row-wise, dot products over contiguous rows).
    for i in 0..n {
        for j in 0..=i {
            let dot = dot4(&a[i * n..i * n + j], &a[j * n..j * n + j]);
            let v = a[i * n + j] - dot;
            if i == j {
                if v <= 0.0 {
                    return Err(GptqError::NotPositiveDefinite { column: rev(i) });
                }
                a[i * n + i] = v.sqrt();
            } else {
                a[i * n + j] = v / a[j * n + j];
            }
        }
        for j in i + 1..n {
            a[i * n + j] = 0.0;
        }
    }
    // Inverse of the lower factor, row by row: X[i] = (e_i - sum_{k<i} L[i][k] X[k]) / L[i][i],
    // each step an axpy over contiguous rows.
    let mut inv = vec![0f64; n * n];
    for i in 0..n {
        let (done, rest) = inv.split_at_mut(i * n);
        let row = &mut rest[..n];
        row[i] = 1.0;
        for k in 0..i {
            let l = a[i * n + k];
            if l != 0.0 {
                row[..=k].iter_mut().zip(&done[k * n..k * n + k + 1]).for_each(|(r, x)| *r -= l * x);
            }
        }
        let d = a[i * n + i];
        row[..=i].iter_mut().for_each(|r| *r /= d);
    }
    // U[i][j] = inv[rev(j)][rev(i)] in block-local indices: reversed and transposed.
    let mut u = vec![0f32; n * n];
    for i in 0..n {
        for j in i..n {
            u[i * n + j] = inv[(n - 1 - i) * n + (n - 1 - j)] as f32;
        }
    }
    Ok(u)
}

/// `sum x_i y_i` with four independent accumulators (so the compiler can vectorize it).
#[inline(always)]
fn dot4(x: &[f64], y: &[f64]) -> f64 {
    let mut acc = [0f64; 4];
    let (xc, yc) = (x.chunks_exact(4), y.chunks_exact(4));
    let tail: f64 = xc.remainder().iter().zip(yc.remainder()).map(|(a, b)| a * b).sum();
    for (a, b) in xc.zip(yc) {
        for k in 0..4 {
            acc[k] += a[k] * b[k];
        }
    }
    acc[0] + acc[1] + acc[2] + acc[3] + tail
}

/// What GPTQ needs from one input Hessian, computed once for all linears sharing the input
/// (q/k/v, gate/up): the diagonal blocks of at most [`MAX_HESSIAN_BLOCK`] columns, each in
/// "act order" (columns with the most input energy first, so the error of the most sensitive
/// columns is spread over the most others), and `U` of each block.
pub struct HessianFactors {
    features: usize,
    /// Per block, the original column indices in processing order.
    blocks: Vec<Vec<usize>>,
    /// Per block, `U` `[n][n]` of the permuted block.
    factors: Vec<Vec<f32>>,
}

impl HessianFactors {
    pub fn new(stats: &LinearStats) -> Result<Self, GptqError> {
        let inp = stats.features();
        if !stats.has_hessian() {
            return Err(GptqError::Shape(QuantError::LengthMismatch {
                what: "GPTQ input Hessian [In][In]",
                expected: inp * inp,
                found: stats.hessian().len(),
            }));
        }
        let parts = inp.div_ceil(MAX_HESSIAN_BLOCK).max(1);
        let per = inp.div_ceil(parts);
        let diag = stats.diagonal();
        let blocks: Vec<Vec<usize>> = (0..inp)
            .step_by(per.max(1))
            .map(|s| {
                let mut cols: Vec<usize> = (s..(s + per).min(inp)).collect();
                cols.sort_by(|&a, &b| diag[b].total_cmp(&diag[a]));
                cols
            })
            .collect();
        let factors =
            blocks.par_iter().map(|cols| inverse_upper_factor(stats.hessian(), inp, cols)).collect::<Result<_, _>>()?;
        Ok(HessianFactors { features: inp, blocks, factors })
    }
}

/// GPTQ codes for the row-major `[Out][In]` `weight` on the steps of `scales` (module docs).
pub fn gptq_lpbq(weight: &[f32], scales: &LpbqRounded, h: &HessianFactors) -> Result<LpbqRounded, GptqError> {
    let shape = scales.shape;
    let inp = shape.in_features();
    if weight.len() != shape.num_weights() {
        return Err(QuantError::LengthMismatch {
            what: "GPTQ weight [Out][In]",
            expected: shape.num_weights(),
            found: weight.len(),
        }
        .into());
    }
    if h.features != inp {
        return Err(
            QuantError::LengthMismatch { what: "GPTQ input Hessian [In]", expected: inp, found: h.features }.into()
        );
    }
    let mut codes = vec![0i8; weight.len()];
    // Output channels go in groups that share each row of `U` while it is in cache; every channel
    // still sees exactly its own sequence of operations.
    let group = ROWS_PER_PASS * inp;
    codes.par_chunks_mut(group).zip(weight.par_chunks(group)).enumerate().for_each(|(g, (q_rows, w_rows))| {
        mllm_dsl::simd::widest(
            #[inline(always)]
            || round_channels(g * ROWS_PER_PASS, q_rows, w_rows, scales, h),
        )
    });
    Ok(LpbqRounded { shape, codes, scale1: scales.scale1.clone(), scale2: scales.scale2.clone() })
}

/// GPTQ's codes `q_rows` of the channels `first..` whose weights are `w_rows` (module docs).
#[inline(always)]
fn round_channels(first: usize, q_rows: &mut [i8], w_rows: &[f32], scales: &LpbqRounded, h: &HessianFactors) {
    let shape = scales.shape;
    let (inp, bs, nb) = (shape.in_features(), shape.block_size(), shape.blocks_per_channel());
    let rows = w_rows.len() / inp;
    let mut w = vec![0f32; rows * MAX_HESSIAN_BLOCK];
    let mut err = [0f32; ROWS_PER_PASS];
    for (cols, u) in h.blocks.iter().zip(&h.factors) {
        let n = cols.len();
        // The block's weights of each channel in processing order, updated in place.
        for (r, w_row) in w_rows.chunks_exact(inp).enumerate() {
            w[r * n..(r + 1) * n].iter_mut().zip(cols).for_each(|(x, &c)| *x = w_row[c]);
        }
        for i in 0..n {
            let col = cols[i];
            for r in 0..rows {
                let o = first + r;
                let (s1, s2) = (scales.scale1[o * nb + col / bs], scales.scale2[o]);
                let wi = w[r * n + i];
                let q = lpbq_code(wi, f32::from(s1) * s2);
                q_rows[r * inp + col] = q;
                let deq = f32::from(i16::from(q) * i16::from(s1)) * s2;
                err[r] = (wi - deq) / u[i * n + i];
            }
            let u_row = &u[i * n + i + 1..(i + 1) * n];
            for (r, &e) in err[..rows].iter().enumerate() {
                let rest = &mut w[r * n + i + 1..(r + 1) * n];
                rest.iter_mut().zip(u_row).for_each(|(x, &f)| *x -= e * f);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use compiler::quant::lpbq::LpbqShape;
    use compiler::quant::lpbq_search::lpbq_mse_search;

    struct Lcg(u32);
    impl Lcg {
        fn next(&mut self) -> f32 {
            self.0 = self.0.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (self.0 >> 8) as f32 / (1u32 << 24) as f32 - 0.5
        }
    }

    #[test]
    fn inverse_factor_satisfies_its_definition() {
        let n = 5;
        let mut g = Lcg(3);
        let x: Vec<f32> = (0..40 * n).map(|_| g.next()).collect();
        let mut h = vec![0f32; n * n];
        for r in x.chunks_exact(n) {
            for i in 0..n {
                for j in 0..n {
                    h[i * n + j] += r[i] * r[j] / 40.0;
                }
            }
        }
        let u = inverse_upper_factor(&h, n, &(0..n).collect::<Vec<_>>()).unwrap();
        // (U^T U) (H + damp I) = I
        let damp = DAMP * (0..n).map(|i| f64::from(h[i * n + i])).sum::<f64>() / n as f64;
        for i in 0..n {
            for j in 0..n {
                let v: f64 = (0..n)
                    .map(|k| {
                        let utu: f64 = (0..n).map(|m| f64::from(u[m * n + i]) * f64::from(u[m * n + k])).sum();
                        utu * (f64::from(h[k * n + j]) + if k == j { damp } else { 0.0 })
                    })
                    .sum();
                assert!((v - f64::from(u8::from(i == j))).abs() < 1e-4, "({i},{j}) = {v}");
            }
        }
    }

    /// `X^T X / N` of the row-major `[N][inp]` inputs `x`, summed the plain way.
    fn stats_of(x: &[f32], inp: usize) -> LinearStats {
        let mut sum = vec![0f32; inp * inp];
        for r in x.chunks_exact(inp) {
            for i in 0..inp {
                for j in 0..inp {
                    sum[i * inp + j] += r[i] * r[j];
                }
            }
        }
        LinearStats::from_sum(inp, sum, x.len() / inp).unwrap()
    }

    /// GPTQ's loop one output channel at a time, as the paper writes it.
    fn one_channel_at_a_time(weight: &[f32], scales: &LpbqRounded, h: &HessianFactors) -> Vec<i8> {
        let (inp, bs, nb) = (scales.shape.in_features(), scales.shape.block_size(), scales.shape.blocks_per_channel());
        let mut codes = vec![0i8; weight.len()];
        for (o, (q_row, w_row)) in codes.chunks_mut(inp).zip(weight.chunks(inp)).enumerate() {
            for (cols, u) in h.blocks.iter().zip(&h.factors) {
                let n = cols.len();
                let mut w: Vec<f32> = cols.iter().map(|&c| w_row[c]).collect();
                for i in 0..n {
                    let s1 = scales.scale1[o * nb + cols[i] / bs];
                    let q = lpbq_code(w[i], f32::from(s1) * scales.scale2[o]);
                    q_row[cols[i]] = q;
                    let err = (w[i] - f32::from(i16::from(q) * i16::from(s1)) * scales.scale2[o]) / u[i * n + i];
                    for j in i + 1..n {
                        w[j] -= err * u[i * n + j];
                    }
                }
            }
        }
        codes
    }

    #[test]
    fn channels_rounded_in_groups_get_the_codes_of_one_at_a_time() {
        // 13 channels (a partial group) of 800 inputs (two Hessian blocks).
        let (out, inp, rows) = (13, 800, 900);
        let mut g = Lcg(21);
        let x: Vec<f32> = (0..rows * inp).map(|_| g.next()).collect();
        let stats = stats_of(&x, inp);
        let w: Vec<f32> = (0..out * inp).map(|_| g.next()).collect();
        let scales = lpbq_mse_search(&w, LpbqShape::new(out, inp, 16).unwrap(), Some(stats.diagonal())).unwrap();
        let factors = HessianFactors::new(&stats).unwrap();
        assert_eq!(factors.blocks.len(), 2);
        assert_eq!(gptq_lpbq(&w, &scales, &factors).unwrap().codes, one_channel_at_a_time(&w, &scales, &factors));
    }

    #[test]
    fn gptq_lowers_the_output_error_on_correlated_inputs() {
        let (out, inp, rows) = (8, 32, 256);
        let mut g = Lcg(9);
        // Correlated inputs: a shared component plus noise.
        let x: Vec<f32> = (0..rows)
            .flat_map(|_| {
                let c = g.next() * 4.0;
                (0..inp).map(|_| c + g.next()).collect::<Vec<_>>()
            })
            .collect();
        let w: Vec<f32> = (0..out * inp).map(|_| g.next()).collect();
        let stats = stats_of(&x, inp);
        let shape = LpbqShape::new(out, inp, 16).unwrap();
        let scales = lpbq_mse_search(&w, shape, Some(stats.diagonal())).unwrap();
        let factors = HessianFactors::new(&stats).unwrap();
        let gptq = gptq_lpbq(&w, &scales, &factors).unwrap();
        assert_eq!((&gptq.scale1, &gptq.scale2), (&scales.scale1, &scales.scale2));
        let out_err = |wq: &[f32]| -> f64 {
            x.chunks_exact(inp)
                .map(|r| {
                    (0..out)
                        .map(|o| {
                            let d: f32 = (0..inp).map(|i| r[i] * (w[o * inp + i] - wq[o * inp + i])).sum();
                            f64::from(d * d)
                        })
                        .sum::<f64>()
                })
                .sum()
        };
        let (e_near, e_gptq) = (out_err(&scales.deployed_weights()), out_err(&gptq.deployed_weights()));
        assert!(e_gptq < 0.8 * e_near, "GPTQ {e_gptq} vs nearest {e_near}");
        assert!(gptq_lpbq(&w[1..], &scales, &factors).is_err());
    }
}

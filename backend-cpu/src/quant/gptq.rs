//! GPTQ-style error-compensating rounding of LPBQ codes (Frantar et al., 2022), on the scales a
//! search already fixed on the deployed grid.
//!
//! ```ignore
//! let scales = lpbq_mse_search(&w, shape, Some(stats.diagonal()))?;
//! let rounded = gptq_lpbq(&w, &scales, stats)?; // same scales, codes with error feedback
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
//! Cost: `H^-1`'s factor is `O(In^3)`; inputs wider than [`MAX_HESSIAN_BLOCK`] are split into
//! diagonal blocks (error feedback stays inside a block), which keeps `down_proj`-sized inputs
//! cheap. The feedback itself is `O(Out * In * block)`, parallel over output channels.

use rayon::prelude::*;

use mllm_dsl::quant::lpbq_search::{lpbq_code, LpbqRounded};
use mllm_dsl::quant::QuantError;

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

/// The upper Cholesky factor `U` of `H^-1` (`H^-1 = U^T U`), `[n][n]` row-major f32, for the
/// `n x n` block of the symmetric `h` (stride `stride`) starting at `start`.
///
/// `H = V V^T` with `V = U^-1` upper triangular is a Cholesky factorization in reversed index
/// order, so `U` is the reversed inverse of the ordinary Cholesky factor of reversed `H`.
fn inverse_upper_factor(h: &[f32], stride: usize, start: usize, n: usize) -> Result<Vec<f32>, GptqError> {
    let rev = |i: usize| start + n - 1 - i;
    // Reversed, damped H in f64.
    let mut a = vec![0f64; n * n];
    let mean_diag = (0..n).map(|i| f64::from(h[(start + i) * stride + start + i])).sum::<f64>() / n as f64;
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
            let dot: f64 = a[i * n..i * n + j].iter().zip(&a[j * n..j * n + j]).map(|(x, y)| x * y).sum();
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
    // Inverse of the lower factor, column by column (forward substitution on unit vectors).
    let mut inv = vec![0f64; n * n];
    for c in 0..n {
        inv[c * n + c] = 1.0 / a[c * n + c];
        for i in c + 1..n {
            let s: f64 = (c..i).map(|k| a[i * n + k] * inv[k * n + c]).sum();
            inv[i * n + c] = -s / a[i * n + i];
        }
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

/// GPTQ codes for the row-major `[Out][In]` `weight` on the steps of `scales` (module docs).
pub fn gptq_lpbq(weight: &[f32], scales: &LpbqRounded, stats: &LinearStats) -> Result<LpbqRounded, GptqError> {
    let shape = scales.shape;
    let (inp, bs, nb) = (shape.in_features(), shape.block_size(), shape.blocks_per_channel());
    if weight.len() != shape.num_weights() {
        return Err(QuantError::LengthMismatch {
            what: "GPTQ weight [Out][In]",
            expected: shape.num_weights(),
            found: weight.len(),
        }
        .into());
    }
    if stats.features() != inp {
        let found = stats.features();
        return Err(QuantError::LengthMismatch { what: "GPTQ input Hessian [In]", expected: inp, found }.into());
    }
    // Diagonal blocks of at most MAX_HESSIAN_BLOCK columns, each a whole number of LPBQ blocks.
    let parts = inp.div_ceil(MAX_HESSIAN_BLOCK);
    let per = inp.div_ceil(parts).div_ceil(bs) * bs;
    let ranges: Vec<(usize, usize)> = (0..inp).step_by(per).map(|s| (s, (s + per).min(inp))).collect();
    let factors: Vec<Vec<f32>> = ranges
        .par_iter()
        .map(|&(s, e)| inverse_upper_factor(stats.hessian(), inp, s, e - s))
        .collect::<Result<_, _>>()?;
    let mut codes = vec![0i8; weight.len()];
    codes.par_chunks_mut(inp).zip(weight.par_chunks(inp)).enumerate().with_min_len(4).for_each(
        |(o, (q_row, w_row))| {
            let mut w = w_row.to_vec();
            let s2 = scales.scale2[o];
            for (&(start, end), u) in ranges.iter().zip(&factors) {
                let n = end - start;
                for i in 0..n {
                    let col = start + i;
                    let s1 = scales.scale1[o * nb + col / bs];
                    let q = lpbq_code(w[col], f32::from(s1) * s2);
                    q_row[col] = q;
                    let deq = f32::from(i16::from(q) * i16::from(s1)) * s2;
                    let err = (w[col] - deq) / u[i * n + i];
                    let (rest, u_row) = (&mut w[col + 1..end], &u[i * n + i + 1..(i + 1) * n]);
                    rest.iter_mut().zip(u_row).for_each(|(x, &f)| *x -= err * f);
                }
            }
        },
    );
    Ok(LpbqRounded { shape, codes, scale1: scales.scale1.clone(), scale2: scales.scale2.clone() })
}

#[cfg(test)]
mod tests {
    use super::*;
    use mllm_dsl::quant::lpbq::LpbqShape;
    use mllm_dsl::quant::lpbq_search::lpbq_mse_search;

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
        let u = inverse_upper_factor(&h, n, 0, n).unwrap();
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
        let mut sum = vec![0f32; inp * inp];
        for r in x.chunks_exact(inp) {
            for i in 0..inp {
                for j in 0..inp {
                    sum[i * inp + j] += r[i] * r[j];
                }
            }
        }
        let stats = LinearStats::from_sum(inp, sum, rows).unwrap();
        let shape = LpbqShape::new(out, inp, 16).unwrap();
        let scales = lpbq_mse_search(&w, shape, Some(stats.diagonal())).unwrap();
        let gptq = gptq_lpbq(&w, &scales, &stats).unwrap();
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
        assert!(gptq_lpbq(&w[1..], &scales, &stats).is_err());
    }
}

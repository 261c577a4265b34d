//! SeqMSE for LPBQ weight scales: each output channel's scales chosen for the least error of the
//! layer's *output* on calibration activations, `||X W^T - X Ŵ^T||^2`, not of the weights.
//!
//! ```no_run
//! # use compiler::quant::seqmse::lpbq_seqmse_search;
//! # use compiler::quant::LpbqShape;
//! # fn demo(w: &[f32], shape: LpbqShape, h: &[f32]) -> Result<(), compiler::quant::QuantError> {
//! // h: X^T X / N of the linear's inputs, [In][In] row-major
//! let rounded = lpbq_seqmse_search(w, shape, h)?; // codes + two-level scales
//! let export = rounded.to_export()?; // pymllm's weight / scale1 / scale2
//! # Ok(())
//! # }
//! ```
//!
//! The output error of channel `o` is `d^T H d` with `d = w_o - ŵ_o` and `H = X^T X / N`, so only
//! the second moments the GPTQ path already collects are needed, no activations. Per channel:
//! 1. `scale2 = gamma * max|w| / (7 * 16)` for each `gamma` of [`SEQMSE_GRID`] (clipping fractions
//!    on the deployed two-level grid);
//! 2. each block's `scale1` from [`scale1_candidates`] minimizing `d_b^T H_bb d_b`, the block's
//!    own term of the output error (`H_bb`: the block's diagonal block of `H`);
//! 3. the channel keeps the `gamma` whose blocks' terms sum lowest.
//!
//! The terms between blocks (`d_b^T H_bc d_c`) are left out: they would make the choice of one
//! block depend on every other (`O(In^2)` per candidate instead of `O(bs^2)`). GPTQ, run on the
//! chosen scales (`seqmse-gptq`), compensates exactly those cross terms through its error feedback.

use super::lpbq::LpbqShape;
use super::lpbq_search::{lpbq_grid_search, BlockWeights, LpbqRounded};
use super::QuantError;

/// Fractions of the channel maximum tried for `scale2` (finer and deeper than the `mse` method's).
pub const SEQMSE_GRID: [f32; 10] = [1.0, 0.95, 0.9, 0.85, 0.8, 0.75, 0.7, 0.65, 0.6, 0.55];

/// The module docs' search for a row-major `[Out][In]` weight with `hessian` = `X^T X / N`,
/// `[In][In]` row-major, of the layer's input on calibration data. Parallel over output channels.
pub fn lpbq_seqmse_search(weight: &[f32], shape: LpbqShape, hessian: &[f32]) -> Result<LpbqRounded, QuantError> {
    let inp = shape.in_features();
    if hessian.len() != inp * inp {
        return Err(QuantError::LengthMismatch {
            what: "SeqMSE input second moments X^T X [In][In]",
            expected: inp * inp,
            found: hessian.len(),
        });
    }
    if let Some(i) = hessian.iter().position(|x| !x.is_finite()) {
        return Err(QuantError::NonFinite {
            what: "SeqMSE input second moments X^T X [In][In]",
            index: i,
            value: hessian[i],
        });
    }
    lpbq_grid_search(weight, shape, BlockWeights::BlockHessian(hessian), &SEQMSE_GRID)
}

/// `tr((W - Ŵ) H (W - Ŵ)^T)`: the output error `||X W^T - X Ŵ^T||^2 / N` of `deployed` for the
/// `[In][In]` second moments `hessian`, in f64.
pub fn output_error(weight: &[f32], deployed: &[f32], in_features: usize, hessian: &[f32]) -> f64 {
    weight
        .chunks_exact(in_features)
        .zip(deployed.chunks_exact(in_features))
        .map(|(w, q)| {
            let d: Vec<f64> = w.iter().zip(q).map(|(a, b)| f64::from(a - b)).collect();
            d.iter()
                .enumerate()
                .map(|(i, di)| {
                    let row = &hessian[i * in_features..(i + 1) * in_features];
                    di * row.iter().zip(&d).map(|(h, dj)| f64::from(*h) * dj).sum::<f64>()
                })
                .sum::<f64>()
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::lpbq::{quantize_lpbq, LPBQ_QMAX, SCALE1_STEPS};
    use crate::quant::lpbq_search::{lpbq_code, lpbq_mse_search, scale1_candidates};
    use crate::quant::test_data::uniform as lcg;

    /// `X^T X / N` of `n` rows of strongly correlated inputs with a few loud channels.
    fn correlated_hessian(inp: usize, n: usize) -> Vec<f32> {
        let base = lcg(n * 4, 99);
        let noise = lcg(n * inp, 5);
        let x: Vec<f32> = (0..n * inp)
            .map(|k| {
                let (r, i) = (k / inp, k % inp);
                let loud = if i % 13 == 0 { 6.0 } else { 1.0 };
                loud * (base[r * 4 + i % 4] * 2.0 + noise[k] * 0.3)
            })
            .collect();
        let mut h = vec![0f32; inp * inp];
        for row in x.chunks_exact(inp) {
            for i in 0..inp {
                for j in 0..inp {
                    h[i * inp + j] += row[i] * row[j] / n as f32;
                }
            }
        }
        h
    }

    /// Brute force over the whole candidate set of one channel: every grid value and every
    /// combination of the blocks' scale1 candidates (not one block at a time), scored by the
    /// block-diagonal output error.
    fn brute_force_channel(w: &[f32], bs: usize, h: &[f32], inp: usize) -> f64 {
        let nb = w.len() / bs;
        let row_max = w.iter().fold(0f32, |m, x| m.max(x.abs()));
        let mut best = f64::INFINITY;
        for gamma in SEQMSE_GRID {
            let s2 = gamma * row_max / (f32::from(LPBQ_QMAX) * f32::from(SCALE1_STEPS));
            let cands: Vec<Vec<u8>> = w
                .chunks_exact(bs)
                .map(|b| {
                    let amax = b.iter().fold(0f32, |m, x| m.max(x.abs()));
                    scale1_candidates((amax / 7.0 / s2).round().clamp(1.0, 16.0) as u8).collect()
                })
                .collect();
            let mut idx = vec![0usize; nb];
            loop {
                let q: Vec<f32> = w
                    .iter()
                    .enumerate()
                    .map(|(i, &x)| {
                        let s1 = cands[i / bs][idx[i / bs]];
                        f32::from(i16::from(lpbq_code(x, f32::from(s1) * s2)) * i16::from(s1)) * s2
                    })
                    .collect();
                let mut e = 0f64;
                for b in 0..nb {
                    for i in b * bs..(b + 1) * bs {
                        for j in b * bs..(b + 1) * bs {
                            e += f64::from(w[i] - q[i]) * f64::from(h[i * inp + j]) * f64::from(w[j] - q[j]);
                        }
                    }
                }
                best = best.min(e);
                // Next combination.
                let mut k = 0;
                while k < nb {
                    idx[k] += 1;
                    if idx[k] < cands[k].len() {
                        break;
                    }
                    idx[k] = 0;
                    k += 1;
                }
                if k == nb {
                    break;
                }
            }
        }
        best
    }

    #[test]
    fn chosen_scales_minimize_the_output_error_over_the_grid() {
        let (out, inp, bs) = (6, 32, 16);
        let w = crate::quant::test_data::cubed(out * inp, 3, 8.0);
        let h = correlated_hessian(inp, 256);
        let shape = LpbqShape::new(out, inp, bs).unwrap();
        let found = lpbq_seqmse_search(&w, shape, &h).unwrap();
        let deployed = found.deployed_weights();
        assert_eq!(found.to_export().unwrap().decode().unwrap(), deployed);
        for o in 0..out {
            let row = &w[o * inp..(o + 1) * inp];
            let q = &deployed[o * inp..(o + 1) * inp];
            let mut mine = 0f64;
            for b in 0..inp / bs {
                for i in b * bs..(b + 1) * bs {
                    for j in b * bs..(b + 1) * bs {
                        mine += f64::from(row[i] - q[i]) * f64::from(h[i * inp + j]) * f64::from(row[j] - q[j]);
                    }
                }
            }
            let brute = brute_force_channel(row, bs, &h, inp);
            assert!(mine <= brute * (1.0 + 1e-4) + 1e-12, "channel {o}: {mine} vs brute force {brute}");
        }
    }

    #[test]
    fn output_error_beats_the_weight_error_searches() {
        let (out, inp, bs) = (32, 64, 16);
        let w = crate::quant::test_data::cubed(out * inp, 8, 8.0);
        let h = correlated_hessian(inp, 512);
        let shape = LpbqShape::new(out, inp, bs).unwrap();
        let diag: Vec<f32> = (0..inp).map(|i| h[i * inp + i]).collect();
        let err = |q: &[f32]| output_error(&w, q, inp, &h);
        let seq = err(&lpbq_seqmse_search(&w, shape, &h).unwrap().deployed_weights());
        let mse = err(&lpbq_mse_search(&w, shape, Some(&diag)).unwrap().deployed_weights());
        let rtn = err(&quantize_lpbq(&w, shape).unwrap().decode().unwrap());
        assert!(seq < mse && mse < rtn, "seqmse {seq}, mse {mse}, rtn {rtn}");
    }

    #[test]
    fn malformed_inputs_are_refused() {
        let shape = LpbqShape::new(2, 16, 16).unwrap();
        let w = vec![0.5f32; 32];
        let e = lpbq_seqmse_search(&w, shape, &[1.0; 255]).unwrap_err();
        assert!(e.to_string().contains("expected 256 elements, found 255"), "{e}");
        let mut h = vec![0f32; 256];
        h[17] = f32::NAN;
        assert!(matches!(lpbq_seqmse_search(&w, shape, &h), Err(QuantError::NonFinite { index: 17, .. })));
        assert!(lpbq_seqmse_search(&w[..31], shape, &[0.0; 256]).is_err());
    }
}

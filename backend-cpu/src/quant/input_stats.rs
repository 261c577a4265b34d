//! Second moments of every linear's input on calibration data, `H = X^T X / N` (`[In][In]`), the
//! statistics GPTQ and the input-weighted LPBQ scale search need.
//!
//! ```no_run
//! # use std::sync::Arc;
//! # use backend_cpu::quant::{prefill_logits, InputStatsHook, StatsDepth};
//! # use backend_cpu::CpuBackend;
//! # use compiler::quant::points::linear_inputs;
//! # use mllm_dsl::ir::Program;
//! # use mllm_dsl::CausalLm;
//! # fn demo(program: &Program, model: Box<dyn CausalLm>, calibration: &[Vec<i64>]) -> Result<(), Box<dyn std::error::Error>> {
//! let hook = Arc::new(InputStatsHook::new(&linear_inputs(program), StatsDepth::Full));
//! let backend = CpuBackend::with_qdq(hook.clone());
//! for seq in calibration {
//!     prefill_logits(model.as_ref(), &backend, None, seq)?;
//! }
//! let stats = hook.finish()?; // by linear module path
//! let h = stats.get("model.layers.0.mlp.down_proj").map(|s| s.hessian());
//! # Ok(())
//! # }
//! ```
//!
//! The hook sits on the QDQ points the linears' inputs come from
//! ([`linear_inputs`](compiler::quant::points::linear_inputs)), replays the transposes between the
//! point and the linear, and accumulates `X^T X` with the CPU matmul kernel. Linears sharing an
//! input (q/k/v, gate/up) share one accumulator. It never changes a tensor.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use compiler::quant::points::{InputMove, LinearInput};
use mllm_dsl::QdqAttr;

use super::error::QuantizationError;
use crate::executor::{QdqHook, QdqHookError};
use crate::kernels::{self, KernelError};

/// One linear input's statistics.
#[derive(Clone, Debug, PartialEq)]
pub struct LinearStats {
    features: usize,
    /// `[In][In]` row-major `X^T X / N`.
    hessian: Vec<f32>,
    diagonal: Vec<f32>,
    rows: usize,
}

/// Why summed input statistics cannot make a [`LinearStats`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LinearStatsError {
    #[error("{values} values over {rows} rows for {features} features (expected features^2 values, rows > 0)")]
    Shape { values: usize, rows: usize, features: usize },
    #[error("no input rows")]
    NoRows,
}

impl LinearStats {
    /// Statistics from a summed `X^T X` over `rows` input rows.
    pub fn from_sum(features: usize, mut sum: Vec<f32>, rows: usize) -> Result<Self, LinearStatsError> {
        if Some(sum.len()) != features.checked_mul(features) || rows == 0 {
            return Err(LinearStatsError::Shape { values: sum.len(), rows, features });
        }
        let inv = 1.0 / rows as f32;
        sum.iter_mut().for_each(|v| *v *= inv);
        let diagonal = (0..features).map(|i| sum[i * features + i]).collect();
        Ok(LinearStats { features, hessian: sum, diagonal, rows })
    }

    /// Statistics that know only `E[x_i^2]` (summed over `rows`); [`hessian`](Self::hessian) is
    /// then empty.
    pub fn from_diagonal_sum(mut sum: Vec<f32>, rows: usize) -> Result<Self, LinearStatsError> {
        if rows == 0 {
            return Err(LinearStatsError::NoRows);
        }
        let inv = 1.0 / rows as f32;
        sum.iter_mut().for_each(|v| *v *= inv);
        Ok(LinearStats { features: sum.len(), hessian: Vec::new(), diagonal: sum, rows })
    }

    /// Whether the whole `X^T X` is known (GPTQ needs it).
    pub fn has_hessian(&self) -> bool {
        self.hessian.len() == self.features * self.features
    }

    pub fn features(&self) -> usize {
        self.features
    }

    /// `[In][In]` row-major `X^T X / N`.
    pub fn hessian(&self) -> &[f32] {
        &self.hessian
    }

    /// `E[x_i^2]` per input feature.
    pub fn diagonal(&self) -> &[f32] {
        &self.diagonal
    }

    /// Input rows (tokens) seen.
    pub fn rows(&self) -> usize {
        self.rows
    }
}

/// Statistics by linear module path.
#[derive(Clone, Debug, Default)]
pub struct InputStats {
    by_op: BTreeMap<String, Arc<LinearStats>>,
}

impl InputStats {
    pub fn get(&self, op: &str) -> Option<&LinearStats> {
        self.by_op.get(op).map(|s| s.as_ref())
    }

    /// [`get`](Self::get) as the shared handle (one per distinct input).
    pub fn get_shared(&self, op: &str) -> Option<Arc<LinearStats>> {
        self.by_op.get(op).cloned()
    }

    pub fn len(&self) -> usize {
        self.by_op.len()
    }

    /// Each distinct statistics once (linears sharing an input share one).
    pub fn distinct(&self) -> Vec<Arc<LinearStats>> {
        let mut out: Vec<Arc<LinearStats>> = Vec::new();
        for s in self.by_op.values() {
            if !out.iter().any(|o| Arc::ptr_eq(o, s)) {
                out.push(s.clone());
            }
        }
        out
    }

    pub fn is_empty(&self) -> bool {
        self.by_op.is_empty()
    }
}

struct Accumulator {
    moves: Vec<InputMove>,
    features: usize,
    sum: Vec<f32>,
    rows: usize,
}

/// What [`InputStatsHook`] accumulates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StatsDepth {
    /// `E[x_i^2]` only (`O(N * In)`): the weighted scale search.
    Diagonal,
    /// The whole `X^T X` (`O(N * In^2)`): GPTQ.
    Full,
}

/// The [`QdqHook`] that accumulates `X^T X` (module docs).
pub struct InputStatsHook {
    depth: StatsDepth,
    /// Accumulator indices by QDQ key.
    by_point: HashMap<String, Vec<usize>>,
    /// Linear module path → accumulator index.
    ops: Vec<(String, usize)>,
    accumulators: Vec<Mutex<Accumulator>>,
}

impl InputStatsHook {
    pub fn new(inputs: &[LinearInput], depth: StatsDepth) -> Self {
        let mut by_point: HashMap<String, Vec<usize>> = HashMap::new();
        let mut keys: Vec<(String, Vec<InputMove>)> = Vec::new();
        let mut ops = Vec::new();
        let mut accumulators = Vec::new();
        for input in inputs {
            let id = (input.point.key.clone(), input.moves.clone());
            let index = match keys.iter().position(|k| *k == id) {
                Some(i) => i,
                None => {
                    keys.push(id);
                    accumulators.push(Mutex::new(Accumulator {
                        moves: input.moves.clone(),
                        features: input.in_features,
                        sum: Vec::new(),
                        rows: 0,
                    }));
                    by_point.entry(input.point.key.clone()).or_default().push(keys.len() - 1);
                    keys.len() - 1
                }
            };
            ops.push((input.op.clone(), index));
        }
        InputStatsHook { depth, by_point, ops, accumulators }
    }

    /// The statistics of every linear whose input was seen. Fails when a linear's input never
    /// arrived (calibration ran no sequence, or the model file skipped the point).
    pub fn finish(&self) -> Result<InputStats, QuantizationError> {
        let mut by_index: HashMap<usize, Arc<LinearStats>> = HashMap::new();
        let mut by_op = BTreeMap::new();
        for (op, index) in &self.ops {
            let stats = match by_index.get(index) {
                Some(s) => s.clone(),
                None => {
                    let acc = self.accumulators[*index]
                        .lock()
                        .map_err(|_| QuantizationError::Report("input statistics poisoned".into()))?;
                    if acc.rows == 0 {
                        return Err(QuantizationError::CalibrationData(format!(
                            "the input of linear `{op}` was never seen"
                        )));
                    }
                    let stats = match self.depth {
                        StatsDepth::Full => LinearStats::from_sum(acc.features, acc.sum.clone(), acc.rows),
                        StatsDepth::Diagonal => LinearStats::from_diagonal_sum(acc.sum.clone(), acc.rows),
                    };
                    let s =
                        Arc::new(stats.map_err(|e| QuantizationError::CalibrationData(format!("linear `{op}`: {e}")))?);
                    by_index.insert(*index, s.clone());
                    s
                }
            };
            by_op.insert(op.clone(), stats);
        }
        Ok(InputStats { by_op })
    }
}

/// `x` after `moves`, as `(data, shape)`.
fn replay(x: &[f32], shape: &[usize], moves: &[InputMove]) -> Result<(Vec<f32>, Vec<usize>), KernelError> {
    let (mut data, mut shape) = (x.to_vec(), shape.to_vec());
    for m in moves {
        let (d, s) = match m {
            InputMove::Transpose { dim0, dim1 } => kernels::transpose(&data, &shape, *dim0 as isize, *dim1 as isize),
            InputMove::Permute { perm } => {
                kernels::permute(&data, &shape, &perm.iter().map(|&p| p as isize).collect::<Vec<_>>())
            }
        }?;
        (data, shape) = (d, s);
    }
    Ok((data, shape))
}

impl QdqHook for InputStatsHook {
    fn apply(&self, point: &QdqAttr, x: &[f32], shape: &[usize]) -> Result<Option<Vec<f32>>, QdqHookError> {
        let Some(indices) = self.by_point.get(&point.key) else { return Ok(None) };
        for &i in indices {
            let mut acc =
                self.accumulators[i].lock().map_err(|_| QdqHookError::Poisoned { what: "input statistics" })?;
            let (data, moved) = replay(x, shape, &acc.moves).map_err(|source| QdqHookError::Shape {
                key: point.key.clone(),
                problem: format!("replaying the moves to its linear: {source}"),
            })?;
            let features = acc.features;
            if data.is_empty() {
                continue;
            }
            if features == 0 || data.len() % features != 0 {
                return Err(QdqHookError::Shape {
                    key: point.key.clone(),
                    problem: format!(
                        "a {moved:?} tensor is no whole number of its linear's {features}-wide input rows"
                    ),
                });
            }
            let rows = data.len() / features;
            let gram = match self.depth {
                StatsDepth::Diagonal => {
                    let mut sq = vec![0f32; features];
                    for row in data.chunks_exact(features) {
                        sq.iter_mut().zip(row).for_each(|(s, x)| *s += x * x);
                    }
                    sq
                }
                StatsDepth::Full => {
                    // X^T X: [In, N] x [N, In].
                    let kernel_error = |source| QdqHookError::Kernel { key: point.key.clone(), source };
                    let xt = kernels::transpose_2d(&data, rows, features).map_err(kernel_error)?;
                    kernels::linear_kn(&xt, features, rows, &data, features, None).map_err(kernel_error)?
                }
            };
            if acc.sum.is_empty() {
                acc.sum = gram;
            } else {
                acc.sum.iter_mut().zip(&gram).for_each(|(a, g)| *a += g);
            }
            acc.rows += rows;
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mllm_dsl::QdqKind;

    #[test]
    fn accumulates_second_moments_through_a_transpose() {
        let point = QdqAttr { kind: QdqKind::Activation, key: "l.attn_out".into() };
        let inputs = [
            LinearInput {
                op: "l.o_proj".into(),
                point: point.clone(),
                moves: vec![InputMove::Transpose { dim0: 1, dim1: 2 }],
                in_features: 2,
            },
            LinearInput {
                op: "l.other".into(),
                point: point.clone(),
                moves: vec![InputMove::Transpose { dim0: 1, dim1: 2 }],
                in_features: 2,
            },
        ];
        let hook = InputStatsHook::new(&inputs, StatsDepth::Full);
        assert!(hook.finish().is_err(), "nothing seen yet");
        // [1, heads 2, S 3, D 1] -> transpose(1, 2) -> rows of (head0, head1) per position.
        let x = [1.0, 2.0, 3.0, 10.0, 20.0, 30.0];
        assert_eq!(hook.apply(&point, &x, &[1, 2, 3, 1]).unwrap(), None);
        let stats = hook.finish().unwrap();
        let s = stats.get("l.o_proj").unwrap();
        assert_eq!((s.features(), s.rows()), (2, 3));
        // rows (1,10), (2,20), (3,30): E[x0^2] = 14/3, E[x0 x1] = 140/3, E[x1^2] = 1400/3.
        let expect = [14.0 / 3.0, 140.0 / 3.0, 140.0 / 3.0, 1400.0 / 3.0];
        for (a, b) in s.hessian().iter().zip(expect) {
            assert!((a - b).abs() < 1e-4 * b, "{a} vs {b}");
        }
        assert_eq!(s.diagonal().len(), 2);
        assert!(std::ptr::eq(stats.get("l.other").unwrap(), s), "one accumulator for a shared input");

        let hook = InputStatsHook::new(&inputs, StatsDepth::Diagonal);
        hook.apply(&point, &x, &[1, 2, 3, 1]).unwrap();
        let stats = hook.finish().unwrap();
        let d = stats.get("l.o_proj").unwrap();
        assert!(!d.has_hessian());
        assert!((d.diagonal()[0] - 14.0 / 3.0).abs() < 1e-5 && (d.diagonal()[1] - 1400.0 / 3.0).abs() < 1e-3);
    }
}

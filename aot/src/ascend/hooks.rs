//! The two [`QdqHook`]s of the AscendV1 path, both on the QDQ points the model file already has:
//! - [`AscendObserver`] records, while the float model runs the calibration sequences, the
//!   per-tensor range of every statically quantized linear's input and the per-channel absolute
//!   maximum of every KV-cache point (C8);
//! - [`AscendFakeQuant`] quantizes and dequantizes at those points the way an Ascend device does:
//!   int8 per tensor with the exported `input_scale` / `input_offset` (W8A8), int8 symmetric per
//!   token computed at run time (W8A8_DYNAMIC, W4A8_DYNAMIC), int8 per channel for the KV cache (C8).
//!
//! Every other point (norms, RoPE, softmax...) passes through: on Ascend they run in float.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

use backend_cpu::kernels;
use backend_cpu::{QdqHook, QdqHookError};
use compiler::quant::points::InputMove;
use mllm_dsl::QdqAttr;

/// Ranges observed during calibration.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Observed {
    /// (min, max) by QDQ point key.
    pub ranges: HashMap<String, (f32, f32)>,
    /// Per-channel |x| maximum of each KV point (`[B, H, S, D]` → `H * D` channels), by key.
    pub kv_abs_max: HashMap<String, Vec<f32>>,
}

/// Observes the given activation points (per tensor) and KV points (per channel).
pub struct AscendObserver {
    activations: HashSet<String>,
    kv: HashSet<String>,
    state: Mutex<Observed>,
}

impl AscendObserver {
    pub fn new(activations: Vec<String>, kv: Vec<String>) -> Self {
        AscendObserver {
            activations: activations.into_iter().collect(),
            kv: kv.into_iter().collect(),
            state: Mutex::new(Observed::default()),
        }
    }

    pub fn finish(&self) -> Result<Observed, QdqHookError> {
        let s = self.state.lock().map_err(|_| QdqHookError::Poisoned { what: "AscendV1 observer" })?;
        Ok(s.clone())
    }
}

/// The `H * D` channels of a `[B, H, S, D]` KV tensor; checks the rank.
fn kv_channels(key: &str, shape: &[usize]) -> Result<usize, QdqHookError> {
    match shape {
        [_, h, _, d] => Ok(h * d),
        _ => Err(QdqHookError::Shape {
            key: key.to_string(),
            problem: format!("a KV-cache point must be [B, H, S, D] for per-channel C8, got {shape:?}"),
        }),
    }
}

/// Index of element (b, h, s, d) of a `[B, H, S, D]` tensor, for channel `h * D + d`.
fn for_each_kv(shape: &[usize], mut f: impl FnMut(usize, usize)) {
    let (b, h, s, d) = (shape[0], shape[1], shape[2], shape[3]);
    for bi in 0..b {
        for hi in 0..h {
            for si in 0..s {
                for di in 0..d {
                    let idx = ((bi * h + hi) * s + si) * d + di;
                    f(idx, hi * d + di);
                }
            }
        }
    }
}

impl QdqHook for AscendObserver {
    fn apply(&self, point: &QdqAttr, x: &[f32], shape: &[usize]) -> Result<Option<Vec<f32>>, QdqHookError> {
        let is_act = self.activations.contains(&point.key);
        let is_kv = self.kv.contains(&point.key);
        if !is_act && !is_kv {
            return Ok(None);
        }
        if let Some(bad) = x.iter().find(|v| !v.is_finite()) {
            return Err(QdqHookError::Shape {
                key: point.key.clone(),
                problem: format!("observed a non-finite value {bad}"),
            });
        }
        let mut s = self.state.lock().map_err(|_| QdqHookError::Poisoned { what: "AscendV1 observer" })?;
        if is_act && !x.is_empty() {
            let lo = x.iter().fold(f32::INFINITY, |m, &v| m.min(v));
            let hi = x.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
            let r = s.ranges.entry(point.key.clone()).or_insert((lo, hi));
            *r = (r.0.min(lo), r.1.max(hi));
        }
        if is_kv {
            let channels = kv_channels(&point.key, shape)?;
            let m = s.kv_abs_max.entry(point.key.clone()).or_insert_with(|| vec![0.0; channels]);
            if m.len() != channels {
                return Err(QdqHookError::Shape {
                    key: point.key.clone(),
                    problem: format!("{channels} channels here, {} before", m.len()),
                });
            }
            for_each_kv(shape, |i, c| m[c] = m[c].max(x[i].abs()));
        }
        Ok(None)
    }
}

/// How [`AscendFakeQuant`] treats one point.
#[derive(Clone, Debug, PartialEq)]
pub enum PointQuant {
    /// int8 per tensor: `q = clamp(round(x / scale + offset), -128, 127)`, `x' = (q - offset) * scale`.
    Static { scale: f32, offset: f32 },
    /// int8 symmetric per row of the linear's input (after `moves`, rows of `in_features`).
    PerToken { moves: Vec<InputMove>, in_features: usize },
    /// int8 symmetric per channel of a `[B, H, S, D]` KV tensor (`H * D` scales).
    KvPerChannel { scales: Vec<f32> },
}

/// Fake-quant at the points an Ascend device quantizes (module docs).
pub struct AscendFakeQuant {
    points: HashMap<String, PointQuant>,
}

impl AscendFakeQuant {
    pub fn new(points: HashMap<String, PointQuant>) -> Self {
        AscendFakeQuant { points }
    }
}

fn qdq_int8(x: f32, scale: f32, offset: f32) -> f32 {
    ((x / scale + offset).round_ties_even().clamp(-128.0, 127.0) - offset) * scale
}

/// `x` after `moves` (each a transpose or permute).
fn replay(x: &[f32], shape: &[usize], moves: &[InputMove]) -> Result<(Vec<f32>, Vec<usize>), kernels::KernelError> {
    let (mut data, mut shape) = (x.to_vec(), shape.to_vec());
    for m in moves {
        (data, shape) = match m {
            InputMove::Transpose { dim0, dim1 } => kernels::transpose(&data, &shape, *dim0 as isize, *dim1 as isize)?,
            InputMove::Permute { perm } => {
                kernels::permute(&data, &shape, &perm.iter().map(|&p| p as isize).collect::<Vec<_>>())?
            }
        };
    }
    Ok((data, shape))
}

impl QdqHook for AscendFakeQuant {
    fn apply(&self, point: &QdqAttr, x: &[f32], shape: &[usize]) -> Result<Option<Vec<f32>>, QdqHookError> {
        let Some(q) = self.points.get(&point.key) else { return Ok(None) };
        let kernel = |source| QdqHookError::Kernel { key: point.key.clone(), source };
        Ok(Some(match q {
            PointQuant::Static { scale, offset } => x.iter().map(|&v| qdq_int8(v, *scale, *offset)).collect(),
            PointQuant::PerToken { moves, in_features } => {
                // Positions of the moved elements, to put the quantized rows back in place
                // (indices stay exact in f32 below 2^24 elements).
                if x.len() >= 1 << 24 {
                    return Err(QdqHookError::Shape {
                        key: point.key.clone(),
                        problem: format!("{} elements: per-token fake-quant handles fewer than 2^24", x.len()),
                    });
                }
                let (moved, _) = replay(x, shape, moves).map_err(kernel)?;
                let index: Vec<f32> = (0..x.len()).map(|i| i as f32).collect();
                let (order, _) = replay(&index, shape, moves).map_err(kernel)?;
                if *in_features == 0 || moved.len() % in_features != 0 {
                    return Err(QdqHookError::Shape {
                        key: point.key.clone(),
                        problem: format!("{shape:?} is no whole number of {in_features}-wide rows"),
                    });
                }
                let mut out = vec![0f32; x.len()];
                for (row, pos) in moved.chunks_exact(*in_features).zip(order.chunks_exact(*in_features)) {
                    let amax = row.iter().fold(0f32, |m, &v| m.max(v.abs()));
                    let scale = super::format::symmetric_int8_scale(amax);
                    for (&v, &p) in row.iter().zip(pos) {
                        out[p as usize] = qdq_int8(v, scale, 0.0);
                    }
                }
                out
            }
            PointQuant::KvPerChannel { scales } => {
                let channels = kv_channels(&point.key, shape)?;
                if channels != scales.len() {
                    return Err(QdqHookError::Shape {
                        key: point.key.clone(),
                        problem: format!("{channels} channels, {} C8 scales", scales.len()),
                    });
                }
                let mut out = x.to_vec();
                for_each_kv(shape, |i, c| out[i] = qdq_int8(x[i], scales[c], 0.0));
                out
            }
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mllm_dsl::QdqKind;

    #[test]
    fn per_token_quantizes_each_row_of_the_moved_input_and_puts_it_back() {
        let point = QdqAttr { kind: QdqKind::Activation, key: "a".into() };
        // [1, 2 heads, 2 positions, 1]: after transpose(1, 2) rows are positions: (1, 100), (2, 0.5).
        let x = [1.0, 2.0, 100.0, 0.5];
        let hook = AscendFakeQuant::new(HashMap::from([(
            "a".to_string(),
            PointQuant::PerToken { moves: vec![InputMove::Transpose { dim0: 1, dim1: 2 }], in_features: 2 },
        )]));
        let y = hook.apply(&point, &x, &[1, 2, 2, 1]).unwrap().unwrap();
        // row 0 scale 100/127: 1 -> round(1.27) = 1 -> 0.787..; 100 exact.
        let s0 = 100.0 / 127.0;
        assert!((y[0] - s0).abs() < 1e-6 && (y[2] - 100.0).abs() < 1e-4, "{y:?}");
        // row 1 scale 2/127: both exact multiples? 2 -> 127, 0.5 -> round(31.75) = 32.
        let s1 = 2.0 / 127.0;
        assert!((y[1] - 2.0).abs() < 1e-6 && (y[3] - 32.0 * s1).abs() < 1e-6, "{y:?}");
    }
}

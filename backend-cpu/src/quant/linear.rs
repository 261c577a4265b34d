//! How linear weights become LPBQ: one owner for the choice, used both by calibration (which
//! observes the model with the deployed weights) and by the export (which writes them), so the
//! two always agree.
//!
//! ```no_run
//! # use std::sync::Arc;
//! # use backend_cpu::quant::{InputStats, LinearQuantizer, WeightMethod};
//! # use compiler::quant::LpbqShape;
//! # fn demo(stats: Arc<InputStats>, w: &[f32], out: usize, inp: usize) -> Result<(), Box<dyn std::error::Error>> {
//! let linears = LinearQuantizer::new(WeightMethod::Gptq, Some(stats))?;
//! let export = linears.quantize("model.layers.0.mlp.up_proj", w, LpbqShape::new(out, inp, 16)?)?;
//! # Ok(())
//! # }
//! ```
//!
//! | method | codes and scales | needs |
//! |---|---|---|
//! | [`WeightMethod::Rtn`] | pymllm's: block max / 7, rounded, then the scales squeezed to two levels ([`quantize_lpbq`]) | nothing |
//! | [`WeightMethod::Mse`] | scales searched on the deployed grid for the least (input-energy weighted) error ([`lpbq_mse_search`]) | input statistics optional |
//! | [`WeightMethod::Gptq`] | the `Mse` scales, codes chosen column by column with GPTQ's error feedback ([`super::gptq`]) | input statistics |
//! | [`WeightMethod::SeqMse`] | scales searched for the least error of the layer's output, `tr(D X^T X D^T)` ([`lpbq_seqmse_search`]) | input statistics |
//! | [`WeightMethod::SeqMseGptq`] | the `SeqMse` scales, GPTQ codes | input statistics |
//!
//! Results are cached by key: GPTQ runs once per linear although calibration and export both ask.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use compiler::quant::int8_channel::Int8Channel;
use compiler::quant::lpbq::{quantize_lpbq, LpbqExport, LpbqShape};
use compiler::quant::lpbq_search::lpbq_mse_search;
use compiler::quant::seqmse::lpbq_seqmse_search;
use compiler::quant::QuantError;

use super::error::QuantizationError;
use rayon::prelude::*;

use super::gptq::{gptq_lpbq, GptqError, HessianFactors};
use super::input_stats::{InputStats, StatsDepth};

/// How linear weights are rounded to LPBQ (module docs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WeightMethod {
    /// pymllm's round-to-nearest with the block maximum.
    #[default]
    Rtn,
    /// Scales searched for the least error on the deployed grid.
    Mse,
    /// `Mse` scales, codes by GPTQ on calibration activations.
    Gptq,
    /// Scales searched for the least error of the layer's output on calibration activations.
    SeqMse,
    /// `SeqMse` scales, codes by GPTQ.
    SeqMseGptq,
}

impl WeightMethod {
    pub fn name(self) -> &'static str {
        match self {
            WeightMethod::Rtn => "rtn",
            WeightMethod::Mse => "mse",
            WeightMethod::Gptq => "gptq",
            WeightMethod::SeqMse => "seqmse",
            WeightMethod::SeqMseGptq => "seqmse-gptq",
        }
    }

    /// The input statistics the method uses, if any.
    pub fn input_stats(self) -> Option<StatsDepth> {
        match self {
            WeightMethod::Rtn => None,
            WeightMethod::Mse => Some(StatsDepth::Diagonal),
            WeightMethod::Gptq | WeightMethod::SeqMse | WeightMethod::SeqMseGptq => Some(StatsDepth::Full),
        }
    }
}

/// A weight method name other than rtn, mse, gptq, seqmse or seqmse-gptq.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown weight method `{name}`; expected rtn, mse, gptq, seqmse or seqmse-gptq")]
pub struct UnknownWeightMethod {
    pub name: String,
}

impl std::str::FromStr for WeightMethod {
    type Err = UnknownWeightMethod;
    fn from_str(s: &str) -> Result<Self, UnknownWeightMethod> {
        match s {
            "rtn" => Ok(WeightMethod::Rtn),
            "mse" => Ok(WeightMethod::Mse),
            "gptq" => Ok(WeightMethod::Gptq),
            "seqmse" => Ok(WeightMethod::SeqMse),
            "seqmse-gptq" => Ok(WeightMethod::SeqMseGptq),
            other => Err(UnknownWeightMethod { name: other.to_string() }),
        }
    }
}

/// A linear weight as exported: LPBQ int4 (the default) or per-channel int8 (the linears a
/// mixed-precision recipe raises to 8 bits).
#[derive(Clone, Debug)]
pub enum LinearExport {
    Lpbq(Arc<LpbqExport>),
    Int8(Arc<Int8Channel>),
}

impl LinearExport {
    /// The deployed values, row-major `[Out][In]`.
    pub fn decode(&self) -> Result<Vec<f32>, QuantError> {
        match self {
            LinearExport::Lpbq(e) => e.decode(),
            LinearExport::Int8(e) => Ok(e.decode()),
        }
    }

    /// The deployed values in HWIO order `[In][Out]`.
    pub fn decode_hwio(&self) -> Result<Vec<f32>, QuantError> {
        match self {
            LinearExport::Lpbq(e) => e.decode_hwio(),
            LinearExport::Int8(e) => Ok(e.decode_hwio()),
        }
    }
}

/// Quantizes linear weights with one [`WeightMethod`], caching each linear's result. The linears
/// named by [`LinearQuantizer::set_eight_bit`] become per-channel int8 (round to nearest: at 8 bits
/// its error is far below int4's) instead.
pub struct LinearQuantizer {
    method: WeightMethod,
    stats: Option<Arc<InputStats>>,
    /// GPTQ's factors of each distinct input Hessian, by the statistics' address.
    factors: HashMap<usize, HessianFactors>,
    cache: Mutex<HashMap<String, Arc<LpbqExport>>>,
    /// Linears (op paths) exported as per-channel int8.
    eight_bit: BTreeSet<String>,
    int8_cache: Mutex<HashMap<String, Arc<Int8Channel>>>,
}

impl LinearQuantizer {
    /// `stats`: the linears' input statistics from calibration data ([`InputStats`]); GPTQ fails
    /// without them, the MSE search then weighs every input channel the same.
    ///
    /// For GPTQ the factors of every distinct input Hessian are computed here, in parallel.
    pub fn new(method: WeightMethod, stats: Option<Arc<InputStats>>) -> Result<Self, QuantizationError> {
        let mut factors = HashMap::new();
        let gptq = matches!(method, WeightMethod::Gptq | WeightMethod::SeqMseGptq);
        if let (true, Some(stats)) = (gptq, &stats) {
            let distinct = stats.distinct();
            // On the kernel pool, so `--threads` bounds it too.
            let made: Vec<Result<HessianFactors, GptqError>> =
                crate::kernels::run_in_pool(|| distinct.par_iter().map(|s| HessianFactors::new(s)).collect());
            for (s, f) in distinct.iter().zip(made) {
                let f = f.map_err(|e| QuantizationError::CalibrationData(format!("GPTQ input Hessian: {e}")))?;
                factors.insert(Arc::as_ptr(s) as usize, f);
            }
        }
        Ok(LinearQuantizer {
            method,
            stats,
            factors,
            cache: Mutex::new(HashMap::new()),
            eight_bit: BTreeSet::new(),
            int8_cache: Mutex::default(),
        })
    }

    /// pymllm's rounding, no statistics.
    pub fn rtn() -> Self {
        LinearQuantizer {
            method: WeightMethod::Rtn,
            stats: None,
            factors: HashMap::new(),
            cache: Mutex::default(),
            eight_bit: BTreeSet::new(),
            int8_cache: Mutex::default(),
        }
    }

    /// From now on the linears `ops` (op paths) are exported as per-channel int8, the rest as LPBQ.
    pub fn set_eight_bit(&mut self, ops: BTreeSet<String>) {
        self.eight_bit = ops;
    }

    /// The linears exported as per-channel int8.
    pub fn eight_bit(&self) -> &BTreeSet<String> {
        &self.eight_bit
    }

    /// The weight bits of the linear `op`: 8 or 4.
    pub fn bits(&self, op: &str) -> u32 {
        if self.eight_bit.contains(op) {
            8
        } else {
            4
        }
    }

    /// The export of `op` at its bit width ([`LinearQuantizer::bits`]): per-channel int8 or
    /// [`LinearQuantizer::quantize`]'s LPBQ.
    pub fn export(&self, op: &str, weight: &[f32], shape: LpbqShape) -> Result<LinearExport, QuantizationError> {
        if !self.eight_bit.contains(op) {
            return self.quantize(op, weight, shape).map(LinearExport::Lpbq);
        }
        if let Some(hit) = self.cached_export(op, shape) {
            return Ok(hit);
        }
        let q = Int8Channel::quantize(weight, shape.out_features(), shape.in_features())
            .map_err(|e| QuantizationError::quant(op, e))?;
        let q = Arc::new(q);
        if let Ok(mut c) = self.int8_cache.lock() {
            c.insert(op.to_string(), q.clone());
        }
        Ok(LinearExport::Int8(q))
    }

    /// The export [`LinearQuantizer::export`] already made for `op` at `shape` and its bit width, if any.
    pub fn cached_export(&self, op: &str, shape: LpbqShape) -> Option<LinearExport> {
        if !self.eight_bit.contains(op) {
            return self.cached(op, shape).map(LinearExport::Lpbq);
        }
        let hit = self.int8_cache.lock().ok().and_then(|c| c.get(op).cloned())?;
        (hit.out_features == shape.out_features() && hit.in_features == shape.in_features())
            .then_some(LinearExport::Int8(hit))
    }

    /// The export [`LinearQuantizer::quantize`] already made for `op` at `shape`, if any: a caller
    /// that finds it need not read the float weight at all.
    pub fn cached(&self, op: &str, shape: LpbqShape) -> Option<Arc<LpbqExport>> {
        self.cache.lock().ok().and_then(|c| c.get(op).cloned()).filter(|hit| hit.shape == shape)
    }

    pub fn method(&self) -> WeightMethod {
        self.method
    }

    /// The LPBQ export of the linear `op` (module path, e.g. `model.layers.0.mlp.up_proj`) whose
    /// row-major `[Out][In]` weight is `weight`.
    pub fn quantize(&self, op: &str, weight: &[f32], shape: LpbqShape) -> Result<Arc<LpbqExport>, QuantizationError> {
        if let Some(hit) = self.cached(op, shape) {
            return Ok(hit);
        }
        let stats = self.stats.as_ref().and_then(|s| s.get_shared(op));
        let quant = |e| QuantizationError::quant(op, e);
        let export = match self.method {
            WeightMethod::Rtn => quantize_lpbq(weight, shape).map_err(quant)?,
            WeightMethod::Mse => lpbq_mse_search(weight, shape, stats.as_ref().map(|s| s.diagonal()))
                .and_then(|r| r.to_export())
                .map_err(quant)?,
            WeightMethod::Gptq | WeightMethod::SeqMse | WeightMethod::SeqMseGptq => {
                let stats = stats.filter(|s| s.has_hessian()).ok_or_else(|| QuantizationError::Param {
                    key: format!("{op}.weight"),
                    problem: format!(
                        "the `{}` weight method needs the linear's input statistics X^T X from calibration, and none \
                         were collected (its input is no QDQ point the statistics pass could follow)",
                        self.method.name()
                    ),
                })?;
                let scales = match self.method {
                    WeightMethod::Gptq => lpbq_mse_search(weight, shape, Some(stats.diagonal())),
                    _ => lpbq_seqmse_search(weight, shape, stats.hessian()),
                }
                .map_err(quant)?;
                if self.method == WeightMethod::SeqMse {
                    scales.to_export().map_err(quant)?
                } else {
                    let factors = self.factors.get(&(Arc::as_ptr(&stats) as usize)).ok_or_else(|| {
                        QuantizationError::Report(format!("no GPTQ factors were made for the input of `{op}`"))
                    })?;
                    let rounded = gptq_lpbq(weight, &scales, factors).map_err(|e| QuantizationError::Param {
                        key: format!("{op}.weight"),
                        problem: e.to_string(),
                    })?;
                    rounded.to_export().map_err(quant)?
                }
            }
        };
        let export = Arc::new(export);
        if let Ok(mut c) = self.cache.lock() {
            c.insert(op.to_string(), export.clone());
        }
        Ok(export)
    }
}

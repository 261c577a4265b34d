//! Calibration: run a float checkpoint's model file on calibration sequences and observe every
//! QDQ point with mllm's observer semantics ([`ObserverHook`]), while the model sees the weights
//! calibration is meant to see ([`CalibrationWeights`]).
//!
//! Observers follow pymllm (`core/qdq.py`, `core/observer.py`): activations, constants and RoPE
//! tables get per-tensor affine u16 MinMax observers with eps 1e-4/65535; the KV cache a symmetric
//! u8 observer (zero point 128, eps 1e-4/255); fixed points (the sigmoid output, 1/65536) and
//! global points (mask, `constant_zero`) are not observed; the QDQ points feeding one
//! concatenation share one range ([`ConcatObserver`]). Activations pass through unchanged: as in
//! pymllm, fake-quant is off while observing.
//!
//! Two modes:
//! - [`CalibrationMode::MllmCompatible`] reproduces pymllm's parameters, quirks included:
//!   1. the linears' weights are already int4 while activations are observed (pymllm's
//!      `PerBlockParamFakeQuantize` has no off switch), with the fp32 block scales `q * s`, not
//!      the exported two-level scales;
//!   2. norms, embedding and RoPE tables stay float (their fake-quant is disabled);
//!   3. QDQ points of the top module (`lm_head_input_qdq`, `lm_head_output_qdq`) observe only the
//!      last position (`generate` passes `logits_to_keep=1`);
//!   4. rotate_half's concatenation links its inputs the way pymllm's `ConcatObserver` aliases
//!      tensors ([`ConcatSharing::Pymllm`]).
//! - [`CalibrationMode::Deployed`] observes the model the NPU runs: linears with the deployed LPBQ
//!   weights `q * scale1 * scale2`, norms and embedding decoded from uint16, every position of
//!   every point, concatenation inputs sharing the union of their whole tensors.
//!
//! Each calibration sequence is one prefill with no past and a causal mask over the sequence
//! only ([`prefill_logits`](super::prefill::prefill_logits)), like pymllm's `generate(...,
//! max_new_tokens=1)`: its single forward sees `[1, 1, S, S]` (`1 - tril`) and no KV cache. With
//! a longer mask or a past, `reduce_min` over a score row, the KV observers and the
//! `qk_matmul_output` observer would see columns pymllm never computes.
//!
//! On the oracle (fixtures/pymllm-qwen3-dev-f32, 8 sequences of 32 tokens) mllm-compatible mode
//! reproduces all 74 QDQ scales within 2.1e-7 relative, every zero point, LPBQ tensor and uint16
//! weight exactly. Dropping quirk 3 moves `lm_head_input_qdq` by 18 %; a concatenation range that
//! ignores the aliasing of quirk 4 moves `model.layers.1.self_attn.q_norm_output_qdq` by 0.6 %.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use compiler::aot_config::AotConfig;
use compiler::quant::act_range::{ActRange, ActRanges, RangeObserver};
use compiler::quant::lpbq::{lpbq_block_quantize, LpbqShape};
use compiler::quant::observer::{min_max_of, ConcatObserver, ConcatSharing, ObserverScheme};
use compiler::quant::points::{ConcatGroup, SliceOf};
use compiler::quant::spec::EPS_8BIT;
use compiler::quant::{quantize_u16_weight, QuantParams};
use mllm_dsl::module::{ParamRequest, ParamRole, WeightStore};
use mllm_dsl::{BackendRef, QdqAttr, QdqKind, Result as DslResult, Tensor};

use super::error::QuantizationError;
use super::linear::LinearQuantizer;
use super::params::QdqParams;
use crate::executor::{QdqHook, QdqHookError};
use crate::store::CheckpointStore;

/// Which model calibration observes (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CalibrationMode {
    Deployed,
    MllmCompatible,
}

impl CalibrationMode {
    pub fn name(self) -> &'static str {
        match self {
            CalibrationMode::Deployed => "deployed",
            CalibrationMode::MllmCompatible => "mllm-compatible",
        }
    }
}

/// The observer scheme of a point, or `None` for points with given parameters.
fn scheme_of(kind: &QdqKind) -> Option<ObserverScheme> {
    match kind {
        QdqKind::Activation | QdqKind::Constant | QdqKind::Rope => Some(ObserverScheme::activation_u16()),
        QdqKind::KvCache => Some(ObserverScheme::KvSymmetricU8 { eps: EPS_8BIT }),
        QdqKind::Fixed { .. } | QdqKind::Global { .. } => None,
    }
}

/// The range method of a point of `kind`: constants and RoPE tables are data, not samples, and
/// keep min/max.
fn range_method(kind: &QdqKind, ranges: ActRanges) -> ActRange {
    match kind {
        QdqKind::Activation => ranges.activations,
        QdqKind::KvCache => ranges.kv_cache,
        _ => ActRange::MinMax,
    }
}

/// Where a point's observations go.
enum Slot {
    Own(RangeObserver),
    /// Index into the concatenation observers, and this point's index inside that group.
    Concat {
        group: usize,
        point: usize,
    },
}

struct State {
    slots: HashMap<String, Slot>,
    concats: Vec<ConcatObserver>,
    /// The slice of each concatenation member that enters the concatenation, by (group, point).
    concat_slices: HashMap<(usize, usize), Option<SliceOf>>,
    /// The last tensor seen at each RoPE point (the table the checkpoint stores, quantized).
    rope_tables: BTreeMap<String, (Vec<usize>, Vec<f32>)>,
    /// Calls per point, for the report.
    hits: HashMap<String, usize>,
}

/// The calibration [`QdqHook`]: observes, never changes a tensor.
pub struct ObserverHook {
    mode: CalibrationMode,
    points: Vec<QdqAttr>,
    state: Mutex<State>,
}

impl ObserverHook {
    /// Min/max observers for `points`; members of `concat_groups` share one range per group.
    pub fn new(points: &[QdqAttr], concat_groups: &[ConcatGroup], mode: CalibrationMode) -> Self {
        Self::with_ranges(points, concat_groups, mode, ActRanges::default())
    }

    /// [`new`](Self::new) with `ranges` choosing each activation and KV point's range in deployed
    /// mode (docs/quantization.md). mllm-compatible mode keeps pymllm's min/max; so do the
    /// concatenation groups, whose members must share one range.
    pub fn with_ranges(
        points: &[QdqAttr],
        concat_groups: &[ConcatGroup],
        mode: CalibrationMode,
        ranges: ActRanges,
    ) -> Self {
        let ranges = if mode == CalibrationMode::MllmCompatible { ActRanges::default() } else { ranges };
        let sharing = match mode {
            CalibrationMode::MllmCompatible => ConcatSharing::Pymllm,
            CalibrationMode::Deployed => ConcatSharing::Union,
        };
        let mut slots = HashMap::new();
        let mut concats = Vec::new();
        let mut concat_slices = HashMap::new();
        // As deployed, concatenations that share a point share one range; pymllm's aliasing
        // (mllm-compatible) never meets two such groups in the models it exports.
        let concat_groups = match mode {
            CalibrationMode::MllmCompatible => concat_groups.to_vec(),
            CalibrationMode::Deployed => compiler::quant::points::merge_overlapping(concat_groups),
        };
        for group in &concat_groups {
            let keys = group.keys();
            // Points with given parameters cannot follow a shared range; such a group is left to
            // the compiler's consistency check, as in mllm.
            let Some(scheme) = scheme_of(&group.members[0].point.kind) else { continue };
            if keys.iter().any(|k| slots.contains_key(*k))
                || group.members.iter().any(|m| scheme_of(&m.point.kind) != Some(scheme))
            {
                continue;
            }
            let g = concats.len();
            concats.push(ConcatObserver::new(keys.len(), sharing, scheme));
            for (i, key) in keys.iter().enumerate() {
                slots.insert(key.to_string(), Slot::Concat { group: g, point: i });
                let slice = group.members.iter().find(|m| m.point.key == *key).and_then(|m| m.slice);
                concat_slices.insert((g, i), slice);
            }
        }
        for p in points {
            if let (false, Some(scheme)) = (slots.contains_key(&p.key), scheme_of(&p.kind)) {
                slots.insert(p.key.clone(), Slot::Own(RangeObserver::new(scheme, range_method(&p.kind, ranges))));
            }
        }
        let state = State { slots, concats, concat_slices, rope_tables: BTreeMap::new(), hits: HashMap::new() };
        ObserverHook { mode, points: points.to_vec(), state: Mutex::new(state) }
    }

    pub fn mode(&self) -> CalibrationMode {
        self.mode
    }

    /// Whether this point observes only the last position: the top module's points in
    /// mllm-compatible mode (`logits_to_keep=1`).
    fn last_position_only(&self, point: &QdqAttr) -> bool {
        self.mode == CalibrationMode::MllmCompatible && !point.key.contains('.')
    }

    /// The parameters of every point, from what was observed. Fails on a point that was never
    /// reached or saw a non-finite value.
    pub fn finish(&self) -> Result<Calibration, QuantizationError> {
        let state = self.state.lock().map_err(|_| QuantizationError::Report("observer state poisoned".into()))?;
        let mut params = QdqParams::new();
        let mut ranges = BTreeMap::new();
        for point in &self.points {
            let (p, range): (QuantParams, Option<(f32, f32)>) = match (&point.kind, state.slots.get(&point.key)) {
                (QdqKind::Fixed { .. } | QdqKind::Global { .. }, _) => {
                    let (scale, zp) = point.fixed_params().expect("fixed points carry parameters");
                    let p = QuantParams::u16_affine(scale, zp).map_err(|e| QuantizationError::quant(&point.key, e))?;
                    (p, None)
                }
                (_, Some(Slot::Own(o))) => {
                    let range = o.range().map_err(|e| observed_error(point, e))?;
                    (observed(point, o.qparams())?, Some(range))
                }
                (_, Some(Slot::Concat { group, point: i })) => {
                    let c = &state.concats[*group];
                    (observed(point, c.qparams(*i))?, c.range(*i))
                }
                (_, None) => return Err(QuantizationError::Unobserved { key: point.key.clone() }),
            };
            if let Some(r) = range {
                ranges.insert(point.key.clone(), r);
            }
            params.insert(point.clone(), p);
        }
        Ok(Calibration {
            params,
            rope_tables: state.rope_tables.clone(),
            ranges,
            hits: state.hits.iter().map(|(k, v)| (k.clone(), *v)).collect(),
            mode: self.mode,
        })
    }
}

fn observed(
    point: &QdqAttr,
    p: Result<QuantParams, compiler::quant::QuantError>,
) -> Result<QuantParams, QuantizationError> {
    p.map_err(|e| observed_error(point, e))
}

fn observed_error(point: &QdqAttr, e: compiler::quant::QuantError) -> QuantizationError {
    match e {
        compiler::quant::QuantError::Unobserved => QuantizationError::Unobserved { key: point.key.clone() },
        e => QuantizationError::quant(&point.key, e),
    }
}

/// Range of the last position of every row block: the last `shape[r-2]` row of each outer index.
fn last_position_range(x: &[f32], shape: &[usize]) -> Option<(f32, f32)> {
    let r = shape.len();
    if r < 2 {
        return min_max_of(x);
    }
    let (rows, width) = (shape[r - 2], shape[r - 1]);
    if rows == 0 || width == 0 {
        return None;
    }
    let block = rows * width;
    x.chunks_exact(block).filter_map(|b| min_max_of(&b[block - width..])).reduce(|a, b| (a.0.min(b.0), a.1.max(b.1)))
}

/// Range of `x[.., start..end, ..]` along `slice.dim`.
fn slice_range(key: &str, x: &[f32], shape: &[usize], slice: SliceOf) -> Result<Option<(f32, f32)>, QdqHookError> {
    if slice.dim >= shape.len() || slice.end > shape[slice.dim] || slice.start > slice.end {
        return Err(QdqHookError::Shape {
            key: key.to_string(),
            problem: format!("concatenation slice {slice:?} does not fit a tensor of shape {shape:?}"),
        });
    }
    let inner: usize = shape[slice.dim + 1..].iter().product();
    let mid = shape[slice.dim];
    let (a, b) = (slice.start * inner, slice.end * inner);
    Ok(x.chunks_exact((mid * inner).max(1))
        .filter_map(|blk| min_max_of(&blk[a..b]))
        .reduce(|p, q| (p.0.min(q.0), p.1.max(q.1))))
}

impl QdqHook for ObserverHook {
    fn apply(&self, point: &QdqAttr, x: &[f32], shape: &[usize]) -> Result<Option<Vec<f32>>, QdqHookError> {
        if scheme_of(&point.kind).is_none() {
            return Ok(None);
        }
        let mut state = self.state.lock().map_err(|_| QdqHookError::Poisoned { what: "observer state" })?;
        *state.hits.entry(point.key.clone()).or_default() += 1;
        let whole = if self.last_position_only(point) { last_position_range(x, shape) } else { min_max_of(x) };
        let Some(whole) = whole else { return Ok(None) };
        if point.kind == QdqKind::Rope {
            state.rope_tables.insert(point.key.clone(), (shape.to_vec(), x.to_vec()));
        }
        let state = &mut *state;
        match state.slots.get_mut(&point.key) {
            // Only deployed mode (every position) keeps histograms, so `x` is what `whole` spans.
            Some(Slot::Own(o)) => o.observe(x, whole),
            Some(Slot::Concat { group, point: i }) => {
                let (g, i) = (*group, *i);
                let into_concat = match state.concat_slices.get(&(g, i)).copied().flatten() {
                    Some(slice) => slice_range(&point.key, x, shape, slice)?.unwrap_or(whole),
                    None => whole,
                };
                state.concats[g].observe(i, whole, into_concat);
            }
            None => return Err(QdqHookError::NotTraced { key: point.key.clone() }),
        }
        Ok(None)
    }
}

/// What calibration produced.
#[derive(Clone, Debug)]
pub struct Calibration {
    /// Parameters of every QDQ point (observed, fixed or global).
    pub params: QdqParams,
    /// The tensors seen at RoPE points (`[1, L, D]` sin / cos tables), by QDQ key.
    pub rope_tables: BTreeMap<String, (Vec<usize>, Vec<f32>)>,
    /// Final observed range of every observed point.
    pub ranges: BTreeMap<String, (f32, f32)>,
    /// How often each observed point was reached.
    pub hits: BTreeMap<String, usize>,
    pub mode: CalibrationMode,
}

/// The [`WeightStore`] a model binds to while it is calibrated: a float checkpoint's weights as
/// the calibration mode wants them (module docs). Linear weights are LPBQ-quantized with the block
/// size the AOT config gives their op.
pub struct CalibrationWeights<'a> {
    store: &'a CheckpointStore,
    aot: &'a AotConfig,
    mode: CalibrationMode,
    /// In deployed mode, how the linears are rounded (pymllm's rounding when absent).
    linears: Option<&'a LinearQuantizer>,
    /// When set, only this linear (op path) is quantized; every other parameter is the store's
    /// as it is (a float model with one linear rounded, to measure that linear's sensitivity).
    only: Option<String>,
}

impl<'a> CalibrationWeights<'a> {
    /// `aot` must already have been checked against the model's linears
    /// ([`AotConfig::check_block_size`]).
    pub fn new(store: &'a CheckpointStore, aot: &'a AotConfig, mode: CalibrationMode) -> Self {
        CalibrationWeights { store, aot, mode, linears: None, only: None }
    }

    /// Quantizes the linear `op` only (see the field); the rest is the store's as stored.
    pub fn only(mut self, op: &str) -> Self {
        self.only = Some(op.to_string());
        self
    }

    /// Deployed mode observes the linears as `linears` rounds them (the export must use the same
    /// quantizer). mllm-compatible mode ignores it: pymllm's rounding is part of what it reproduces.
    pub fn with_linears(mut self, linears: &'a LinearQuantizer) -> Self {
        self.linears = Some(linears);
        self
    }

    /// The LPBQ shape of the linear weight `req` (`n_out x n_in`), its block size from the AOT config.
    fn lpbq_shape(&self, req: &ParamRequest<'_>, n_out: usize, n_in: usize) -> DslResult<LpbqShape> {
        let (bs, field) = self.aot.linear_block_size(req.module_path).map_err(|e| weight_error(req, e.to_string()))?;
        LpbqShape::new(n_out, n_in, bs).map_err(|e| weight_error(req, format!("LPBQ block size from `{field}`: {e}")))
    }

    /// In deployed mode, the linear weight `req` decoded from the export `linears` already made
    /// for it (the AOT run rounds every weight before calibrating), without reading the float one.
    fn cached_linear(&self, req: &ParamRequest<'_>) -> DslResult<Option<Vec<f32>>> {
        let (CalibrationMode::Deployed, Some(linears)) = (self.mode, self.linears) else { return Ok(None) };
        let (n_out, n_in, hwio) = match (req.role, req.shape) {
            (ParamRole::Conv2dWeight, &[1, 1, n_in, n_out]) => (n_out, n_in, true),
            (ParamRole::LinearWeight, &[n_out, n_in]) => (n_out, n_in, false),
            _ => return Ok(None),
        };
        let op = req.key.strip_suffix(".weight").unwrap_or(req.key);
        let Some(export) = linears.cached_export(op, self.lpbq_shape(req, n_out, n_in)?) else { return Ok(None) };
        let decoded = if hwio { export.decode_hwio() } else { export.decode() };
        decoded.map(Some).map_err(|e| weight_error(req, e.to_string()))
    }

    /// `[Out][In]` row-major weight → what calibration sees, `[Out][In]`, or `[In][Out]` with `hwio`.
    fn linear(&self, req: &ParamRequest<'_>, w: &[f32], n_out: usize, n_in: usize, hwio: bool) -> DslResult<Vec<f32>> {
        let weight_err = |message: String| weight_error(req, message);
        let shape = self.lpbq_shape(req, n_out, n_in)?;
        if let (CalibrationMode::Deployed, Some(linears)) = (self.mode, self.linears) {
            let op = req.key.strip_suffix(".weight").unwrap_or(req.key);
            let export = linears.export(op, w, shape).map_err(|e| weight_err(e.to_string()))?;
            let decoded = if hwio { export.decode_hwio() } else { export.decode() };
            return decoded.map_err(|e| weight_err(e.to_string()));
        }
        let blocks = lpbq_block_quantize(w, shape).map_err(|e| weight_err(e.to_string()))?;
        let rows = match self.mode {
            CalibrationMode::MllmCompatible => blocks.fake_quant_weights(),
            CalibrationMode::Deployed => blocks.to_export().decode().map_err(|e| weight_err(e.to_string()))?,
        };
        if hwio {
            transpose(req, &rows, n_out, n_in)
        } else {
            Ok(rows)
        }
    }
}

impl WeightStore for CalibrationWeights<'_> {
    fn load(&self, req: &ParamRequest<'_>) -> DslResult<Tensor> {
        if let Some(op) = &self.only {
            if req.key.strip_suffix(".weight") != Some(op.as_str()) {
                return self.store.load(req);
            }
        }
        if let Some(decoded) = self.cached_linear(req)? {
            return Tensor::from_f32(decoded, req.shape.to_vec(), self.store.backend());
        }
        let t = self.store.load(req)?;
        let data = crate::executor::real_values(&t)
            .ok_or_else(|| mllm_dsl::Error::msg(format!("`{}` has no real-valued data", req.key)))?;
        let data = &*data;
        let out = match req.role {
            ParamRole::Conv2dWeight => {
                // HWIO [1, 1, In, Out] <-> [Out][In].
                let (n_in, n_out) = (req.shape[2], req.shape[3]);
                let w = transpose(req, data, n_in, n_out)?;
                self.linear(req, &w, n_out, n_in, true)?
            }
            ParamRole::LinearWeight => self.linear(req, data, req.shape[0], req.shape[1], false)?,
            ParamRole::NormWeight | ParamRole::EmbeddingWeight if self.mode == CalibrationMode::Deployed => {
                quantize_u16_weight(data)
                    .map_err(|e| mllm_dsl::Error::Weight {
                        key: req.key.to_string(),
                        module_path: req.module_path.to_string(),
                        message: format!("uint16 quantization: {e}"),
                    })?
                    .decode()
            }
            _ => return Ok(t),
        };
        Tensor::from_f32(out, req.shape.to_vec(), self.store.backend())
    }

    fn contains(&self, key: &str) -> bool {
        self.store.contains(key)
    }

    fn backend(&self) -> BackendRef {
        self.store.backend()
    }
}

/// A weight error naming `req`'s key and module path.
fn weight_error(req: &ParamRequest<'_>, message: String) -> mllm_dsl::Error {
    mllm_dsl::Error::Weight { key: req.key.to_string(), module_path: req.module_path.to_string(), message }
}

/// `rows x cols` row-major → `cols x rows`, for the weight `req` asked for.
pub(crate) fn transpose(req: &ParamRequest<'_>, x: &[f32], rows: usize, cols: usize) -> DslResult<Vec<f32>> {
    crate::kernels::transpose_2d(x, rows, cols).map_err(|e| mllm_dsl::Error::Weight {
        key: req.key.to_string(),
        module_path: req.module_path.to_string(),
        message: format!("transposing [{rows}, {cols}]: {e}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_linear_rounded_before_calibration_reaches_the_model_as_if_rounded_there() {
        // The AOT run rounds every linear before calibrating; the calibration model then takes
        // the cached export (without the float weight) and must see the same values, in both layouts.
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../fixtures/qwen3-dev-f32");
        let hf = models::hf::HfConfig::from_dir(dir).unwrap();
        let store = CheckpointStore::for_config(dir, crate::CpuBackend::float(), &hf).unwrap();
        let aot = AotConfig::w4a16_kv8();
        let (op, key) = ("model.layers.0.mlp.up_proj", "model.layers.0.mlp.up_proj.weight");
        let (n_out, n_in) = (hf.intermediate_size, hf.hidden_size);
        let (block, _) = aot.linear_block_size(op).unwrap();
        let hf_rows = store.checkpoint().read_float_param(key).unwrap();
        for (role, shape) in
            [(ParamRole::Conv2dWeight, [1, 1, n_in, n_out].to_vec()), (ParamRole::LinearWeight, vec![n_out, n_in])]
        {
            let req = ParamRequest { key, module_path: op, role, shape: &shape };
            let at_calibration = LinearQuantizer::rtn();
            let rounded_there =
                CalibrationWeights::new(&store, &aot, CalibrationMode::Deployed).with_linears(&at_calibration);
            assert!(rounded_there.cached_linear(&req).unwrap().is_none());
            let rounded_there = rounded_there.load(&req).unwrap();

            let before = LinearQuantizer::rtn();
            before.quantize(op, &hf_rows, LpbqShape::new(n_out, n_in, block).unwrap()).unwrap();
            let from_cache = CalibrationWeights::new(&store, &aot, CalibrationMode::Deployed).with_linears(&before);
            assert!(from_cache.cached_linear(&req).unwrap().is_some(), "{role:?}: the cached export is taken");
            let from_cache = from_cache.load(&req).unwrap();
            assert_eq!(from_cache.shape(), rounded_there.shape());
            let values = |t: &Tensor| crate::executor::real_values(t).unwrap().to_vec();
            assert_eq!(values(&from_cache), values(&rounded_there), "{role:?}");
        }
    }

    #[test]
    fn last_position_and_slices_pick_the_right_elements() {
        // [1, 2, 3, 2]: two outer blocks of 3 rows x 2.
        let x: Vec<f32> = (0..12).map(|v| v as f32).collect();
        assert_eq!(last_position_range(&x, &[1, 2, 3, 2]), Some((4.0, 11.0)));
        assert_eq!(last_position_range(&x, &[2, 3, 2]), Some((4.0, 11.0)));
        let x = [5.0, 1.0, 9.0, -2.0];
        assert_eq!(last_position_range(&x, &[1, 1, 2, 2]), Some((-2.0, 9.0)));
        // First half of the last dim of [2, 4]: elements 0,1 and 4,5.
        let x = [1.0, -3.0, 7.0, 8.0, 0.5, 2.0, -9.0, 9.0];
        assert_eq!(slice_range("p", &x, &[2, 4], SliceOf { dim: 1, start: 0, end: 2 }).unwrap(), Some((-3.0, 2.0)));
        assert_eq!(slice_range("p", &x, &[2, 4], SliceOf { dim: 0, start: 1, end: 2 }).unwrap(), Some((-9.0, 9.0)));
        assert!(slice_range("p", &x, &[2, 4], SliceOf { dim: 1, start: 0, end: 5 }).is_err());
    }

    #[test]
    fn observes_without_changing_and_reports_unreached_points() {
        let act = QdqAttr { kind: QdqKind::Activation, key: "m.a".into() };
        let kv = QdqAttr { kind: QdqKind::KvCache, key: "m.k".into() };
        let sig = QdqAttr { kind: QdqKind::Fixed { scale: 1.0 / 65536.0, zero_point: 0 }, key: "m.s".into() };
        let hook = ObserverHook::new(&[act.clone(), kv.clone(), sig.clone()], &[], CalibrationMode::Deployed);
        assert_eq!(hook.apply(&act, &[-1.0, 3.0], &[2]).unwrap(), None);
        assert_eq!(hook.apply(&sig, &[0.5], &[1]).unwrap(), None);
        assert!(matches!(hook.finish(), Err(QuantizationError::Unobserved { key }) if key == "m.k"));
        hook.apply(&kv, &[-2.0, 1.0], &[2]).unwrap();
        let cal = hook.finish().unwrap();
        assert_eq!(cal.params.get("m.a").unwrap().scale, 4.0f32 / 65535.0);
        assert_eq!(cal.params.get("m.k").unwrap().scale, 2.0f32 / 127.5);
        assert_eq!(cal.params.get("m.k").unwrap().zero_point, 128);
        assert_eq!(cal.params.get("m.s").unwrap().scale, 1.0 / 65536.0);
        assert!(hook.apply(&QdqAttr { kind: QdqKind::Activation, key: "other".into() }, &[1.0], &[1]).is_err());
    }

    #[test]
    fn top_module_points_observe_the_last_position_in_mllm_mode() {
        let head = QdqAttr { kind: QdqKind::Activation, key: "lm_head_input_qdq".into() };
        let x = [100.0, -100.0, 1.0, 2.0];
        for (mode, expect) in [(CalibrationMode::MllmCompatible, 2.0f32), (CalibrationMode::Deployed, 200.0)] {
            let hook = ObserverHook::new(std::slice::from_ref(&head), &[], mode);
            hook.apply(&head, &x, &[1, 1, 2, 2]).unwrap();
            let p = *hook.finish().unwrap().params.get("lm_head_input_qdq").unwrap();
            assert_eq!(p.scale, expect / 65535.0, "{mode:?}");
        }
    }
}

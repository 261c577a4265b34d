//! [`CpuBackend`]: executes mllm-dsl ops eagerly on f32 host buffers with the [`kernels`].
//!
//! QDQ points are the identity in float mode; a [`QdqHook`] turns them into fake-quant (or
//! calibration observers) without touching the model file.

use crate::kernels::threads::try_fill_new;
use crate::kernels::{self, BinaryOp, ReduceKind as KReduce, UnaryOp};
use crate::kernels::{BatchRepeat, JoinAxis, RhsPart, RhsParts};
use crate::lazy::{LazyJoin, Strided};
use crate::on_grid::{grid_of, OnGrid};
use crate::packed_weight::{packed_of, WeightView};
use crate::u16_table::u16_table_of;
use compiler::quant::FakeQuantizer;
use mllm_dsl::fused::Fused;
use mllm_dsl::op::{OpKind, ReduceKind};
use mllm_dsl::{Backend, BackendError, BackendRef, QdqAttr, Storage, Tensor, TensorType};
use std::borrow::Cow;
use std::sync::Arc;

/// What happens at a QDQ point in eager mode.
pub trait QdqHook: Send + Sync {
    /// Returns the new data for `x` at `point` (quantized-dequantized, or observed and passed
    /// through). `Ok(None)` leaves the tensor unchanged.
    fn apply(&self, point: &QdqAttr, x: &[f32], shape: &[usize]) -> Result<Option<Vec<f32>>, QdqHookError>;

    /// The grid [`QdqHook::apply`]'s output at `point` lies on, if it is a 16-bit grid: the
    /// backend keeps it with the values ([`OnGrid`]) for the integer int4 products.
    fn grid(&self, _point: &QdqAttr) -> Option<kernels::Grid> {
        None
    }

    /// Whether [`QdqHook::quantizer`] hands out quantizers (the fused steps then run fused).
    fn has_quantizers(&self) -> bool {
        false
    }

    /// The element-wise quantizer of `point` and the 16-bit grid its outputs lie on, for a fused
    /// step that applies the point inside its own loop ([`Backend::fused`]). `None` (the default)
    /// when the hook does more than map each value on its own (an observer must see every
    /// point's whole tensor): the step then runs op by op.
    fn quantizer(&self, _point: &QdqAttr) -> Option<Result<(&FakeQuantizer, Option<kernels::Grid>), QdqHookError>> {
        None
    }

    /// The new data and grid of tensor `x` at `point`: `Ok(None)` leaves it unchanged, as does a
    /// tensor already on the point's 16-bit grid (a uint16 table's values at a QDQ of its own
    /// encoding, a QDQ output at the same point again). A hook that finds the grid and the
    /// quantizer with one lookup overrides it: a decode step passes about a thousand points, and
    /// each lookup in a table the step's weight streaming has evicted costs a few cache misses.
    fn apply_to(&self, point: &QdqAttr, x: &Tensor) -> Result<Option<Quantized>, QdqHookError> {
        let grid = self.grid(point);
        if grid.is_some() && grid == grid_of(x) {
            return Ok(None);
        }
        let data = qdq_input(point, x)?;
        Ok(self.apply(point, &data, x.shape())?.map(|values| Quantized { values, grid }))
    }
}

/// A QDQ point's new data for a tensor ([`QdqHook::apply_to`]).
pub struct Quantized {
    pub values: Vec<f32>,
    /// The 16-bit grid the values lie on, if the point has one.
    pub grid: Option<kernels::Grid>,
}

/// The real values a QDQ point at `point` reads from `x`.
pub(crate) fn qdq_input<'a>(point: &QdqAttr, x: &'a Tensor) -> Result<Cow<'a, [f32]>, QdqHookError> {
    real_values(x).ok_or_else(|| QdqHookError::NotReal { key: point.key.clone(), dtype: x.dtype() })
}

/// Why a [`QdqHook`] could not handle a QDQ point.
#[derive(Debug, thiserror::Error)]
pub enum QdqHookError {
    #[error("QDQ point `{key}` has no parameters: it was not among the points traced from the model file")]
    NoParameters { key: String },
    #[error("QDQ point `{key}` was not among the points traced from the model file; cannot observe it")]
    NotTraced { key: String },
    #[error("QDQ point `{key}` is {here} here but was traced as {traced}")]
    KindMismatch { key: String, here: String, traced: String },
    #[error("the {what} of a QDQ hook is poisoned (a thread panicked while updating it)")]
    Poisoned { what: &'static str },
    #[error("QDQ point `{key}`: its input must hold real-valued data, got {dtype}")]
    NotReal { key: String, dtype: mllm_dsl::DType },
    #[error("QDQ point `{key}`: {problem}")]
    Shape { key: String, problem: String },
    #[error("QDQ point `{key}`: {source}")]
    Kernel {
        key: String,
        #[source]
        source: kernels::KernelError,
    },
    /// The hook's own parameter source failed (e.g. a checkpoint without the point's scale).
    #[error(transparent)]
    Params(Box<dyn std::error::Error + Send + Sync>),
}

/// Why the CPU backend could not run an op or apply a QDQ point; [`Backend::execute`] and
/// [`Backend::qdq`] hand its message to the core, which adds the op, module path and call site.
#[derive(Debug, thiserror::Error)]
pub enum CpuOpError {
    #[error("{what} must hold real-valued data, got {dtype}")]
    NotReal { what: &'static str, dtype: mllm_dsl::DType },
    #[error("{what} must hold integer ids, got {dtype}")]
    NotIds { what: &'static str, dtype: mllm_dsl::DType },
    #[error("{0}")]
    Kernel(#[from] kernels::KernelError),
    #[error("{0}")]
    Hook(#[from] QdqHookError),
    #[error("{0}")]
    Tensor(#[from] mllm_dsl::Error),
    /// An input (or the QDQ input's backend) that the op needs is absent.
    #[error("{0}")]
    Missing(&'static str),
    #[error("lazy result has shape {shape:?}, expected {out}")]
    LazyShape { shape: Vec<usize>, out: TensorType },
    #[error("input has {features} features but the weight {weight} expects {expected}")]
    Features { features: usize, weight: String, expected: usize },
    #[error("kernel produced {found} elements, expected {expected} for {out}")]
    OutputLength { found: usize, expected: usize, out: TensorType },
}

/// How an int4 linear multiplies input rows that lie on a QDQ point's 16-bit grid.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum GridProducts {
    /// The codes in integers where the CPU can ([`kernels::linear_packed_on_grid`]): exact sums,
    /// the fastest tile.
    #[default]
    Integer,
    /// The values in f32 like any other rows: the summation of a float reference (backend-qnn's
    /// interpreter multiplies decoded weights in f32), so a comparison with it measures
    /// semantics rather than summation order.
    F32,
}

/// How a linear multiplies its input with bf16 weights.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Bf16Products {
    /// The weights widened to f32 and the input kept f32: the float references' arithmetic
    /// (HF transformers run in float32).
    #[default]
    F32,
    /// The input rounded to bf16 (to nearest even) and the products summed in f32
    /// ([`kernels::linear_packed_bf16`]): prefill chunks on AMX tiles where the CPU has AMX-BF16
    /// (Intel since Sapphire Rapids), else twice the multiply rate of f32 on AMD CPUs with
    /// AVX-512 BF16 (`vdpbf16ps`; Zen 4), for a prefill about twice as fast or more (elsewhere
    /// the rounded input takes the f32 tiles, no faster than f32 products), at the cost of the
    /// input's precision (8 significant bits instead of 24), as llama.cpp's bf16 and torch's
    /// bfloat16 linears do.
    Bf16,
}

/// The eager CPU backend.
#[derive(Clone, Default)]
pub struct CpuBackend {
    qdq: Option<Arc<dyn QdqHook>>,
    products: GridProducts,
    bf16: Bf16Products,
}

impl CpuBackend {
    /// Float mode: QDQ points are the identity.
    pub fn float() -> BackendRef {
        CpuBackend::configured(None, GridProducts::default())
    }

    /// QDQ points go through `hook` (fake-quant, calibration).
    pub fn with_qdq(hook: Arc<dyn QdqHook>) -> BackendRef {
        CpuBackend::configured(Some(hook), GridProducts::default())
    }

    /// QDQ points through `hook` when there is one, grid rows multiplied as `products` says.
    pub fn configured(hook: Option<Arc<dyn QdqHook>>, products: GridProducts) -> BackendRef {
        Arc::new(CpuBackend { qdq: hook, products, bf16: Bf16Products::default() })
    }

    /// Float mode with bf16 weights multiplied as `bf16` says.
    pub fn float_with(bf16: Bf16Products) -> BackendRef {
        Arc::new(CpuBackend { bf16, ..CpuBackend::default() })
    }
}

/// Real values of an input: f32 data in place, packed weights and lazy joins materialized.
fn f32_of<'a>(t: &'a Tensor, what: &'static str) -> Result<Cow<'a, [f32]>, CpuOpError> {
    real_values(t).ok_or(CpuOpError::NotReal { what, dtype: t.dtype() })
}

/// `t`'s real values in its logical (row-major) layout: borrowed for f32 storage, computed for
/// this backend's own storages ([`PackedWeight`](crate::PackedWeight), [`LazyJoin`], [`Strided`]);
/// `None` for integer or foreign data.
pub fn real_values(t: &Tensor) -> Option<Cow<'_, [f32]>> {
    let storage = t.storage()?;
    if let Some(v) = storage.dense_f32() {
        return Some(Cow::Borrowed(v));
    }
    match storage {
        Storage::Native(data) => match (packed_of(t), lazy_of(t), data.downcast_ref::<Strided>()) {
            (Some(w), _, _) => Some(Cow::Owned(w.to_f32())),
            (_, Some(l), _) => l.materialize().ok().map(Cow::Owned),
            (_, _, Some(view)) => Some(view.values()),
            _ => u16_table_of(t).map(|table| Cow::Owned(table.to_f32())),
        },
        Storage::F32(_) | Storage::I64(_) => None,
    }
}

/// The lazy join behind `t`, if it has one.
fn lazy_of(t: &Tensor) -> Option<&LazyJoin> {
    match t.storage()? {
        Storage::Native(data) => data.downcast_ref::<LazyJoin>(),
        _ => None,
    }
}

/// `t`'s f32 values as a part of a lazy join, shared, not copied: dense data, or a strided view
/// of the same shape (a view op changes the shape and leaves the data: then `None`).
fn part_of(t: &Tensor) -> Option<Strided> {
    let storage = t.storage()?;
    if let Some(data) = storage.dense_f32() {
        return Strided::dense(data.clone(), t.shape().to_vec()).ok();
    }
    match storage {
        Storage::Native(data) => data.downcast_ref::<Strided>().filter(|v| v.shape == t.shape()).cloned(),
        _ => None,
    }
}

fn lazy_storage(lazy: LazyJoin, out: &TensorType) -> Result<Storage, CpuOpError> {
    if lazy.shape != out.shape {
        return Err(CpuOpError::LazyShape { shape: lazy.shape, out: out.clone() });
    }
    Ok(Storage::Native(Arc::new(lazy)))
}

/// `x @ y` read straight from `y`'s lazy parts: `y`'s batch dims must equal `x`'s (no
/// broadcasting), it must be joined along one of its two matrix dims and repeated along a batch
/// dim. `None` when the product does not have that form (the caller materializes `y`).
fn matmul_lazy(x: &Tensor, y: &LazyJoin) -> Result<Option<Vec<f32>>, CpuOpError> {
    let (xs, ys) = (x.shape(), y.shape.as_slice());
    let r = ys.len();
    if r < 3 || xs.len() != r || xs[..r - 2] != ys[..r - 2] || xs[r - 1] != ys[r - 2] {
        return Ok(None);
    }
    let axis = match (y.parts.len(), y.cat_dim) {
        (1, _) => JoinAxis::K,
        (_, d) if d == r - 2 => JoinAxis::K,
        (_, d) if d == r - 1 => JoinAxis::N,
        _ => return Ok(None),
    };
    if y.times > 1 && y.repeat_dim >= r - 2 {
        return Ok(None);
    }
    let src_batch = &y.parts[0].shape[..r - 2];
    let batches = if y.times > 1 {
        let d = y.repeat_dim;
        BatchRepeat {
            outer: src_batch[..d].iter().product(),
            size: src_batch[d],
            times: y.times,
            inner: src_batch[d + 1..].iter().product(),
        }
    } else {
        BatchRepeat::none(src_batch.iter().product())
    };
    let extent_dim = match axis {
        JoinAxis::K => r - 2,
        JoinAxis::N => r - 1,
    };
    let parts = y
        .parts
        .iter()
        .map(|p| RhsPart {
            data: p.data.part_data(),
            extent: p.shape[extent_dim],
            batch_stride: p.batch_stride,
            row_stride: p.row_stride,
        })
        .collect();
    let rhs = RhsParts { parts, axis, k: ys[r - 2], n: ys[r - 1], batches };
    let a = f32_of(x, "lhs")?;
    Ok(Some(kernels::matmul_parts(&a, xs[r - 2], &rhs)?))
}

fn i64_of<'a>(t: &'a Tensor, what: &'static str) -> Result<&'a [i64], CpuOpError> {
    t.as_i64().ok_or(CpuOpError::NotIds { what, dtype: t.dtype() })
}

/// The last `N` dims of `shape` when all dims before them are 1.
fn trailing<const N: usize>(shape: &[usize]) -> Option<[usize; N]> {
    let lead = shape.len().checked_sub(N)?;
    shape[..lead].iter().all(|&n| n == 1).then(|| shape[lead..].try_into().ok())?
}

/// Whether every input of a fused step is an f32 tensor.
fn all_f32(inputs: &[&Tensor]) -> bool {
    inputs.iter().all(|t| t.dtype() == mllm_dsl::DType::F32)
}

/// Whether `table` is `[.., S, D]` with leading dims of 1 and `x` is `[.., S, D]`: each of `x`'s
/// rows of `D` reads the table's row `r % S`.
fn rows_match(x: &[usize], table: &[usize]) -> bool {
    x.len() >= 2
        && table.len() >= 2
        && x[x.len() - 2..] == table[table.len() - 2..]
        && table[..table.len() - 2].iter().all(|&n| n == 1)
}

/// The f32 values of a fused step's input.
fn fused_input<'t>(t: &'t Tensor, what: &str) -> Result<Cow<'t, [f32]>, BackendError> {
    real_values(t).ok_or_else(|| BackendError::Op(format!("a fused step's {what} must hold real-valued data")))
}

/// The masked softmax's three one-value constants, as its fused steps take them.
fn softmax_constants(
    scale: &Tensor,
    below_min: &Tensor,
    attend: &Tensor,
) -> Result<kernels::MaskedSoftmaxConstants, BackendError> {
    let constant = |t: &Tensor, what| fused_input(t, what).map(|v| v[0]);
    Ok(kernels::MaskedSoftmaxConstants {
        scale: constant(scale, "scale")?,
        below_min: constant(below_min, "offset below the row minimum")?,
        attend: constant(attend, "attending mask value")?,
    })
}

/// A fused step's output of `like`'s type: on the last point's 16-bit grid if it has one, as that
/// point's own output would be.
fn fused_output(like: &Tensor, values: Vec<f32>, grid: Option<kernels::Grid>) -> Result<Tensor, BackendError> {
    let backend =
        like.backend().cloned().ok_or_else(|| BackendError::Op("a fused step's input has no backend".into()))?;
    Tensor::from_storage(like.ty().clone(), quantized_storage(values, grid), backend)
        .map_err(|e| BackendError::Op(e.to_string()))
}

/// A QDQ point's output values, kept with the 16-bit grid they lie on if the point has one.
fn quantized_storage(values: Vec<f32>, grid: Option<kernels::Grid>) -> Storage {
    match grid {
        Some(grid) => Storage::Native(Arc::new(OnGrid { values: values.into(), grid })),
        None => out_f32(values),
    }
}

fn out_f32(data: Vec<f32>) -> Storage {
    Storage::F32(data.into())
}

impl Backend for CpuBackend {
    fn name(&self) -> &str {
        if self.qdq.is_some() {
            "cpu-qdq"
        } else {
            "cpu"
        }
    }

    fn execute(&self, op: &OpKind, inputs: &[&Tensor], out: &TensorType) -> Result<Storage, BackendError> {
        let result = match profile::start() {
            None => self.run(op, inputs, out),
            Some(t0) => {
                let result = self.run(op, inputs, out);
                profile::record(op, inputs, t0);
                result
            }
        };
        result.map_err(|e| BackendError::Op(e.to_string()))
    }

    fn qdq(&self, x: &Tensor, point: &QdqAttr) -> Result<Tensor, BackendError> {
        let t0 = profile::start();
        let result = self.apply_qdq(x, point);
        profile::lap(t0, profile::QDQ_POINT);
        result.map_err(|e| BackendError::Qdq { key: point.key.clone(), message: e.to_string() })
    }

    fn fuses(&self, kind: Fused) -> bool {
        matches!(
            kind,
            Fused::RotateHalfRope | Fused::MaskedSoftmax | Fused::SiluGate | Fused::Attention | Fused::ResidualAdd
        ) && self.qdq.as_ref().is_none_or(|h| h.has_quantizers())
    }

    fn fused(&self, kind: Fused, inputs: &[&Tensor], points: &[QdqAttr]) -> Option<Result<Tensor, BackendError>> {
        let t0 = profile::start();
        let (result, label) = match kind {
            Fused::RotateHalfRope => (self.rotate_half_rope(inputs, points), "RoPE (fused)"),
            Fused::MaskedSoftmax => (self.masked_softmax(inputs, points), "masked softmax (fused)"),
            Fused::SiluGate => (self.silu_gate(inputs, points), "SiLU gate (fused)"),
            Fused::Attention => (self.attention(inputs, points), profile::ATTENTION_FUSED),
            Fused::ResidualAdd => (self.residual_add(inputs, points), "residual add (fused)"),
            _ => (None, ""),
        };
        profile::lap(t0, label);
        result
    }
}

impl CpuBackend {
    /// [`Backend::qdq`] with the hook's or the input's problem.
    fn apply_qdq(&self, x: &Tensor, point: &QdqAttr) -> Result<Tensor, CpuOpError> {
        let Some(hook) = &self.qdq else { return Ok(x.clone()) };
        match hook.apply_to(point, x)? {
            None => Ok(x.clone()),
            Some(Quantized { values: new, grid }) => {
                let backend = x.backend().cloned().ok_or(CpuOpError::Missing("QDQ input has no backend"))?;
                Ok(Tensor::from_storage(x.ty().clone(), quantized_storage(new, grid), backend)?)
            }
        }
    }

    /// [`Fused::RotateHalfRope`] on f32 `[x, cos, sin]`, `x [.., S, D]` and the tables `[S, D]`
    /// (leading dims of 1), with its four points; `None` for other inputs (the step then runs op
    /// by op).
    fn rotate_half_rope(&self, inputs: &[&Tensor], points: &[QdqAttr]) -> Option<Result<Tensor, BackendError>> {
        let &[x, cos, sin] = inputs else { return None };
        if !all_f32(inputs) || !rows_match(x.shape(), cos.shape()) || sin.shape() != cos.shape() {
            return None;
        }
        let (quantizers, grid) = match self.quantizers::<4>(points)? {
            Ok(found) => found,
            Err(e) => return Some(Err(e)),
        };
        let run = || {
            let (xs, cs, ss) =
                (fused_input(x, "input")?, fused_input(cos, "cos table")?, fused_input(sin, "sin table")?);
            let d = x.shape()[x.shape().len() - 1];
            // SAFETY: `rotate_half` writes all of its output when it returns Ok.
            let out = unsafe { try_fill_new(xs.len(), |out| kernels::rotate_half(&xs, &cs, &ss, d, &quantizers, out)) }
                .map_err(|e| BackendError::Op(e.to_string()))?;
            fused_output(x, out, grid)
        };
        Some(run())
    }

    /// [`Fused::SiluGate`] on f32 `[gate, up]` of one shape, with its three points; `None` for
    /// other inputs.
    fn silu_gate(&self, inputs: &[&Tensor], points: &[QdqAttr]) -> Option<Result<Tensor, BackendError>> {
        self.zip_step(inputs, ["gate", "up"], || self.quantizers::<3>(points), kernels::silu_gate)
    }

    /// [`Fused::ResidualAdd`] on f32 `[x, y]` of one shape with its one or two points; `None` for
    /// other inputs.
    fn residual_add(&self, inputs: &[&Tensor], points: &[QdqAttr]) -> Option<Result<Tensor, BackendError>> {
        // Without the sum's point the output lies on no grid.
        let found = || match points.len() {
            1 => self.quantizers::<1>(points).map(|f| f.map(|([branch], _)| ([branch, None], None))),
            _ => self.quantizers::<2>(points),
        };
        self.zip_step(inputs, ["residual", "branch"], found, kernels::residual_add)
    }

    /// An elementwise fused step on f32 `[a, b]` of one shape (`what` names them in errors):
    /// its points' quantizers and output grid as `found` gives them ([`CpuBackend::quantizers`]),
    /// then `kernel` over the two inputs' values; `None` for other inputs.
    fn zip_step<'h, const N: usize>(
        &'h self,
        inputs: &[&Tensor],
        what: [&str; 2],
        found: impl FnOnce() -> Option<Result<(kernels::QdqPoints<'h, N>, Option<kernels::Grid>), BackendError>>,
        kernel: impl Fn(
            &[f32],
            &[f32],
            &kernels::QdqPoints<'h, N>,
            &mut [std::mem::MaybeUninit<f32>],
        ) -> Result<(), kernels::KernelError>,
    ) -> Option<Result<Tensor, BackendError>> {
        let &[a, b] = inputs else { return None };
        if !all_f32(inputs) || a.shape() != b.shape() {
            return None;
        }
        let (quantizers, grid) = match found()? {
            Ok(found) => found,
            Err(e) => return Some(Err(e)),
        };
        let run = || {
            let (av, bv) = (fused_input(a, what[0])?, fused_input(b, what[1])?);
            // SAFETY: the fused kernels write all of their output when they return Ok.
            let out = unsafe { try_fill_new(av.len(), |out| kernel(&av, &bv, &quantizers, out)) }
                .map_err(|e| BackendError::Op(e.to_string()))?;
            fused_output(a, out, grid)
        };
        Some(run())
    }

    /// [`Fused::MaskedSoftmax`] on f32 `[scores, mask, scale, below_min, attend]`, `scores
    /// [.., S, T]`, the mask `[S, T]` (leading dims of 1) and three one-value constants, with its
    /// five points; `None` for other inputs.
    fn masked_softmax(&self, inputs: &[&Tensor], points: &[QdqAttr]) -> Option<Result<Tensor, BackendError>> {
        let &[scores, mask, scale, below_min, attend] = inputs else { return None };
        if !all_f32(inputs)
            || !rows_match(scores.shape(), mask.shape())
            || [scale, below_min, attend].iter().any(|c| c.numel() != 1)
        {
            return None;
        }
        let (quantizers, grid) = match self.quantizers::<5>(points)? {
            Ok(found) => found,
            Err(e) => return Some(Err(e)),
        };
        let run = || {
            let constants = softmax_constants(scale, below_min, attend)?;
            let (s, m) = (fused_input(scores, "scores")?, fused_input(mask, "mask")?);
            let t = scores.shape()[scores.shape().len() - 1];
            let out = kernels::masked_softmax(&s, t, &m, constants, &quantizers)
                .map_err(|e| BackendError::Op(e.to_string()))?;
            fused_output(scores, out, grid)
        };
        Some(run())
    }

    /// [`Fused::Attention`] on `[q, k, v, past_k, past_v, mask, scale, below_min, attend]`: `q [..,
    /// H, S, D]` f32, the new `k [.., Hkv, D, S]` and `v [.., Hkv, S, D]` and the past `[.., Hkv,
    /// D, P]` and `[.., Hkv, P, D]` in place (dense, or views of the KV cache), the mask `[.., S,
    /// P + S]` and three one-value constants, leading dims of 1; with its seven points. `None` for
    /// other inputs (the step then runs op by op).
    fn attention(&self, inputs: &[&Tensor], points: &[QdqAttr]) -> Option<Result<Tensor, BackendError>> {
        let &[q, k, v, past_k, past_v, mask, scale, below_min, attend] = inputs else { return None };
        let [h, s, d] = trailing::<3>(q.shape())?;
        let [hkv, d_k, s_k] = trailing::<3>(k.shape())?;
        let [hkv_p, d_p, p] = trailing::<3>(past_k.shape())?;
        let t = p + s;
        let fits = hkv > 0
            && h % hkv == 0
            && [hkv_p, d_k, s_k, d_p] == [hkv, d, s, d]
            && trailing::<3>(v.shape()) == Some([hkv, s, d])
            && trailing::<3>(past_v.shape()) == Some([hkv, p, d])
            && trailing::<2>(mask.shape()) == Some([s, t])
            && [q, mask, scale, below_min, attend].iter().all(|x| x.dtype() == mllm_dsl::DType::F32)
            && [scale, below_min, attend].iter().all(|c| c.numel() == 1);
        if !fits {
            return None;
        }
        let parts = [past_k, k, past_v, v].map(part_of);
        let [Some(past_k), Some(k), Some(past_v), Some(v)] = &parts else { return None };
        let (quantizers, grid) = match self.quantizers::<7>(points)? {
            Ok(found) => found,
            Err(e) => return Some(Err(e)),
        };
        let run = || {
            fn part(x: &Strided, extent: usize) -> RhsPart<'_> {
                RhsPart { data: x.data.part_data(), extent, batch_stride: x.batch_stride, row_stride: x.row_stride }
            }
            let batches = BatchRepeat { outer: 1, size: hkv, times: h / hkv, inner: 1 };
            let keys = RhsParts { parts: vec![part(past_k, p), part(k, s)], axis: JoinAxis::N, k: d, n: t, batches };
            let values = RhsParts { parts: vec![part(past_v, p), part(v, s)], axis: JoinAxis::K, k: t, n: d, batches };
            let constants = softmax_constants(scale, below_min, attend)?;
            let (qv, m) = (fused_input(q, "query")?, fused_input(mask, "mask")?);
            let out = kernels::attention(&qv, s, &keys, &values, &m, constants, &quantizers)
                .map_err(|e| BackendError::Op(e.to_string()))?;
            fused_output(q, out, grid)
        };
        Some(run())
    }

    /// The fake quantizers of a fused step's `points`, looked up in the model's order (the hook's
    /// lookups learn that order), and the grid of the last one's output; all `None` in float
    /// mode. `None` when there are not `N` points or the hook hands out no quantizers.
    #[allow(clippy::type_complexity)]
    fn quantizers<const N: usize>(
        &self,
        points: &[QdqAttr],
    ) -> Option<Result<(kernels::QdqPoints<'_, N>, Option<kernels::Grid>), BackendError>> {
        if points.len() != N {
            return None;
        }
        let mut found = ([None; N], None);
        if let Some(hook) = &self.qdq {
            for (slot, p) in found.0.iter_mut().zip(points) {
                match hook.quantizer(p)? {
                    Ok((q, grid)) => (*slot, found.1) = (Some(q), grid),
                    Err(e) => return Some(Err(BackendError::Qdq { key: p.key.clone(), message: e.to_string() })),
                }
            }
        }
        Some(Ok(found))
    }

    fn run(&self, op: &OpKind, inputs: &[&Tensor], out: &TensorType) -> Result<Storage, CpuOpError> {
        let x = inputs[0];
        let shape = x.shape();
        let e = CpuOpError::Kernel;
        let same_buffer = || x.storage().cloned().ok_or(CpuOpError::Missing("no data"));
        let data = match op {
            // Views keep the buffer: only the logical type changes. So do permutations that keep
            // the element order (a decode step's head splits and merges of its one token).
            OpKind::View { .. } | OpKind::Unsqueeze { .. } => return same_buffer(),
            OpKind::Transpose { .. } | OpKind::Permute { .. } if keeps_order(op, shape) => return same_buffer(),
            OpKind::Cast { to } => return cast(x, *to),
            OpKind::Transpose { dim0, dim1 } => {
                kernels::transpose(&f32_of(x, "input")?, shape, *dim0 as isize, *dim1 as isize).map_err(e)?.0
            }
            OpKind::Permute { perm } => {
                let perm: Vec<isize> = perm.iter().map(|&p| p as isize).collect();
                kernels::permute(&f32_of(x, "input")?, shape, &perm).map_err(e)?.0
            }
            OpKind::Slice { dim, start, end } => {
                kernels::slice(&f32_of(x, "input")?, shape, *dim as isize, *start as isize, *end as isize).map_err(e)?.0
            }
            OpKind::Concat { dim } if inputs.len() > 1 && inputs.iter().all(|t| part_of(t).is_some()) => {
                let parts = inputs.iter().filter_map(|t| part_of(t)).collect();
                return lazy_storage(LazyJoin::concat(parts, *dim).map_err(e)?, out);
            }
            OpKind::Concat { dim } => {
                let data = inputs.iter().map(|t| f32_of(t, "input")).collect::<Result<Vec<_>, CpuOpError>>()?;
                let parts: Vec<(&[f32], &[usize])> = data.iter().zip(inputs).map(|(d, t)| (&**d, t.shape())).collect();
                kernels::concat(&parts, *dim as isize).map_err(e)?.0
            }
            OpKind::Repeat { dim, times } if part_of(x).is_some() || lazy_of(x).is_some_and(|l| l.shape == shape) => {
                let lazy = match (part_of(x), lazy_of(x)) {
                    (Some(part), _) => LazyJoin::single(part),
                    (_, Some(l)) => l.clone(),
                    _ => unreachable!("checked by the guard"),
                };
                match lazy.repeat(*dim, *times) {
                    Some(repeated) => return lazy_storage(repeated, out),
                    None => {
                        kernels::repeat_interleave(&lazy.materialize().map_err(e)?, shape, *dim as isize, *times)
                            .map_err(e)?
                            .0
                    }
                }
            }
            OpKind::Repeat { dim, times } => {
                kernels::repeat_interleave(&f32_of(x, "input")?, shape, *dim as isize, *times).map_err(e)?.0
            }
            OpKind::MatMul => {
                let y = inputs[1];
                if let Some(lazy) = lazy_of(y).filter(|l| l.shape == y.shape()) {
                    if let Some(data) = matmul_lazy(x, lazy)? {
                        return check_len(data, out);
                    }
                }
                kernels::matmul(&f32_of(x, "lhs")?, shape, &f32_of(y, "rhs")?, y.shape()).map_err(e)?.0
            }
            OpKind::Add | OpKind::Sub | OpKind::Mul | OpKind::Equal => {
                let y = inputs[1];
                let (a, b) = (f32_of(x, "lhs")?, f32_of(y, "rhs")?);
                let (a, b) = (&*a, &*b);
                match op {
                    OpKind::Equal => kernels::equal(a, shape, b, y.shape()),
                    OpKind::Add => kernels::binary(BinaryOp::Add, a, shape, b, y.shape()),
                    OpKind::Sub => kernels::binary(BinaryOp::Sub, a, shape, b, y.shape()),
                    _ => kernels::binary(BinaryOp::Mul, a, shape, b, y.shape()),
                }
                .map_err(e)?
                .0
            }
            OpKind::Neg => kernels::unary(UnaryOp::Neg, &f32_of(x, "input")?),
            OpKind::Sigmoid => kernels::unary(UnaryOp::Sigmoid, &f32_of(x, "input")?),
            OpKind::Silu => kernels::unary(UnaryOp::Silu, &f32_of(x, "input")?),
            OpKind::Softmax { dim } => kernels::softmax(&f32_of(x, "input")?, shape, *dim as isize).map_err(e)?,
            OpKind::RmsNorm { eps, unit_offset } => {
                let w = f32_of(inputs[1], "weight")?;
                // Gemma's `1 + w`, added in f32 as transformers does.
                let w: Cow<'_, [f32]> =
                    if *unit_offset { w.iter().map(|v| 1.0 + v).collect::<Vec<f32>>().into() } else { w };
                kernels::rms_norm(&f32_of(x, "input")?, shape, &w, *eps).map_err(e)?
            }
            OpKind::Embedding if packed_of(inputs[1]).is_some_and(|w| w.view == WeightView::NK) => {
                let w = packed_of(inputs[1]).ok_or(CpuOpError::Missing("packed weight"))?;
                w.matrix.gather_columns(i64_of(x, "ids")?).map_err(e)?
            }
            OpKind::Embedding if u16_table_of(inputs[1]).is_some() => {
                let w = u16_table_of(inputs[1]).ok_or(CpuOpError::Missing("uint16 table"))?;
                w.gather_rows(i64_of(x, "ids")?).map_err(e)?
            }
            OpKind::Embedding => {
                let w = inputs[1];
                kernels::index_select(&f32_of(w, "weight")?, w.shape(), 0, i64_of(x, "ids")?, shape).map_err(e)?.0
            }
            OpKind::Gather { dim: 0 } if shape.len() == 2 && u16_table_of(x).is_some() => {
                let w = u16_table_of(x).ok_or(CpuOpError::Missing("uint16 table"))?;
                w.gather_rows(i64_of(inputs[1], "indices")?).map_err(e)?
            }
            OpKind::Gather { dim } => {
                let idx = inputs[1];
                kernels::index_select(&f32_of(x, "table")?, shape, *dim as isize, i64_of(idx, "indices")?, idx.shape())
                    .map_err(e)?
                    .0
            }
            OpKind::Conv2d | OpKind::Linear if packed_of(inputs[1]).is_some() => {
                let w = packed_of(inputs[1]).ok_or(CpuOpError::Missing("packed weight"))?;
                let k = *shape.last().unwrap_or(&1);
                if k != w.matrix.k() {
                    let weight = format!("{:?}", w.matrix);
                    return Err(CpuOpError::Features { features: k, weight, expected: w.matrix.k() });
                }
                let bias = inputs.get(2).map(|b| f32_of(b, "bias")).transpose()?;
                let m = x.numel() / k.max(1);
                if self.bf16 == Bf16Products::Bf16 && matches!(w.matrix.elems(), kernels::PackedElems::Bf16(_)) {
                    kernels::linear_packed_bf16(&f32_of(x, "input")?, m, &w.matrix, bias.as_deref()).map_err(e)?
                } else {
                    let grid = grid_of(x).filter(|_| self.products == GridProducts::Integer);
                    let bias_buffer = match inputs.get(2).map(|b| b.storage()) {
                        None => Some(None),
                        Some(Some(Storage::F32(b))) => Some(Some(b)),
                        Some(_) => None,
                    };
                    match (x.storage(), bias_buffer) {
                        // A decode step's linear: with the others that read its input (`siblings`).
                        (Some(storage), Some(bias)) if m == 1 && crate::siblings::enabled() => {
                            let fits = |s: &kernels::PackedMatrix| s.k() == k;
                            let setting = self.products as u8;
                            // The input's values are read only if the output was not made ahead.
                            crate::siblings::one_row_linear(storage, &w.matrix, bias, setting, fits, |products| {
                                kernels::linears_packed_on_grid(&f32_of(x, "input")?, 1, products, grid).map_err(e)
                            })?
                        }
                        _ => kernels::linear_packed_on_grid(&f32_of(x, "input")?, m, &w.matrix, bias.as_deref(), grid)
                            .map_err(e)?,
                    }
                }
            }
            OpKind::Conv2d => {
                // NHWC [N, H, W, In] x HWIO [1, 1, In, Out]: a [N*H*W, In] x [In, Out] product.
                let (w, k) = (inputs[1], shape[3]);
                let n = w.shape()[3];
                let bias = inputs.get(2).map(|b| f32_of(b, "bias")).transpose()?;
                kernels::linear_kn(&f32_of(x, "input")?, x.numel() / k, k, &f32_of(w, "weight")?, n, bias.as_deref())
                    .map_err(e)?
            }
            OpKind::Linear => {
                let (w, k) = (inputs[1], *shape.last().unwrap_or(&1));
                let n = w.shape()[0];
                let bias = inputs.get(2).map(|b| f32_of(b, "bias")).transpose()?;
                kernels::linear_nk(&f32_of(x, "input")?, x.numel() / k, k, &f32_of(w, "weight")?, n, bias.as_deref())
                    .map_err(e)?
            }
            OpKind::Reduce { kind, dim, keepdim } => {
                let kind = match kind {
                    ReduceKind::Min => KReduce::Min,
                    ReduceKind::Max => KReduce::Max,
                    ReduceKind::Mean => KReduce::Mean,
                };
                kernels::reduce(&f32_of(x, "input")?, shape, *dim as isize, *keepdim, kind).map_err(e)?.0
            }
            OpKind::Where => {
                let (a, b) = (inputs[1], inputs[2]);
                kernels::where_(
                    &f32_of(x, "condition")?,
                    shape,
                    &f32_of(a, "on_true")?,
                    a.shape(),
                    &f32_of(b, "on_false")?,
                    b.shape(),
                )
                .map_err(e)?
                .0
            }
        };
        let storage = check_len(data, out)?;
        // Moving values keeps them on their grid: an int4 linear after a transpose (attention's
        // output before o_proj) still multiplies codes.
        match (op, grid_of(x), storage) {
            (
                OpKind::Transpose { .. } | OpKind::Permute { .. } | OpKind::Slice { .. },
                Some(grid),
                Storage::F32(values),
            ) => Ok(Storage::Native(Arc::new(OnGrid { values, grid }))),
            (_, _, storage) => Ok(storage),
        }
    }
}

/// Whether a transpose or permute of `shape` keeps the element order
/// ([`kernels::keeps_order`]).
fn keeps_order(op: &OpKind, shape: &[usize]) -> bool {
    match op {
        OpKind::Transpose { dim0, dim1 } => kernels::keeps_order(
            shape,
            (0..shape.len()).map(|d| match d {
                d if d == *dim0 => *dim1,
                d if d == *dim1 => *dim0,
                d => d,
            }),
        ),
        OpKind::Permute { perm } => perm.len() == shape.len() && kernels::keeps_order(shape, perm.iter().copied()),
        _ => false,
    }
}

fn check_len(data: Vec<f32>, out: &TensorType) -> Result<Storage, CpuOpError> {
    if data.len() != out.numel() {
        return Err(CpuOpError::OutputLength { found: data.len(), expected: out.numel(), out: out.clone() });
    }
    Ok(out_f32(data))
}

/// Casts keep real values real (float and quantized dtypes all hold f32 data here: quantization
/// happens at QDQ points) and convert between real and integer storage.
fn cast(x: &Tensor, to: mllm_dsl::DType) -> Result<Storage, CpuOpError> {
    let storage = x.storage().ok_or(CpuOpError::Missing("cast of a tensor without data"))?;
    Ok(match (storage, storage.dense_f32(), to.is_index()) {
        (_, Some(v), true) => Storage::I64(v.iter().map(|&f| f as i64).collect::<Vec<_>>().into()),
        (Storage::I64(v), _, false) => Storage::F32(v.iter().map(|&i| i as f32).collect::<Vec<_>>().into()),
        (s, _, _) => s.clone(),
    })
}

/// Opt-in time per op kind (`MLLM_CPU_PROFILE=1`; `=shapes` also splits products by operand
/// shapes), to see where a model's time goes without an
/// external profiler. Off by default: then an op costs one relaxed atomic load more.
pub mod profile {
    use mllm_dsl::op::OpKind;
    use mllm_dsl::Tensor;
    use std::collections::BTreeMap;
    use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
    use std::sync::{Mutex, PoisonError};
    use std::time::{Duration, Instant};

    /// The environment variable that switches profiling on (any value but `0` or empty).
    pub const ENV: &str = "MLLM_CPU_PROFILE";

    /// Key of a chunk's whole model forward (it overlaps the ops' keys).
    pub const FORWARD: &str = "(chunk: model forward, ops included)";
    /// Key of feeding a chunk's inputs (ids, positions, mask, past K/V views) to the model.
    pub const CHUNK_INPUTS: &str = "chunk: inputs";
    /// Key of reading a chunk's outputs (logits, present K/V codes) back.
    pub const CHUNK_OUTPUTS: &str = "chunk: outputs";
    /// Key of QDQ points applied on their own (a fused step's points count in the step).
    pub const QDQ_POINT: &str = "QDQ point";
    /// Keys of one-row products (decode steps): linears as `Conv2D` or `Linear`, and `MatMul`
    /// (attention). With `MLLM_CPU_PROFILE=shapes` the operand shapes follow them.
    pub const CONV2D_ONE_ROW: &str = "Conv2D (1 row)";
    pub const LINEAR_ONE_ROW: &str = "Linear (1 row)";
    pub const MATMUL_ONE_ROW: &str = "MatMul (1 row)";
    /// Key of attention run as one fused step (its products, softmax and points).
    pub const ATTENTION_FUSED: &str = "attention (fused)";

    /// [`UNREAD`], [`OFF`], [`ON`] or [`SHAPES`].
    static STATE: AtomicU8 = AtomicU8::new(UNREAD);
    /// The environment variable is not read yet.
    const UNREAD: u8 = 0;
    const OFF: u8 = 1;
    const ON: u8 = 2;
    /// On, with products keyed by their operand shapes (`MLLM_CPU_PROFILE=shapes`).
    const SHAPES: u8 = 3;
    static TABLE: Mutex<BTreeMap<String, (u64, Duration)>> = Mutex::new(BTreeMap::new());
    /// The times booked during decode steps ([`set_decode_step`]).
    static DECODE_TABLE: Mutex<BTreeMap<String, (u64, Duration)>> = Mutex::new(BTreeMap::new());
    static IN_DECODE_STEP: AtomicBool = AtomicBool::new(false);

    /// Whether ops are being timed.
    pub fn enabled() -> bool {
        match STATE.load(Ordering::Relaxed) {
            UNREAD => {
                let value = std::env::var(ENV).unwrap_or_default();
                let state = match value.as_str() {
                    "" | "0" => OFF,
                    "shapes" => SHAPES,
                    _ => ON,
                };
                STATE.store(state, Ordering::Relaxed);
                state != OFF
            }
            s => s != OFF,
        }
    }

    /// Switches timing on or off from here on, whatever the environment says.
    pub fn set_enabled(on: bool) {
        STATE.store(if on { ON } else { OFF }, Ordering::Relaxed);
    }

    pub(crate) fn start() -> Option<Instant> {
        enabled().then(Instant::now)
    }

    /// Books the time since `t0` (when profiling) under `key`; returns the new start.
    pub(crate) fn lap(t0: Option<Instant>, key: &str) -> Option<Instant> {
        let t0 = t0?;
        let now = Instant::now();
        add(key, now - t0);
        Some(now)
    }

    /// Books the time since `t0` under the op's type and, for matrix products, whether the
    /// left operand is a single row (decode) or several (prefill).
    pub(super) fn record(op: &OpKind, inputs: &[&Tensor], t0: Instant) {
        let elapsed = t0.elapsed();
        let name = op.type_name();
        if !matches!(op, OpKind::Conv2d | OpKind::Linear | OpKind::MatMul) {
            return add(name, elapsed);
        }
        let shape = inputs[0].shape();
        let one_row = shape.len().checked_sub(2).map_or(1, |d| shape[d]) == 1;
        let rows = if one_row { " (1 row)" } else { " (rows)" };
        if STATE.load(Ordering::Relaxed) == SHAPES {
            let shapes: Vec<String> = inputs.iter().take(2).map(|t| format!("{:?}", t.shape())).collect();
            return add(&format!("{name}{rows} {}", shapes.join(" x ")), elapsed);
        }
        // Spelled out, so booking a product allocates nothing (the profile's own cost counts in
        // the time between ops).
        let key = match (op, one_row) {
            (OpKind::Conv2d, true) => CONV2D_ONE_ROW,
            (OpKind::Conv2d, false) => "Conv2D (rows)",
            (OpKind::Linear, true) => LINEAR_ONE_ROW,
            (OpKind::Linear, false) => "Linear (rows)",
            (_, true) => MATMUL_ONE_ROW,
            (_, false) => "MatMul (rows)",
        };
        debug_assert!(key.starts_with(name) && key.ends_with(rows));
        add(key, elapsed);
    }

    /// Books `elapsed` under `key` (also used for work outside ops, e.g. feeding the KV cache).
    pub fn add(key: &str, elapsed: Duration) {
        let book = |table: &Mutex<BTreeMap<String, (u64, Duration)>>| {
            let mut table = table.lock().unwrap_or_else(PoisonError::into_inner);
            // A key's String is made once, when it is first booked.
            let entry = match table.get_mut(key) {
                Some(entry) => entry,
                None => table.entry(key.to_string()).or_default(),
            };
            entry.0 += 1;
            entry.1 += elapsed;
        };
        if IN_DECODE_STEP.load(Ordering::Relaxed) {
            book(&DECODE_TABLE);
        }
        book(&TABLE);
    }

    /// Whether the chunk being run is a decode step (one row): its times are also booked in
    /// [`decode_table`]. Set by the chunk model for each chunk.
    pub(crate) fn set_decode_step(on: bool) {
        IN_DECODE_STEP.store(on, Ordering::Relaxed);
    }

    /// The accumulated (calls, time) per key (see [`report`] for the keys).
    pub fn table() -> BTreeMap<String, (u64, Duration)> {
        TABLE.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// [`table`] of the decode steps alone (chunks of one row).
    pub fn decode_table() -> BTreeMap<String, (u64, Duration)> {
        DECODE_TABLE.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Clears the accumulated times.
    pub fn reset() {
        TABLE.lock().unwrap_or_else(PoisonError::into_inner).clear();
        DECODE_TABLE.lock().unwrap_or_else(PoisonError::into_inner).clear();
        IN_DECODE_STEP.store(false, Ordering::Relaxed);
    }

    /// Where a decode step's time went, in milliseconds per step ([`StepProfile::of`] a
    /// [`decode_table`]).
    #[derive(Clone, Copy, Debug, Default, PartialEq)]
    pub struct StepProfile {
        /// Decode steps profiled.
        pub steps: u64,
        /// The model forward, ops included.
        pub forward_ms: f64,
        /// Linears of one input row (`Conv2D` / `Linear`): the weight stream.
        pub linears_ms: f64,
        /// Attention: its matrix products of one row (`MatMul`), or the whole of it where it runs
        /// fused.
        pub attention_ms: f64,
        /// QDQ points applied on their own.
        pub qdq_points_ms: f64,
        /// Every other op and fused step (norms, softmax, RoPE, SiLU gate, views, ...).
        pub other_ops_ms: f64,
        /// Feeding the chunk's inputs and reading its outputs, outside the forward.
        pub chunk_io_ms: f64,
    }

    impl StepProfile {
        /// Per step of a table of decode steps (its [`FORWARD`] calls), `None` without any.
        pub fn of(decode: &BTreeMap<String, (u64, Duration)>) -> Option<StepProfile> {
            let steps = decode.get(FORWARD).map_or(0, |v| v.0);
            if steps == 0 {
                return None;
            }
            let mut p = StepProfile { steps, ..StepProfile::default() };
            for (key, (_, time)) in decode {
                let slot = match key.as_str() {
                    FORWARD => &mut p.forward_ms,
                    CHUNK_INPUTS | CHUNK_OUTPUTS => &mut p.chunk_io_ms,
                    QDQ_POINT => &mut p.qdq_points_ms,
                    k if k.starts_with(CONV2D_ONE_ROW) || k.starts_with(LINEAR_ONE_ROW) => &mut p.linears_ms,
                    k if k.starts_with(MATMUL_ONE_ROW) || k == ATTENTION_FUSED => &mut p.attention_ms,
                    k if k.starts_with('(') => continue,
                    _ => &mut p.other_ops_ms,
                };
                *slot += time.as_secs_f64() * 1e3 / steps as f64;
            }
            Some(p)
        }

        /// The forward's time outside every op: the model code, op dispatch and shape
        /// inference, tensors made and freed, handing the forward to the kernel threads.
        pub fn framework_ms(&self) -> f64 {
            self.forward_ms - self.linears_ms - self.attention_ms - self.qdq_points_ms - self.other_ops_ms
        }
    }

    /// One line per op kind, slowest first: calls, total ms, share. Keys in parentheses overlap
    /// others and are left out of the total.
    pub fn report() -> String {
        let table = TABLE.lock().unwrap_or_else(PoisonError::into_inner);
        let total: Duration = table.iter().filter(|(k, _)| !k.starts_with('(')).map(|(_, v)| v.1).sum();
        let mut rows: Vec<_> = table.iter().collect();
        rows.sort_by_key(|row| std::cmp::Reverse(row.1 .1));
        let mut out = format!("op time, total {:.1} ms\n", total.as_secs_f64() * 1e3);
        for (name, (calls, time)) in rows {
            let share = 100.0 * time.as_secs_f64() / total.as_secs_f64().max(f64::MIN_POSITIVE);
            out.push_str(&format!("{name:<28} {calls:>8} calls {:>10.1} ms {share:>5.1}%\n", time.as_secs_f64() * 1e3));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mllm_dsl::QdqKind;

    /// A hook whose parameters are missing, as a checkpoint without the point's scale would be.
    struct MissingParams;

    impl QdqHook for MissingParams {
        fn apply(&self, point: &QdqAttr, _x: &[f32], _shape: &[usize]) -> Result<Option<Vec<f32>>, QdqHookError> {
            Err(QdqHookError::Params(format!("{}.fake_quant.scale is not in the checkpoint", point.key).into()))
        }
    }

    #[test]
    fn a_step_profile_splits_the_decode_steps_time_per_step() {
        use profile::{StepProfile, CHUNK_OUTPUTS, FORWARD, QDQ_POINT};
        let table = |rows: &[(&str, u64, u64)]| -> std::collections::BTreeMap<String, (u64, std::time::Duration)> {
            rows.iter().map(|&(k, calls, us)| (k.to_string(), (calls, std::time::Duration::from_micros(us)))).collect()
        };
        // Four decode steps.
        let decode = table(&[
            (FORWARD, 4, 20_000),
            ("Conv2D (1 row)", 400, 12_000),
            ("MatMul (1 row)", 40, 2_000),
            (QDQ_POINT, 300, 2_000),
            ("RMSNorm", 40, 800),
            ("(something overlapping)", 4, 50_000),
            (CHUNK_OUTPUTS, 4, 400),
        ]);
        let p = StepProfile::of(&decode).unwrap();
        let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
        assert_eq!(p.steps, 4);
        assert!(close(p.forward_ms, 5.0) && close(p.linears_ms, 3.0) && close(p.attention_ms, 0.5), "{p:?}");
        assert!(close(p.qdq_points_ms, 0.5) && close(p.other_ops_ms, 0.2) && close(p.chunk_io_ms, 0.1), "{p:?}");
        assert!(close(p.framework_ms(), 0.8), "{p:?}");
        assert_eq!(StepProfile::of(&table(&[("RMSNorm", 1, 5)])), None);
    }

    #[test]
    fn errors_say_whether_the_op_or_the_qdq_point_failed() {
        let backend = CpuBackend::with_qdq(Arc::new(MissingParams));
        let x = Tensor::from_f32(vec![1.0, 2.0], vec![2], backend.clone()).unwrap();
        let point = QdqAttr { kind: QdqKind::Activation, key: "model.norm_input_qdq".into() };
        let err = backend.qdq(&x, &point).unwrap_err();
        assert_eq!(
            err,
            BackendError::Qdq {
                key: "model.norm_input_qdq".into(),
                message: "model.norm_input_qdq.fake_quant.scale is not in the checkpoint".into()
            }
        );
        // Integer data at a QDQ point is named with the point.
        let ids = Tensor::from_i64(vec![3, 4], vec![2], mllm_dsl::DType::I32, backend.clone()).unwrap();
        let err = backend.qdq(&ids, &point).unwrap_err().to_string();
        assert!(err.contains("model.norm_input_qdq") && err.contains("real-valued data, got"), "{err}");
        // An input without data is the op's problem.
        let out = TensorType::new(vec![2], mllm_dsl::DType::F32);
        let err = backend.execute(&OpKind::Neg, &[&Tensor::scalar(1.0)], &out).unwrap_err();
        assert!(matches!(err, BackendError::Op(_)), "{err:?}");
    }

    #[test]
    fn qdq_outputs_keep_their_grid_and_values_on_it_pass_unchanged() {
        use crate::quant::{FakeQuantHook, QdqParams};
        use crate::u16_table::U16Table;
        use compiler::quant::QuantParams;
        let (scale, zero_point) = (0.01f32, 30000);
        let u16_point = QdqAttr { kind: QdqKind::Activation, key: "a_qdq".into() };
        let u8_point = QdqAttr { kind: QdqKind::Activation, key: "kv_qdq".into() };
        let mut params = QdqParams::new();
        params.insert(u16_point.clone(), QuantParams { scale, zero_point, qmin: 0, qmax: 65535 });
        params.insert(u8_point.clone(), QuantParams { scale, zero_point: 128, qmin: 0, qmax: 255 });
        let backend = CpuBackend::with_qdq(Arc::new(FakeQuantHook::new(&params)));
        let grid = kernels::Grid { scale, zero_point };

        // A u16 point's output records its grid and reads as the fake-quantized values.
        let x = Tensor::from_f32(vec![0.123, -1.0, 7.777], vec![3], backend.clone()).unwrap();
        let y = backend.qdq(&x, &u16_point).unwrap();
        assert_eq!(grid_of(&y), Some(grid));
        let fq = compiler::quant::FakeQuantizer::new(&QuantParams { scale, zero_point, qmin: 0, qmax: 65535 });
        let want: Vec<f32> = [0.123f32, -1.0, 7.777].iter().map(|&v| fq.fake(v)).collect();
        assert_ne!(want, [0.123f32, -1.0, 7.777]);
        assert_eq!(y.as_f32().unwrap(), &want[..]);
        assert_eq!(real_values(&y).unwrap().as_ref(), &want[..]);
        // Moving the values (a transpose) keeps the grid; computing with them does not.
        let y2 = backend
            .qdq(&Tensor::from_f32(vec![0.5, -0.25, 1.5, 2.0], vec![2, 2], backend.clone()).unwrap(), &u16_point)
            .unwrap();
        let moved = TensorType::new(vec![2, 2], mllm_dsl::DType::F32);
        let t = backend.execute(&OpKind::Transpose { dim0: 0, dim1: 1 }, &[&y2], &moved).unwrap();
        let t = Tensor::from_storage(moved.clone(), t, backend.clone()).unwrap();
        assert_eq!(grid_of(&t), Some(grid));
        let yv = y2.as_f32().unwrap();
        assert_eq!(t.as_f32().unwrap(), &[yv[0], yv[2], yv[1], yv[3]][..]);
        let neg = backend.execute(&OpKind::Neg, &[&y2], &moved).unwrap();
        assert_eq!(grid_of(&Tensor::from_storage(moved, neg, backend.clone()).unwrap()), None);
        // The same point again, and a uint16 table of that encoding, pass as they are.
        let again = backend.qdq(&y, &u16_point).unwrap();
        let native = |t: &Tensor| match t.storage() {
            Some(Storage::Native(d)) => d.clone(),
            other => panic!("{other:?}"),
        };
        assert!(Arc::ptr_eq(&native(&again), &native(&y)), "the same data, not a copy");
        let table = U16Table::new(vec![0, 30000, 65535, 12], 2, 2, scale, zero_point).unwrap();
        let t = table.clone().into_tensor(vec![2, 2], backend.clone()).unwrap();
        let same = backend.qdq(&t, &u16_point).unwrap();
        assert!(u16_table_of(&same).is_some(), "the table stays codes");
        // A table of another encoding is fake-quantized like any tensor (65535 clamps).
        let other = U16Table::new(vec![0, 30000, 65535, 12], 2, 2, scale * 2.0, zero_point).unwrap();
        let t = other.clone().into_tensor(vec![2, 2], backend.clone()).unwrap();
        let q = backend.qdq(&t, &u16_point).unwrap();
        assert!(u16_table_of(&q).is_none());
        let want: Vec<f32> = other.to_f32().iter().map(|&v| fq.fake(v)).collect();
        assert_eq!(q.as_f32().unwrap(), &want[..]);
        // An 8-bit point records no grid (its codes are not the linears' 16-bit ones).
        let k = backend.qdq(&x, &u8_point).unwrap();
        assert_eq!(grid_of(&k), None);
        assert!(matches!(k.storage(), Some(Storage::F32(_))));
    }
}

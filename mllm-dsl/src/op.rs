//! The op set and its shape/dtype inference.
//!
//! Every op knows its mllm type name (`Conv2D` prints as `linalg.CPU.Conv2DOp`), its options (printed
//! as sorted attributes) and how to infer its output type from its inputs' types. Inference is shared
//! by eager execution and tracing, so both raise the same errors at the same call.

use crate::dtype::{fmt_shape, DType, TensorType};
use crate::ir::Attr;
use std::collections::BTreeMap;

/// Which reduction a `Reduce` op computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceKind {
    Min,
    Max,
    Mean,
}

/// An op with its options. Inputs are listed in the order the op takes them.
#[derive(Clone, Debug, PartialEq)]
pub enum OpKind {
    /// Reshape; `shape` is the requested shape, possibly with one `-1`.
    View {
        shape: Vec<i64>,
    },
    Transpose {
        dim0: usize,
        dim1: usize,
    },
    Permute {
        perm: Vec<usize>,
    },
    Unsqueeze {
        dim: usize,
    },
    /// `x[..., start:end, ...]` along `dim`.
    Slice {
        dim: usize,
        start: usize,
        end: usize,
    },
    Concat {
        dim: usize,
    },
    /// Repeat-interleave along `dim` (h0,h0,h1,h1 — GQA's `repeat_kv`), not tiling.
    Repeat {
        dim: usize,
        times: usize,
    },
    MatMul,
    Add,
    Sub,
    Mul,
    Neg,
    Sigmoid,
    Silu,
    Softmax {
        dim: usize,
    },
    /// Inputs: x [..., D], weight [D]. `y = x / sqrt(mean(x^2) + eps) * w`, or `* (1 + w)` with
    /// `unit_offset` (Gemma's norms, whose checkpoints store `w` centred on 0).
    RmsNorm {
        eps: f32,
        unit_offset: bool,
    },
    /// Inputs: ids (int), weight [V, H]. Output [..ids, H].
    Embedding,
    /// Inputs: table, indices (int). Output `table.shape[..dim] ++ indices.shape ++ table.shape[dim+1..]`.
    Gather {
        dim: usize,
    },
    /// 1×1 convolution as a linear: x NHWC [N, H, W, In], weight HWIO [1, 1, In, Out], optional bias [Out].
    Conv2d,
    /// x [..., In], weight [Out, In] (PyTorch layout), optional bias [Out].
    Linear,
    Reduce {
        kind: ReduceKind,
        dim: usize,
        keepdim: bool,
    },
    Equal,
    /// Inputs: condition (Bool), on_true, on_false.
    Where,
    Cast {
        to: DType,
    },
}

impl OpKind {
    /// mllm's op type name (`OpTypes` string), used in `linalg.<Device>.<Name>Op` and op names.
    pub fn type_name(&self) -> &'static str {
        match self {
            OpKind::View { .. } => "View",
            OpKind::Transpose { .. } => "Transpose",
            OpKind::Permute { .. } => "Permute",
            OpKind::Unsqueeze { .. } => "Unsqueeze",
            OpKind::Slice { .. } => "Slice",
            OpKind::Concat { .. } => "Concat",
            OpKind::Repeat { .. } => "Repeat",
            OpKind::MatMul => "MatMul",
            OpKind::Add => "Add",
            OpKind::Sub => "Sub",
            OpKind::Mul => "Mul",
            OpKind::Neg => "Neg",
            OpKind::Sigmoid => "Sigmoid",
            OpKind::Silu => "SiLU",
            OpKind::Softmax { .. } => "Softmax",
            OpKind::RmsNorm { .. } => "RMSNorm",
            OpKind::Embedding => "Embedding",
            OpKind::Gather { .. } => "Gather",
            OpKind::Conv2d => "Conv2D",
            OpKind::Linear => "Linear",
            OpKind::Reduce { kind: ReduceKind::Min, .. } => "ReduceMin",
            OpKind::Reduce { kind: ReduceKind::Max, .. } => "ReduceMax",
            OpKind::Reduce { kind: ReduceKind::Mean, .. } => "ReduceMean",
            OpKind::Equal => "Equal",
            OpKind::Where => "Where",
            OpKind::Cast { .. } => "CastType",
        }
    }

    /// The op's options as IR attributes (printed sorted, together with the op's other attributes).
    pub fn option_attrs(&self) -> BTreeMap<String, Attr> {
        let mut m = BTreeMap::new();
        let mut put = |k: &str, v: Attr| {
            m.insert(k.to_string(), v);
        };
        match self {
            OpKind::View { shape } => put("shape", Attr::Ints(shape.clone())),
            OpKind::Transpose { dim0, dim1 } => {
                put("dim0", Attr::Int(*dim0 as i64));
                put("dim1", Attr::Int(*dim1 as i64));
            }
            OpKind::Permute { perm } => put("perm", ints(perm)),
            OpKind::Unsqueeze { dim } | OpKind::Concat { dim } | OpKind::Softmax { dim } | OpKind::Gather { dim } => {
                put("dim", Attr::Int(*dim as i64))
            }
            OpKind::Slice { dim, start, end } => {
                put("dim", Attr::Int(*dim as i64));
                put("start", Attr::Int(*start as i64));
                put("end", Attr::Int(*end as i64));
            }
            OpKind::Repeat { dim, times } => {
                put("dim", Attr::Int(*dim as i64));
                put("times", Attr::Int(*times as i64));
            }
            OpKind::RmsNorm { eps, unit_offset } => {
                put("eps", Attr::Float(*eps));
                // Printed only when set, so the IR of the other models reads as before.
                if *unit_offset {
                    put("unit_offset", Attr::Bool(true));
                }
            }
            OpKind::Reduce { dim, keepdim, .. } => {
                put("dim", Attr::Int(*dim as i64));
                put("keepdim", Attr::Bool(*keepdim));
            }
            OpKind::Cast { to } => put("to", Attr::DType(*to)),
            OpKind::MatMul
            | OpKind::Add
            | OpKind::Sub
            | OpKind::Mul
            | OpKind::Neg
            | OpKind::Sigmoid
            | OpKind::Silu
            | OpKind::Embedding
            | OpKind::Conv2d
            | OpKind::Linear
            | OpKind::Equal
            | OpKind::Where => {}
        }
        m
    }

    /// Rebuilds an op from its type name and attributes (the parser's inverse of
    /// [`type_name`](Self::type_name) + [`option_attrs`](Self::option_attrs)). Option attributes are
    /// removed from `attrs`; what remains are the op's other attributes.
    pub fn from_parts(name: &str, attrs: &mut BTreeMap<String, Attr>) -> Result<OpKind, OpAttrError> {
        let mut take =
            |k: &str| attrs.remove(k).ok_or_else(|| OpAttrError::Missing { op: name.to_string(), key: k.to_string() });
        let wrong =
            |key: &'static str, expected: &'static str, found: Attr| OpAttrError::WrongKind { key, expected, found };
        let usize_of = |a: Attr, k: &'static str| match a {
            Attr::Int(v) if v >= 0 => Ok(v as usize),
            other => Err(wrong(k, "a non-negative int", other)),
        };
        Ok(match name {
            "View" => match take("shape")? {
                Attr::Ints(v) => OpKind::View { shape: v },
                other => return Err(wrong("shape", "a list of ints", other)),
            },
            "Transpose" => {
                OpKind::Transpose { dim0: usize_of(take("dim0")?, "dim0")?, dim1: usize_of(take("dim1")?, "dim1")? }
            }
            "Permute" => match take("perm")? {
                Attr::Ints(v) => OpKind::Permute { perm: v.iter().map(|&d| d as usize).collect() },
                other => return Err(wrong("perm", "a list of ints", other)),
            },
            "Unsqueeze" => OpKind::Unsqueeze { dim: usize_of(take("dim")?, "dim")? },
            "Concat" => OpKind::Concat { dim: usize_of(take("dim")?, "dim")? },
            "Softmax" => OpKind::Softmax { dim: usize_of(take("dim")?, "dim")? },
            "Gather" => OpKind::Gather { dim: usize_of(take("dim")?, "dim")? },
            "Slice" => OpKind::Slice {
                dim: usize_of(take("dim")?, "dim")?,
                start: usize_of(take("start")?, "start")?,
                end: usize_of(take("end")?, "end")?,
            },
            "Repeat" => {
                OpKind::Repeat { dim: usize_of(take("dim")?, "dim")?, times: usize_of(take("times")?, "times")? }
            }
            "RMSNorm" => {
                let eps = match take("eps")? {
                    Attr::Float(e) => e,
                    other => return Err(wrong("eps", "a float", other)),
                };
                let unit_offset = match attrs.remove("unit_offset") {
                    None => false,
                    Some(Attr::Bool(b)) => b,
                    Some(other) => return Err(wrong("unit_offset", "a bool", other)),
                };
                OpKind::RmsNorm { eps, unit_offset }
            }
            "ReduceMin" | "ReduceMax" | "ReduceMean" => {
                let kind = match name {
                    "ReduceMin" => ReduceKind::Min,
                    "ReduceMax" => ReduceKind::Max,
                    _ => ReduceKind::Mean,
                };
                let dim = usize_of(take("dim")?, "dim")?;
                let keepdim = match take("keepdim")? {
                    Attr::Bool(b) => b,
                    other => return Err(wrong("keepdim", "a bool", other)),
                };
                OpKind::Reduce { kind, dim, keepdim }
            }
            "CastType" => match take("to")? {
                Attr::DType(d) => OpKind::Cast { to: d },
                other => return Err(wrong("to", "a dtype", other)),
            },
            "MatMul" => OpKind::MatMul,
            "Add" => OpKind::Add,
            "Sub" => OpKind::Sub,
            "Mul" => OpKind::Mul,
            "Neg" => OpKind::Neg,
            "Sigmoid" => OpKind::Sigmoid,
            "SiLU" => OpKind::Silu,
            "Embedding" => OpKind::Embedding,
            "Conv2D" => OpKind::Conv2d,
            "Linear" => OpKind::Linear,
            "Equal" => OpKind::Equal,
            "Where" => OpKind::Where,
            other => return Err(OpAttrError::UnknownOp(other.to_string())),
        })
    }

    /// How many inputs the op takes: `(min, max)`.
    pub fn arity(&self) -> (usize, usize) {
        match self {
            OpKind::Concat { .. } => (1, usize::MAX),
            OpKind::MatMul
            | OpKind::Add
            | OpKind::Sub
            | OpKind::Mul
            | OpKind::RmsNorm { .. }
            | OpKind::Embedding
            | OpKind::Gather { .. }
            | OpKind::Equal => (2, 2),
            OpKind::Conv2d | OpKind::Linear => (2, 3),
            OpKind::Where => (3, 3),
            _ => (1, 1),
        }
    }

    /// Infers the output type from the input types. The error message names the shapes involved;
    /// the caller adds the op name, module path and call site.
    pub fn infer(&self, inputs: &[&TensorType]) -> Result<TensorType, InferError> {
        let (lo, hi) = self.arity();
        if inputs.len() < lo || inputs.len() > hi {
            return Err(InferError::Arity { expected: arity_text(lo, hi), found: inputs.len() });
        }
        let x = inputs[0];
        let out = |shape: Vec<usize>, dtype: DType| Ok(TensorType { shape, dtype, device: x.device });
        let dim_ok = |dim: usize, rank: usize| {
            if dim < rank {
                Ok(())
            } else {
                Err(InferError::Dim { dim, shape: x.shape.clone() })
            }
        };
        match self {
            OpKind::View { shape } => out(resolve_view(&x.shape, shape)?, x.dtype),
            OpKind::Transpose { dim0, dim1 } => {
                dim_ok(*dim0, x.rank())?;
                dim_ok(*dim1, x.rank())?;
                let mut s = x.shape.clone();
                s.swap(*dim0, *dim1);
                out(s, x.dtype)
            }
            OpKind::Permute { perm } => {
                let mut seen = vec![false; x.rank()];
                if perm.len() != x.rank()
                    || perm.iter().any(|&p| p >= x.rank() || std::mem::replace(&mut seen[p], true))
                {
                    return Err(InferError::Permutation { perm: perm.clone(), shape: x.shape.clone() });
                }
                out(perm.iter().map(|&p| x.shape[p]).collect(), x.dtype)
            }
            OpKind::Unsqueeze { dim } => {
                dim_ok(*dim, x.rank() + 1)?;
                let mut s = x.shape.clone();
                s.insert(*dim, 1);
                out(s, x.dtype)
            }
            OpKind::Slice { dim, start, end } => {
                dim_ok(*dim, x.rank())?;
                if start > end || *end > x.shape[*dim] {
                    return Err(InferError::Slice { start: *start, end: *end, dim: *dim, shape: x.shape.clone() });
                }
                let mut s = x.shape.clone();
                s[*dim] = end - start;
                out(s, x.dtype)
            }
            OpKind::Concat { dim } => {
                dim_ok(*dim, x.rank())?;
                let mut s = x.shape.clone();
                for t in &inputs[1..] {
                    let same_other_dims = t.rank() == x.rank()
                        && t.shape.iter().zip(&x.shape).enumerate().all(|(i, (a, b))| i == *dim || a == b);
                    if !same_other_dims {
                        return Err(InferError::Concat { a: x.shape.clone(), b: t.shape.clone(), dim: *dim });
                    }
                    same_dtype(x, t)?;
                    s[*dim] += t.shape[*dim];
                }
                out(s, x.dtype)
            }
            OpKind::Repeat { dim, times } => {
                dim_ok(*dim, x.rank())?;
                let mut s = x.shape.clone();
                s[*dim] *= times;
                out(s, x.dtype)
            }
            OpKind::MatMul => {
                let y = inputs[1];
                if x.rank() < 2 || y.rank() < 2 {
                    return Err(InferError::MatMulRank { a: x.shape.clone(), b: y.shape.clone() });
                }
                let (m, k) = (x.shape[x.rank() - 2], x.shape[x.rank() - 1]);
                let (k2, n) = (y.shape[y.rank() - 2], y.shape[y.rank() - 1]);
                if k != k2 {
                    return Err(InferError::InnerDims { a: x.shape.clone(), b: y.shape.clone() });
                }
                // Mixed operands are fine (uint16 activations x uint8 KV in the QNN form).
                numeric(x)?;
                numeric(y)?;
                let mut s = broadcast(&x.shape[..x.rank() - 2], &y.shape[..y.rank() - 2])
                    .map_err(|_| InferError::BatchDims { a: x.shape.clone(), b: y.shape.clone() })?;
                s.extend([m, n]);
                out(s, x.dtype)
            }
            OpKind::Add | OpKind::Sub | OpKind::Mul => {
                let y = inputs[1];
                let s = broadcast(&x.shape, &y.shape)?;
                if !x.dtype.is_numeric() || !y.dtype.is_numeric() {
                    return Err(InferError::NumericPair(x.dtype, y.dtype));
                }
                // A scalar constant (f32 [1]) combines with any numeric dtype; otherwise dtypes agree.
                if !is_scalar_f32(y) && !is_scalar_f32(x) {
                    same_dtype(x, y)?;
                }
                out(s, if is_scalar_f32(x) && !is_scalar_f32(y) { y.dtype } else { x.dtype })
            }
            OpKind::Neg | OpKind::Sigmoid | OpKind::Silu => {
                numeric(x)?;
                out(x.shape.clone(), x.dtype)
            }
            OpKind::Softmax { dim } => {
                dim_ok(*dim, x.rank())?;
                numeric(x)?;
                out(x.shape.clone(), x.dtype)
            }
            OpKind::RmsNorm { .. } => {
                let w = inputs[1];
                let d = *x.shape.last().ok_or(InferError::Scalar)?;
                if w.shape != [d] {
                    return Err(InferError::NormWeight { weight: w.shape.clone(), input: x.shape.clone() });
                }
                numeric(x)?;
                out(x.shape.clone(), x.dtype)
            }
            OpKind::Embedding => {
                let w = inputs[1];
                if !x.dtype.is_index() {
                    return Err(InferError::Index { what: "ids", found: x.dtype });
                }
                if w.rank() != 2 {
                    return Err(InferError::EmbeddingWeight(w.shape.clone()));
                }
                let mut s = x.shape.clone();
                s.push(w.shape[1]);
                out(s, w.dtype)
            }
            OpKind::Gather { dim } => {
                let idx = inputs[1];
                dim_ok(*dim, x.rank())?;
                if !idx.dtype.is_index() {
                    return Err(InferError::Index { what: "indices", found: idx.dtype });
                }
                let mut s = x.shape[..*dim].to_vec();
                s.extend(&idx.shape);
                s.extend(&x.shape[dim + 1..]);
                out(s, x.dtype)
            }
            OpKind::Conv2d => {
                let w = inputs[1];
                if x.rank() != 4 || w.rank() != 4 || w.shape[0] != 1 || w.shape[1] != 1 || w.shape[2] != x.shape[3] {
                    return Err(InferError::Conv2d { input: x.shape.clone(), weight: w.shape.clone() });
                }
                check_bias(inputs.get(2), w.shape[3])?;
                numeric(x)?;
                out(vec![x.shape[0], x.shape[1], x.shape[2], w.shape[3]], x.dtype)
            }
            OpKind::Linear => {
                let w = inputs[1];
                let k = *x.shape.last().ok_or(InferError::Scalar)?;
                if w.rank() != 2 || w.shape[1] != k {
                    return Err(InferError::LinearWeight { weight: w.shape.clone(), input: x.shape.clone(), k });
                }
                check_bias(inputs.get(2), w.shape[0])?;
                numeric(x)?;
                let mut s = x.shape.clone();
                *s.last_mut().unwrap() = w.shape[0];
                out(s, x.dtype)
            }
            OpKind::Reduce { dim, keepdim, .. } => {
                dim_ok(*dim, x.rank())?;
                numeric(x)?;
                let mut s = x.shape.clone();
                if *keepdim {
                    s[*dim] = 1;
                } else {
                    s.remove(*dim);
                }
                out(s, x.dtype)
            }
            OpKind::Equal => {
                let s = broadcast(&x.shape, &inputs[1].shape)?;
                out(s, DType::Bool)
            }
            OpKind::Where => {
                let (a, b) = (inputs[1], inputs[2]);
                if x.dtype != DType::Bool {
                    return Err(InferError::Condition(x.dtype));
                }
                let s = broadcast(&broadcast(&x.shape, &a.shape)?, &b.shape)?;
                if !is_scalar_f32(a) && !is_scalar_f32(b) {
                    same_dtype(a, b)?;
                }
                out(s, if is_scalar_f32(a) { b.dtype } else { a.dtype })
            }
            OpKind::Cast { to } => out(x.shape.clone(), *to),
        }
    }
}

fn ints(v: &[usize]) -> Attr {
    Attr::Ints(v.iter().map(|&d| d as i64).collect())
}

fn arity_text(lo: usize, hi: usize) -> String {
    match (lo, hi) {
        (l, h) if l == h => l.to_string(),
        (l, usize::MAX) => format!("at least {l}"),
        (l, h) => format!("{l} to {h}"),
    }
}

/// A scalar f32 constant (`[1]`), which combines with operands of any numeric dtype.
fn is_scalar_f32(t: &TensorType) -> bool {
    t.dtype == DType::F32 && t.numel() == 1 && t.rank() <= 1
}

fn numeric(t: &TensorType) -> Result<(), InferError> {
    if t.dtype.is_numeric() {
        Ok(())
    } else {
        Err(InferError::NotNumeric(t.dtype))
    }
}

fn same_dtype(a: &TensorType, b: &TensorType) -> Result<(), InferError> {
    if a.dtype == b.dtype {
        Ok(())
    } else {
        Err(InferError::DTypes(a.dtype, b.dtype))
    }
}

fn check_bias(bias: Option<&&TensorType>, out: usize) -> Result<(), InferError> {
    match bias {
        Some(b) if b.shape != [out] => Err(InferError::Bias { bias: b.shape.clone(), outputs: out }),
        _ => Ok(()),
    }
}

/// Numpy broadcasting of two shapes.
pub fn broadcast(a: &[usize], b: &[usize]) -> Result<Vec<usize>, InferError> {
    let n = a.len().max(b.len());
    let mut s = vec![0; n];
    for i in 0..n {
        let da = if i + a.len() >= n { a[i + a.len() - n] } else { 1 };
        let db = if i + b.len() >= n { b[i + b.len() - n] } else { 1 };
        s[i] = match (da, db) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => return Err(InferError::Broadcast { a: a.to_vec(), b: b.to_vec() }),
        };
    }
    Ok(s)
}

/// Resolves a view shape with at most one `-1` against the input's element count.
pub fn resolve_view(input: &[usize], requested: &[i64]) -> Result<Vec<usize>, InferError> {
    let numel: usize = input.iter().product();
    let mut infer_at = None;
    let mut known = 1usize;
    for (i, &d) in requested.iter().enumerate() {
        match d {
            -1 if infer_at.is_none() => infer_at = Some(i),
            -1 => return Err(InferError::ViewTwoInferred(requested.to_vec())),
            d if d < 0 => return Err(InferError::ViewNegative { view: requested.to_vec(), dim: d }),
            d => known *= d as usize,
        }
    }
    let mut s: Vec<usize> = requested.iter().map(|&d| d.max(0) as usize).collect();
    match infer_at {
        Some(i) if known != 0 && numel.is_multiple_of(known) => s[i] = numel / known,
        None if known == numel => {}
        _ => return Err(InferError::View { input: input.to_vec(), numel, view: requested.to_vec() }),
    }
    Ok(s)
}

/// An op's printed attributes that do not rebuild it.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum OpAttrError {
    #[error("{op}Op needs attribute '{key}'")]
    Missing { op: String, key: String },
    #[error("attribute '{key}' must be {expected}, found {found}")]
    WrongKind { key: &'static str, expected: &'static str, found: Attr },
    #[error("unknown op type '{0}'")]
    UnknownOp(String),
}

/// Why an op's output type cannot be inferred from its inputs. The texts name the shapes and dtypes
/// involved; the caller adds the op name, module path and call site.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum InferError {
    #[error("expects {expected} inputs, got {found}")]
    Arity { expected: String, found: usize },
    #[error("dim {dim} out of range for shape {}", fmt_shape(shape))]
    Dim { dim: usize, shape: Vec<usize> },
    #[error("perm {perm:?} is not a permutation of the dims of {}", fmt_shape(shape))]
    Permutation { perm: Vec<usize>, shape: Vec<usize> },
    #[error("slice {start}..{end} out of range for dim {dim} of {}", fmt_shape(shape))]
    Slice { start: usize, end: usize, dim: usize, shape: Vec<usize> },
    #[error("cannot concat {} with {} along dim {dim}", fmt_shape(a), fmt_shape(b))]
    Concat { a: Vec<usize>, b: Vec<usize>, dim: usize },
    #[error("needs rank >= 2, got {} and {}", fmt_shape(a), fmt_shape(b))]
    MatMulRank { a: Vec<usize>, b: Vec<usize> },
    #[error("inner dims differ: {} x {}", fmt_shape(a), fmt_shape(b))]
    InnerDims { a: Vec<usize>, b: Vec<usize> },
    #[error("batch dims do not broadcast: {} x {}", fmt_shape(a), fmt_shape(b))]
    BatchDims { a: Vec<usize>, b: Vec<usize> },
    #[error("shapes {} and {} do not broadcast", fmt_shape(a), fmt_shape(b))]
    Broadcast { a: Vec<usize>, b: Vec<usize> },
    #[error("needs numeric inputs, got {0} and {1}")]
    NumericPair(DType, DType),
    #[error("needs a float or quantized input, got {0}")]
    NotNumeric(DType),
    #[error("dtypes differ: {0} and {1}")]
    DTypes(DType, DType),
    #[error("needs rank >= 1")]
    Scalar,
    #[error("weight {} does not match last dim of {}", fmt_shape(weight), fmt_shape(input))]
    NormWeight { weight: Vec<usize>, input: Vec<usize> },
    /// `what` is "ids" (Embedding) or "indices" (Gather).
    #[error("{what} must be Int32/Int64, got {found}")]
    Index { what: &'static str, found: DType },
    #[error("weight must be [vocab, hidden], got {}", fmt_shape(.0))]
    EmbeddingWeight(Vec<usize>),
    #[error(
        "needs NHWC input [N, H, W, In] and 1x1 HWIO weight [1, 1, In, Out], got {} and {}",
        fmt_shape(input),
        fmt_shape(weight)
    )]
    Conv2d { input: Vec<usize>, weight: Vec<usize> },
    #[error("weight {} does not match input {} (expected [out, {k}])", fmt_shape(weight), fmt_shape(input))]
    LinearWeight { weight: Vec<usize>, input: Vec<usize>, k: usize },
    #[error("bias {} does not match {outputs} outputs", fmt_shape(bias))]
    Bias { bias: Vec<usize>, outputs: usize },
    #[error("condition must be Bool, got {0}")]
    Condition(DType),
    #[error("view {0:?} has more than one -1")]
    ViewTwoInferred(Vec<i64>),
    #[error("view {view:?} has a negative dim {dim}")]
    ViewNegative { view: Vec<i64>, dim: i64 },
    #[error("cannot view {} ({numel} elements) as {view:?}", fmt_shape(input))]
    View { input: Vec<usize>, numel: usize, view: Vec<i64> },
}

/// A dim outside `-rank..rank`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("dim {dim} out of range for rank {rank}")]
pub struct DimOutOfRange {
    pub dim: i64,
    pub rank: usize,
}

/// Normalizes a possibly negative dim against a rank (`-1` is the last dim).
pub fn norm_dim(dim: i64, rank: usize) -> Result<usize, DimOutOfRange> {
    let d = if dim < 0 { dim + rank as i64 } else { dim };
    if d < 0 || d as usize >= rank {
        Err(DimOutOfRange { dim, rank })
    } else {
        Ok(d as usize)
    }
}

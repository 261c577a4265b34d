//! [`LazyJoin`]: the result of `cat` and `repeat_interleave` kept as references to its inputs,
//! and [`Strided`]: a tensor read in place from rows of a wider buffer.
//!
//! An attention layer joins the past keys and values with the new ones and repeats them for GQA
//! (`repeat_interleave(cat(past, new))`) only to multiply them with the queries. Materialized,
//! that copies the whole KV cache three times per layer and step. Kept lazy, the product reads
//! the pieces where they lie ([`crate::kernels::matmul_parts`]); any other consumer gets the
//! materialized data, computed by the same kernels the eager ops use. The past itself is a
//! [`Strided`] view of the runtime's KV cache, whose rows hold a column per position up to the
//! cache's capacity: only the first `n_past` of each row are the tensor.

use crate::kernels::{self, decode_u8, Grid, KernelError, PartData};
use mllm_dsl::{F32Buffer, NativeData};
use std::any::Any;
use std::sync::Arc;

/// The values of a tensor of rank ≥ 2 read in place from `data`: element `(b, r, c)` (`b`
/// indexing the leading dims flattened, `r` and `c` the last two) is
/// `data[b * batch_stride + r * row_stride + c]`.
#[derive(Debug, Clone)]
pub struct Strided {
    pub data: StridedData,
    pub shape: Vec<usize>,
    pub row_stride: usize,
    pub batch_stride: usize,
}

/// The buffer a [`Strided`] view reads.
#[derive(Debug, Clone)]
pub enum StridedData {
    F32(F32Buffer),
    /// 8-bit codes standing for `(u - zero_point) * scale` (a KV cache kept as its KV8 codes).
    U8 {
        codes: Arc<Vec<u8>>,
        grid: Grid,
    },
}

impl StridedData {
    fn len(&self) -> usize {
        match self {
            StridedData::F32(v) => v.len(),
            StridedData::U8 { codes, .. } => codes.len(),
        }
    }

    /// Elements `at..at + len` as f32 values.
    fn extend_values(&self, out: &mut Vec<f32>, at: usize, len: usize) {
        match self {
            StridedData::F32(v) => out.extend_from_slice(&v[at..at + len]),
            StridedData::U8 { codes, grid } => out.extend(codes[at..at + len].iter().map(|&u| decode_u8(u, *grid))),
        }
    }

    /// The elements as a part of a product's right operand.
    pub fn part_data(&self) -> PartData<'_> {
        match self {
            StridedData::F32(v) => PartData::F32(v),
            StridedData::U8 { codes, grid } => PartData::U8 { codes, grid: *grid },
        }
    }
}

impl From<F32Buffer> for StridedData {
    fn from(v: F32Buffer) -> Self {
        StridedData::F32(v)
    }
}

impl From<Vec<f32>> for StridedData {
    fn from(v: Vec<f32>) -> Self {
        StridedData::F32(v.into())
    }
}

impl NativeData for Strided {
    fn len(&self) -> usize {
        self.shape.iter().product()
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl Strided {
    /// A view of `data`, checked to lie inside it with rows that do not overlap.
    pub fn new(
        data: StridedData,
        shape: Vec<usize>,
        row_stride: usize,
        batch_stride: usize,
    ) -> Result<Self, KernelError> {
        let view = Strided { data, shape, row_stride, batch_stride };
        let (batches, rows, cols) = view.dims()?;
        let bad = |reason: String| Err(KernelError::InvalidArgument { op: "strided view", reason });
        if batches * rows * cols == 0 {
            return Ok(view);
        }
        if row_stride < cols || batch_stride < rows * row_stride {
            return bad(format!(
                "rows of {cols} at stride {row_stride}, {rows} rows at batch stride {batch_stride} overlap"
            ));
        }
        let last = (batches - 1) * batch_stride + (rows - 1) * row_stride + cols;
        if last > view.data.len() {
            return bad(format!(
                "shape {:?} at strides ({batch_stride}, {row_stride}) needs {last} values, the buffer has {}",
                view.shape,
                view.data.len()
            ));
        }
        Ok(view)
    }

    /// Dense data in row-major order.
    pub fn dense(data: F32Buffer, shape: Vec<usize>) -> Result<Self, KernelError> {
        kernels::shape::check_len("strided view", "data", &data, &shape)?;
        let cols = shape.last().copied().unwrap_or(1);
        let rows = if shape.len() >= 2 { shape[shape.len() - 2] } else { 1 };
        Ok(Strided { data: StridedData::F32(data), shape, row_stride: cols, batch_stride: rows * cols })
    }

    /// (batches, rows, cols): the leading dims flattened, then the last two.
    pub fn dims(&self) -> Result<(usize, usize, usize), KernelError> {
        match self.shape.as_slice() {
            [outer @ .., rows, cols] => Ok((outer.iter().product(), *rows, *cols)),
            _ => Err(KernelError::InvalidArgument {
                op: "strided view",
                reason: format!("shape {:?} has fewer than 2 dims", self.shape),
            }),
        }
    }

    /// The values in row-major order: borrowed when the view is the whole of an f32 buffer, else
    /// copied (and decoded).
    pub fn values(&self) -> std::borrow::Cow<'_, [f32]> {
        let (batches, rows, cols) = match (&self.data, self.dims()) {
            (_, Ok(dims)) => dims,
            (StridedData::F32(data), Err(_)) => return std::borrow::Cow::Borrowed(&data[..]),
            (StridedData::U8 { .. }, Err(_)) => (1, 1, self.data.len()),
        };
        let len = batches * rows * cols;
        if let StridedData::F32(data) = &self.data {
            if self.row_stride == cols && self.batch_stride == rows * cols {
                return std::borrow::Cow::Borrowed(&data[..len]);
            }
        }
        let mut out = Vec::with_capacity(len);
        for b in 0..batches {
            for r in 0..rows {
                self.data.extend_values(&mut out, b * self.batch_stride + r * self.row_stride, cols);
            }
        }
        std::borrow::Cow::Owned(out)
    }
}

/// `repeat_interleave(cat(parts, cat_dim), times, repeat_dim)` of f32 parts read in place.
#[derive(Debug, Clone)]
pub struct LazyJoin {
    /// Shape of the result.
    pub shape: Vec<usize>,
    /// The parts (one part: no concatenation).
    pub parts: Vec<Strided>,
    pub cat_dim: usize,
    pub repeat_dim: usize,
    /// 1: no repeat.
    pub times: usize,
}

impl NativeData for LazyJoin {
    fn len(&self) -> usize {
        self.shape.iter().product()
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl LazyJoin {
    /// `cat(parts, dim)`, checked like the eager op.
    pub fn concat(parts: Vec<Strided>, dim: usize) -> Result<Self, KernelError> {
        let shapes: Vec<&[usize]> = parts.iter().map(|p| p.shape.as_slice()).collect();
        let shape = concat_shape(&shapes, dim)?;
        Ok(LazyJoin { shape, parts, cat_dim: dim, repeat_dim: 0, times: 1 })
    }

    /// `x` itself, to be repeated.
    pub fn single(x: Strided) -> Self {
        LazyJoin { shape: x.shape.clone(), parts: vec![x], cat_dim: 0, repeat_dim: 0, times: 1 }
    }

    /// `repeat_interleave(self, times, dim)`; `None` when `self` is already repeated.
    pub fn repeat(&self, dim: usize, times: usize) -> Option<Self> {
        if self.times != 1 || dim >= self.shape.len() {
            return None;
        }
        let mut shape = self.shape.clone();
        shape[dim] *= times;
        Some(LazyJoin { shape, parts: self.parts.clone(), cat_dim: self.cat_dim, repeat_dim: dim, times })
    }

    /// The data, row-major in [`Self::shape`].
    pub fn materialize(&self) -> Result<Vec<f32>, KernelError> {
        let (joined, shape) = match self.parts.as_slice() {
            [part] => (part.values().into_owned(), part.shape.clone()),
            parts => {
                let values: Vec<_> = parts.iter().map(Strided::values).collect();
                let views: Vec<(&[f32], &[usize])> =
                    values.iter().zip(parts).map(|(v, p)| (&v[..], p.shape.as_slice())).collect();
                kernels::concat(&views, self.cat_dim as isize)?
            }
        };
        if self.times == 1 {
            return Ok(joined);
        }
        Ok(kernels::repeat_interleave(&joined, &shape, self.repeat_dim as isize, self.times)?.0)
    }
}

/// The shape `cat` gives, with the eager op's checks (data lengths are checked separately).
fn concat_shape(shapes: &[&[usize]], dim: usize) -> Result<Vec<usize>, KernelError> {
    let Some(&first) = shapes.first() else {
        return Err(KernelError::InvalidArgument { op: "concat", reason: "needs at least one part".into() });
    };
    if dim >= first.len() {
        return Err(KernelError::DimOutOfRange { op: "concat", dim: dim as isize, rank: first.len() });
    }
    let mut shape = first.to_vec();
    shape[dim] = 0;
    for (i, &s) in shapes.iter().enumerate() {
        let same = s.len() == first.len() && s.iter().zip(first).enumerate().all(|(k, (a, b))| k == dim || a == b);
        if !same {
            return Err(KernelError::ConcatMismatch {
                op: "concat",
                part: i,
                shape: s.to_vec(),
                first: first.to_vec(),
                dim,
            });
        }
        shape[dim] += s[dim];
    }
    Ok(shape)
}

//! [`LazyJoin`]: the result of `cat` and `repeat_interleave` kept as references to its inputs.
//!
//! An attention layer joins the past keys and values with the new ones and repeats them for GQA
//! (`repeat_interleave(cat(past, new))`) only to multiply them with the queries. Materialized,
//! that copies the whole KV cache three times per layer and step. Kept lazy, the product reads
//! the pieces where they lie ([`crate::kernels::matmul_parts`]); any other consumer gets the
//! materialized data, computed by the same kernels the eager ops use.

use crate::kernels::{self, KernelError};
use mllm_dsl::{F32Buffer, NativeData};
use std::any::Any;

/// `repeat_interleave(cat(parts, cat_dim), times, repeat_dim)` of dense f32 parts.
#[derive(Debug, Clone)]
pub struct LazyJoin {
    /// Shape of the result.
    pub shape: Vec<usize>,
    /// Dense parts with their shapes (one part: no concatenation).
    pub parts: Vec<(F32Buffer, Vec<usize>)>,
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
    pub fn concat(parts: Vec<(F32Buffer, Vec<usize>)>, dim: usize) -> Result<Self, KernelError> {
        let shapes: Vec<&[usize]> = parts.iter().map(|(_, s)| s.as_slice()).collect();
        let shape = concat_shape(&shapes, dim)?;
        for (data, shape) in &parts {
            kernels::shape::check_len("concat", "part", data, shape)?;
        }
        Ok(LazyJoin { shape, parts, cat_dim: dim, repeat_dim: 0, times: 1 })
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
            [(data, shape)] => (data.to_vec(), shape.clone()),
            parts => {
                let views: Vec<(&[f32], &[usize])> = parts.iter().map(|(d, s)| (&d[..], s.as_slice())).collect();
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

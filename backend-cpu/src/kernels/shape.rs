//! Shape arithmetic shared by the kernels: element counts, row-major strides, dim normalisation,
//! numpy broadcasting and a coalesced iteration plan over broadcast operands.
//!
//! Every tensor is a contiguous row-major `f32` slice plus a `&[usize]` shape; nothing here knows
//! about the DSL's tensor type.

use super::KernelError;

/// Number of elements of `shape` (1 for a scalar `[]`), or `None` on `usize` overflow.
pub fn checked_numel(shape: &[usize]) -> Option<usize> {
    shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d))
}

/// Number of elements of `shape`; saturates instead of overflowing (such a shape never matches data).
pub fn numel(shape: &[usize]) -> usize {
    checked_numel(shape).unwrap_or(usize::MAX)
}

/// Row-major (C order) strides of `shape`, in elements.
pub fn contiguous_strides(shape: &[usize]) -> Vec<usize> {
    let mut strides = vec![1usize; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        strides[d] = strides[d + 1].saturating_mul(shape[d + 1]);
    }
    strides
}

/// Checks that `data` holds exactly the elements `shape` describes.
pub fn check_len(op: &'static str, operand: &'static str, data: &[f32], shape: &[usize]) -> Result<(), KernelError> {
    check_len_of(op, operand, data.len(), shape)
}

/// [`check_len`] for data of any element type, given its length.
pub fn check_len_of(op: &'static str, operand: &'static str, len: usize, shape: &[usize]) -> Result<(), KernelError> {
    match checked_numel(shape) {
        Some(expected) if expected == len => Ok(()),
        Some(expected) => Err(KernelError::DataLength { op, operand, shape: shape.to_vec(), expected, actual: len }),
        None => Err(KernelError::InvalidArgument {
            op,
            reason: format!("{operand} shape {shape:?} has more elements than usize can count"),
        }),
    }
}

/// Maps a possibly negative dim (`-1` = last) onto `0..rank`.
pub fn normalize_dim(op: &'static str, dim: isize, rank: usize) -> Result<usize, KernelError> {
    let resolved = if dim < 0 { dim + rank as isize } else { dim };
    if (0..rank as isize).contains(&resolved) {
        Ok(resolved as usize)
    } else {
        Err(KernelError::DimOutOfRange { op, dim, rank })
    }
}

/// The numpy broadcast of two shapes: right-aligned, each pair of dims equal or one of them 1.
pub fn broadcast_shape(a: &[usize], b: &[usize]) -> Result<Vec<usize>, KernelError> {
    broadcast_shape_for("broadcast_shape", a, b)
}

/// [`broadcast_shape`] reporting errors under the calling kernel's name.
pub(crate) fn broadcast_shape_for(op: &'static str, a: &[usize], b: &[usize]) -> Result<Vec<usize>, KernelError> {
    let rank = a.len().max(b.len());
    let mut out = vec![0usize; rank];
    for (i, slot) in out.iter_mut().enumerate() {
        // Position i counted from the right-aligned start; missing leading dims act as 1.
        let da = dim_from_right(a, rank - 1 - i);
        let db = dim_from_right(b, rank - 1 - i);
        *slot = match (da, db) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => return Err(KernelError::NotBroadcastable { op, a: a.to_vec(), b: b.to_vec() }),
        };
    }
    Ok(out)
}

fn dim_from_right(shape: &[usize], from_right: usize) -> usize {
    if from_right < shape.len() {
        shape[shape.len() - 1 - from_right]
    } else {
        1
    }
}

/// Strides (in elements) that read an operand of `shape` as if it had `out_shape`: 0 along broadcast
/// dims. `shape` must broadcast to `out_shape`.
pub fn broadcast_strides(shape: &[usize], out_shape: &[usize]) -> Vec<usize> {
    let own = contiguous_strides(shape);
    let lead = out_shape.len() - shape.len();
    (0..out_shape.len()).map(|d| if d < lead || shape[d - lead] == 1 { 0 } else { own[d - lead] }).collect()
}

/// Splits `shape` around `dim` into `(outer, size, inner)`: the products of the dims before it,
/// the dim itself and the dims after it. Lets most dim-wise kernels work on a 3-D view.
pub fn split_at_dim(shape: &[usize], dim: usize) -> (usize, usize, usize) {
    (numel(&shape[..dim]), shape[dim], numel(&shape[dim + 1..]))
}

/// Iteration plan for `K` operands broadcast to one output: output dims of size 1 are dropped and
/// adjacent dims merged whenever every operand walks them contiguously, so the innermost loop is as
/// long as possible and each operand moves through it with stride 1 (present) or 0 (broadcast).
#[derive(Debug, Clone)]
pub(crate) struct BroadcastPlan<const K: usize> {
    /// Length of the innermost merged dim (1 for a scalar output).
    pub inner: usize,
    /// Stride of each operand along the innermost dim: 1, or 0 when broadcast.
    pub inner_strides: [usize; K],
    outer_shape: Vec<usize>,
    outer_strides: [Vec<usize>; K],
}

impl<const K: usize> BroadcastPlan<K> {
    /// `shapes` must each broadcast to `out_shape` (checked by the caller).
    pub fn new(out_shape: &[usize], shapes: [&[usize]; K]) -> Self {
        let strides: [Vec<usize>; K] = shapes.map(|s| broadcast_strides(s, out_shape));
        // (size, per-operand stride) of each kept dim, outermost first.
        let mut dims: Vec<(usize, [usize; K])> = Vec::with_capacity(out_shape.len());
        for (d, &size) in out_shape.iter().enumerate() {
            if size == 1 {
                continue;
            }
            let s: [usize; K] = std::array::from_fn(|k| strides[k][d]);
            if let Some(last) = dims.last_mut() {
                if (0..K).all(|k| last.1[k] == s[k] * size) {
                    last.0 *= size;
                    last.1 = s;
                    continue;
                }
            }
            dims.push((size, s));
        }
        let (inner, inner_strides) = dims.pop().unwrap_or((1, [0; K]));
        let outer_shape = dims.iter().map(|d| d.0).collect();
        let outer_strides = std::array::from_fn(|k| dims.iter().map(|d| d.1[k]).collect());
        BroadcastPlan { inner, inner_strides, outer_shape, outer_strides }
    }

    /// Visits the output elements `start..start + len` as runs that stay inside one innermost row.
    /// `visit(pos, run, offsets)` gets the run's position relative to `start`, its length and the
    /// offset of its first element in each operand.
    /// Always inlined, so a caller compiled for wider vectors ([`mllm_dsl::simd::widest`]) gets
    /// `visit`'s loop compiled that way too.
    #[inline(always)]
    pub fn for_each_run(&self, start: usize, len: usize, mut visit: impl FnMut(usize, usize, [usize; K])) {
        if len == 0 {
            return;
        }
        let rank = self.outer_shape.len();
        let mut col = start % self.inner;
        let mut row = start / self.inner;
        let mut index = vec![0usize; rank];
        for d in (0..rank).rev() {
            index[d] = row % self.outer_shape[d];
            row /= self.outer_shape[d];
        }
        let mut base: [usize; K] =
            std::array::from_fn(|k| (0..rank).map(|d| index[d] * self.outer_strides[k][d]).sum());
        let mut done = 0;
        while done < len {
            let run = (self.inner - col).min(len - done);
            let offsets = std::array::from_fn(|k| base[k] + col * self.inner_strides[k]);
            visit(done, run, offsets);
            done += run;
            col = 0;
            // Advance the outer odometer by one row.
            for d in (0..rank).rev() {
                index[d] += 1;
                for (k, b) in base.iter_mut().enumerate() {
                    *b += self.outer_strides[k][d];
                }
                if index[d] < self.outer_shape[d] {
                    break;
                }
                for (k, b) in base.iter_mut().enumerate() {
                    *b -= self.outer_strides[k][d] * self.outer_shape[d];
                }
                index[d] = 0;
            }
        }
    }
}

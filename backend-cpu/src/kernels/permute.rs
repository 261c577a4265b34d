//! Dimension permutation (`permute`, `transpose`) into a new contiguous tensor.
//!
//! The output dims are first simplified: size-1 dims are dropped and neighbours that are also
//! neighbours in the input are merged, so `[1,S,H,D] -> [1,H,S,D]` becomes a 3-D problem `[H,S,D]`
//! whose last dim is contiguous in the input, i.e. plain row copies of D floats. When the input's
//! contiguous dim moves away from the end (e.g. swapping the last two dims) the copy runs as a
//! tiled 2-D transpose so both sides stay in cache. Large outputs are split over the pool along the
//! outermost output dim.

use super::shape::{check_len, contiguous_strides, normalize_dim};
use super::threads::parallel_ctx;
use super::KernelError;

/// Below this many elements the calling thread does the work.
const MIN_PARALLEL_LEN: usize = 1 << 16;

/// Side of the square tiles of the 2-D transpose (32 x 32 floats = 4 KB per side).
const TILE: usize = 32;

/// `x.permute(perm)`: output dim `i` is input dim `perm[i]` (negative entries count from the end).
pub fn permute(x: &[f32], shape: &[usize], perm: &[isize]) -> Result<(Vec<f32>, Vec<usize>), KernelError> {
    permute_for("permute", x, shape, perm)
}

/// `x.transpose(d0, d1)`: swaps two dims (negative dims count from the end).
pub fn transpose(x: &[f32], shape: &[usize], d0: isize, d1: isize) -> Result<(Vec<f32>, Vec<usize>), KernelError> {
    const OP: &str = "transpose";
    let rank = shape.len();
    let a = normalize_dim(OP, d0, rank)?;
    let b = normalize_dim(OP, d1, rank)?;
    let mut perm: Vec<isize> = (0..rank as isize).collect();
    perm.swap(a, b);
    permute_for(OP, x, shape, &perm)
}

/// A row-major `[rows, cols]` matrix as `[cols, rows]` (tiled, parallel for large ones).
pub fn transpose_2d(x: &[f32], rows: usize, cols: usize) -> Result<Vec<f32>, KernelError> {
    Ok(transpose(x, &[rows, cols], 0, 1)?.0)
}

fn permute_for(
    op: &'static str,
    x: &[f32],
    shape: &[usize],
    perm: &[isize],
) -> Result<(Vec<f32>, Vec<usize>), KernelError> {
    check_len(op, "x", x, shape)?;
    let rank = shape.len();
    let invalid = || KernelError::InvalidPermutation { op, perm: perm.to_vec(), rank, shape: shape.to_vec() };
    if perm.len() != rank {
        return Err(invalid());
    }
    let mut seen = vec![false; rank];
    let mut axes = Vec::with_capacity(rank);
    for &p in perm {
        let axis = normalize_dim(op, p, rank).map_err(|_| invalid())?;
        if std::mem::replace(&mut seen[axis], true) {
            return Err(invalid());
        }
        axes.push(axis);
    }
    let in_strides = contiguous_strides(shape);
    let out_shape: Vec<usize> = axes.iter().map(|&a| shape[a]).collect();
    let mut out = vec![0.0f32; x.len()];
    if out.is_empty() {
        return Ok((out, out_shape));
    }
    if keeps_order(shape, axes.iter().copied()) {
        out.copy_from_slice(x);
        return Ok((out, out_shape));
    }

    // Simplify: drop size-1 dims, merge output neighbours that are input neighbours too.
    let mut dims: Vec<(usize, usize)> = Vec::with_capacity(rank); // (size, input stride)
    for &a in &axes {
        let (size, stride) = (shape[a], in_strides[a]);
        if size == 1 {
            continue;
        }
        match dims.last_mut() {
            Some(last) if last.1 == stride * size => *last = (last.0 * size, stride),
            _ => dims.push((size, stride)),
        }
    }
    // Two or more dims are left: a permutation that keeps the order was copied above.
    let sizes: Vec<usize> = dims.iter().map(|d| d.0).collect();
    let strides: Vec<usize> = dims.iter().map(|d| d.1).collect();

    let outer_block = out.len() / sizes[0];
    match parallel_ctx(out.len(), MIN_PARALLEL_LEN) {
        Some(ctx) if sizes[0] >= 2 => {
            // Split output dim 0: each task permutes a sub-block with dim 0 shortened.
            let per_task = sizes[0].div_ceil(ctx.threads * 2);
            ctx.for_each_chunk_mut(&mut out, per_task * outer_block, |t, chunk| {
                let mut sub = sizes.clone();
                sub[0] = chunk.len() / outer_block;
                let offset = t * per_task * strides[0];
                copy_permuted(x, offset, &sub, &strides, chunk);
            });
        }
        _ => copy_permuted(x, 0, &sizes, &strides, &mut out),
    }
    Ok((out, out_shape))
}

/// Whether the permutation whose output dim `d` is input dim `axes[d]` keeps every dim of `shape`
/// longer than 1 in its place in line, so a contiguous tensor's elements stay in their order: the
/// permuted tensor is the same buffer (the eager backend hands it on instead of copying).
pub(crate) fn keeps_order(shape: &[usize], axes: impl IntoIterator<Item = usize>) -> bool {
    let mut last = None;
    for a in axes {
        let Some(&n) = shape.get(a) else { return false };
        if n > 1 {
            if last.is_some_and(|l| a < l) {
                return false;
            }
            last = Some(a);
        }
    }
    true
}

/// Writes `out` (contiguous, dims `sizes`) from `src` where output element `idx` reads
/// `src[offset + sum(idx[d] * strides[d])]`.
fn copy_permuted(src: &[f32], offset: usize, sizes: &[usize], strides: &[usize], out: &mut [f32]) {
    let last = sizes.len() - 1;
    let out_strides = contiguous_strides(sizes);
    if strides[last] == 1 {
        // Contiguous innermost run: row copies.
        let run = sizes[last];
        for_each_index(&sizes[..last], &strides[..last], &out_strides[..last], |s, o| {
            out[o..o + run].copy_from_slice(&src[offset + s..offset + s + run])
        });
        return;
    }
    let Some(p) = strides[..last].iter().position(|&s| s == 1) else {
        // Not reachable for permutations of contiguous tensors; kept as a correct fallback.
        for_each_index(sizes, strides, &out_strides, |s, o| out[o] = src[offset + s]);
        return;
    };
    // Tiled transpose between output dims p (input-contiguous) and `last` (output-contiguous);
    // the other dims are walked with p and last pinned to 0.
    let mut rest = sizes.to_vec();
    rest[p] = 1;
    rest[last] = 1;
    let (rows, cols) = (sizes[p], sizes[last]);
    let (out_row, in_col) = (out_strides[p], strides[last]);
    for_each_index(&rest, strides, &out_strides, |in_base, out_base| {
        for r0 in (0..rows).step_by(TILE) {
            for c0 in (0..cols).step_by(TILE) {
                for r in r0..(r0 + TILE).min(rows) {
                    let o = out_base + r * out_row;
                    let s = offset + in_base + r;
                    for c in c0..(c0 + TILE).min(cols) {
                        out[o + c] = src[s + c * in_col];
                    }
                }
            }
        }
    });
}

/// Calls `visit(a, b)` for every index of `sizes` in row-major order with
/// `a = sum(idx[d] * a_strides[d])` and `b = sum(idx[d] * b_strides[d])`.
fn for_each_index(sizes: &[usize], a_strides: &[usize], b_strides: &[usize], mut visit: impl FnMut(usize, usize)) {
    let total: usize = sizes.iter().product();
    let mut idx = vec![0usize; sizes.len()];
    let (mut a, mut b) = (0usize, 0usize);
    for _ in 0..total {
        visit(a, b);
        for d in (0..sizes.len()).rev() {
            idx[d] += 1;
            a += a_strides[d];
            b += b_strides[d];
            if idx[d] < sizes[d] {
                break;
            }
            a -= a_strides[d] * sizes[d];
            b -= b_strides[d] * sizes[d];
            idx[d] = 0;
        }
    }
}

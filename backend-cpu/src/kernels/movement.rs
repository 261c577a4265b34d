//! Copies that cut, join or repeat along one dim: `slice`, `concat`, `repeat_interleave`.
//!
//! Each views its tensors as `[outer, dim, inner]` so the work is a sequence of contiguous block
//! copies. They are memory-bound and stay on the calling thread: on this two-core target a second
//! thread does not raise copy bandwidth enough to pay for the dispatch at model sizes.

use super::shape::{check_len, normalize_dim, numel, split_at_dim};
use super::KernelError;

/// `x[.., start:end, ..]` along `dim` with Python slice rules: negative `start`/`end` count from
/// the end, both are clamped to `0..=size`, and `end <= start` gives an empty dim.
pub fn slice(
    x: &[f32],
    shape: &[usize],
    dim: isize,
    start: isize,
    end: isize,
) -> Result<(Vec<f32>, Vec<usize>), KernelError> {
    const OP: &str = "slice";
    check_len(OP, "x", x, shape)?;
    let d = normalize_dim(OP, dim, shape.len())?;
    let (outer, size, inner) = split_at_dim(shape, d);
    let clamp = |i: isize| {
        let i = if i < 0 { i + size as isize } else { i };
        i.clamp(0, size as isize) as usize
    };
    let (start, end) = (clamp(start), clamp(end));
    let len = end.saturating_sub(start);
    let mut out_shape = shape.to_vec();
    out_shape[d] = len;
    let mut out = Vec::with_capacity(outer * len * inner);
    for o in 0..outer {
        let base = (o * size + start) * inner;
        out.extend_from_slice(&x[base..base + len * inner]);
    }
    Ok((out, out_shape))
}

/// Concatenates `parts` (data, shape) along `dim`; all parts have the same rank and agree on every
/// other dim.
pub fn concat(parts: &[(&[f32], &[usize])], dim: isize) -> Result<(Vec<f32>, Vec<usize>), KernelError> {
    const OP: &str = "concat";
    let Some(&(_, first)) = parts.first() else {
        return Err(KernelError::InvalidArgument { op: OP, reason: "needs at least one part".to_string() });
    };
    let d = normalize_dim(OP, dim, first.len())?;
    let mut total = 0;
    for (i, &(data, shape)) in parts.iter().enumerate() {
        check_len(OP, "part", data, shape)?;
        let same_elsewhere =
            shape.len() == first.len() && shape.iter().zip(first).enumerate().all(|(k, (a, b))| k == d || a == b);
        if !same_elsewhere {
            return Err(KernelError::ConcatMismatch {
                op: OP,
                part: i,
                shape: shape.to_vec(),
                first: first.to_vec(),
                dim: d,
            });
        }
        total += shape[d];
    }
    let mut out_shape = first.to_vec();
    out_shape[d] = total;
    let (outer, _, inner) = split_at_dim(first, d);
    let mut out = Vec::with_capacity(numel(&out_shape));
    for o in 0..outer {
        for &(data, shape) in parts {
            let block = shape[d] * inner;
            out.extend_from_slice(&data[o * block..(o + 1) * block]);
        }
    }
    Ok((out, out_shape))
}

/// `torch.repeat_interleave(x, repeats, dim)`: each slice along `dim` is repeated `repeats` times
/// in place (`h0, h0, h1, h1` for 2), which is GQA's `repeat_kv` on the head dim.
pub fn repeat_interleave(
    x: &[f32],
    shape: &[usize],
    dim: isize,
    repeats: usize,
) -> Result<(Vec<f32>, Vec<usize>), KernelError> {
    const OP: &str = "repeat_interleave";
    check_len(OP, "x", x, shape)?;
    let d = normalize_dim(OP, dim, shape.len())?;
    let (outer, size, inner) = split_at_dim(shape, d);
    let mut out_shape = shape.to_vec();
    out_shape[d] = size * repeats;
    let mut out = Vec::with_capacity(numel(&out_shape));
    if inner > 0 {
        for block in x.chunks_exact(inner).take(outer * size) {
            for _ in 0..repeats {
                out.extend_from_slice(block);
            }
        }
    }
    Ok((out, out_shape))
}

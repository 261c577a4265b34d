//! `index_select`: gathers slices of a table along one dim by integer indices, e.g. embedding
//! lookup (`[V, H]` by ids `[B, S]` -> `[B, S, H]`) or RoPE tables (`[1, L, D]` on dim 1 by
//! positions `[S]` -> `[1, S, D]`).

use super::shape::{check_len, check_len_of, normalize_dim, numel, split_at_dim};
use super::KernelError;

/// Output shape `shape[..dim] ++ indices_shape ++ shape[dim + 1..]`; element
/// `[.., i.., ..] = table[.., indices[i..], ..]`. Indices must lie in `0..shape[dim]` (negative
/// indices are rejected, as in torch.index_select); the first offending one is reported.
pub fn index_select(
    table: &[f32],
    shape: &[usize],
    dim: isize,
    indices: &[i64],
    indices_shape: &[usize],
) -> Result<(Vec<f32>, Vec<usize>), KernelError> {
    const OP: &str = "index_select";
    check_len(OP, "table", table, shape)?;
    check_len_of(OP, "indices", indices.len(), indices_shape)?;
    let d = normalize_dim(OP, dim, shape.len())?;
    let (outer, bound, inner) = split_at_dim(shape, d);
    let rows = indices
        .iter()
        .enumerate()
        .map(|(position, &index)| {
            usize::try_from(index).ok().filter(|&i| i < bound).ok_or(KernelError::IndexOutOfRange {
                op: OP,
                index,
                position,
                dim: d,
                bound,
            })
        })
        .collect::<Result<Vec<usize>, _>>()?;
    let out_shape: Vec<usize> = shape[..d].iter().chain(indices_shape).chain(&shape[d + 1..]).copied().collect();
    let mut out = Vec::with_capacity(numel(&out_shape));
    for o in 0..outer {
        let base = o * bound * inner;
        for &r in &rows {
            let s = base + r * inner;
            out.extend_from_slice(&table[s..s + inner]);
        }
    }
    Ok((out, out_shape))
}

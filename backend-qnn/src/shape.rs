//! Shape inference shared by the validator and the interpreter.
//!
//! Each function computes the output dims of one op from its input dims and params, or says
//! why the inputs do not fit ([`ShapeError`]). The validator compares the result with the declared output
//! tensor; the interpreter uses the same arithmetic (e.g. the resolved slice ranges) to execute.

/// Why an op's input dims or params do not fit.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShapeError {
    #[error("shapes {} are not broadcastable (dim {dim} differs: {a} vs {b})", list(shapes))]
    NotBroadcastable { shapes: Vec<Vec<u32>>, dim: usize, a: u32, b: u32 },
    #[error("{what} must be {expected}, found {dims:?}")]
    Rank { what: &'static str, expected: &'static str, dims: Vec<u32> },
    #[error("group must be >= 1")]
    ZeroGroup,
    #[error("stride {stride:?} and dilation {dilation:?} must be >= 1")]
    ZeroStrideOrDilation { stride: [u32; 2], dilation: [u32; 2] },
    #[error("filter in-channels {per_group} x group {group} != input channels {channels}")]
    InChannels { per_group: u32, group: u32, channels: u32 },
    #[error("filter out-channels {channels} not divisible by group {group}")]
    OutChannels { channels: u32, group: u32 },
    #[error("kernel extent {extent} exceeds padded input size {padded}")]
    KernelTooLarge { extent: i64, padded: i64 },
    #[error("inner dims differ: in[0] {a:?} gives K = {ka}, in[1] {b:?} gives K = {kb}")]
    InnerDims { a: Vec<u32>, b: Vec<u32>, ka: u32, kb: u32 },
    #[error("axis {axis} is out of range for rank {rank}")]
    AxisOutOfRange { axis: i64, rank: usize },
    #[error("axis {axis} appears twice")]
    AxisRepeated { axis: u32 },
    #[error("perm {perm:?} has {} entries for rank {rank}", perm.len())]
    PermLength { perm: Vec<u32>, rank: usize },
    #[error("perm {perm:?} is not a permutation of 0..{}", perm.len())]
    NotAPermutation { perm: Vec<u32> },
    #[error("no inputs")]
    NoInputs,
    #[error("in[{index}] has rank {rank} but in[0] has rank {first_rank}")]
    ConcatRank { index: usize, rank: usize, first_rank: usize },
    #[error("in[{index}] dims {dims:?} differ from in[0] dims {first:?} outside axis {axis}")]
    ConcatDims { index: usize, dims: Vec<u32>, first: Vec<u32>, axis: usize },
    #[error("new_axes_mask is not supported (must be 0)")]
    NewAxesMask,
    #[error("ranges has {values} values, expected rank {rank} x 3")]
    RangesLength { values: usize, rank: usize },
    #[error("axis {axis}: stride must be non-zero")]
    ZeroStride { axis: usize },
    #[error("axis {axis}: shrink index {index} is out of range for dim {dim}")]
    ShrinkIndex { axis: usize, index: i64, dim: u32 },
    #[error("axis {axis}: range ({begin}, {end}, {stride}) selects no elements of dim {dim}")]
    EmptyRange { axis: usize, begin: i64, end: i64, stride: i64, dim: u32 },
}

fn list(shapes: &[Vec<u32>]) -> String {
    shapes.iter().map(|s| format!("{s:?}")).collect::<Vec<_>>().join(", ")
}

/// Numpy-style broadcast of several shapes (right-aligned; each dim equal or 1).
pub fn broadcast(shapes: &[&[u32]]) -> Result<Vec<u32>, ShapeError> {
    let rank = shapes.iter().map(|s| s.len()).max().unwrap_or(0);
    let mut out = vec![1u32; rank];
    for shape in shapes {
        let pad = rank - shape.len();
        for (i, &d) in shape.iter().enumerate() {
            let o = &mut out[pad + i];
            if *o == 1 {
                *o = d;
            } else if d != 1 && d != *o {
                return Err(ShapeError::NotBroadcastable {
                    shapes: shapes.iter().map(|s| s.to_vec()).collect(),
                    dim: pad + i,
                    a: *o,
                    b: d,
                });
            }
        }
    }
    Ok(out)
}

/// Output dims of an NHWC `Conv2d` with HWIO filter.
pub fn conv2d_output(
    input: &[u32],
    filter: &[u32],
    stride: [u32; 2],
    pad: [[u32; 2]; 2],
    dilation: [u32; 2],
    group: u32,
) -> Result<Vec<u32>, ShapeError> {
    if input.len() != 4 {
        return Err(ShapeError::Rank { what: "input", expected: "NHWC rank 4", dims: input.to_vec() });
    }
    if filter.len() != 4 {
        return Err(ShapeError::Rank {
            what: "filter",
            expected: "HWIO rank 4 [kh, kw, Cin/group, Cout]",
            dims: filter.to_vec(),
        });
    }
    if group == 0 {
        return Err(ShapeError::ZeroGroup);
    }
    if stride.contains(&0) || dilation.contains(&0) {
        return Err(ShapeError::ZeroStrideOrDilation { stride, dilation });
    }
    let (cin, cin_per_group, cout) = (input[3], filter[2], filter[3]);
    if u64::from(cin_per_group) * u64::from(group) != u64::from(cin) {
        return Err(ShapeError::InChannels { per_group: cin_per_group, group, channels: cin });
    }
    if cout % group != 0 {
        return Err(ShapeError::OutChannels { channels: cout, group });
    }
    let spatial = |size: u32, k: u32, s: u32, p: [u32; 2], d: u32| -> Result<u32, ShapeError> {
        let padded = i64::from(size) + i64::from(p[0]) + i64::from(p[1]);
        let extent = i64::from(d) * (i64::from(k) - 1) + 1;
        if padded < extent {
            return Err(ShapeError::KernelTooLarge { extent, padded });
        }
        Ok(((padded - extent) / i64::from(s) + 1) as u32)
    };
    let h = spatial(input[1], filter[0], stride[0], pad[0], dilation[0])?;
    let w = spatial(input[2], filter[1], stride[1], pad[1], dilation[1])?;
    Ok(vec![input[0], h, w, cout])
}

/// Output dims of `MatMul` (`[..., M, K] x [..., K, N]`, batch dims broadcast).
pub fn matmul_output(a: &[u32], b: &[u32], transpose_a: bool, transpose_b: bool) -> Result<Vec<u32>, ShapeError> {
    for (what, dims) in [("in[0]", a), ("in[1]", b)] {
        if dims.len() < 2 {
            return Err(ShapeError::Rank { what, expected: "of rank >= 2", dims: dims.to_vec() });
        }
    }
    let (ra, rb) = (a.len(), b.len());
    let (m, ka) = if transpose_a { (a[ra - 1], a[ra - 2]) } else { (a[ra - 2], a[ra - 1]) };
    let (kb, n) = if transpose_b { (b[rb - 1], b[rb - 2]) } else { (b[rb - 2], b[rb - 1]) };
    if ka != kb {
        return Err(ShapeError::InnerDims { a: a.to_vec(), b: b.to_vec(), ka, kb });
    }
    let mut out = broadcast(&[&a[..ra - 2], &b[..rb - 2]])?;
    out.extend([m, n]);
    Ok(out)
}

/// Output dims of a reduction over `axes`.
pub fn reduce_output(input: &[u32], axes: &[u32], keep_dims: bool) -> Result<Vec<u32>, ShapeError> {
    check_axes(input.len(), axes)?;
    let mut out = Vec::new();
    for (i, &d) in input.iter().enumerate() {
        if axes.contains(&(i as u32)) {
            if keep_dims {
                out.push(1);
            }
        } else {
            out.push(d);
        }
    }
    Ok(out)
}

/// Axes must be distinct and < rank.
pub fn check_axes(rank: usize, axes: &[u32]) -> Result<(), ShapeError> {
    for (i, &a) in axes.iter().enumerate() {
        if a as usize >= rank {
            return Err(ShapeError::AxisOutOfRange { axis: a.into(), rank });
        }
        if axes[..i].contains(&a) {
            return Err(ShapeError::AxisRepeated { axis: a });
        }
    }
    Ok(())
}

/// Output dims of `Transpose`; `perm` must be a permutation of `0..rank`.
pub fn transpose_output(input: &[u32], perm: &[u32]) -> Result<Vec<u32>, ShapeError> {
    if perm.len() != input.len() {
        return Err(ShapeError::PermLength { perm: perm.to_vec(), rank: input.len() });
    }
    let mut seen = vec![false; perm.len()];
    for &p in perm {
        match seen.get_mut(p as usize) {
            Some(s) if !*s => *s = true,
            _ => return Err(ShapeError::NotAPermutation { perm: perm.to_vec() }),
        }
    }
    Ok(perm.iter().map(|&p| input[p as usize]).collect())
}

/// Normalized axis and output dims of `Gather`: `in[:axis] + indices + in[axis+1:]`.
pub fn gather_output(input: &[u32], indices: &[u32], axis: i32) -> Result<(usize, Vec<u32>), ShapeError> {
    let rank = input.len() as i64;
    let a = i64::from(axis);
    if rank == 0 || a < -rank || a >= rank {
        return Err(ShapeError::AxisOutOfRange { axis: a, rank: input.len() });
    }
    let a = if a < 0 { a + rank } else { a } as usize;
    let mut out = input[..a].to_vec();
    out.extend_from_slice(indices);
    out.extend_from_slice(&input[a + 1..]);
    Ok((a, out))
}

/// Output dims of `Concat` along `axis`.
pub fn concat_output(inputs: &[&[u32]], axis: u32) -> Result<Vec<u32>, ShapeError> {
    let first = inputs.first().ok_or(ShapeError::NoInputs)?;
    let axis = axis as usize;
    if axis >= first.len() {
        return Err(ShapeError::AxisOutOfRange { axis: axis as i64, rank: first.len() });
    }
    let mut out = first.to_vec();
    out[axis] = 0;
    for (i, dims) in inputs.iter().enumerate() {
        if dims.len() != first.len() {
            return Err(ShapeError::ConcatRank { index: i, rank: dims.len(), first_rank: first.len() });
        }
        for (d, (&x, &y)) in dims.iter().zip(first.iter()).enumerate() {
            if d != axis && x != y {
                return Err(ShapeError::ConcatDims { index: i, dims: dims.to_vec(), first: first.to_vec(), axis });
            }
        }
        out[axis] += dims[axis];
    }
    Ok(out)
}

/// One resolved axis of a `StridedSlice`: elements `begin + k * stride` for `k < len`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SliceAxis {
    pub begin: i64,
    pub stride: i64,
    pub len: u32,
    /// Removed from the output dims (`shrink_axes`).
    pub shrink: bool,
}

/// Resolve `StridedSlice` ranges (`[rank][begin, end, stride]`) and masks into per-axis
/// selections and output dims. `new_axes_mask` is not modelled and must be 0.
pub fn strided_slice(
    input: &[u32],
    ranges: &[i32],
    begin_mask: u32,
    end_mask: u32,
    shrink_axes: u32,
    new_axes_mask: u32,
) -> Result<(Vec<SliceAxis>, Vec<u32>), ShapeError> {
    if new_axes_mask != 0 {
        return Err(ShapeError::NewAxesMask);
    }
    if ranges.len() != input.len() * 3 {
        return Err(ShapeError::RangesLength { values: ranges.len(), rank: input.len() });
    }
    let mut axes = Vec::with_capacity(input.len());
    let mut out = Vec::new();
    for (i, &dim) in input.iter().enumerate() {
        let d = i64::from(dim);
        let (b, e, s) = (i64::from(ranges[3 * i]), i64::from(ranges[3 * i + 1]), i64::from(ranges[3 * i + 2]));
        if s == 0 {
            return Err(ShapeError::ZeroStride { axis: i });
        }
        let bit = |mask: u32| mask >> i & 1 == 1;
        let shrink = bit(shrink_axes);
        let normalize = |v: i64| if v < 0 { v + d } else { v };
        let (lo, hi) = if s > 0 { (0, d) } else { (-1, d - 1) };
        let begin = if bit(begin_mask) {
            if s > 0 {
                0
            } else {
                d - 1
            }
        } else {
            normalize(b).clamp(lo, hi)
        };
        let len = if shrink {
            let idx = normalize(b);
            if !(0..d).contains(&idx) {
                return Err(ShapeError::ShrinkIndex { axis: i, index: b, dim });
            }
            axes.push(SliceAxis { begin: idx, stride: 1, len: 1, shrink: true });
            continue;
        } else {
            let end = if bit(end_mask) {
                if s > 0 {
                    d
                } else {
                    -1
                }
            } else {
                normalize(e).clamp(lo, hi)
            };
            let span = if s > 0 { end - begin } else { begin - end };
            if span <= 0 {
                0
            } else {
                (span + s.abs() - 1) / s.abs()
            }
        };
        if len == 0 {
            return Err(ShapeError::EmptyRange { axis: i, begin: b, end: e, stride: s, dim });
        }
        axes.push(SliceAxis { begin, stride: s, len: len as u32, shrink: false });
        out.push(len as u32);
    }
    Ok((axes, out))
}

/// Number of elements of `dims`.
pub fn numel(dims: &[u32]) -> u64 {
    dims.iter().map(|&d| u64::from(d)).product()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_are_typed_and_say_what_does_not_fit() {
        let e = broadcast(&[&[2, 3], &[4, 3]]).unwrap_err();
        assert_eq!(e, ShapeError::NotBroadcastable { shapes: vec![vec![2, 3], vec![4, 3]], dim: 0, a: 2, b: 4 });
        assert_eq!(e.to_string(), "shapes [2, 3], [4, 3] are not broadcastable (dim 0 differs: 2 vs 4)");
        let e = matmul_output(&[3], &[3, 2], false, false).unwrap_err();
        assert_eq!(e.to_string(), "in[0] must be of rank >= 2, found [3]");
        assert_eq!(gather_output(&[4, 5], &[2], -3).unwrap_err(), ShapeError::AxisOutOfRange { axis: -3, rank: 2 });
        assert_eq!(concat_output(&[], 0).unwrap_err(), ShapeError::NoInputs);
    }

    #[test]
    fn broadcasting() {
        assert_eq!(broadcast(&[&[2, 1, 4], &[3, 1]]).unwrap(), vec![2, 3, 4]);
        assert_eq!(broadcast(&[&[1], &[5, 6]]).unwrap(), vec![5, 6]);
        assert!(broadcast(&[&[2, 3], &[4, 3]]).is_err());
        assert_eq!(broadcast(&[&[1, 4], &[3, 1], &[1]]).unwrap(), vec![3, 4]);
    }

    #[test]
    fn conv2d_shapes() {
        // 1x1 conv as linear: [1, 1, S, In] x [1, 1, In, Out].
        assert_eq!(
            conv2d_output(&[1, 1, 32, 64], &[1, 1, 64, 128], [1, 1], [[0, 0], [0, 0]], [1, 1], 1).unwrap(),
            vec![1, 1, 32, 128]
        );
        // 3x3, stride 2, pad 1: (8 + 2 - 3) / 2 + 1 = 4.
        assert_eq!(
            conv2d_output(&[1, 8, 8, 4], &[3, 3, 2, 6], [2, 2], [[1, 1], [1, 1]], [1, 1], 2).unwrap(),
            vec![1, 4, 4, 6]
        );
        assert!(conv2d_output(&[1, 8, 8, 4], &[3, 3, 3, 6], [1, 1], [[0, 0], [0, 0]], [1, 1], 1).is_err());
    }

    #[test]
    fn matmul_shapes() {
        assert_eq!(matmul_output(&[2, 3, 4], &[4, 5], false, false).unwrap(), vec![2, 3, 5]);
        assert_eq!(matmul_output(&[1, 4, 3], &[1, 5, 4], true, true).unwrap(), vec![1, 3, 5]);
        assert!(matmul_output(&[3, 4], &[5, 6], false, false).is_err());
    }

    #[test]
    fn strided_slice_resolution() {
        // x[:, 2:6:2] on [3, 8]
        let (axes, out) = strided_slice(&[3, 8], &[0, 3, 1, 2, 6, 2], 0, 0, 0, 0).unwrap();
        assert_eq!(out, vec![3, 2]);
        assert_eq!(axes[1].begin, 2);
        // negative start with end_mask: x[-3:] on [8]
        let (axes, out) = strided_slice(&[8], &[-3, 0, 1], 0, 1, 0, 0).unwrap();
        assert_eq!((axes[0].begin, out), (5, vec![3]));
        // reverse with masks: x[::-1]
        let (axes, out) = strided_slice(&[4], &[0, 0, -1], 1, 1, 0, 0).unwrap();
        assert_eq!((axes[0].begin, axes[0].stride, out), (3, -1, vec![4]));
        // shrink axis 0
        let (axes, out) = strided_slice(&[4, 2], &[-1, 0, 1, 0, 2, 1], 0, 0, 1, 0).unwrap();
        assert_eq!((axes[0].begin, out), (3, vec![2]));
        assert!(strided_slice(&[4], &[2, 2, 1], 0, 0, 0, 0).is_err());
        assert!(strided_slice(&[4], &[0, 4, 1], 0, 0, 0, 1).is_err());
    }

    #[test]
    fn reduce_gather_concat_transpose() {
        assert_eq!(reduce_output(&[2, 3, 4], &[2], true).unwrap(), vec![2, 3, 1]);
        assert_eq!(reduce_output(&[2, 3, 4], &[0, 2], false).unwrap(), vec![3]);
        assert!(reduce_output(&[2, 3], &[1, 1], false).is_err());
        assert_eq!(gather_output(&[10, 4], &[1, 3], 0).unwrap(), (0, vec![1, 3, 4]));
        assert_eq!(gather_output(&[2, 10, 4], &[5], -2).unwrap(), (1, vec![2, 5, 4]));
        assert_eq!(concat_output(&[&[1, 2, 3], &[1, 5, 3]], 1).unwrap(), vec![1, 7, 3]);
        assert!(concat_output(&[&[1, 2, 3], &[2, 5, 3]], 1).is_err());
        assert_eq!(transpose_output(&[2, 3, 4], &[2, 0, 1]).unwrap(), vec![4, 2, 3]);
        assert!(transpose_output(&[2, 3, 4], &[0, 0, 1]).is_err());
    }
}

//! Real-valued kernels and index maps used by the interpreter.
//!
//! Index maps (`Vec<usize>`, output element -> source element) express every data-movement op
//! (broadcast, transpose, strided slice, gather, concat pieces), so those ops move integer codes
//! untouched when input and output share an encoding. Arithmetic kernels work on f32 with f64
//! accumulation for reductions; MatMul and 1x1 Conv2d use the `gemm` crate.

use crate::shape::SliceAxis;

/// Row-major strides.
pub fn strides(dims: &[u32]) -> Vec<usize> {
    let mut s = vec![1usize; dims.len()];
    for i in (0..dims.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * dims[i + 1] as usize;
    }
    s
}

/// For each element of `out_dims` (row-major), `base + sum(index[axis] * axis_strides[axis])`.
pub fn strided_map(out_dims: &[u32], axis_strides: &[isize], base: isize) -> Vec<usize> {
    let numel: usize = out_dims.iter().map(|&d| d as usize).product();
    let rank = out_dims.len();
    let mut map = Vec::with_capacity(numel);
    let mut idx = vec![0u32; rank];
    let mut offset = base;
    for _ in 0..numel {
        map.push(offset as usize);
        // Odometer increment, updating the offset incrementally.
        for axis in (0..rank).rev() {
            idx[axis] += 1;
            offset += axis_strides[axis];
            if idx[axis] < out_dims[axis] {
                break;
            }
            offset -= axis_strides[axis] * out_dims[axis] as isize;
            idx[axis] = 0;
        }
    }
    map
}

/// Map from each element of `out_dims` to the element of a tensor of `in_dims` that
/// broadcasts onto it (numpy rules, right-aligned).
pub fn broadcast_map(out_dims: &[u32], in_dims: &[u32]) -> Vec<usize> {
    let pad = out_dims.len() - in_dims.len();
    let in_strides = strides(in_dims);
    let axis_strides: Vec<isize> = (0..out_dims.len())
        .map(|a| if a < pad || in_dims[a - pad] == 1 { 0 } else { in_strides[a - pad] as isize })
        .collect();
    strided_map(out_dims, &axis_strides, 0)
}

/// Transpose: output axis `k` walks input axis `perm[k]`.
pub fn transpose_map(in_dims: &[u32], perm: &[u32]) -> Vec<usize> {
    let s = strides(in_dims);
    let out_dims: Vec<u32> = perm.iter().map(|&p| in_dims[p as usize]).collect();
    let axis_strides: Vec<isize> = perm.iter().map(|&p| s[p as usize] as isize).collect();
    strided_map(&out_dims, &axis_strides, 0)
}

/// Strided slice with resolved axes.
pub fn slice_map(in_dims: &[u32], axes: &[SliceAxis]) -> Vec<usize> {
    let s = strides(in_dims);
    let mut base = 0isize;
    let mut out_dims = Vec::new();
    let mut axis_strides = Vec::new();
    for (a, ax) in axes.iter().enumerate() {
        base += ax.begin as isize * s[a] as isize;
        if !ax.shrink {
            out_dims.push(ax.len);
            axis_strides.push(ax.stride as isize * s[a] as isize);
        }
    }
    strided_map(&out_dims, &axis_strides, base)
}

/// Gather along `axis` with already range-checked indices.
pub fn gather_map(in_dims: &[u32], axis: usize, indices: &[usize]) -> Vec<usize> {
    let outer: usize = in_dims[..axis].iter().map(|&d| d as usize).product();
    let inner: usize = in_dims[axis + 1..].iter().map(|&d| d as usize).product();
    let dim = in_dims[axis] as usize;
    let mut map = Vec::with_capacity(outer * indices.len() * inner);
    for o in 0..outer {
        for &i in indices {
            let start = (o * dim + i) * inner;
            map.extend(start..start + inner);
        }
    }
    map
}

/// Concatenate row-major parts along `axis`.
pub fn concat<T: Copy>(parts: &[(&[T], &[u32])], axis: usize) -> Vec<T> {
    let first = parts[0].1;
    let outer: usize = first[..axis].iter().map(|&d| d as usize).product();
    let total: usize = parts.iter().map(|(v, _)| v.len()).sum();
    let mut out = Vec::with_capacity(total);
    for o in 0..outer {
        for (values, dims) in parts {
            let chunk: usize = dims[axis..].iter().map(|&d| d as usize).product();
            out.extend_from_slice(&values[o * chunk..(o + 1) * chunk]);
        }
    }
    out
}

/// For each input element, the index of its group when the axes in `reduced` are collapsed
/// (the output offset of a keep-dims reduction).
pub fn group_map(in_dims: &[u32], reduced: &[u32]) -> (Vec<usize>, usize) {
    let kept: Vec<u32> =
        in_dims.iter().enumerate().map(|(a, &d)| if reduced.contains(&(a as u32)) { 1 } else { d }).collect();
    let ks = strides(&kept);
    let axis_strides: Vec<isize> =
        (0..in_dims.len()).map(|a| if reduced.contains(&(a as u32)) { 0 } else { ks[a] as isize }).collect();
    let groups = kept.iter().map(|&d| d as usize).product();
    (strided_map(in_dims, &axis_strides, 0), groups)
}

/// Reductions over groups.
#[derive(Clone, Copy, Debug)]
pub enum Reduce {
    Min,
    Max,
    Mean,
}

pub fn reduce(values: &[f32], groups_of: &[usize], groups: usize, how: Reduce) -> Vec<f32> {
    match how {
        Reduce::Min | Reduce::Max => {
            let init = if matches!(how, Reduce::Min) { f32::INFINITY } else { f32::NEG_INFINITY };
            let mut out = vec![init; groups];
            for (&v, &g) in values.iter().zip(groups_of) {
                out[g] = if matches!(how, Reduce::Min) { out[g].min(v) } else { out[g].max(v) };
            }
            out
        }
        Reduce::Mean => {
            let mut sum = vec![0f64; groups];
            let mut count = vec![0usize; groups];
            for (&v, &g) in values.iter().zip(groups_of) {
                sum[g] += f64::from(v);
                count[g] += 1;
            }
            sum.iter().zip(count).map(|(&s, c)| (s / c as f64) as f32).collect()
        }
    }
}

/// Softmax of `beta * x` along `axis`.
pub fn softmax(x: &[f32], dims: &[u32], axis: usize, beta: f32) -> Vec<f32> {
    let n = dims[axis] as usize;
    let inner: usize = dims[axis + 1..].iter().map(|&d| d as usize).product();
    let outer = x.len() / (n * inner).max(1);
    let mut out = vec![0f32; x.len()];
    let beta = f64::from(beta);
    for o in 0..outer {
        for i in 0..inner {
            let at = |k: usize| (o * n + k) * inner + i;
            let max = (0..n).map(|k| beta * f64::from(x[at(k)])).fold(f64::NEG_INFINITY, f64::max);
            let exps: Vec<f64> = (0..n).map(|k| (beta * f64::from(x[at(k)]) - max).exp()).collect();
            let sum: f64 = exps.iter().sum();
            for (k, e) in exps.iter().enumerate() {
                out[at(k)] = (e / sum) as f32;
            }
        }
    }
    out
}

/// `y = x / sqrt(mean(x^2 over axes) + eps) * gamma + beta`; `gamma`/`beta` have the dims of
/// the normalized axes, in `axes` order.
pub fn rms_norm(x: &[f32], dims: &[u32], axes: &[u32], gamma: &[f32], beta: Option<&[f32]>, eps: f32) -> Vec<f32> {
    let (groups_of, groups) = group_map(dims, axes);
    let mut sumsq = vec![0f64; groups];
    let mut count = vec![0usize; groups];
    for (&v, &g) in x.iter().zip(&groups_of) {
        sumsq[g] += f64::from(v) * f64::from(v);
        count[g] += 1;
    }
    let inv_rms: Vec<f64> =
        sumsq.iter().zip(&count).map(|(&s, &c)| 1.0 / (s / c as f64 + f64::from(eps)).sqrt()).collect();
    // Index of each element into gamma: only the normalized axes move it.
    let gamma_dims: Vec<u32> = axes.iter().map(|&a| dims[a as usize]).collect();
    let gs = strides(&gamma_dims);
    let axis_strides: Vec<isize> =
        (0..dims.len()).map(|a| axes.iter().position(|&ax| ax as usize == a).map_or(0, |j| gs[j] as isize)).collect();
    let gamma_of = strided_map(dims, &axis_strides, 0);
    x.iter()
        .zip(groups_of.iter().zip(&gamma_of))
        .map(|(&v, (&g, &k))| {
            let b = beta.map_or(0.0, |b| f64::from(b[k]));
            (f64::from(v) * inv_rms[g] * f64::from(gamma[k]) + b) as f32
        })
        .collect()
}

/// Row-major matrix with arbitrary strides for gemm.
#[derive(Clone, Copy)]
pub struct MatRef<'a> {
    pub data: &'a [f32],
    pub row_stride: isize,
    pub col_stride: isize,
}

/// `dst[m, n] = sum_k a[m, k] * b[k, n]`, dst row-major contiguous.
pub fn matmul(dst: &mut [f32], a: MatRef<'_>, b: MatRef<'_>, m: usize, n: usize, k: usize) {
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        dst.fill(0.0);
        return;
    }
    assert!(dst.len() >= m * n, "matmul destination too small");
    // SAFETY: the strides describe in-bounds elements: callers derive them from the dims of the
    // slices passed in (checked by the validator), and `dst` holds m * n elements (asserted).
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            n as isize,
            false,
            a.data.as_ptr(),
            a.col_stride,
            a.row_stride,
            b.data.as_ptr(),
            b.col_stride,
            b.row_stride,
            0.0f32,
            1.0f32,
            false,
            false,
            false,
            gemm::Parallelism::None,
        );
    }
}

/// Geometry of an NHWC Conv2d with HWIO filter.
pub struct ConvGeometry {
    pub input: [usize; 4],
    pub filter: [usize; 4],
    pub output: [usize; 4],
    pub stride: [usize; 2],
    pub pad_before: [usize; 2],
    pub dilation: [usize; 2],
    pub group: usize,
}

/// NHWC x HWIO Conv2d (+ bias), f32 with f64 accumulation for the general case and gemm for
/// 1x1 / stride 1 / no padding / one group (the LLM linear layout).
pub fn conv2d(x: &[f32], w: &[f32], bias: Option<&[f32]>, g: &ConvGeometry) -> Vec<f32> {
    let [n, h, wd, cin] = g.input;
    let [kh, kw, cin_g, cout] = g.filter;
    let [_, oh, ow, _] = g.output;
    let mut out = vec![0f32; n * oh * ow * cout];
    let pointwise =
        kh == 1 && kw == 1 && g.stride == [1, 1] && g.pad_before == [0, 0] && g.group == 1 && oh == h && ow == wd;
    if pointwise {
        let rows = n * h * wd;
        matmul(
            &mut out,
            MatRef { data: x, row_stride: cin as isize, col_stride: 1 },
            MatRef { data: w, row_stride: cout as isize, col_stride: 1 },
            rows,
            cout,
            cin,
        );
    } else {
        let cout_g = cout / g.group;
        for b in 0..n {
            for oy in 0..oh {
                for ox in 0..ow {
                    for oc in 0..cout {
                        let grp = oc / cout_g;
                        let mut acc = 0f64;
                        for ky in 0..kh {
                            let iy = (oy * g.stride[0] + ky * g.dilation[0]) as isize - g.pad_before[0] as isize;
                            if iy < 0 || iy >= h as isize {
                                continue;
                            }
                            for kx in 0..kw {
                                let ix = (ox * g.stride[1] + kx * g.dilation[1]) as isize - g.pad_before[1] as isize;
                                if ix < 0 || ix >= wd as isize {
                                    continue;
                                }
                                let xbase = ((b * h + iy as usize) * wd + ix as usize) * cin + grp * cin_g;
                                let wbase = (ky * kw + kx) * cin_g * cout;
                                for ic in 0..cin_g {
                                    acc += f64::from(x[xbase + ic]) * f64::from(w[wbase + ic * cout + oc]);
                                }
                            }
                        }
                        out[((b * oh + oy) * ow + ox) * cout + oc] = acc as f32;
                    }
                }
            }
        }
    }
    if let Some(bias) = bias {
        for row in out.chunks_mut(cout) {
            for (o, b) in row.iter_mut().zip(bias) {
                *o += b;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps() {
        assert_eq!(strides(&[2, 3, 4]), vec![12, 4, 1]);
        assert_eq!(broadcast_map(&[2, 3], &[3]), vec![0, 1, 2, 0, 1, 2]);
        assert_eq!(broadcast_map(&[2, 3], &[2, 1]), vec![0, 0, 0, 1, 1, 1]);
        assert_eq!(transpose_map(&[2, 3], &[1, 0]), vec![0, 3, 1, 4, 2, 5]);
        assert_eq!(gather_map(&[3, 2], 0, &[2, 0]), vec![4, 5, 0, 1]);
        assert_eq!(gather_map(&[2, 3], 1, &[2]), vec![2, 5]);
        let axes = [
            SliceAxis { begin: 1, stride: 1, len: 1, shrink: true },
            SliceAxis { begin: 3, stride: -2, len: 2, shrink: false },
        ];
        // [2, 4]: row 1, columns 3 and 1 -> flat 7, 5
        assert_eq!(slice_map(&[2, 4], &axes), vec![7, 5]);
        let (groups_of, groups) = group_map(&[2, 3], &[1]);
        assert_eq!((groups_of, groups), (vec![0, 0, 0, 1, 1, 1], 2));
        let a = [1, 2, 3, 4];
        let b = [5, 6];
        assert_eq!(concat(&[(&a[..], &[2, 2][..]), (&b[..], &[2, 1][..])], 1), vec![1, 2, 5, 3, 4, 6]);
    }

    #[test]
    fn matmul_with_transposed_operand() {
        // a [2, 3], b^T given as [2, 3] -> b [3, 2]
        let a = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
        let bt = [1.0, 0.0, -1.0, 2.0, 1.0, 0.0];
        let mut out = [0f32; 4];
        matmul(
            &mut out,
            MatRef { data: &a, row_stride: 3, col_stride: 1 },
            MatRef { data: &bt, row_stride: 1, col_stride: 3 },
            2,
            2,
            3,
        );
        assert_eq!(out, [-2.0, 4.0, -2.0, 13.0]);
    }
}

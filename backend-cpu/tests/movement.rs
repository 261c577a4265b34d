//! Transposes and permutes through the eager backend against an index-by-index reference. Those
//! that keep every dim longer than 1 in its order (a decode step's head splits and merges of its
//! one token) keep the elements in theirs too: the backend hands their input's buffer on instead
//! of copying it, and the values must be the reference's either way.

use backend_cpu::CpuBackend;
use mllm_dsl::Tensor;

/// Output element `i` of permuting `shape` by `perm` (output dim `d` is input dim `perm[d]`).
fn reference(x: &[f32], shape: &[usize], perm: &[usize]) -> Vec<f32> {
    let out_shape: Vec<usize> = perm.iter().map(|&p| shape[p]).collect();
    let strides: Vec<usize> = (0..shape.len()).map(|d| shape[d + 1..].iter().product()).collect();
    (0..x.len())
        .map(|mut i| {
            let mut at = 0;
            for d in (0..out_shape.len()).rev() {
                at += (i % out_shape[d]) * strides[perm[d]];
                i /= out_shape[d];
            }
            x[at]
        })
        .collect()
}

fn buffer(t: &Tensor) -> *const f32 {
    t.as_f32().expect("dense f32 data").as_ptr()
}

#[test]
fn transposes_and_permutes_match_the_reference_and_share_when_order_is_kept() {
    let backend = CpuBackend::float();
    // (shape, transposed dims, whether the element order is kept)
    let transposes: &[(&[usize], (usize, usize), bool)] = &[
        (&[1, 1, 3, 4], (1, 2), true),  // [1, S=1, H, D] -> [1, H, 1, D]
        (&[1, 3, 1, 4], (1, 2), true),  // and back
        (&[1, 3, 1, 4], (2, 3), true),  // a K row to a K column
        (&[1, 2, 1, 3], (1, 3), false), // a size-1 dim between two longer ones
        (&[2, 3, 4], (0, 1), false),
        (&[2, 3, 4], (2, 2), true),
    ];
    for &(shape, (a, b), kept) in transposes {
        let n: usize = shape.iter().product();
        let data: Vec<f32> = (0..n).map(|i| i as f32 * 0.5 - 3.0).collect();
        let x = Tensor::from_f32(data.clone(), shape.to_vec(), backend.clone()).unwrap();
        let y = x.transpose(a as i64, b as i64).unwrap();
        let mut perm: Vec<usize> = (0..shape.len()).collect();
        perm.swap(a, b);
        assert_eq!(y.as_f32().unwrap(), reference(&data, shape, &perm), "transpose {shape:?} ({a}, {b})");
        assert_eq!(buffer(&y) == buffer(&x), kept, "transpose {shape:?} ({a}, {b}) shares its input's buffer");
    }
    let permutes: &[(&[usize], &[usize], bool)] = &[
        (&[1, 1, 3, 4], &[0, 2, 1, 3], true),
        (&[2, 1, 3], &[1, 0, 2], true),
        (&[2, 1, 3], &[2, 1, 0], false),
        (&[2, 3, 4], &[1, 2, 0], false),
    ];
    for &(shape, perm, kept) in permutes {
        let n: usize = shape.iter().product();
        let data: Vec<f32> = (0..n).map(|i| i as f32 * 0.25 + 1.0).collect();
        let x = Tensor::from_f32(data.clone(), shape.to_vec(), backend.clone()).unwrap();
        let y = x.permute(perm).unwrap();
        assert_eq!(y.as_f32().unwrap(), reference(&data, shape, perm), "permute {shape:?} by {perm:?}");
        assert_eq!(buffer(&y) == buffer(&x), kept, "permute {shape:?} by {perm:?} shares its input's buffer");
    }
}

//! Every kernel against a naive reference written here (index arithmetic, triple loops, f64
//! accumulation) on pseudo-random inputs of odd sizes, including broadcasting, negative dims and
//! the error cases. Sizes above the parallel thresholds are included and run with 1 and 2 threads.

mod common;

use backend_cpu::kernels::{self, BinaryOp, KernelError, LinearStrategy, ReduceKind, UnaryOp, WeightLayout};
use common::Lcg;

fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

fn unravel(mut flat: usize, shape: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; shape.len()];
    for d in (0..shape.len()).rev() {
        idx[d] = flat % shape[d];
        flat /= shape[d];
    }
    idx
}

fn ravel(idx: &[usize], shape: &[usize]) -> usize {
    idx.iter().zip(shape).fold(0, |acc, (&i, &s)| acc * s + i)
}

/// Numpy broadcast shape, computed independently of the kernels' helper.
fn naive_broadcast(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let rank = a.len().max(b.len());
    let pad = |s: &[usize]| {
        let mut p = vec![1; rank - s.len()];
        p.extend_from_slice(s);
        p
    };
    let (a, b) = (pad(a), pad(b));
    a.iter()
        .zip(&b)
        .map(|(&x, &y)| match (x, y) {
            _ if x == y => Some(x),
            (1, _) => Some(y),
            (_, 1) => Some(x),
            _ => None,
        })
        .collect()
}

/// Element of an operand of `shape` seen at output index `out_idx` under broadcasting.
fn bcast_get(data: &[f32], shape: &[usize], out_idx: &[usize]) -> f32 {
    let lead = out_idx.len() - shape.len();
    let idx: Vec<usize> = shape.iter().enumerate().map(|(d, &s)| if s == 1 { 0 } else { out_idx[lead + d] }).collect();
    data[ravel(&idx, shape)]
}

fn assert_close(got: &[f32], want: &[f64], rel: f64, abs: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let tol = abs + rel * w.abs();
        assert!((g as f64 - w).abs() <= tol, "{what}: element {i}: got {g}, want {w} (tol {tol})");
    }
}

fn with_threads(f: impl Fn(usize)) {
    for threads in [1, 2] {
        kernels::set_num_threads(threads).unwrap();
        f(threads);
    }
}

// ---------------------------------------------------------------- matmul / linear

fn naive_matmul(a: &[f32], a_shape: &[usize], b: &[f32], b_shape: &[usize]) -> (Vec<f64>, Vec<usize>) {
    // Promote 1-D operands as numpy does, compute, then drop the promoted dims.
    let a_sh: Vec<usize> = if a_shape.len() == 1 { vec![1, a_shape[0]] } else { a_shape.to_vec() };
    let b_sh: Vec<usize> = if b_shape.len() == 1 { vec![b_shape[0], 1] } else { b_shape.to_vec() };
    let (m, k) = (a_sh[a_sh.len() - 2], a_sh[a_sh.len() - 1]);
    let n = b_sh[b_sh.len() - 1];
    let ab = &a_sh[..a_sh.len() - 2];
    let bb = &b_sh[..b_sh.len() - 2];
    let batch = naive_broadcast(ab, bb).unwrap();
    let mut out = Vec::new();
    for bi in 0..numel(&batch) {
        let bidx = unravel(bi, &batch);
        for i in 0..m {
            for j in 0..n {
                let mut acc = 0.0f64;
                for p in 0..k {
                    let mut ai = bidx.clone();
                    ai.extend([i, p]);
                    let mut bj = bidx.clone();
                    bj.extend([p, j]);
                    let mut a_full = ab.to_vec();
                    a_full.extend([m, k]);
                    let mut b_full = bb.to_vec();
                    b_full.extend([k, n]);
                    acc += bcast_get(a, &a_full, &ai) as f64 * bcast_get(b, &b_full, &bj) as f64;
                }
                out.push(acc);
            }
        }
    }
    let mut shape = batch;
    if a_shape.len() >= 2 {
        shape.push(m);
    }
    if b_shape.len() >= 2 {
        shape.push(n);
    }
    (out, shape)
}

#[test]
fn matmul_matches_naive_with_broadcasting() {
    let cases: &[(&[usize], &[usize])] = &[
        (&[1, 3, 5, 7], &[1, 3, 7, 4]),
        (&[2, 1, 5, 7], &[3, 7, 4]),
        (&[2, 3, 5, 7], &[7, 4]), // shared right operand: folded into one product
        (&[1, 3, 5, 7], &[1, 7, 4]),
        (&[5, 7], &[2, 3, 7, 4]), // shared left operand
        (&[5, 7], &[7]),          // matrix x vector
        (&[7], &[7, 4]),          // vector x matrix
        (&[3, 7], &[3, 7, 1]),
        (&[7], &[7]),                 // dot product -> scalar []
        (&[4, 64, 48], &[4, 48, 64]), // batch-parallel path
        (&[1, 96, 200], &[200, 130]), // gemm-internal threads
        (&[1, 300], &[300, 700]),     // M = 1: split over N
        (&[2, 9, 100], &[100, 260]),  // small M, long rows: depth-blocked
        // 1 to 4 rows (decode attention): register tiles of 128, 80 and 64 columns, then masked
        // 16-column tails
        (&[3, 1, 40], &[3, 40, 150]),
        (&[3, 2, 33], &[3, 33, 130]),
        (&[2, 3, 17], &[2, 17, 101]),
        (&[4, 70], &[70, 64]),
        (&[7, 29], &[29, 203]), // 4 rows, then 3
        (&[2, 0, 7], &[7, 3]),  // empty
    ];
    let mut rng = Lcg(1);
    for &(a_shape, b_shape) in cases {
        let a = rng.shaped(a_shape, 1.0);
        let b = rng.shaped(b_shape, 1.0);
        let (want, want_shape) = naive_matmul(&a, a_shape, &b, b_shape);
        with_threads(|t| {
            let (got, shape) = kernels::matmul(&a, a_shape, &b, b_shape).unwrap();
            assert_eq!(shape, want_shape, "{a_shape:?} x {b_shape:?}");
            assert_close(&got, &want, 1e-5, 1e-5, &format!("matmul {a_shape:?} x {b_shape:?} threads {t}"));
        });
    }
}

#[test]
fn matmul_rejects_bad_shapes() {
    let a = vec![0.0; 15];
    let b = vec![0.0; 12];
    assert!(matches!(
        kernels::matmul(&a, &[3, 5], &b, &[4, 3]),
        Err(KernelError::InnerDimMismatch { k_a: 5, k_b: 4, .. })
    ));
    assert!(matches!(
        kernels::matmul(&a, &[3, 5], &b, &[3, 4]),
        Err(KernelError::DataLength { operand: "a", expected: 15, .. }) | Err(KernelError::InnerDimMismatch { .. })
    ));
    assert!(matches!(
        kernels::matmul(&a, &[3, 4], &b, &[4, 3]),
        Err(KernelError::DataLength { operand: "a", expected: 12, actual: 15, .. })
    ));
    assert!(matches!(kernels::matmul(&[1.0], &[], &b, &[4, 3]), Err(KernelError::RankTooLow { operand: "a", .. })));
    let a = vec![0.0; 2 * 3 * 5];
    let b = vec![0.0; 3 * 5 * 2];
    assert!(matches!(kernels::matmul(&a, &[2, 3, 5], &b, &[3, 5, 2]), Err(KernelError::NotBroadcastable { .. })));
}

fn naive_linear(x: &[f32], m: usize, k: usize, w: &[f32], n: usize, nk: bool, bias: Option<&[f32]>) -> Vec<f64> {
    let mut out = vec![0.0f64; m * n];
    for i in 0..m {
        for j in 0..n {
            let mut acc = bias.map_or(0.0, |b| b[j] as f64);
            for p in 0..k {
                let wv = if nk { w[j * k + p] } else { w[p * n + j] };
                acc += x[i * k + p] as f64 * wv as f64;
            }
            out[i * n + j] = acc;
        }
    }
    out
}

#[test]
fn linear_matches_naive_for_both_layouts_and_strategies() {
    let mut rng = Lcg(2);
    for &(m, k, n) in &[
        (1, 7, 5),
        (3, 13, 11),
        (1, 257, 301),
        (40, 129, 67),
        (5, 130, 300), // small M with [K, N] rows: depth-blocked
        (63, 97, 257),
        (2, 1, 3),
    ] {
        let x = rng.shaped(&[m, k], 1.0);
        let w = rng.shaped(&[k, n], 1.0);
        let bias = rng.shaped(&[n], 1.0);
        for layout in [WeightLayout::KN, WeightLayout::NK] {
            let nk = layout == WeightLayout::NK;
            for b in [None, Some(bias.as_slice())] {
                let want = naive_linear(&x, m, k, &w, n, nk, b);
                with_threads(|t| {
                    for strategy in [LinearStrategy::Auto, LinearStrategy::GemmThreads, LinearStrategy::SplitN] {
                        let got = kernels::linear_with(layout, &x, m, k, &w, n, b, strategy).unwrap();
                        let what = format!("{layout:?} {strategy:?} m{m} k{k} n{n} bias {} threads {t}", b.is_some());
                        assert_close(&got, &want, 1e-5, 1e-5, &what);
                    }
                    let direct = if nk {
                        kernels::linear_nk(&x, m, k, &w, n, b)
                    } else {
                        kernels::linear_kn(&x, m, k, &w, n, b)
                    };
                    assert_close(&direct.unwrap(), &want, 1e-5, 1e-5, "linear_kn/nk");
                });
            }
        }
    }
}

#[test]
fn linear_rejects_bad_lengths() {
    let x = vec![0.0; 6];
    let w = vec![0.0; 12];
    assert!(kernels::linear_kn(&x, 2, 3, &w, 4, None).is_ok());
    assert!(matches!(
        kernels::linear_kn(&x, 2, 3, &w, 5, None),
        Err(KernelError::DataLength { operand: "weight", expected: 15, actual: 12, .. })
    ));
    assert!(matches!(
        kernels::linear_nk(&x, 2, 3, &w, 4, Some(&[0.0; 3])),
        Err(KernelError::DataLength { operand: "bias", .. })
    ));
    assert!(matches!(kernels::linear_kn(&x, 3, 3, &w, 4, None), Err(KernelError::DataLength { operand: "x", .. })));
}

// ---------------------------------------------------------------- elementwise

type BinaryRef = fn(f32, f32) -> f32;
type UnaryRef = fn(f64) -> f64;

fn naive_broadcast_map(
    a: &[f32],
    a_shape: &[usize],
    b: &[f32],
    b_shape: &[usize],
    f: impl Fn(f32, f32) -> f32,
) -> (Vec<f32>, Vec<usize>) {
    let shape = naive_broadcast(a_shape, b_shape).unwrap();
    let out = (0..numel(&shape))
        .map(|i| {
            let idx = unravel(i, &shape);
            f(bcast_get(a, a_shape, &idx), bcast_get(b, b_shape, &idx))
        })
        .collect();
    (out, shape)
}

const BROADCAST_CASES: &[(&[usize], &[usize])] = &[
    (&[3, 5, 7], &[3, 5, 7]),
    (&[3, 5, 7], &[1]),
    (&[], &[3, 5, 7]),
    (&[3, 1, 7], &[5, 1]),
    (&[1, 3, 5, 7], &[7]),
    (&[3, 5, 1], &[1, 5, 7]),
    (&[1, 1], &[1]),
    (&[3, 0, 7], &[7]),
    (&[3, 170, 130], &[3, 170, 130]), // parallel, equal shapes
    (&[3, 170, 130], &[170, 1]),      // parallel, broadcast
    (&[1], &[2, 190, 190]),           // parallel, scalar left
];

#[test]
fn binary_ops_match_naive_bitwise() {
    let mut rng = Lcg(3);
    let ops: [(BinaryOp, BinaryRef); 4] = [
        (BinaryOp::Add, |x, y| x + y),
        (BinaryOp::Sub, |x, y| x - y),
        (BinaryOp::Mul, |x, y| x * y),
        (BinaryOp::Div, |x, y| x / y),
    ];
    for &(a_shape, b_shape) in BROADCAST_CASES {
        let a = rng.shaped(a_shape, 3.0);
        let b = rng.shaped(b_shape, 3.0);
        for (op, f) in ops {
            let (want, want_shape) = naive_broadcast_map(&a, a_shape, &b, b_shape, f);
            with_threads(|t| {
                let (got, shape) = kernels::binary(op, &a, a_shape, &b, b_shape).unwrap();
                assert_eq!(shape, want_shape);
                assert_eq!(got, want, "{op:?} {a_shape:?} {b_shape:?} threads {t}");
                // Operand order matters for sub/div: swap to cover the broadcast-left paths.
                let (want, _) = naive_broadcast_map(&b, b_shape, &a, a_shape, f);
                let (got, _) = kernels::binary(op, &b, b_shape, &a, a_shape).unwrap();
                assert_eq!(got, want, "{op:?} {b_shape:?} {a_shape:?} threads {t}");
            });
        }
    }
    let (sum, _) = kernels::add(&[1.0, 2.0], &[2], &[10.0], &[1]).unwrap();
    assert_eq!(sum, [11.0, 12.0]);
    let (q, _) = kernels::div(&[1.0], &[1], &[4.0, 0.0], &[2]).unwrap();
    assert_eq!(q, [0.25, f32::INFINITY]);
    assert_eq!(kernels::sub(&[5.0], &[], &[2.0], &[1]).unwrap(), (vec![3.0], vec![1]));
    assert_eq!(kernels::mul(&[2.0, 3.0], &[2, 1], &[4.0, 5.0], &[2]).unwrap().0, [8.0, 10.0, 12.0, 15.0]);
}

#[test]
fn binary_rejects_bad_shapes() {
    let a = vec![0.0; 15];
    let b = vec![0.0; 20];
    let err = kernels::add(&a, &[3, 5], &b, &[4, 5]).unwrap_err();
    assert_eq!(err, KernelError::NotBroadcastable { op: "add", a: vec![3, 5], b: vec![4, 5] });
    assert!(err.to_string().contains("[3, 5] and [4, 5]"), "{err}");
    assert!(matches!(
        kernels::mul(&a, &[3, 4], &b, &[4, 5]),
        Err(KernelError::DataLength { op: "mul", operand: "a", .. })
    ));
    assert_eq!(kernels::broadcast_shape(&[2, 1, 7], &[5, 1]).unwrap(), vec![2, 5, 7]);
    assert_eq!(kernels::broadcast_shape(&[], &[3]).unwrap(), vec![3]);
    assert!(kernels::broadcast_shape(&[2, 3], &[3, 3]).is_err());
}

#[test]
fn equal_and_where_match_naive() {
    let mut rng = Lcg(4);
    // Values from a small set so that equality actually happens.
    let small =
        |rng: &mut Lcg, shape: &[usize]| -> Vec<f32> { (0..numel(shape)).map(|_| rng.next_f32(2.0).round()).collect() };
    for &(a_shape, b_shape) in BROADCAST_CASES {
        let a = small(&mut rng, a_shape);
        let b = small(&mut rng, b_shape);
        let (want, want_shape) = naive_broadcast_map(&a, a_shape, &b, b_shape, |x, y| f32::from(x == y));
        with_threads(|_| {
            assert_eq!(kernels::equal(&a, a_shape, &b, b_shape).unwrap(), (want.clone(), want_shape.clone()));
        });
    }
    assert_eq!(kernels::equal(&[f32::NAN], &[1], &[f32::NAN], &[1]).unwrap().0, [0.0]);

    let cases: &[(&[usize], &[usize], &[usize])] = &[
        (&[3, 1, 7], &[5, 1], &[1]),
        (&[2, 3], &[2, 3], &[2, 3]),
        (&[1, 1, 5, 5], &[1, 2, 5, 5], &[]),
        (&[190, 190], &[1, 190], &[3, 190, 1]),            // parallel
        (&[1, 1, 2, 600], &[1, 9, 2, 600], &[1, 9, 2, 1]), // masked attention scores
    ];
    for &(c_shape, a_shape, b_shape) in cases {
        let cond = small(&mut rng, c_shape);
        let a = rng.shaped(a_shape, 1.0);
        let b = rng.shaped(b_shape, 1.0);
        let ab = naive_broadcast(a_shape, b_shape).unwrap();
        let shape = naive_broadcast(c_shape, &ab).unwrap();
        let want: Vec<f32> = (0..numel(&shape))
            .map(|i| {
                let idx = unravel(i, &shape);
                if bcast_get(&cond, c_shape, &idx) != 0.0 {
                    bcast_get(&a, a_shape, &idx)
                } else {
                    bcast_get(&b, b_shape, &idx)
                }
            })
            .collect();
        with_threads(|_| {
            let got = kernels::where_(&cond, c_shape, &a, a_shape, &b, b_shape).unwrap();
            assert_eq!(got, (want.clone(), shape.clone()), "where {c_shape:?} {a_shape:?} {b_shape:?}");
        });
    }
    assert!(matches!(
        kernels::where_(&[1.0; 4], &[4], &[0.0; 3], &[3], &[0.0], &[1]),
        Err(KernelError::NotBroadcastable { op: "where", .. })
    ));
}

#[test]
fn unary_ops_match_f64_reference() {
    let mut rng = Lcg(5);
    let mut x = rng.shaped(&[3, 5, 7], 8.0);
    x.extend([0.0, -0.0, 80.0, -80.0, 1e-8]);
    let big = rng.shaped(&[70_001], 8.0); // parallel path
    let sig = |v: f64| 1.0 / (1.0 + (-v).exp());
    let refs: [(UnaryOp, UnaryRef); 4] = [
        (UnaryOp::Neg, |v| -v),
        (UnaryOp::Sigmoid, |v| 1.0 / (1.0 + (-v).exp())),
        (UnaryOp::Silu, |v| v / (1.0 + (-v).exp())),
        (UnaryOp::Exp, f64::exp),
    ];
    for input in [&x, &big] {
        for (op, f) in refs {
            let want: Vec<f64> = input.iter().map(|&v| f(v as f64)).collect();
            with_threads(|t| {
                let got = kernels::unary(op, input);
                assert_close(&got, &want, 4e-7, 1e-30, &format!("{op:?} threads {t}"));
                let mut inplace = input.clone();
                kernels::unary_inplace(op, &mut inplace);
                assert_eq!(inplace, got);
            });
        }
    }
    let probe = [-1.5f32, 0.25, 3.0];
    let want_silu: Vec<f64> = probe.iter().map(|&v| v as f64 * sig(v as f64)).collect();
    assert_close(&kernels::silu(&probe), &want_silu, 4e-7, 0.0, "silu");
    assert_eq!(kernels::neg(&probe), [1.5, -0.25, -3.0]);
    assert_close(&kernels::exp(&[0.0, 1.0]), &[1.0, std::f64::consts::E], 1e-7, 0.0, "exp");
    assert_close(&kernels::sigmoid(&[0.0]), &[0.5], 0.0, 0.0, "sigmoid");
}

// ---------------------------------------------------------------- softmax / rms_norm / reduce

fn norm_dim(dim: isize, rank: usize) -> usize {
    if dim < 0 {
        (dim + rank as isize) as usize
    } else {
        dim as usize
    }
}

#[test]
fn softmax_matches_f64_reference() {
    let mut rng = Lcg(6);
    let cases: &[(&[usize], isize)] = &[
        (&[3, 5, 7], -1),
        (&[3, 5, 7], 0),
        (&[3, 5, 7], 1),
        (&[1, 3, 5, 7], -3),
        (&[9], 0),
        (&[64, 1031], -1),  // parallel rows
        (&[130, 3, 67], 0), // one outer block, strided over dim 0
    ];
    for &(shape, dim) in cases {
        // Large logits check stability: exp without the max shift would overflow.
        let mut x = rng.shaped(shape, 30.0);
        x[0] = 500.0;
        let d = norm_dim(dim, shape.len());
        let mut want = vec![0.0f64; x.len()];
        // f32 rounds `x - max` to 24 bits, so exp inherits a relative error of |x - max| * 2^-24
        // (torch float32 has the same); the tolerance allows that plus a few ulp.
        let mut tol = vec![0.0f64; x.len()];
        for i in 0..x.len() {
            let idx = unravel(i, shape);
            let mut j = idx.clone();
            let vals: Vec<f64> = (0..shape[d])
                .map(|k| {
                    j[d] = k;
                    x[ravel(&j, shape)] as f64
                })
                .collect();
            let max = vals.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let sum: f64 = vals.iter().map(|v| (v - max).exp()).sum();
            want[i] = (x[i] as f64 - max).exp() / sum;
            tol[i] = want[i] * (1e-6 + (x[i] as f64 - max).abs() * 6e-8) + 1e-37;
        }
        with_threads(|t| {
            let got = kernels::softmax(&x, shape, dim).unwrap();
            for i in 0..x.len() {
                assert!(
                    (got[i] as f64 - want[i]).abs() <= tol[i],
                    "softmax {shape:?} dim {dim} threads {t}: element {i}: got {}, want {}",
                    got[i],
                    want[i]
                );
            }
        });
    }
    // Masked attention rows: -inf logits get probability 0; a fully masked row is NaN as in torch.
    let ninf = f32::NEG_INFINITY;
    let masked = [0.0, ninf, 1.0, ninf, ninf, ninf, ninf, ninf];
    let got = kernels::softmax(&masked, &[2, 4], -1).unwrap();
    let e = std::f64::consts::E;
    assert_close(&got[..4], &[1.0 / (1.0 + e), 0.0, e / (1.0 + e), 0.0], 1e-6, 0.0, "masked");
    assert!(got[4..].iter().all(|v| v.is_nan()));
    assert_eq!(
        kernels::softmax(&[0.0; 6], &[2, 3], 2).unwrap_err(),
        KernelError::DimOutOfRange { op: "softmax", dim: 2, rank: 2 }
    );
    assert!(kernels::softmax(&[0.0; 6], &[2, 3], -3).is_err());
}

#[test]
fn rms_norm_matches_f64_reference() {
    let mut rng = Lcg(7);
    for shape in [&[1usize, 3, 5, 7][..], &[7], &[40, 1029]] {
        let x = rng.shaped(shape, 2.0);
        let h = *shape.last().unwrap();
        let w = rng.shaped(&[h], 1.5);
        let eps = 1e-6f32;
        let mut want = Vec::with_capacity(x.len());
        for row in x.chunks(h) {
            let ms: f64 = row.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / h as f64;
            let r = 1.0 / (ms + eps as f64).sqrt();
            want.extend(row.iter().zip(&w).map(|(&v, &wv)| v as f64 * r * wv as f64));
        }
        with_threads(|t| {
            let got = kernels::rms_norm(&x, shape, &w, eps).unwrap();
            assert_close(&got, &want, 2e-6, 1e-30, &format!("rms_norm {shape:?} threads {t}"));
        });
    }
    // eps matters when the row is all zeros: output 0, not NaN.
    assert_eq!(kernels::rms_norm(&[0.0; 3], &[3], &[1.0; 3], 1e-6).unwrap(), [0.0; 3]);
    assert!(matches!(
        kernels::rms_norm(&[0.0; 6], &[2, 3], &[1.0; 2], 1e-6),
        Err(KernelError::DataLength { operand: "weight", .. })
    ));
    assert!(matches!(kernels::rms_norm(&[0.0], &[], &[1.0], 1e-6), Err(KernelError::RankTooLow { .. })));
}

#[test]
fn reduce_matches_naive() {
    let mut rng = Lcg(8);
    let cases: &[(&[usize], isize)] = &[
        (&[1, 3, 5, 7], -1),
        (&[1, 3, 5, 7], 1),
        (&[1, 3, 5, 7], 0),
        (&[3, 5, 7], -2),
        (&[11], 0),
        (&[300, 301], 1), // parallel rows
        (&[300, 301], 0), // parallel columns
    ];
    for &(shape, dim) in cases {
        let x = rng.shaped(shape, 4.0);
        let d = norm_dim(dim, shape.len());
        let mut kept = shape.to_vec();
        kept[d] = 1;
        for kind in [ReduceKind::Sum, ReduceKind::Mean, ReduceKind::Max, ReduceKind::Min] {
            let want: Vec<f64> = (0..numel(&kept))
                .map(|i| {
                    let mut idx = unravel(i, &kept);
                    let vals: Vec<f64> = (0..shape[d])
                        .map(|k| {
                            idx[d] = k;
                            x[ravel(&idx, shape)] as f64
                        })
                        .collect();
                    match kind {
                        ReduceKind::Sum => vals.iter().sum(),
                        ReduceKind::Mean => vals.iter().sum::<f64>() / vals.len() as f64,
                        ReduceKind::Max => vals.iter().cloned().fold(f64::MIN, f64::max),
                        ReduceKind::Min => vals.iter().cloned().fold(f64::MAX, f64::min),
                    }
                })
                .collect();
            for keepdim in [true, false] {
                let mut want_shape = kept.clone();
                if !keepdim {
                    want_shape.remove(d);
                }
                with_threads(|t| {
                    let (got, got_shape) = kernels::reduce(&x, shape, dim, keepdim, kind).unwrap();
                    assert_eq!(got_shape, want_shape);
                    // f32 sums of up to 301 values in [-4, 4]: a few ulp of the magnitudes involved.
                    assert_close(&got, &want, 1e-5, 1e-4, &format!("{kind:?} {shape:?} dim {dim} threads {t}"));
                });
            }
        }
    }
    // NaN inside the vectorised part of a long row, and in a long column reduction.
    let mut long = rng.shaped(&[2, 40], 1.0);
    long[20] = f32::NAN;
    for kind in [ReduceKind::Max, ReduceKind::Min] {
        let (row, _) = kernels::reduce(&long, &[2, 40], 1, false, kind).unwrap();
        assert!(row[0].is_nan() && !row[1].is_nan(), "{kind:?} {row:?}");
        let (col, _) = kernels::reduce(&long, &[40, 2], 0, false, kind).unwrap();
        assert!(col[0].is_nan() && !col[1].is_nan(), "{kind:?} {col:?}");
    }
    let nan = [1.0, f32::NAN, 3.0, 2.0];
    assert!(kernels::reduce(&nan, &[4], 0, false, ReduceKind::Max).unwrap().0[0].is_nan());
    assert!(kernels::reduce(&nan, &[2, 2], 0, false, ReduceKind::Min).unwrap().0[1].is_nan());
    assert_eq!(kernels::reduce(&nan, &[2, 2], 0, false, ReduceKind::Min).unwrap().0[0], 1.0);
    assert!(matches!(
        kernels::reduce(&[], &[2, 0], 1, false, ReduceKind::Max),
        Err(KernelError::InvalidArgument { op: "reduce", .. })
    ));
    assert_eq!(kernels::reduce(&[], &[2, 0], 1, false, ReduceKind::Sum).unwrap(), (vec![0.0; 2], vec![2]));
    assert!(matches!(
        kernels::reduce(&[0.0; 4], &[2, 2], -3, false, ReduceKind::Sum),
        Err(KernelError::DimOutOfRange { dim: -3, rank: 2, .. })
    ));
}

// ---------------------------------------------------------------- layout and copies

fn naive_permute(x: &[f32], shape: &[usize], perm: &[usize]) -> (Vec<f32>, Vec<usize>) {
    let out_shape: Vec<usize> = perm.iter().map(|&p| shape[p]).collect();
    let out = (0..x.len())
        .map(|i| {
            let oidx = unravel(i, &out_shape);
            let mut iidx = vec![0; shape.len()];
            for (o, &p) in perm.iter().enumerate() {
                iidx[p] = oidx[o];
            }
            x[ravel(&iidx, shape)]
        })
        .collect();
    (out, out_shape)
}

fn all_perms(n: usize) -> Vec<Vec<usize>> {
    if n == 0 {
        return vec![vec![]];
    }
    let mut out = Vec::new();
    for p in all_perms(n - 1) {
        for pos in 0..n {
            let mut q = p.clone();
            q.insert(pos, n - 1);
            out.push(q);
        }
    }
    out
}

#[test]
fn permute_matches_naive_for_every_permutation() {
    let mut rng = Lcg(9);
    for shape in [&[2usize, 3, 5, 7][..], &[1, 3, 1, 7], &[3, 37, 41], &[1, 67, 5, 197]] {
        let x = rng.shaped(shape, 1.0);
        for perm in all_perms(shape.len()) {
            let want = naive_permute(&x, shape, &perm);
            let iperm: Vec<isize> = perm.iter().map(|&p| p as isize).collect();
            with_threads(|t| {
                assert_eq!(kernels::permute(&x, shape, &iperm).unwrap(), want, "{shape:?} {perm:?} threads {t}");
            });
        }
    }
    // Negative dims and transpose.
    let shape = [2usize, 3, 5, 7];
    let x = rng.shaped(&shape, 1.0);
    assert_eq!(kernels::permute(&x, &shape, &[0, -2, 1, -1]).unwrap(), naive_permute(&x, &shape, &[0, 2, 1, 3]));
    assert_eq!(kernels::transpose(&x, &shape, -1, -2).unwrap(), naive_permute(&x, &shape, &[0, 1, 3, 2]));
    assert_eq!(kernels::transpose(&x, &shape, 0, 2).unwrap(), naive_permute(&x, &shape, &[2, 1, 0, 3]));
    for bad in [&[0isize, 1, 2][..], &[0, 1, 1, 3], &[0, 1, 2, 4]] {
        assert!(matches!(kernels::permute(&x, &shape, bad), Err(KernelError::InvalidPermutation { .. })));
    }
    assert!(matches!(kernels::transpose(&x, &shape, 0, 4), Err(KernelError::DimOutOfRange { dim: 4, .. })));
}

#[test]
fn slice_matches_python_semantics() {
    let mut rng = Lcg(10);
    let shape = [3usize, 5, 7];
    let x = rng.shaped(&shape, 1.0);
    for dim in [0isize, 1, 2, -1] {
        let d = norm_dim(dim, 3);
        let size = shape[d] as isize;
        for (start, end) in [(0, 1), (1, 4), (-3, -1), (2, 100), (-100, 2), (4, 2), (0, size)] {
            let clamp = |i: isize| (if i < 0 { i + size } else { i }).clamp(0, size) as usize;
            let (s, e) = (clamp(start), clamp(end).max(clamp(start)));
            let mut want_shape = shape.to_vec();
            want_shape[d] = e - s;
            let want: Vec<f32> = (0..numel(&want_shape))
                .map(|i| {
                    let mut idx = unravel(i, &want_shape);
                    idx[d] += s;
                    x[ravel(&idx, &shape)]
                })
                .collect();
            assert_eq!(
                kernels::slice(&x, &shape, dim, start, end).unwrap(),
                (want, want_shape),
                "dim {dim} {start}..{end}"
            );
        }
    }
    assert!(matches!(kernels::slice(&x, &shape, 3, 0, 1), Err(KernelError::DimOutOfRange { .. })));
}

#[test]
fn concat_matches_naive() {
    let mut rng = Lcg(11);
    for dim in [0isize, 1, 2, -1, -3] {
        let d = norm_dim(dim, 3);
        let sizes = [2usize, 0, 3, 1];
        let shapes: Vec<Vec<usize>> = sizes
            .iter()
            .map(|&s| {
                let mut sh = vec![3, 5, 7];
                sh[d] = s;
                sh
            })
            .collect();
        let datas: Vec<Vec<f32>> = shapes.iter().map(|s| rng.shaped(s, 1.0)).collect();
        let parts: Vec<(&[f32], &[usize])> =
            datas.iter().zip(&shapes).map(|(x, s)| (x.as_slice(), s.as_slice())).collect();
        let mut out_shape = vec![3, 5, 7];
        out_shape[d] = sizes.iter().sum();
        let want: Vec<f32> = (0..numel(&out_shape))
            .map(|i| {
                let mut idx = unravel(i, &out_shape);
                let mut p = 0;
                while idx[d] >= sizes[p] {
                    idx[d] -= sizes[p];
                    p += 1;
                }
                datas[p][ravel(&idx, &shapes[p])]
            })
            .collect();
        assert_eq!(kernels::concat(&parts, dim).unwrap(), (want, out_shape), "dim {dim}");
    }
    let a = [0.0f32; 6];
    let b = [0.0f32; 8];
    assert_eq!(
        kernels::concat(&[(&a, &[2, 3]), (&b, &[2, 4])], 0).unwrap_err(),
        KernelError::ConcatMismatch { op: "concat", part: 1, shape: vec![2, 4], first: vec![2, 3], dim: 0 }
    );
    assert_eq!(kernels::concat(&[(&a, &[2, 3]), (&b, &[2, 4])], 1).unwrap().1, vec![2, 7]);
    assert!(matches!(kernels::concat(&[(&a, &[2, 3]), (&b, &[8])], 1), Err(KernelError::ConcatMismatch { .. })));
    assert!(matches!(kernels::concat(&[], 0), Err(KernelError::InvalidArgument { .. })));
}

#[test]
fn repeat_interleave_matches_torch_semantics() {
    let mut rng = Lcg(12);
    let shape = [1usize, 3, 5, 7];
    let x = rng.shaped(&shape, 1.0);
    for dim in [0isize, 1, 2, 3, -1] {
        let d = norm_dim(dim, 4);
        for repeats in [0usize, 1, 3] {
            let mut out_shape = shape.to_vec();
            out_shape[d] *= repeats;
            let want: Vec<f32> = (0..numel(&out_shape))
                .map(|i| {
                    let mut idx = unravel(i, &out_shape);
                    idx[d] /= repeats;
                    x[ravel(&idx, &shape)]
                })
                .collect();
            assert_eq!(kernels::repeat_interleave(&x, &shape, dim, repeats).unwrap(), (want, out_shape));
        }
    }
    // GQA: heads h0, h1 become h0, h0, h1, h1.
    let kv = [1.0, 2.0, 3.0, 4.0]; // [1, 2, 1, 2]
    assert_eq!(
        kernels::repeat_interleave(&kv, &[1, 2, 1, 2], 1, 2).unwrap(),
        (vec![1.0, 2.0, 1.0, 2.0, 3.0, 4.0, 3.0, 4.0], vec![1, 4, 1, 2])
    );
}

#[test]
fn index_select_matches_naive_and_reports_bad_indices() {
    let mut rng = Lcg(13);
    // Embedding: [V, H] by [B, S] -> [B, S, H].
    let table = rng.shaped(&[11, 7], 1.0);
    let ids = [3i64, 0, 10, 3, 7, 1];
    let (out, shape) = kernels::index_select(&table, &[11, 7], 0, &ids, &[2, 3]).unwrap();
    assert_eq!(shape, vec![2, 3, 7]);
    let want: Vec<f32> = ids.iter().flat_map(|&i| table[i as usize * 7..i as usize * 7 + 7].to_vec()).collect();
    assert_eq!(out, want);

    // RoPE table [1, L, D] gathered on dim 1 by positions [S] -> [1, S, D], and a negative dim.
    let rope = rng.shaped(&[1, 9, 5], 1.0);
    let pos = [4i64, 5, 6, 8];
    for dim in [1isize, -2] {
        let (out, shape) = kernels::index_select(&rope, &[1, 9, 5], dim, &pos, &[4]).unwrap();
        assert_eq!(shape, vec![1, 4, 5]);
        let want: Vec<f32> = pos.iter().flat_map(|&p| rope[p as usize * 5..p as usize * 5 + 5].to_vec()).collect();
        assert_eq!(out, want);
    }

    // Last dim with a 2-D index tensor on a 3-D table: [3, 5, 7] by [2, 2] on dim 2 -> [3, 5, 2, 2].
    let x = rng.shaped(&[3, 5, 7], 1.0);
    let idx = [6i64, 0, 2, 2];
    let (out, shape) = kernels::index_select(&x, &[3, 5, 7], -1, &idx, &[2, 2]).unwrap();
    assert_eq!(shape, vec![3, 5, 2, 2]);
    let want: Vec<f32> = (0..numel(&shape))
        .map(|i| {
            let o = unravel(i, &shape);
            x[ravel(&[o[0], o[1], idx[o[2] * 2 + o[3]] as usize], &[3, 5, 7])]
        })
        .collect();
    assert_eq!(out, want);

    let err = kernels::index_select(&table, &[11, 7], 0, &[1, 11], &[2]).unwrap_err();
    assert_eq!(err, KernelError::IndexOutOfRange { op: "index_select", index: 11, position: 1, dim: 0, bound: 11 });
    let msg = err.to_string();
    assert!(msg.contains("index 11") && msg.contains("size 11"), "{msg}");
    assert!(matches!(
        kernels::index_select(&table, &[11, 7], 0, &[-1], &[1]),
        Err(KernelError::IndexOutOfRange { index: -1, .. })
    ));
    assert!(matches!(
        kernels::index_select(&table, &[11, 7], 0, &[1, 2], &[3]),
        Err(KernelError::DataLength { operand: "indices", .. })
    ));
}

#[test]
fn thread_count_is_configurable() {
    kernels::set_num_threads(1).unwrap();
    assert_eq!(kernels::num_threads(), 1);
    let available = std::thread::available_parallelism().map_or(1, |n| n.get());
    kernels::set_num_threads(2).unwrap();
    assert_eq!(kernels::num_threads(), 2.min(available));
    kernels::set_num_threads(0).unwrap();
    assert_eq!(kernels::num_threads(), available);
    // More than the machine has is capped (with a warning), not spawned.
    kernels::set_num_threads(100_000).unwrap();
    assert_eq!(kernels::num_threads(), available);
}

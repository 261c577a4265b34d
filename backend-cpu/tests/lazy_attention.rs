//! The copy-free attention path against naive references: `matmul_parts` (products over joined and
//! repeated pieces) and, through the eager backend, `cat` / `repeat_interleave` results that stay
//! lazy until an op needs their data — as a matmul operand (joined along K or N, repeated along a
//! batch dim, on 1 and 2 threads), as the operand of any other op, viewed, and as a model output.

mod common;

use backend_cpu::kernels::{self, BatchRepeat, JoinAxis, KernelError, RhsParts};
use backend_cpu::CpuBackend;
use common::Lcg;
use mllm_dsl::{BackendRef, Tensor};

/// `[B, M, K] @ [B, K, N]` in f64.
fn naive_bmm(a: &[f32], b: &[f32], batches: usize, m: usize, k: usize, n: usize) -> Vec<f64> {
    let mut out = vec![0.0; batches * m * n];
    for z in 0..batches {
        for i in 0..m {
            for j in 0..n {
                out[(z * m + i) * n + j] =
                    (0..k).map(|p| a[(z * m + i) * k + p] as f64 * b[(z * k + p) * n + j] as f64).sum();
            }
        }
    }
    out
}

fn assert_close(got: &[f32], want: &[f64], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!((g as f64 - w).abs() <= 1e-4 * (1.0 + w.abs()), "{what}: element {i}: got {g}, want {w}");
    }
}

/// KV-cache-like operands: `heads` source matrices, each the row (K) or column (N) join of a past
/// part of `past` and a new part of `new`, every source used by `times` consecutive batches.
#[allow(clippy::too_many_arguments)]
fn joined_case(
    rng: &mut Lcg,
    axis: JoinAxis,
    heads: usize,
    times: usize,
    m: usize,
    past: usize,
    new: usize,
    other: usize,
) {
    let total = past + new;
    let (k, n) = match axis {
        JoinAxis::K => (total, other),
        JoinAxis::N => (other, total),
    };
    let (past_part, new_part) = (rng.vec(heads * past * other, 1.0), rng.vec(heads * new * other, 1.0));
    // The full right operand, batch by batch, built by index arithmetic.
    let mut b = Vec::with_capacity(heads * times * k * n);
    for h in 0..heads * times {
        let src = h / times;
        for p in 0..k {
            for j in 0..n {
                let (t, o) = match axis {
                    JoinAxis::K => (p, j),
                    JoinAxis::N => (j, p),
                };
                let v = match (axis, t < past) {
                    (JoinAxis::K, true) => past_part[(src * past + t) * other + o],
                    (JoinAxis::K, false) => new_part[(src * new + t - past) * other + o],
                    (JoinAxis::N, true) => past_part[(src * other + o) * past + t],
                    (JoinAxis::N, false) => new_part[(src * other + o) * new + t - past],
                };
                b.push(v);
            }
        }
    }
    let batches = heads * times;
    let a = rng.vec(batches * m * k, 1.0);
    let want = naive_bmm(&a, &b, batches, m, k, n);
    let rhs = RhsParts {
        parts: vec![(&past_part[..], past), (&new_part[..], new)],
        axis,
        k,
        n,
        batches: BatchRepeat { outer: 1, size: heads, times, inner: 1 },
    };
    for threads in [1, 2] {
        kernels::set_num_threads(threads).unwrap();
        let got = kernels::matmul_parts(&a, m, &rhs).unwrap();
        assert_close(
            &got,
            &want,
            &format!("{axis:?} heads {heads} x{times} m{m} past {past} new {new} threads {threads}"),
        );
    }
}

#[test]
fn matmul_parts_matches_naive() {
    let mut rng = Lcg(1);
    for axis in [JoinAxis::K, JoinAxis::N] {
        for &(heads, times, m, past, new, other) in
            &[(1, 1, 1, 3, 1, 5), (2, 2, 1, 40, 1, 16), (4, 2, 7, 0, 7, 16), (3, 3, 32, 64, 32, 24), (2, 1, 5, 9, 2, 1)]
        {
            joined_case(&mut rng, axis, heads, times, m, past, new, other);
        }
    }
}

#[test]
fn batch_repeat_maps_inner_batches() {
    // Batch dims [2, 3 -> 6, 2]: output batch (o, s*2 + j, t) reads source (o, s, t).
    let mut rng = Lcg(2);
    let (outer, size, times, inner, k, n, m) = (2, 3, 2, 2, 4, 5, 2);
    let src = rng.vec(outer * size * inner * k * n, 1.0);
    let mut full = Vec::new();
    for o in 0..outer {
        for s in 0..size * times {
            for t in 0..inner {
                let from = ((o * size + s / times) * inner + t) * k * n;
                full.extend_from_slice(&src[from..from + k * n]);
            }
        }
    }
    let batches = outer * size * times * inner;
    let a = rng.vec(batches * m * k, 1.0);
    let rhs = RhsParts {
        parts: vec![(&src[..], k)],
        axis: JoinAxis::K,
        k,
        n,
        batches: BatchRepeat { outer, size, times, inner },
    };
    assert_close(&kernels::matmul_parts(&a, m, &rhs).unwrap(), &naive_bmm(&a, &full, batches, m, k, n), "inner repeat");
}

#[test]
fn matmul_parts_rejects_inconsistent_parts() {
    let part = [0.0; 2 * 3 * 4];
    let rhs = RhsParts { parts: vec![(&part[..], 3)], axis: JoinAxis::K, k: 4, n: 4, batches: BatchRepeat::none(2) };
    assert!(matches!(kernels::matmul_parts(&[0.0; 16], 2, &rhs), Err(KernelError::InvalidArgument { .. })));
    let rhs = RhsParts { parts: vec![(&part[..], 3)], axis: JoinAxis::K, k: 3, n: 5, batches: BatchRepeat::none(2) };
    assert!(matches!(kernels::matmul_parts(&[0.0; 12], 2, &rhs), Err(KernelError::DataLength { operand: "part", .. })));
}

fn tensor(rng: &mut Lcg, shape: &[usize], backend: &BackendRef) -> (Tensor, Vec<f32>) {
    let data = rng.shaped(shape, 1.0);
    (Tensor::from_f32(data.clone(), shape.to_vec(), backend.clone()).unwrap(), data)
}

/// Plain copies of `cat` on the last or second-to-last dim and of `repeat_interleave` on dim 1.
fn naive_cat(a: &[f32], a_shape: &[usize], b: &[f32], dim: usize) -> Vec<f32> {
    let outer: usize = a_shape[..dim].iter().product();
    let (ab, bb) = (a.len() / outer, b.len() / outer);
    (0..outer).flat_map(|o| a[o * ab..(o + 1) * ab].iter().chain(&b[o * bb..(o + 1) * bb]).copied()).collect()
}

fn naive_repeat_dim1(x: &[f32], shape: &[usize], times: usize) -> Vec<f32> {
    let inner: usize = shape[2..].iter().product();
    x.chunks(inner).flat_map(|c| std::iter::repeat_n(c, times).flatten().copied()).collect()
}

#[test]
fn lazy_kv_joins_give_eager_results_everywhere() {
    let backend = CpuBackend::float();
    let mut rng = Lcg(3);
    let (kvh, groups, d, past, s) = (2, 2, 8, 5, 3);
    let h = kvh * groups;
    let (q, qd) = tensor(&mut rng, &[1, h, s, d], &backend);
    let (pk, pkd) = tensor(&mut rng, &[1, kvh, d, past], &backend);
    let (k, kd) = tensor(&mut rng, &[1, kvh, d, s], &backend);
    let (pv, pvd) = tensor(&mut rng, &[1, kvh, past, d], &backend);
    let (v, vd) = tensor(&mut rng, &[1, kvh, s, d], &backend);
    let t = past + s;
    let kh_data = naive_repeat_dim1(&naive_cat(&pkd, &[1, kvh, d, past], &kd, 3), &[1, kvh, d, t], groups);
    let vh_data = naive_repeat_dim1(&naive_cat(&pvd, &[1, kvh, past, d], &vd, 2), &[1, kvh, t, d], groups);

    for threads in [1, 2] {
        kernels::set_num_threads(threads).unwrap();
        let kh = Tensor::cat(&[&pk, &k], -1).unwrap().repeat_interleave(groups, 1).unwrap();
        let vh = Tensor::cat(&[&pv, &v], 2).unwrap().repeat_interleave(groups, 1).unwrap();
        assert_eq!(kh.shape(), [1, h, d, t]);
        // Products read the pieces in place (K joined along N, V along K).
        let scores = q.matmul(&kh).unwrap();
        assert_close(scores.as_f32().unwrap(), &naive_bmm(&qd, &kh_data, h, s, d, t), "q @ K");
        let (p, pd) = tensor(&mut rng, &[1, h, s, t], &backend);
        let y = p.matmul(&vh).unwrap();
        assert_close(y.as_f32().unwrap(), &naive_bmm(&pd, &vh_data, h, s, t, d), "p @ V");
        // Any other consumer, a view and a lazy left operand see the materialized values.
        let doubled = kh.add(&kh).unwrap();
        assert_eq!(doubled.as_f32().unwrap(), kh_data.iter().map(|x| x + x).collect::<Vec<_>>(), "lazy + lazy");
        let flat = kh.view(&[h as i64, -1]).unwrap();
        assert_eq!(backend_cpu::executor::real_values(&flat).unwrap().as_ref(), kh_data.as_slice(), "view of lazy");
        let (r, rd) = tensor(&mut rng, &[1, h, t, 2], &backend);
        let kr = kh.matmul(&r).unwrap();
        assert_close(kr.as_f32().unwrap(), &naive_bmm(&kh_data, &rd, h, d, t, 2), "lazy @ dense");
        // Repeat of a repeat and cat of lazies fall back to eager copies.
        let twice = kh.repeat_interleave(2, 1).unwrap();
        let want = naive_repeat_dim1(&kh_data, &[1, h, d, t], 2);
        assert_eq!(
            backend_cpu::executor::real_values(&twice).unwrap().as_ref(),
            want.as_slice(),
            "repeat of lazy repeat"
        );
        let both = Tensor::cat(&[&kh, &kh], 0).unwrap();
        assert_eq!(backend_cpu::executor::real_values(&both).unwrap().len(), 2 * kh_data.len(), "cat of lazies");
    }
}

#[test]
fn lazy_cat_with_mismatched_parts_is_an_error() {
    let backend = CpuBackend::float();
    let mut rng = Lcg(4);
    let (a, _) = tensor(&mut rng, &[1, 2, 3], &backend);
    let (b, _) = tensor(&mut rng, &[1, 3, 3], &backend);
    assert!(Tensor::cat(&[&a, &b], 2).is_err());
}

//! The copy-free attention path against naive references: `matmul_parts` (products over joined and
//! repeated pieces) and, through the eager backend, `cat` / `repeat_interleave` results that stay
//! lazy until an op needs their data — as a matmul operand (joined along K or N, repeated along a
//! batch dim, on 1 and 2 threads), as the operand of any other op, viewed, and as a model output.

mod common;

use backend_cpu::kernels::{self, BatchRepeat, JoinAxis, KernelError, RhsPart, RhsParts};
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
    let batches_map = BatchRepeat { outer: 1, size: heads, times, inner: 1 };
    let rhs = RhsParts::dense(&[(&past_part[..], past), (&new_part[..], new)], axis, k, n, batches_map);
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
    let rhs = RhsParts::dense(&[(&src[..], k)], JoinAxis::K, k, n, BatchRepeat { outer, size, times, inner });
    assert_close(&kernels::matmul_parts(&a, m, &rhs).unwrap(), &naive_bmm(&a, &full, batches, m, k, n), "inner repeat");
}

#[test]
fn matmul_parts_rejects_inconsistent_parts() {
    let part = [0.0; 2 * 3 * 4];
    let rhs = RhsParts::dense(&[(&part[..], 3)], JoinAxis::K, 4, 4, BatchRepeat::none(2));
    assert!(matches!(kernels::matmul_parts(&[0.0; 16], 2, &rhs), Err(KernelError::InvalidArgument { .. })));
    let rhs = RhsParts::dense(&[(&part[..], 3)], JoinAxis::K, 3, 5, BatchRepeat::none(2));
    assert!(matches!(kernels::matmul_parts(&[0.0; 12], 2, &rhs), Err(KernelError::DataLength { operand: "part", .. })));
    // A strided part whose last row runs past its buffer: 2 batches of 3 rows of 4 at strides
    // (13, 4) need 25 values.
    let strided = RhsPart { data: (&part[..]).into(), extent: 3, batch_stride: 13, row_stride: 4 };
    let rhs = RhsParts { parts: vec![strided], axis: JoinAxis::K, k: 3, n: 4, batches: BatchRepeat::none(2) };
    assert!(matches!(kernels::matmul_parts(&[0.0; 12], 2, &rhs), Err(KernelError::InvalidArgument { .. })));
    // Rows that overlap (stride below the row length).
    let overlapping = RhsPart { data: (&part[..]).into(), extent: 3, batch_stride: 12, row_stride: 3 };
    let rhs = RhsParts { parts: vec![overlapping], axis: JoinAxis::K, k: 3, n: 4, batches: BatchRepeat::none(2) };
    assert!(matches!(kernels::matmul_parts(&[0.0; 12], 2, &rhs), Err(KernelError::InvalidArgument { .. })));
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

/// `data` laid out as the runtime's KV cache holds it: each of `batches` blocks of `rows` rows of
/// `cols` values becomes `rows` rows of `row_stride` with NaN after the valid values (a product that
/// read past them would turn NaN), blocks `rows * row_stride` apart.
fn widened(data: &[f32], batches: usize, rows: usize, cols: usize, row_stride: usize, block_rows: usize) -> Vec<f32> {
    let mut out = vec![f32::NAN; batches * block_rows * row_stride];
    for b in 0..batches {
        for r in 0..rows {
            let at = (b * block_rows + r) * row_stride;
            out[at..at + cols].copy_from_slice(&data[(b * rows + r) * cols..(b * rows + r + 1) * cols]);
        }
    }
    out
}

#[test]
fn strided_past_is_read_in_place() {
    use backend_cpu::lazy::Strided;
    use mllm_dsl::{DType, Storage, TensorType};
    let backend = CpuBackend::float();
    let mut rng = Lcg(5);
    // A cache with room for 9 positions holding 5: K rows of 9 columns, V heads of 9 rows.
    let (kvh, groups, d, past, room, s) = (2, 3, 8, 5, 9, 2);
    let h = kvh * groups;
    let (q, qd) = tensor(&mut rng, &[1, h, s, d], &backend);
    let pkd = rng.shaped(&[1, kvh, d, past], 1.0);
    let pvd = rng.shaped(&[1, kvh, past, d], 1.0);
    let (k, kd) = tensor(&mut rng, &[1, kvh, d, s], &backend);
    let (v, vd) = tensor(&mut rng, &[1, kvh, s, d], &backend);
    let view = |data: Vec<f32>, shape: Vec<usize>, row_stride, batch_stride| {
        let strided = Strided::new(data.into(), shape.clone(), row_stride, batch_stride).unwrap();
        let ty = TensorType::new(shape, DType::F32);
        Tensor::from_storage(ty, Storage::Native(std::sync::Arc::new(strided)), backend.clone()).unwrap()
    };
    let pk = view(widened(&pkd, kvh * d, 1, past, room, 1), vec![1, kvh, d, past], room, d * room);
    let pv = view(widened(&pvd, kvh, past, d, d, room), vec![1, kvh, past, d], d, room * d);
    // The views' own values, and a view op of them, are the dense ones.
    assert_eq!(backend_cpu::executor::real_values(&pk).unwrap().as_ref(), pkd.as_slice(), "past K values");
    let flat = pv.view(&[-1]).unwrap();
    assert_eq!(backend_cpu::executor::real_values(&flat).unwrap().as_ref(), pvd.as_slice(), "view of past V");
    let t = past + s;
    let kh_data = naive_repeat_dim1(&naive_cat(&pkd, &[1, kvh, d, past], &kd, 3), &[1, kvh, d, t], groups);
    let vh_data = naive_repeat_dim1(&naive_cat(&pvd, &[1, kvh, past, d], &vd, 2), &[1, kvh, t, d], groups);
    for threads in [1, 2] {
        kernels::set_num_threads(threads).unwrap();
        let kh = Tensor::cat(&[&pk, &k], -1).unwrap().repeat_interleave(groups, 1).unwrap();
        let vh = Tensor::cat(&[&pv, &v], 2).unwrap().repeat_interleave(groups, 1).unwrap();
        let scores = q.matmul(&kh).unwrap();
        assert_close(scores.as_f32().unwrap(), &naive_bmm(&qd, &kh_data, h, s, d, t), "q @ strided K");
        let (p, pd) = tensor(&mut rng, &[1, h, s, t], &backend);
        let y = p.matmul(&vh).unwrap();
        assert_close(y.as_f32().unwrap(), &naive_bmm(&pd, &vh_data, h, s, t, d), "p @ strided V");
        // Materialized by any other consumer.
        assert_eq!(backend_cpu::executor::real_values(&kh).unwrap().as_ref(), kh_data.as_slice(), "joined K");
    }
    // A view that does not fit its buffer is refused.
    let short = Strided::new(vec![0.0; 8 * room].into(), vec![1, kvh, d, past], room, d * room);
    assert!(matches!(short, Err(KernelError::InvalidArgument { .. })), "{short:?}");
}

/// A past part of 8-bit codes gives the product over its decoded values bit for bit: 1 to 4 rows
/// (the register tile decoding in place) and 6 (the part decoded first), joined along K and N, the
/// codes strided as in the KV cache, on 1 and 2 threads; `other` (a head's dim) of 16 to 100
/// columns leaves the register tiles' rest 1, 2, 3, 4 and 7 vectors wide.
#[test]
fn u8_parts_equal_their_decoded_values_bit_for_bit() {
    use kernels::{decode_u8, Grid, PartData};
    let mut rng = Lcg(31);
    let grid = Grid { scale: 0.0173, zero_point: 128 };
    let (heads, times, past, new) = (3, 2, 37, 2);
    for (threads, other, axis, m) in
        iproduct([1, 2], [16, 24, 40, 64, 100], [JoinAxis::K, JoinAxis::N], [1, 2, 3, 4, 6])
    {
        kernels::set_num_threads(threads).unwrap();
        let stride = other.max(past) + 13;
        let rows = m / if m > 3 { 2 } else { 1 };
        let times = if m > 3 { times } else { 1 };
        let (k, n) = match axis {
            JoinAxis::K => (past + new, other),
            JoinAxis::N => (other, past + new),
        };
        // Past part `[heads, r, c]` with rows `stride` apart (K: r = past positions, c =
        // other; N: r = other, c = past positions).
        let (r, c) = match axis {
            JoinAxis::K => (past, other),
            JoinAxis::N => (other, past),
        };
        let codes: Vec<u8> = (0..heads * r * stride).map(|_| (rng.next_f32(1.0).abs() * 255.0) as u8).collect();
        let decoded: Vec<f32> = codes.iter().map(|&u| decode_u8(u, grid)).collect();
        let new_part_values = rng.vec(heads * new * other, 1.0);
        let a = rng.vec(heads * times * rows * k, 1.0);
        let batches = BatchRepeat { outer: 1, size: heads, times, inner: 1 };
        let part = |data| RhsPart { data, extent: past, batch_stride: r * stride, row_stride: stride };
        let new_part = RhsPart {
            data: PartData::F32(&new_part_values),
            extent: new,
            batch_stride: new * other,
            row_stride: if axis == JoinAxis::K { other } else { new },
        };
        let rhs = |past| RhsParts { parts: vec![past, new_part], axis, k, n, batches };
        let got = kernels::matmul_parts(&a, rows, &rhs(part(PartData::U8 { codes: &codes, grid }))).unwrap();
        let want = kernels::matmul_parts(&a, rows, &rhs(part(PartData::F32(&decoded)))).unwrap();
        assert!(c <= stride);
        // The joined operand of every output batch, dense, for the naive product.
        let mut joined = Vec::with_capacity(heads * times * k * n);
        for h in (0..heads).flat_map(|h| std::iter::repeat_n(h, times)) {
            for (p, j) in (0..k).flat_map(|p| (0..n).map(move |j| (p, j))) {
                // The position (joined axis) and the head dim of element (p, j).
                let (pos, dim) = if axis == JoinAxis::K { (p, j) } else { (j, p) };
                joined.push(match (pos < past, axis) {
                    (true, JoinAxis::K) => decoded[h * r * stride + pos * stride + dim],
                    (true, JoinAxis::N) => decoded[h * r * stride + dim * stride + pos],
                    (false, JoinAxis::K) => new_part_values[h * new * other + (pos - past) * other + dim],
                    (false, JoinAxis::N) => new_part_values[h * new * other + dim * new + (pos - past)],
                });
            }
        }
        let what = format!("{axis:?}, {m} rows per KV head, {other} columns");
        assert_close(&want, &naive_bmm(&a, &joined, heads * times, rows, k, n), &what);
        let differ = got.iter().zip(&want).filter(|(x, y)| x.to_bits() != y.to_bits()).count();
        assert_eq!(
            differ, 0,
            "{axis:?}, {m} rows per KV head, {other} columns, {threads} threads: {differ} outputs differ"
        );
    }
}

/// Every combination of the four lists, the first varying slowest.
fn iproduct<A: Copy, B: Copy, C: Copy, D: Copy>(
    a: impl IntoIterator<Item = A>,
    b: impl IntoIterator<Item = B> + Clone,
    c: impl IntoIterator<Item = C> + Clone,
    d: impl IntoIterator<Item = D> + Clone,
) -> impl Iterator<Item = (A, B, C, D)> {
    a.into_iter().flat_map(move |a| {
        let (c, d) = (c.clone(), d.clone());
        b.clone().into_iter().flat_map(move |b| {
            let d = d.clone();
            c.clone().into_iter().flat_map(move |c| d.clone().into_iter().map(move |d| (a, b, c, d)))
        })
    })
}

/// The fused attention kernel against the written-out step (scores product, its point, the masked
/// softmax, the values product, its point), bit for bit: pasts of 8-bit codes strided as in the KV
/// cache and of f32 values, 1 to 4 query heads per KV head, 1 and 3 query rows, on 1 and 2
/// threads (heads split over them, and one KV head of 600 positions whose products both threads
/// share), with quantizers and in float mode.
#[test]
fn fused_attention_equals_the_ops_bit_for_bit() {
    use compiler::quant::{FakeQuantizer, QuantParams};
    use kernels::{decode_u8, Grid, MaskedSoftmaxConstants, PartData};
    let mut rng = Lcg(47);
    let grid = Grid { scale: 0.0173, zero_point: 128 };
    let q16 = |scale: f32, zp: i32| FakeQuantizer::new(&QuantParams { scale, zero_point: zp, qmin: 0, qmax: 65535 });
    let qs = [
        q16(9e-4, 32768),
        q16(6e-4, 30000),
        q16(6e-4, 30000),
        q16(7e-4, 50000),
        q16(8e-4, 40000),
        q16(1.0 / 65536.0, 0),
        q16(1e-4, 32768),
    ];
    let with_points =
        [Some(&qs[0]), Some(&qs[1]), Some(&qs[2]), Some(&qs[3]), Some(&qs[4]), Some(&qs[5]), Some(&qs[6])];
    let c = MaskedSoftmaxConstants { scale: 0.125, below_min: -20.0, attend: 0.0 };
    let d = 64;
    for (threads, group, s, (codes_past, kv_heads, past)) in
        iproduct([1, 2], [1, 2, 3, 4], [1, 3], [(true, 2, 37), (false, 2, 37), (true, 1, 600)])
    {
        kernels::set_num_threads(threads).unwrap();
        let (heads, t, stride) = (kv_heads * group, past + s, past + 11);
        // Past K `[Hkv, D, past]` and V `[Hkv, past, D]` in rows `stride` apart (V: heads `stride`
        // rows apart), as codes or their values; the new K `[Hkv, D, S]` and V `[Hkv, S, D]`.
        let k_codes: Vec<u8> = (0..kv_heads * d * stride).map(|_| (rng.next_f32(1.0).abs() * 255.0) as u8).collect();
        let v_codes: Vec<u8> = (0..kv_heads * stride * d).map(|_| (rng.next_f32(1.0).abs() * 255.0) as u8).collect();
        let decode = |codes: &[u8]| codes.iter().map(|&u| decode_u8(u, grid)).collect::<Vec<f32>>();
        let (k_values, v_values) = (decode(&k_codes), decode(&v_codes));
        let (new_k, new_v) = (rng.vec(kv_heads * d * s, 2.0), rng.vec(kv_heads * s * d, 2.0));
        let data = |codes: &'static str| match (codes_past, codes) {
            (true, "k") => PartData::U8 { codes: &k_codes, grid },
            (true, _) => PartData::U8 { codes: &v_codes, grid },
            (false, "k") => PartData::F32(&k_values),
            (false, _) => PartData::F32(&v_values),
        };
        let batches = BatchRepeat { outer: 1, size: kv_heads, times: group, inner: 1 };
        let new_part =
            |data, row_stride| RhsPart { data: PartData::F32(data), extent: s, batch_stride: s * d, row_stride };
        let past_part = |data, batch_stride, row_stride| RhsPart { data, extent: past, batch_stride, row_stride };
        let joined = |parts, axis, k, n| RhsParts { parts, axis, k, n, batches };
        let keys = joined(vec![past_part(data("k"), d * stride, stride), new_part(&new_k, s)], JoinAxis::N, d, t);
        let values = joined(vec![past_part(data("v"), stride * d, d), new_part(&new_v, d)], JoinAxis::K, t, d);
        let q = rng.vec(heads * s * d, 1.0);
        // Causal over the chunk's own columns, and one past column masked.
        let mask: Vec<f32> = (0..s * t)
            .map(|i| (i / t, i % t))
            .map(|(row, col)| if col == 3 || col > past + row { -0.001 } else { 0.0 })
            .collect();
        for points in [with_points, [None; 7]] {
            let fake = |p: Option<&FakeQuantizer>, v: Vec<f32>| -> Vec<f32> {
                v.into_iter().map(|v| p.map_or(v, |q| q.fake(v))).collect()
            };
            let scores = fake(points[0], kernels::matmul_parts(&q, s, &keys).unwrap());
            let softmax_points = [points[1], points[2], points[3], points[4], points[5]];
            let probabilities = kernels::masked_softmax(&scores, t, &mask, c, &softmax_points).unwrap();
            let want = fake(points[6], kernels::matmul_parts(&probabilities, s, &values).unwrap());
            let got = kernels::attention(&q, s, &keys, &values, &mask, c, &points).unwrap();
            assert!(want.iter().all(|v| v.is_finite()));
            let differ = got.iter().zip(&want).filter(|(x, y)| x.to_bits() != y.to_bits()).count();
            let what = format!(
                "{group} query heads per KV head, {s} rows, past as {}, {threads} threads, points {}",
                if codes_past { "codes" } else { "values" },
                points[0].is_some()
            );
            assert!(got.len() == want.len() && differ == 0, "{what}: {differ} of {} values differ", want.len());
        }
        // A mask of the wrong width is refused, naming the kernel.
        let err = kernels::attention(&q, s, &keys, &values, &mask[..s * (t - 1)], c, &[None; 7]).unwrap_err();
        assert!(err.to_string().contains("attention") && err.to_string().contains("mask"), "{err}");
    }
}

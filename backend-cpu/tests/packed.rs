//! The packed weight kernels against naive references: products (f64 accumulation over the exact
//! bf16 / f32 weight values) on every instruction-set version this CPU has, for row counts around
//! the tile heights, column counts around the panel width, with and without bias, on 1 and 2
//! threads; gathers and unpacking bit-exact; bad inputs rejected.

mod common;

use backend_cpu::kernels::{self, Bf16Tile, Isa, KernelError, PackedMatrix, PANEL};
use common::Lcg;

/// bf16 bit patterns (truncated f32s: any bf16 value will do) and their exact f32 values.
fn bf16_values(rng: &mut Lcg, len: usize) -> (Vec<u16>, Vec<f32>) {
    let bits: Vec<u16> = (0..len).map(|_| (rng.next_f32(1.0).to_bits() >> 16) as u16).collect();
    let values = bits.iter().map(|&b| f32::from_bits(u32::from(b) << 16)).collect();
    (bits, values)
}

/// `x[M, K] @ rows[N, K]^T + bias` in f64.
fn naive(x: &[f32], m: usize, k: usize, rows: &[f32], n: usize, bias: Option<&[f32]>) -> Vec<f64> {
    let mut out = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            let dot: f64 = (0..k).map(|p| x[i * k + p] as f64 * rows[j * k + p] as f64).sum();
            out[i * n + j] = dot + bias.map_or(0.0, |b| b[j] as f64);
        }
    }
    out
}

fn assert_close(got: &[f32], want: &[f64], k: usize, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    // f32 accumulation of k products of magnitude <= 1.
    let tol = 1e-6 * (k as f64 + 1.0);
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!((g as f64 - w).abs() <= tol, "{what}: element {i}: got {g}, want {w}");
    }
}

fn isas() -> Vec<Isa> {
    let isas = kernels::available_isas();
    assert!(isas.contains(&Isa::Portable));
    isas
}

#[test]
fn products_match_naive_for_bf16_and_f32_on_every_isa() {
    let mut rng = Lcg(11);
    let shapes =
        [(1, 1, 1), (1, 7, 5), (3, 64, 32), (12, 33, 31), (13, 40, 33), (25, 17, 67), (2, 300, 301), (30, 129, 96)];
    for &(m, k, n) in &shapes {
        let x = rng.vec(m * k, 1.0);
        let bias = rng.vec(n, 1.0);
        let (bits, bf16_rows) = bf16_values(&mut rng, n * k);
        let f32_rows = rng.vec(n * k, 1.0);
        let packed = [
            ("bf16", PackedMatrix::from_rows_bf16(n, k, &bits).unwrap(), &bf16_rows),
            ("f32", PackedMatrix::from_rows_f32(n, k, &f32_rows).unwrap(), &f32_rows),
        ];
        for (dtype, w, rows) in &packed {
            assert_eq!((w.k(), w.n()), (k, n));
            for b in [None, Some(bias.as_slice())] {
                let want = naive(&x, m, k, rows, n, b);
                for threads in [1, 2] {
                    kernels::set_num_threads(threads).unwrap();
                    for isa in isas() {
                        let got = kernels::linear_packed_with(isa, &x, m, w, b).unwrap();
                        let what = format!("{dtype} {isa:?} m{m} k{k} n{n} bias {} threads {threads}", b.is_some());
                        assert_close(&got, &want, k, &what);
                    }
                    assert_close(&kernels::linear_packed(&x, m, w, b).unwrap(), &want, k, "linear_packed");
                }
            }
        }
    }
}

/// bf16 products: `x` rounded to bf16 by `half` (round to nearest even), then exact products
/// summed in f32, on every tile this CPU runs (AMX's `tdpbf16ps` and `vdpbf16ps` where the CPU
/// has them, the rounded rows on the f32 tiles), for odd K (the last row pairs with zero), row
/// counts around the tile heights (12 for `vdpbf16ps`; 8, 16 and 32 for AMX, whose tile also
/// needs K a multiple of 32; 130 rows cross the 120-row blocks) and partial panels. The rounding
/// must show: against the unrounded product the results differ by far more than the summation
/// tolerance.
#[test]
fn bf16_products_round_the_input_to_bf16_and_sum_in_f32() {
    let mut rng = Lcg(17);
    let shapes = [
        (1, 1, 1),
        (1, 7, 5),
        (3, 64, 32),
        (12, 33, 31),
        (13, 129, 33),
        (25, 17, 67),
        (1, 1024, 96),
        (7, 64, 33),
        (8, 32, 32),
        (16, 96, 31),
        (33, 128, 65),
        (130, 64, 40),
    ];
    for &(m, k, n) in &shapes {
        let x = rng.vec(m * k, 1.0);
        let rounded: Vec<f32> = x.iter().map(|&v| half::bf16::from_f32(v).to_f32()).collect();
        assert_ne!(x, rounded, "the inputs must not all be bf16 values already");
        let bias = rng.vec(n, 1.0);
        let (bits, rows) = bf16_values(&mut rng, n * k);
        let w = PackedMatrix::from_rows_bf16(n, k, &bits).unwrap();
        for b in [None, Some(bias.as_slice())] {
            let want = naive(&rounded, m, k, &rows, n, b);
            let unrounded = naive(&x, m, k, &rows, n, b);
            for threads in [1, 2] {
                kernels::set_num_threads(threads).unwrap();
                for tile in Bf16Tile::all_available() {
                    let got = kernels::linear_packed_bf16_with(tile, &x, m, &w, b).unwrap();
                    let what = format!("bf16 products {tile:?} m{m} k{k} n{n} bias {} threads {threads}", b.is_some());
                    assert_close(&got, &want, k, &what);
                    if k >= 7 {
                        let apart = got.iter().zip(&unrounded).map(|(&g, &u)| (g as f64 - u).abs()).fold(0.0, f64::max);
                        assert!(apart > 1e-5 * (k as f64 + 1.0), "{what}: no sign of the rounding ({apart})");
                    }
                }
                assert_close(&kernels::linear_packed_bf16(&x, m, &w, b).unwrap(), &want, k, "linear_packed_bf16");
            }
        }
    }
}

/// f32 matrices are not bf16: [`kernels::linear_packed_bf16`] multiplies them as
/// [`kernels::linear_packed`] does, bit for bit.
#[test]
fn bf16_products_leave_f32_matrices_alone() {
    let mut rng = Lcg(19);
    let (m, k, n) = (5, 40, 33);
    let x = rng.vec(m * k, 1.0);
    let w = PackedMatrix::from_rows_f32(n, k, &rng.vec(n * k, 1.0)).unwrap();
    assert_eq!(kernels::linear_packed_bf16(&x, m, &w, None).unwrap(), kernels::linear_packed(&x, m, &w, None).unwrap());
}

#[test]
fn large_products_split_over_threads_match_naive() {
    // Above the parallel threshold, with a partial last panel and several row blocks.
    let mut rng = Lcg(5);
    let (m, k, n) = (130, 96, 10 * PANEL + 7);
    let x = rng.vec(m * k, 1.0);
    let (bits, rows) = bf16_values(&mut rng, n * k);
    let w = PackedMatrix::from_rows_bf16(n, k, &bits).unwrap();
    let want = naive(&x, m, k, &rows, n, None);
    for threads in [1, 2] {
        kernels::set_num_threads(threads).unwrap();
        assert_close(&kernels::linear_packed(&x, m, &w, None).unwrap(), &want, k, &format!("threads {threads}"));
    }
}

#[test]
fn gathers_and_unpacking_return_the_stored_values_exactly() {
    let mut rng = Lcg(3);
    let (n, k) = (70, 9);
    let (bits, bf16_rows) = bf16_values(&mut rng, n * k);
    let f32_rows = rng.vec(n * k, 1.0);
    for (w, rows) in [
        (PackedMatrix::from_rows_bf16(n, k, &bits).unwrap(), &bf16_rows),
        (PackedMatrix::from_rows_f32(n, k, &f32_rows).unwrap(), &f32_rows),
    ] {
        assert_eq!(&w.to_nk_f32(), rows, "{w:?} to_nk_f32");
        let kn = w.to_kn_f32();
        for j in 0..n {
            for p in 0..k {
                assert_eq!(kn[p * n + j], rows[j * k + p], "{w:?} to_kn_f32 [{p}, {j}]");
            }
        }
        let ids = [69i64, 0, 31, 32, 5];
        let got = w.gather_columns(&ids).unwrap();
        let want: Vec<f32> = ids.iter().flat_map(|&i| rows[i as usize * k..(i as usize + 1) * k].to_vec()).collect();
        assert_eq!(got, want, "{w:?} gather_columns");
    }
}

#[test]
fn bad_inputs_are_rejected() {
    assert!(matches!(
        PackedMatrix::from_rows_f32(3, 4, &[0.0; 11]),
        Err(KernelError::DataLength { operand: "rows", expected: 12, actual: 11, .. })
    ));
    assert!(matches!(PackedMatrix::from_rows_bf16(3, 4, &[0; 13]), Err(KernelError::DataLength { .. })));
    let w = PackedMatrix::from_rows_f32(3, 4, &[1.0; 12]).unwrap();
    assert!(matches!(
        kernels::linear_packed(&[0.0; 7], 2, &w, None),
        Err(KernelError::DataLength { operand: "x", .. })
    ));
    assert!(matches!(
        kernels::linear_packed(&[0.0; 8], 2, &w, Some(&[0.0; 2])),
        Err(KernelError::DataLength { operand: "bias", .. })
    ));
    let wb = PackedMatrix::from_rows_bf16(3, 4, &[0x3f80; 12]).unwrap();
    assert!(matches!(
        kernels::linear_packed_bf16(&[0.0; 7], 2, &wb, None),
        Err(KernelError::DataLength { operand: "x", .. })
    ));
    assert!(matches!(
        kernels::linear_packed_bf16(&[0.0; 8], 2, &wb, Some(&[0.0; 2])),
        Err(KernelError::DataLength { operand: "bias", .. })
    ));
    assert!(matches!(w.gather_columns(&[3]), Err(KernelError::IndexOutOfRange { index: 3, bound: 3, .. })));
    assert!(matches!(w.gather_columns(&[-1]), Err(KernelError::IndexOutOfRange { index: -1, .. })));
    assert_eq!(kernels::linear_packed(&[], 0, &w, None).unwrap(), Vec::<f32>::new());
}

//! The W4A16 int4 kernels against the f32 path: LPBQ codes and scales made by the project's
//! quantizer (`compiler::quant::lpbq`), decoded to f32 by its decoder, multiplied in f64; the
//! int4 product on every instruction-set version this CPU has, for row counts around the tile
//! heights, column counts around the panel width, odd block sizes, bias and 1 or 2 threads.
//! Unpacking returns the decoder's values bit for bit; bad codes and scales are rejected.

mod common;

use backend_cpu::kernels::{self, Int4Packer, KernelError, PackedMatrix, PANEL};
use common::Lcg;
use compiler::quant::lpbq::{lpbq_block_quantize, LpbqShape};

/// An LPBQ export of a random `[n, k]` weight: its HWIO nibbles (as bytes), scale1, scale2, and
/// the decoded f32 weight `[k, n]` (HWIO).
struct Lpbq {
    nibbles: Vec<u8>,
    scale1: Vec<u8>,
    scale2: Vec<f32>,
    decoded_kn: Vec<f32>,
}

fn lpbq(rng: &mut Lcg, n: usize, k: usize, block: usize) -> Lpbq {
    let shape = LpbqShape::new(n, k, block).unwrap();
    // Rows of varying magnitude, so scale1 takes many values.
    let w: Vec<f32> = (0..n * k).map(|i| rng.next_f32(0.02 + (i % 7) as f32 * 0.01)).collect();
    let export = lpbq_block_quantize(&w, shape).unwrap().to_export();
    let decoded_kn = export.decode_hwio().unwrap();
    Lpbq {
        nibbles: export.weight_hwio.iter().map(|&v| v as u8).collect(),
        scale1: export.scale1,
        scale2: export.scale2,
        decoded_kn,
    }
}

fn pack(q: &Lpbq, k: usize, n: usize, block: usize, piece: usize) -> PackedMatrix {
    let mut packer = Int4Packer::new(k, n, block).unwrap();
    for chunk in q.nibbles.chunks(piece.max(1)) {
        packer.push(chunk).unwrap();
    }
    packer.finish(&q.scale1, &q.scale2).unwrap()
}

/// `x[M, K] @ w[K, N] + bias` in f64, and `Σ |x w|` per output (the scale of rounding errors).
fn naive(x: &[f32], m: usize, k: usize, w_kn: &[f32], n: usize, bias: Option<&[f32]>) -> (Vec<f64>, Vec<f64>) {
    let (mut out, mut mag) = (vec![0.0; m * n], vec![0.0; m * n]);
    for i in 0..m {
        for j in 0..n {
            for p in 0..k {
                let t = x[i * k + p] as f64 * w_kn[p * n + j] as f64;
                out[i * n + j] += t;
                mag[i * n + j] += t.abs();
            }
            out[i * n + j] += bias.map_or(0.0, |b| b[j] as f64);
            mag[i * n + j] += bias.map_or(0.0, |b| b[j].abs() as f64);
        }
    }
    (out, mag)
}

fn assert_close(got: &[f32], want: &(Vec<f64>, Vec<f64>), k: usize, what: &str) {
    assert_eq!(got.len(), want.0.len(), "{what}: length");
    for (i, (&g, (&w, &mag))) in got.iter().zip(want.0.iter().zip(&want.1)).enumerate() {
        assert!(g.is_finite(), "{what}: element {i} is {g}");
        // f32 sums of k terms, in another order than the decoded-weight product, plus the scaling.
        let tol = (k as f64 + 4.0) * f32::EPSILON as f64 * mag + 1e-30;
        assert!((g as f64 - w).abs() <= tol, "{what}: element {i}: got {g}, want {w} (tol {tol:e})");
    }
}

#[test]
fn int4_products_match_the_decoded_f32_weights_on_every_isa() {
    let mut rng = Lcg(21);
    // (m, k, n, block): tails around the tile heights (1..=4 use per-block sums, taller tiles the
    // scaled codes), partial panels, blocks of 1, odd and large sizes.
    let shapes = [
        (1, 16, 1, 16),
        (1, 32, 31, 16),
        (2, 21, 33, 7),
        (3, 6, 5, 2),
        (4, 48, 64, 16),
        (5, 64, 67, 32),
        (12, 9, 32, 1),
        (13, 80, 96, 16),
        (25, 45, 40, 15),
        (30, 128, 129, 64),
    ];
    for &(m, k, n, block) in &shapes {
        let q = lpbq(&mut rng, n, k, block);
        let x = rng.vec(m * k, 1.0);
        let bias = rng.vec(n, 0.5);
        for piece in [1, 7, n * k] {
            let w = pack(&q, k, n, block, piece);
            assert_eq!((w.k(), w.n()), (k, n));
            assert_eq!(w.to_kn_f32(), q.decoded_kn, "m{m} k{k} n{n} bs{block}: unpacked values");
            for b in [None, Some(bias.as_slice())] {
                let want = naive(&x, m, k, &q.decoded_kn, n, b);
                for threads in [1, 2] {
                    kernels::set_num_threads(threads).unwrap();
                    for isa in kernels::available_isas() {
                        let got = kernels::linear_packed_with(isa, &x, m, &w, b).unwrap();
                        let what = format!("{isa:?} m{m} k{k} n{n} bs{block} bias {} threads {threads}", b.is_some());
                        assert_close(&got, &want, k, &what);
                    }
                }
            }
        }
    }
}

#[test]
fn large_int4_products_split_over_threads_match() {
    // Above the parallel threshold, several row blocks and a partial last panel.
    let mut rng = Lcg(8);
    let (m, k, n, block) = (131, 256, 9 * PANEL + 5, 16);
    let q = lpbq(&mut rng, n, k, block);
    let w = pack(&q, k, n, block, 4096);
    let x = rng.vec(m * k, 1.0);
    let want = naive(&x, m, k, &q.decoded_kn, n, None);
    for threads in [1, 2] {
        kernels::set_num_threads(threads).unwrap();
        assert_close(&kernels::linear_packed(&x, m, &w, None).unwrap(), &want, k, &format!("threads {threads}"));
    }
}

#[test]
fn every_code_and_scale_value_decodes_like_the_lpbq_decoder() {
    // All 16 nibbles in every column position, scale1 over 0..=16.
    let (k, n, block) = (16, 40, 4);
    let nibbles: Vec<u8> = (0..k * n).map(|i| ((i * 7 + i / n) % 16) as u8).collect();
    let scale1: Vec<u8> = (0..n * (k / block)).map(|i| (i % 17) as u8).collect();
    let scale2: Vec<f32> = (0..n).map(|c| 0.001 * (c + 1) as f32).collect();
    let export = compiler::quant::lpbq::LpbqExport {
        shape: LpbqShape::new(n, k, block).unwrap(),
        weight_hwio: nibbles.iter().map(|&v| v as i8).collect(),
        scale1: scale1.clone(),
        scale2: scale2.clone(),
    };
    let mut packer = Int4Packer::new(k, n, block).unwrap();
    packer.push(&nibbles).unwrap();
    let w = packer.finish(&scale1, &scale2).unwrap();
    assert_eq!(w.to_kn_f32(), export.decode_hwio().unwrap());
}

#[test]
fn bad_codes_and_shapes_are_rejected() {
    assert!(matches!(Int4Packer::new(10, 4, 3), Err(KernelError::InvalidArgument { .. })));
    assert!(matches!(Int4Packer::new(0, 4, 1), Err(KernelError::InvalidArgument { .. })));
    let mut p = Int4Packer::new(4, 2, 2).unwrap();
    let err = p.push(&[1, 2, 16]).unwrap_err().to_string();
    assert!(err.contains("element 2") && err.contains("16"), "{err}");
    let mut p = Int4Packer::new(4, 2, 2).unwrap();
    assert!(p.push(&[0; 9]).is_err());
    let mut p = Int4Packer::new(4, 2, 2).unwrap();
    p.push(&[0; 7]).unwrap();
    assert!(matches!(p.finish(&[1; 4], &[1.0; 2]), Err(KernelError::InvalidArgument { .. })));
    let mut p = Int4Packer::new(4, 2, 2).unwrap();
    p.push(&[0; 8]).unwrap();
    assert!(matches!(p.finish(&[1; 3], &[1.0; 2]), Err(KernelError::DataLength { operand: "scale1", .. })));
    let mut p = Int4Packer::new(4, 2, 2).unwrap();
    p.push(&[0; 8]).unwrap();
    assert!(matches!(p.finish(&[1; 4], &[1.0; 3]), Err(KernelError::DataLength { operand: "scale2", .. })));
}

/// A row on a u16 grid: `(u - zp) * scale` with codes spread over `lo..=hi`.
fn grid_row(rng: &mut Lcg, k: usize, grid: kernels::Grid, lo: i32, hi: i32) -> Vec<f32> {
    (0..k)
        .map(|_| {
            let u = lo + ((rng.next_f32(1.0) + 1.0) * 0.5 * (hi - lo) as f32) as i32;
            (u.clamp(lo, hi) - grid.zero_point) as f32 * grid.scale
        })
        .collect()
}

#[test]
fn rows_on_a_u16_grid_multiply_in_integers_and_match_the_decoded_weights() {
    let mut rng = Lcg(5);
    #[cfg(target_arch = "x86_64")]
    let available = ["avx512f", "avx512bw", "avx512vnni", "avx512vbmi"].iter().all(|f| match *f {
        "avx512f" => std::arch::is_x86_feature_detected!("avx512f"),
        "avx512bw" => std::arch::is_x86_feature_detected!("avx512bw"),
        "avx512vnni" => std::arch::is_x86_feature_detected!("avx512vnni"),
        _ => std::arch::is_x86_feature_detected!("avx512vbmi"),
    });
    #[cfg(not(target_arch = "x86_64"))]
    let available = false;
    // (k, n, block, zero point, code range): codes around the zero point, a zero point at 0 with
    // codes over the whole u16 range (an offset other than the zero point), one near 65535.
    let cases = [
        (16, 1, 16, 32768, (30000, 36000)),
        (64, 33, 16, 32768, (0, 65535)),
        (128, 96, 32, 0, (0, 65535)),
        (96, 70, 4, 65000, (100, 65535)),
        (256, 9 * PANEL + 5, 64, 1234, (0, 40000)),
    ];
    for &(k, n, block, zero_point, (lo, hi)) in &cases {
        let q = lpbq(&mut rng, n, k, block);
        let w = pack(&q, k, n, block, 4096);
        let grid = kernels::Grid { scale: 3.1e-4, zero_point };
        let x = grid_row(&mut rng, k, grid, lo, hi);
        let bias = rng.vec(n, 0.5);
        let what = format!("k{k} n{n} bs{block} zp{zero_point} codes {lo}..={hi}");
        assert_eq!(kernels::runs_on_grid(&x, 1, &w, Some(grid)), available, "{what}: integer path");
        for b in [None, Some(bias.as_slice())] {
            let want = naive(&x, 1, k, &q.decoded_kn, n, b);
            for threads in [1, 2] {
                kernels::set_num_threads(threads).unwrap();
                let got = kernels::linear_packed_on_grid(&x, 1, &w, b, Some(grid)).unwrap();
                assert_close(&got, &want, k, &format!("{what} bias {} threads {threads}", b.is_some()));
            }
        }
        // Several rows (a prefill chunk: whole tiles of 8 and a remainder) run in integers too.
        for m in [2, 8, 19] {
            let xs = grid_row(&mut rng, m * k, grid, lo, hi);
            assert_eq!(kernels::runs_on_grid(&xs, m, &w, Some(grid)), available, "{what}: {m} rows");
            let want = naive(&xs, m, k, &q.decoded_kn, n, Some(&bias));
            for threads in [1, 2] {
                kernels::set_num_threads(threads).unwrap();
                let got = kernels::linear_packed_on_grid(&xs, m, &w, Some(&bias), Some(grid)).unwrap();
                assert_close(&got, &want, k, &format!("{what} {m} rows threads {threads}"));
            }
        }
        // A value off the grid (in any row) or blocks of an odd size take the f32 tiles.
        let mut off = x.clone();
        off[k / 2] = f32::from_bits(off[k / 2].to_bits() ^ 1);
        assert!(!kernels::runs_on_grid(&off, 1, &w, Some(grid)), "{what}: off the grid");
        let want = naive(&off, 1, k, &q.decoded_kn, n, None);
        assert_close(&kernels::linear_packed_on_grid(&off, 1, &w, None, Some(grid)).unwrap(), &want, k, &what);
        let two = [x.as_slice(), off.as_slice()].concat();
        assert!(!kernels::runs_on_grid(&two, 2, &w, Some(grid)), "{what}: a second row off the grid");
    }
    // The largest block the integer sums take (4096 rows), at their extreme: every code -8 and
    // every activation 32768 below the offset (one 65535 forces the offset to 32768), so a
    // column's block sum is about 2^30. Exact integers, so the product is the decoded one.
    let (k, n) = (4096, PANEL);
    let nibbles = vec![8u8; k * n];
    let (scale1, scale2) = (vec![255u8; n], vec![1e-6f32; n]);
    let mut packer = Int4Packer::new(k, n, k).unwrap();
    packer.push(&nibbles).unwrap();
    let w = packer.finish(&scale1, &scale2).unwrap();
    let grid = kernels::Grid { scale: 1e-3, zero_point: 0 };
    let mut x = vec![0.0f32; 2 * k];
    x[k - 1] = 65535.0 * 1e-3;
    assert_eq!(kernels::runs_on_grid(&x, 2, &w, Some(grid)), available);
    let decoded = vec![(-8.0f32 * 255.0) * 1e-6; k * n];
    let want = naive(&x, 2, k, &decoded, n, None);
    assert_close(&kernels::linear_packed_on_grid(&x, 2, &w, None, Some(grid)).unwrap(), &want, k, "extreme block");
    let q = lpbq(&mut rng, 8, 42, 7);
    let w = pack(&q, 42, 8, 7, 64);
    let grid = kernels::Grid { scale: 0.01, zero_point: 32768 };
    assert!(!kernels::runs_on_grid(&grid_row(&mut rng, 42, grid, 32000, 33000), 1, &w, Some(grid)));
    if !available {
        eprintln!("note: this CPU lacks AVX-512 VNNI/VBMI: only the f32 fallback was checked");
    }
}

#[test]
fn sibling_products_in_one_job_equal_each_product_alone() {
    // Matrices of one K as a layer's q, k, v (int4 of two block sizes, a float one, a bias):
    // `linears_packed_on_grid` runs them as one job, above the parallel threshold, and each
    // output is that matrix's product alone bit for bit, on the grid's integer tile and off it.
    let mut rng = Lcg(11);
    let k = 512;
    let grid = kernels::Grid { scale: 2.7e-4, zero_point: 32768 };
    let shapes = [(9 * PANEL + 5, 16), (2 * PANEL, 16), (2 * PANEL + 3, 32)];
    let int4: Vec<PackedMatrix> =
        shapes.iter().map(|&(n, block)| pack(&lpbq(&mut rng, n, k, block), k, n, block, 4096)).collect();
    let float = PackedMatrix::from_rows_f32(40, k, &rng.vec(40 * k, 0.1)).unwrap();
    let bias = rng.vec(2 * PANEL, 0.5);
    let products: Vec<(&PackedMatrix, Option<&[f32]>)> =
        vec![(&int4[0], None), (&int4[1], Some(&bias)), (&float, None), (&int4[2], None)];
    for m in [1, 3] {
        let on_grid = grid_row(&mut rng, m * k, grid, 20000, 45000);
        let off_grid = rng.vec(m * k, 1.0);
        for (x, g) in [(&on_grid, Some(grid)), (&off_grid, None)] {
            for threads in [1, 2] {
                kernels::set_num_threads(threads).unwrap();
                let outs = kernels::linears_packed_on_grid(x, m, &products, g).unwrap();
                assert_eq!(outs.len(), products.len());
                for (j, (&(w, b), out)) in products.iter().zip(&outs).enumerate() {
                    let alone = kernels::linear_packed_on_grid(x, m, w, b, g).unwrap();
                    assert_eq!(out, &alone, "matrix {j}, {m} rows, grid {}, threads {threads}", g.is_some());
                }
            }
        }
    }
    // A matrix of another K is refused, naming the operand.
    let other = PackedMatrix::from_rows_f32(8, k + 4, &rng.vec(8 * (k + 4), 0.1)).unwrap();
    let x = rng.vec(k, 1.0);
    assert!(matches!(
        kernels::linears_packed_on_grid(&x, 1, &[(&int4[0], None), (&other, None)], None),
        Err(KernelError::DataLength { operand: "x", .. })
    ));
}

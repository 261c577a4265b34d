//! Per-op checks on tiny hand-computed cases, plus a Conv2d + RmsNorm + Softmax graph checked
//! against independent naive f32/f64 references.

use super::*;
use crate::dtype::DataType;
use crate::encoding::{lpbq_from_block_scales, Encoding, Int4Storage, ScaleOffset};
use crate::graph::{GraphBuilder, NodeBuilder, Param, Scalar, StaticData};

const F32: DataType = DataType::Float32;

fn run1(b: GraphBuilder, inputs: &[&[f32]]) -> TensorValue {
    let g = b.finish().unwrap();
    let it = Interpreter::new(&g).unwrap();
    let vals: Vec<TensorValue> = inputs.iter().enumerate().map(|(i, v)| it.input_from_real(i, v).unwrap()).collect();
    it.run(&vals).unwrap().remove(0)
}

fn close(a: &[f32], b: &[f32], tol: f32) {
    assert_eq!(a.len(), b.len());
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!((x - y).abs() <= tol, "element {i}: {x} vs {y} (tol {tol})");
    }
}

fn so(scale: f32, offset: i32) -> Encoding {
    Encoding::scale_offset(scale, offset)
}

fn binary(op: OpType, da: &[u32], db: &[u32], dout: &[u32], enc: [Encoding; 3], dt: [DataType; 3]) -> GraphBuilder {
    let mut b = GraphBuilder::new("g");
    let x = b.input("a", dt[0], da, enc[0].clone());
    let y = b.input("b", dt[1], db, enc[1].clone());
    b.node("n", op).input(&x).input(&y).graph_output("o", dt[2], dout, enc[2].clone()).finish();
    b
}

/// in (APP_WRITE) -> op -> out (APP_READ); `params` adds the node's params.
fn unary_graph(
    op: OpType,
    input: (DataType, &[u32], Encoding),
    output: (DataType, &[u32], Encoding),
    params: impl FnOnce(NodeBuilder<'_>) -> NodeBuilder<'_>,
) -> GraphBuilder {
    let mut b = GraphBuilder::new("g");
    let x = b.input("a", input.0, input.1, input.2);
    params(b.node("n", op).input(&x)).graph_output("o", output.0, output.1, output.2).finish();
    b
}

#[test]
fn add_broadcasts_float() {
    let b = binary(OpType::ElementWiseAdd, &[2, 1], &[3], &[2, 3], Default::default(), [F32; 3]);
    let o = run1(b, &[&[1.0, 2.0], &[10.0, 20.0, 30.0]]);
    assert_eq!(o.to_real().unwrap(), vec![11.0, 21.0, 31.0, 12.0, 22.0, 32.0]);
}

#[test]
fn quantized_mul_and_sub_requantize_half_even() {
    let u8q = DataType::UFixedPoint8;
    // a = 1, 2 (codes 2, 4 at scale .5); b = 3, .5; product 3, 1 at scale .25 -> 12, 4.
    let b = binary(OpType::ElementWiseMultiply, &[2], &[2], &[2], [so(0.5, 0), so(0.5, 0), so(0.25, 0)], [u8q; 3]);
    let o = run1(b, &[&[1.0, 2.0], &[3.0, 0.5]]);
    assert_eq!(o.codes().unwrap(), &[12, 4]);
    // 2.5 and 3.5 at scale 1 round to 2 and 4 (ties to even); -1 saturates to 0.
    let b = binary(OpType::ElementWiseSubtract, &[3], &[3], &[3], [so(0.5, 0), so(0.5, 0), so(1.0, 0)], [u8q; 3]);
    let o = run1(b, &[&[3.0, 4.0, 1.0], &[0.5, 0.5, 2.0]]);
    assert_eq!(o.codes().unwrap(), &[2, 4, 0]);
}

#[test]
fn neg_and_sigmoid() {
    let b =
        unary_graph(OpType::ElementWiseNeg, (F32, &[3], Encoding::Undefined), (F32, &[3], Encoding::Undefined), |n| n);
    assert_eq!(run1(b, &[&[1.0, -2.0, 0.0]]).to_real().unwrap(), vec![-1.0, 2.0, -0.0]);
    // Sigmoid to mllm's fixed u16 encoding (scale 1/65536, zero point 0).
    let b = unary_graph(
        OpType::Sigmoid,
        (F32, &[3], Encoding::Undefined),
        (DataType::UFixedPoint16, &[3], so(1.0 / 65536.0, 0)),
        |n| n,
    );
    let o = run1(b, &[&[0.0, 2.0, -30.0]]);
    let s2 = (1.0 / (1.0 + (-2.0f64).exp()) * 65536.0).round() as i64;
    assert_eq!(o.codes().unwrap(), &[32768, s2, 0]);
}

#[test]
fn equal_and_select_form_a_masked_softmax_mask() {
    // mask u16 with 65535 = attend (0.0) and 0 = masked; compare with a constant zero.
    let mask_enc = so(255.0 / 65535.0, -65535);
    let mut b = GraphBuilder::new("g");
    let m = b.input("mask", DataType::UFixedPoint16, &[4], mask_enc.clone());
    let zero = b.static_tensor("zero", DataType::UFixedPoint16, &[1], mask_enc.clone(), StaticData::from_u16(&[65535]));
    let eq = b
        .node("eq", OpType::ElementWiseEqual)
        .input(&m)
        .input(&zero)
        .output("eq", DataType::Bool8, &[4], Encoding::Undefined)
        .finish_one();
    let scores = b.input("s", F32, &[4], Encoding::Undefined);
    let low = b.static_tensor("low", F32, &[1], Encoding::Undefined, StaticData::from_f32(&[-100.0]));
    b.node("sel", OpType::ElementWiseSelect)
        .inputs([&eq, &scores, &low])
        .graph_output("o", F32, &[4], Encoding::Undefined)
        .finish();
    let g = b.finish().unwrap();
    let it = Interpreter::new(&g).unwrap();
    let mask = it.input_from_real(0, &[0.0, -255.0, 0.0, -255.0]).unwrap();
    assert_eq!(mask.codes().unwrap(), &[65535, 0, 65535, 0]);
    let s = it.input_from_real(1, &[1.0, 2.0, 3.0, 4.0]).unwrap();
    let all = it.run_all(&[mask, s]).unwrap();
    assert_eq!(all["eq"].codes().unwrap(), &[1, 0, 1, 0]);
    assert_eq!(all["o"].to_real().unwrap(), vec![1.0, -100.0, 3.0, -100.0]);
}

#[test]
fn softmax_with_beta_and_axis() {
    let b =
        unary_graph(OpType::Softmax, (F32, &[2, 3], Encoding::Undefined), (F32, &[2, 3], Encoding::Undefined), |n| {
            n.scalar("axis", Scalar::UInt32(1)).scalar("beta", Scalar::Float32(2.0))
        });
    let o = run1(b, &[&[1.0, 2.0, 3.0, 0.0, 0.0, 0.0]]).to_real().unwrap();
    let e: Vec<f64> = [2.0f64, 4.0, 6.0].iter().map(|v| v.exp()).collect();
    let s: f64 = e.iter().sum();
    let want: Vec<f32> = e.iter().map(|v| (v / s) as f32).chain([1.0 / 3.0; 3]).collect();
    close(&o, &want, 1e-7);
    // Axis 0 on the same data.
    let b =
        unary_graph(OpType::Softmax, (F32, &[2, 3], Encoding::Undefined), (F32, &[2, 3], Encoding::Undefined), |n| {
            n.scalar("axis", Scalar::UInt32(0))
        });
    let o = run1(b, &[&[0.0, 0.0, 3.0, 0.0, 0.0, 0.0]]).to_real().unwrap();
    let p = (3.0f64.exp() / (3.0f64.exp() + 1.0)) as f32;
    close(&o, &[0.5, 0.5, p, 0.5, 0.5, 1.0 - p], 1e-7);
}

#[test]
fn rms_norm_hand_computed() {
    let mut b = GraphBuilder::new("g");
    let x = b.input("x", F32, &[1, 4], Encoding::Undefined);
    let g = b.static_tensor("gamma", F32, &[4], Encoding::Undefined, StaticData::from_f32(&[1.0, 1.0, 2.0, 2.0]));
    let be = b.static_tensor("beta", F32, &[4], Encoding::Undefined, StaticData::from_f32(&[0.5; 4]));
    b.node("n", OpType::RmsNorm)
        .inputs([&x, &g, &be])
        .scalar("epsilon", Scalar::Float32(0.0))
        .tensor_param_u32("axes", &[1], &[1])
        .graph_output("o", F32, &[1, 4], Encoding::Undefined)
        .finish();
    let o = run1(b, &[&[1.0, 2.0, 3.0, 4.0]]).to_real().unwrap();
    let rms = (30.0f64 / 4.0).sqrt();
    let want: Vec<f32> = [1.0, 2.0, 6.0, 8.0].iter().map(|v| (v / rms + 0.5) as f32).collect();
    close(&o, &want, 1e-6);
}

#[test]
fn transpose_and_reshape_move_codes() {
    let enc = so(0.1, -5);
    let u16q = DataType::UFixedPoint16;
    let b = unary_graph(OpType::Transpose, (u16q, &[2, 3], enc.clone()), (u16q, &[3, 2], enc.clone()), |n| {
        n.tensor_param_u32("perm", &[2], &[1, 0])
    });
    let o = run1(b, &[&[0.0, 0.1, 0.2, 0.3, 0.4, 0.5]]);
    assert_eq!(o.codes().unwrap(), &[5, 8, 6, 9, 7, 10]);
    // Reshape into a different encoding requantizes: real 0.5 at scale .25 is code 2.
    let b = unary_graph(OpType::Reshape, (u16q, &[2, 3], enc.clone()), (u16q, &[6], so(0.25, 0)), |n| n);
    let o = run1(b, &[&[0.0, 0.1, 0.2, 0.3, 0.4, 0.5]]);
    // 0.1/.25 = 0.4 -> 0, 0.3/.25 = 1.2 -> 1, 0.4/.25 = 1.6 -> 2
    assert_eq!(o.codes().unwrap(), &[0, 0, 1, 1, 2, 2]);
}

#[test]
fn concat_kv_cache_codes_and_mixed_requantization() {
    let kv = Encoding::ScaleOffset(ScaleOffset::uint8_symmetric(0.05));
    let u8q = DataType::UFixedPoint8;
    let b = binary(OpType::Concat, &[1, 2], &[1, 1], &[1, 3], [kv.clone(), kv.clone(), kv.clone()], [u8q; 3]);
    let mut b = b;
    // Add the axis param to the node created by `binary`.
    let g = {
        let mut g = b.finish_unchecked();
        g.nodes[0].params.push(("axis".into(), Param::Scalar(Scalar::UInt32(1))));
        g
    };
    let it = Interpreter::new(&g).unwrap();
    let a = TensorValue::from_codes(&g.tensors[0], vec![0, 255]).unwrap();
    let c = TensorValue::from_codes(&g.tensors[1], vec![128]).unwrap();
    assert_eq!(it.run(&[a, c]).unwrap()[0].codes().unwrap(), &[0, 255, 128]);
    // Mixed: second input at a coarser scale is requantized into the output encoding.
    b = binary(OpType::Concat, &[2], &[1], &[3], [so(0.5, 0), so(2.0, 0), so(0.5, 0)], [u8q; 3]);
    let mut g = b.finish_unchecked();
    g.nodes[0].params.push(("axis".into(), Param::Scalar(Scalar::UInt32(0))));
    let it = Interpreter::new(&g).unwrap();
    let a = TensorValue::from_codes(&g.tensors[0], vec![1, 3]).unwrap();
    let c = TensorValue::from_codes(&g.tensors[1], vec![3]).unwrap();
    assert_eq!(it.run(&[a, c]).unwrap()[0].codes().unwrap(), &[1, 3, 12]);
}

#[test]
fn gather_embedding_rows() {
    let enc = so(0.01, 0);
    let mut b = GraphBuilder::new("g");
    let table = b.static_tensor(
        "embed",
        DataType::UFixedPoint16,
        &[4, 2],
        enc.clone(),
        StaticData::from_u16(&[0, 1, 10, 11, 20, 21, 30, 31]),
    );
    let ids = b.input("ids", DataType::Int32, &[1, 2], Encoding::Undefined);
    b.node("emb", OpType::Gather)
        .input(&table)
        .input(&ids)
        .scalar("axis", Scalar::Int32(0))
        .graph_output("o", DataType::UFixedPoint16, &[1, 2, 2], enc)
        .finish();
    let o = run1(b, &[&[3.0, 1.0]]);
    assert_eq!(o.codes().unwrap(), &[30, 31, 10, 11]);
    // Out-of-range runtime indices are reported.
    let mut b = GraphBuilder::new("g");
    let table = b.static_tensor("t", F32, &[2], Encoding::Undefined, StaticData::from_f32(&[1.0, 2.0]));
    let ids = b.input("ids", DataType::Int32, &[1], Encoding::Undefined);
    b.node("emb", OpType::Gather).input(&table).input(&ids).graph_output("o", F32, &[1], Encoding::Undefined).finish();
    let g = b.finish().unwrap();
    let it = Interpreter::new(&g).unwrap();
    let err = it.run(&[it.input_from_real(0, &[2.0]).unwrap()]).unwrap_err();
    assert!(err.to_string().contains("index 0 is 2, outside 0..2"), "{err}");
}

#[test]
fn strided_slice_rotate_half_and_reverse() {
    let b = unary_graph(
        OpType::StridedSlice,
        (F32, &[2, 4], Encoding::Undefined),
        (F32, &[2, 2], Encoding::Undefined),
        |n| n.tensor_param_i32("ranges", &[2, 3], &[0, 2, 1, 2, 4, 1]),
    );
    let o = run1(b, &[&[0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]]);
    assert_eq!(o.to_real().unwrap(), vec![2.0, 3.0, 6.0, 7.0]);
    let b =
        unary_graph(OpType::StridedSlice, (F32, &[2, 4], Encoding::Undefined), (F32, &[4], Encoding::Undefined), |n| {
            n.tensor_param_i32("ranges", &[2, 3], &[-1, 0, 1, 0, 0, -1])
                .scalar("shrink_axes", Scalar::UInt32(1))
                .scalar("begin_mask", Scalar::UInt32(2))
                .scalar("end_mask", Scalar::UInt32(2))
        });
    let o = run1(b, &[&[0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]]);
    assert_eq!(o.to_real().unwrap(), vec![7.0, 6.0, 5.0, 4.0]);
}

#[test]
fn reductions() {
    for (op, keep, dims, want) in [
        (OpType::ReduceMin, true, vec![2, 1], vec![-1.0, 0.0]),
        (OpType::ReduceMax, false, vec![2], vec![3.0, 5.0]),
        (OpType::ReduceMean, false, vec![2], vec![1.0, 8.0 / 3.0]),
    ] {
        let b = unary_graph(op, (F32, &[2, 3], Encoding::Undefined), (F32, &dims, Encoding::Undefined), |n| {
            n.tensor_param_u32("axes", &[1], &[1]).scalar("keep_dims", Scalar::Bool8(keep))
        });
        let o = run1(b, &[&[1.0, 3.0, -1.0, 0.0, 5.0, 3.0]]).to_real().unwrap();
        close(&o, &want, 1e-6);
    }
}

#[test]
fn convert_cast_quantize_dequantize() {
    // Convert u16 activation -> u8 symmetric KV.
    let kv = Encoding::ScaleOffset(ScaleOffset::uint8_symmetric(0.1));
    let b = unary_graph(
        OpType::Convert,
        (DataType::UFixedPoint16, &[3], so(0.001, -30000)),
        (DataType::UFixedPoint8, &[3], kv),
        |n| n,
    );
    let o = run1(b, &[&[0.0, 1.0, -1.25]]);
    // 0 -> 128; 1.0 -> 10 + 128; -1.25 -> -12.5 -> -12 (even) + 128
    assert_eq!(o.codes().unwrap(), &[128, 138, 116]);
    // Cast f32 -> i32 truncates toward zero.
    let b = unary_graph(
        OpType::Cast,
        (F32, &[3], Encoding::Undefined),
        (DataType::Int32, &[3], Encoding::Undefined),
        |n| n,
    );
    assert_eq!(run1(b, &[&[1.9, -1.9, 7.0]]).codes().unwrap(), &[1, -1, 7]);
    // Cast u8 (offset -128) -> s8 (offset 0), same scale: code - 128.
    let b = unary_graph(
        OpType::Cast,
        (DataType::UFixedPoint8, &[2], so(0.5, -128)),
        (DataType::SFixedPoint8, &[2], so(0.5, 0)),
        |n| n,
    );
    assert_eq!(run1(b, &[&[-64.0, 10.0]]).codes().unwrap(), &[-128, 20]);
    // Quantize then Dequantize.
    let mut b = GraphBuilder::new("g");
    let x = b.input("x", F32, &[3], Encoding::Undefined);
    let q =
        b.node("q", OpType::Quantize).input(&x).output("q", DataType::UFixedPoint8, &[3], so(0.5, -10)).finish_one();
    b.node("dq", OpType::Dequantize).input(&q).graph_output("o", F32, &[3], Encoding::Undefined).finish();
    let g = b.finish().unwrap();
    let it = Interpreter::new(&g).unwrap();
    let all = it.run_all(&[it.input_from_real(0, &[0.0, 0.74, 200.0]).unwrap()]).unwrap();
    assert_eq!(all["q"].codes().unwrap(), &[10, 11, 255]);
    assert_eq!(all["o"].to_real().unwrap(), vec![0.0, 0.5, 122.5]);
}

fn naive_matmul(a: &[f32], b: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
    let mut out = vec![0f32; m * n];
    for i in 0..m {
        for j in 0..n {
            out[i * n + j] = (0..k).map(|p| f64::from(a[i * k + p]) * f64::from(b[p * n + j])).sum::<f64>() as f32;
        }
    }
    out
}

fn pseudo(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 33) as f32 / (1u64 << 31) as f32) * 2.0 - 1.0
        })
        .collect()
}

#[test]
fn matmul_batch_broadcast_and_transpose() {
    // a [2, 3, 4], b^T [5, 4] (transpose_in1) broadcast over the batch.
    let a = pseudo(24, 1);
    let bt = pseudo(20, 2);
    let mut b = GraphBuilder::new("g");
    let x = b.input("a", F32, &[2, 3, 4], Encoding::Undefined);
    let y = b.input("b", F32, &[5, 4], Encoding::Undefined);
    b.node("mm", OpType::MatMul)
        .input(&x)
        .input(&y)
        .scalar("transpose_in1", Scalar::Bool8(true))
        .graph_output("o", F32, &[2, 3, 5], Encoding::Undefined)
        .finish();
    let o = run1(b, &[&a, &bt]).to_real().unwrap();
    let bmat: Vec<f32> = (0..4).flat_map(|k| (0..5).map(move |n| (k, n))).map(|(k, n)| bt[n * 4 + k]).collect();
    let mut want = naive_matmul(&a[..12], &bmat, 3, 4, 5);
    want.extend(naive_matmul(&a[12..], &bmat, 3, 4, 5));
    close(&o, &want, 1e-5);
}

#[test]
fn fully_connected_with_bias() {
    let mut b = GraphBuilder::new("g");
    let x = b.input("x", F32, &[2, 3], Encoding::Undefined);
    let w =
        b.static_tensor("w", F32, &[2, 3], Encoding::Undefined, StaticData::from_f32(&[1.0, 0.0, -1.0, 0.5, 0.5, 0.5]));
    let bias = b.static_tensor("bias", F32, &[2], Encoding::Undefined, StaticData::from_f32(&[10.0, -10.0]));
    b.node("fc", OpType::FullyConnected)
        .inputs([&x, &w, &bias])
        .graph_output("o", F32, &[2, 2], Encoding::Undefined)
        .finish();
    let o = run1(b, &[&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]]).to_real().unwrap();
    assert_eq!(o, vec![8.0, -7.0, 8.0, -2.5]);
}

/// Independent NHWC x HWIO reference with explicit index arithmetic.
#[allow(clippy::too_many_arguments)]
fn naive_conv(
    x: &[f32],
    xd: [usize; 4],
    w: &[f32],
    wd: [usize; 4],
    stride: usize,
    pad: usize,
    group: usize,
    od: [usize; 4],
) -> Vec<f32> {
    let mut out = vec![0f32; od.iter().product()];
    let cin_g = wd[2];
    let cout_g = wd[3] / group;
    for n in 0..od[0] {
        for oy in 0..od[1] {
            for ox in 0..od[2] {
                for oc in 0..od[3] {
                    let g = oc / cout_g;
                    let mut acc = 0f64;
                    for ky in 0..wd[0] {
                        for kx in 0..wd[1] {
                            for ic in 0..cin_g {
                                let iy = (oy * stride + ky) as i64 - pad as i64;
                                let ix = (ox * stride + kx) as i64 - pad as i64;
                                if iy < 0 || ix < 0 || iy >= xd[1] as i64 || ix >= xd[2] as i64 {
                                    continue;
                                }
                                let xi = ((n * xd[1] + iy as usize) * xd[2] + ix as usize) * xd[3] + g * cin_g + ic;
                                let wi = ((ky * wd[1] + kx) * wd[2] + ic) * wd[3] + oc;
                                acc += f64::from(x[xi]) * f64::from(w[wi]);
                            }
                        }
                    }
                    out[((n * od[1] + oy) * od[2] + ox) * od[3] + oc] = acc as f32;
                }
            }
        }
    }
    out
}

#[test]
fn conv2d_general_stride_pad_group() {
    let x = pseudo(2 * 5 * 5 * 4, 3);
    let w = pseudo(3 * 3 * 2 * 6, 4);
    let mut b = GraphBuilder::new("g");
    let xi = b.input("x", F32, &[2, 5, 5, 4], Encoding::Undefined);
    let wi = b.static_tensor("w", F32, &[3, 3, 2, 6], Encoding::Undefined, StaticData::from_f32(&w));
    b.node("conv", OpType::Conv2d)
        .input(&xi)
        .input(&wi)
        .tensor_param_u32("stride", &[2], &[2, 2])
        .tensor_param_u32("pad_amount", &[2, 2], &[1, 1, 1, 1])
        .scalar("group", Scalar::UInt32(2))
        .graph_output("o", F32, &[2, 3, 3, 6], Encoding::Undefined)
        .finish();
    let o = run1(b, &[&x]).to_real().unwrap();
    let want = naive_conv(&x, [2, 5, 5, 4], &w, [3, 3, 2, 6], 2, 1, 2, [2, 3, 3, 6]);
    close(&o, &want, 1e-5);
}

/// An LPBQ weight `[1, 1, cin, cout]` from deterministic int4 values and per-block scales;
/// returns the encoding, the stored bytes and the real weights computed independently as
/// `q * scale2[o] * scale1[o][i / block]`.
fn lpbq_weight(cin: usize, cout: usize, block: usize, seed: u64) -> (Encoding, Vec<u8>, Vec<f32>) {
    let nb = cin / block;
    let q: Vec<i8> = pseudo(cin * cout, seed).iter().map(|v| (v * 7.0).round() as i8).collect();
    let block_scales: Vec<f32> = pseudo(cout * nb, seed + 1).iter().map(|v| 0.01 + 0.02 * v.abs()).collect();
    let parts = lpbq_from_block_scales(&block_scales, cout, nb).unwrap();
    let real: Vec<f32> = (0..cin * cout)
        .map(|flat| {
            let (i, o) = (flat / cout, flat % cout);
            (f64::from(q[flat]) * f64::from(parts.scale2[o].scale) * f64::from(parts.scale1[o * nb + i / block])) as f32
        })
        .collect();
    let bytes = Int4Storage::LowNibble.encode(&q, true).unwrap();
    (parts.into_encoding(3, nb as u32), bytes, real)
}

#[test]
fn conv2d_with_lpbq_weights_uses_the_encoded_expansion() {
    let (enc, bytes, w_real) = lpbq_weight(8, 4, 4, 10);
    let x = pseudo(3 * 8, 11);
    let mut b = GraphBuilder::new("g");
    let xi = b.input("x", F32, &[1, 1, 3, 8], Encoding::Undefined);
    let wi = b.static_tensor("w", DataType::SFixedPoint4, &[1, 1, 8, 4], enc, StaticData::new(bytes));
    b.node("conv", OpType::Conv2d)
        .input(&xi)
        .input(&wi)
        .tensor_param_u32("stride", &[2], &[1, 1])
        .tensor_param_u32("pad_amount", &[2, 2], &[0, 0, 0, 0])
        .graph_output("o", F32, &[1, 1, 3, 4], Encoding::Undefined)
        .finish();
    let o = run1(b, &[&x]).to_real().unwrap();
    close(&o, &naive_matmul(&x, &w_real, 3, 8, 4), 1e-6);
}

/// Conv2d (LPBQ) -> RmsNorm -> Softmax on uint16 activations, against (a) a naive reference
/// that fake-quantizes every intermediate with the same encodings (must agree within one code)
/// and (b) a pure f64 reference without intermediate quantization (within one output step).
#[test]
fn conv_rmsnorm_softmax_graph_matches_f32_references() {
    let (seq, cin, cout) = (4usize, 16usize, 8usize);
    let (w_enc, w_bytes, w_real) = lpbq_weight(cin, cout, 4, 20);
    let x_src = pseudo(seq * cin, 21);
    let gamma_src: Vec<f32> = pseudo(cout, 22).iter().map(|v| 1.0 + 0.5 * v).collect();

    // Float forward pass, used for calibration (min/max, like PTQ) and as reference (b).
    let x_enc = u16_range(-1.0, 1.0);
    let x_real: Vec<f32> = {
        let s = scale_offset_of(&x_enc);
        x_src.iter().map(|&v| s.dequantize(s.quantize(v, (0, 65535)))).collect()
    };
    let project = |s: usize, o: usize| -> f64 {
        (0..cin).map(|i| f64::from(x_real[s * cin + i]) * f64::from(w_real[i * cout + o])).sum()
    };
    let y_float: Vec<f64> = (0..seq * cout).map(|k| project(k / cout, k % cout)).collect();
    let (y_lo, y_hi) = min_max(&y_float);
    let y_enc = u16_range(y_lo as f32 * 1.1, y_hi as f32 * 1.1);
    let g_enc = u16_range(0.0, 2.0);
    let gamma_codes: Vec<u16> =
        gamma_src.iter().map(|&g| scale_offset_of(&g_enc).quantize(g, (0, 65535)) as u16).collect();
    let gamma_real: Vec<f64> =
        gamma_codes.iter().map(|&c| f64::from(scale_offset_of(&g_enc).dequantize(i64::from(c)))).collect();
    let norm = |y: &[f64], eps: f64| -> Vec<f64> {
        let ms = y.iter().map(|v| v * v).sum::<f64>() / y.len() as f64;
        y.iter().zip(&gamma_real).map(|(v, g)| v / (ms + eps).sqrt() * g).collect()
    };
    let n_float: Vec<f64> = y_float.chunks(cout).flat_map(|y| norm(y, 1e-6)).collect();
    let (n_lo, n_hi) = min_max(&n_float);
    let n_enc = u16_range(n_lo as f32 * 1.1, n_hi as f32 * 1.1);
    let beta_zero = scale_offset_of(&n_enc).quantize(0.0, (0, 65535)) as u16;
    let s_enc = so(1.0 / 65535.0, 0);

    let u16q = DataType::UFixedPoint16;
    let (s32, cin32, cout32) = (seq as u32, cin as u32, cout as u32);
    let mut b = GraphBuilder::new("conv_norm_softmax");
    let x = b.input("x", u16q, &[1, 1, s32, cin32], x_enc.clone());
    let w = b.static_tensor("w", DataType::SFixedPoint4, &[1, 1, cin32, cout32], w_enc, StaticData::new(w_bytes));
    let y = b
        .node("proj", OpType::Conv2d)
        .input(&x)
        .input(&w)
        .tensor_param_u32("stride", &[2], &[1, 1])
        .tensor_param_u32("pad_amount", &[2, 2], &[0, 0, 0, 0])
        .output("y", u16q, &[1, 1, s32, cout32], y_enc.clone())
        .finish_one();
    let gamma = b.static_tensor("gamma", u16q, &[cout32], g_enc, StaticData::from_u16(&gamma_codes));
    let beta = b.static_tensor("beta", u16q, &[cout32], n_enc.clone(), StaticData::from_u16(&vec![beta_zero; cout]));
    let n = b
        .node("norm", OpType::RmsNorm)
        .inputs([&y, &gamma, &beta])
        .scalar("epsilon", Scalar::Float32(1e-6))
        .tensor_param_u32("axes", &[1], &[3])
        .output("n", u16q, &[1, 1, s32, cout32], n_enc.clone())
        .finish_one();
    b.node("softmax", OpType::Softmax).input(&n).graph_output("p", u16q, &[1, 1, s32, cout32], s_enc).finish();
    let g = b.finish().unwrap();
    let it = Interpreter::new(&g).unwrap();
    let xin = it.input_from_real(0, &x_src).unwrap();
    assert_eq!(xin.to_real().unwrap(), x_real);
    let codes = it.run(&[xin]).unwrap().remove(0).codes().unwrap().to_vec();

    let softmax = |v: &[f64]| -> Vec<f64> {
        let max = v.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = v.iter().map(|x| (x - max).exp()).collect();
        let sum: f64 = e.iter().sum();
        e.iter().map(|x| x / sum).collect()
    };
    let fq = |enc: &Encoding, v: f64| -> f64 {
        let s = scale_offset_of(enc);
        let q = (v / f64::from(s.scale)).round_ties_even() - f64::from(s.offset);
        f64::from(s.scale) * (q.clamp(0.0, 65535.0) + f64::from(s.offset))
    };
    let step = 1.0 / 65535.0;

    // (a) Same quantization points (y and n fake-quantized; beta is an exact zero): one code.
    let beta_real = f64::from(scale_offset_of(&n_enc).dequantize(i64::from(beta_zero)));
    assert_eq!(beta_real, 0.0);
    let fake_quant: Vec<f64> = y_float
        .chunks(cout)
        .flat_map(|y| {
            let yq: Vec<f64> = y.iter().map(|&v| fq(&y_enc, v)).collect();
            let nq: Vec<f64> = norm(&yq, 1e-6).iter().map(|&v| fq(&n_enc, v)).collect();
            softmax(&nq)
        })
        .collect();
    for (i, (&c, r)) in codes.iter().zip(&fake_quant).enumerate() {
        let want = (r / step).round_ties_even();
        assert!((c as f64 - want).abs() <= 1.0, "element {i}: code {c}, fake-quant reference {want}");
    }

    // (b) Pure float (no intermediate rounding): within one output quantization step. With
    // uint16 intermediates the roundings of y and n (<= half a step of each) move the softmax
    // inputs by ~1e-4 here, which changes the probabilities by less than one output step.
    let pure: Vec<f64> = n_float.chunks(cout).flat_map(softmax).collect();
    for (i, (&c, r)) in codes.iter().zip(&pure).enumerate() {
        let got = c as f64 * step;
        assert!((got - r).abs() <= step, "element {i}: {got} vs float reference {r}");
    }
}

fn u16_range(lo: f32, hi: f32) -> Encoding {
    let scale = (hi - lo) / 65535.0;
    Encoding::from_zero_point(scale, (-lo / scale).round() as i32)
}

fn scale_offset_of(enc: &Encoding) -> ScaleOffset {
    match enc {
        Encoding::ScaleOffset(s) => *s,
        other => panic!("expected SCALE_OFFSET, found {other:?}"),
    }
}

fn min_max(v: &[f64]) -> (f64, f64) {
    v.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &x| (lo.min(x), hi.max(x)))
}

#[test]
fn run_checks_input_metadata_and_count() {
    let b =
        unary_graph(OpType::ElementWiseNeg, (F32, &[2], Encoding::Undefined), (F32, &[2], Encoding::Undefined), |n| n);
    let g = b.finish().unwrap();
    let it = Interpreter::new(&g).unwrap();
    assert!(matches!(it.run(&[]), Err(InterpError::InputCount { expected: 1, found: 0, .. })));
    let wrong =
        TensorValue { dtype: F32, dims: vec![3], encoding: Encoding::Undefined, values: Values::Real(vec![0.0; 3]) };
    assert!(matches!(it.run(&[wrong]), Err(InterpError::Input { index: 0, .. })));
    let mut bad = g.clone();
    bad.outputs.clear();
    assert!(matches!(Interpreter::new(&bad), Err(InterpError::Invalid(_))));
}

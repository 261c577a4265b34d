//! A tiny one-layer, attention-like graph in the shape mllm's Qwen3 AOT lowering produces
//! (mllm/backends/qnn/aot/visitor): embedding Gather, RmsNorm, LPBQ 1x1 Conv2d projections, q-norm,
//! RoPE with rotate-half (StridedSlice + Neg + Concat), uint8 symmetric KV cache (Transpose +
//! Convert + Concat), scaled scores, masked softmax (ReduceMin + Add + Equal + Select + Softmax),
//! output projection, residual, SiLU (Sigmoid + Multiply) and a per-channel FullyConnected head.

#![allow(dead_code)]

use backend_qnn::encoding::{lpbq_from_block_scales, Int4Storage, ScaleOffset};
use backend_qnn::{DataType, Encoding, GraphBuilder, OpType, QnnGraph, Scalar, StaticData, TensorRef};

pub const SEQ: u32 = 4;
pub const HIDDEN: u32 = 8;
pub const PAST: u32 = 4;
pub const VOCAB: u32 = 16;
pub const MAX_POS: u32 = 32;
pub const BLOCK: u32 = 4;

const U16: DataType = DataType::UFixedPoint16;
const U8: DataType = DataType::UFixedPoint8;

/// Deterministic values in [-1, 1).
pub fn pseudo(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 33) as f32 / (1u64 << 31) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// uint16 encoding covering [lo, hi].
pub fn u16_range(lo: f32, hi: f32) -> Encoding {
    let scale = (hi - lo) / 65535.0;
    Encoding::from_zero_point(scale, (-lo / scale).round() as i32)
}

fn codes_u16(enc: &Encoding, values: &[f32]) -> StaticData {
    let Encoding::ScaleOffset(so) = enc else { panic!("per-tensor encoding expected") };
    let codes: Vec<u16> = values.iter().map(|&v| so.quantize(v, (0, 65535)) as u16).collect();
    StaticData::from_u16(&codes)
}

fn kv() -> Encoding {
    Encoding::ScaleOffset(ScaleOffset::uint8_symmetric(4.0 / 128.0))
}

/// A 1x1 Conv2d with an LPBQ weight `[1, 1, HIDDEN, HIDDEN]`.
fn lpbq_proj(b: &mut GraphBuilder, name: &str, x: &TensorRef, out_enc: Encoding, seed: u64) -> TensorRef {
    let (cin, cout) = (HIDDEN as usize, HIDDEN as usize);
    let nb = (HIDDEN / BLOCK) as usize;
    let q: Vec<i8> = pseudo(cin * cout, seed).iter().map(|v| (v * 7.0).round() as i8).collect();
    let scales: Vec<f32> = pseudo(cout * nb, seed + 1).iter().map(|v| 0.02 + 0.02 * v.abs()).collect();
    let enc = lpbq_from_block_scales(&scales, cout, nb).unwrap().into_encoding(3, nb as u32);
    let bytes = Int4Storage::LowNibble.encode(&q, true).unwrap();
    let w = b.static_tensor(
        format!("{name}.weight"),
        DataType::SFixedPoint4,
        &[1, 1, HIDDEN, HIDDEN],
        enc,
        StaticData::new(bytes),
    );
    b.node(name, OpType::Conv2d)
        .input(x)
        .input(&w)
        .tensor_param_u32("stride", &[2], &[1, 1])
        .tensor_param_u32("pad_amount", &[2, 2], &[0, 0, 0, 0])
        .tensor_param_u32("dilation", &[2], &[1, 1])
        .scalar("group", Scalar::UInt32(1))
        .output(format!("{name}.out"), U16, &[1, 1, SEQ, HIDDEN], out_enc)
        .finish_one()
}

fn rms_norm(b: &mut GraphBuilder, name: &str, x: &TensorRef, out_enc: Encoding, seed: u64) -> TensorRef {
    let g_enc = u16_range(0.0, 2.0);
    let gamma: Vec<f32> = pseudo(HIDDEN as usize, seed).iter().map(|v| 1.0 + 0.5 * v).collect();
    let g = b.static_tensor(format!("{name}.weight"), U16, &[HIDDEN], g_enc.clone(), codes_u16(&g_enc, &gamma));
    // mllm passes a zero bias quantized with the output's encoding.
    let beta = b.static_tensor(
        format!("{name}_runtime_bias"),
        U16,
        &[HIDDEN],
        out_enc.clone(),
        codes_u16(&out_enc, &vec![0.0; HIDDEN as usize]),
    );
    b.node(name, OpType::RmsNorm)
        .inputs([x, &g, &beta])
        .scalar("epsilon", Scalar::Float32(1e-6))
        .tensor_param_u32("axes", &[1], &[3])
        .output(format!("{name}.out"), U16, &[1, 1, SEQ, HIDDEN], out_enc)
        .finish_one()
}

fn constant(b: &mut GraphBuilder, name: &str, enc: Encoding, value: f32) -> TensorRef {
    b.static_tensor(name, U16, &[1], enc.clone(), codes_u16(&enc, &[value]))
}

/// The example graph; `name` becomes the graph (and snapshot) name.
pub fn tiny_attention(name: &str) -> QnnGraph {
    let mut b = GraphBuilder::new(name);
    let act = u16_range(-4.0, 4.0);
    let ids = b.input("input_ids", DataType::Int32, &[1, SEQ], Encoding::Undefined);
    let pos = b.input("position_ids", DataType::Int32, &[SEQ], Encoding::Undefined);
    let mask_enc = Encoding::from_zero_point(0.001 / 65535.0, 65535);
    let mask = b.input("attention_mask", U16, &[1, 1, SEQ, PAST + SEQ], mask_enc.clone());
    let past_k = b.input("past_key", U8, &[1, 1, HIDDEN, PAST], kv());
    let past_v = b.input("past_value", U8, &[1, 1, PAST, HIDDEN], kv());

    // Embedding: Gather with the table first, output shares the table's encoding.
    let emb_enc = u16_range(-1.0, 1.0);
    let table = b.static_tensor(
        "model.embed_tokens.weight",
        U16,
        &[VOCAB, HIDDEN],
        emb_enc.clone(),
        codes_u16(&emb_enc, &pseudo((VOCAB * HIDDEN) as usize, 1)),
    );
    let h = b
        .node("model.embed_tokens", OpType::Gather)
        .input(&table)
        .input(&ids)
        .scalar("axis", Scalar::Int32(0))
        .output("h0", U16, &[1, SEQ, HIDDEN], emb_enc.clone())
        .finish_one();
    let h = b
        .node("model.embed_tokens.view", OpType::Reshape)
        .input(&h)
        .output("h", U16, &[1, 1, SEQ, HIDDEN], emb_enc)
        .finish_one();

    let hn = rms_norm(&mut b, "model.layers.0.input_layernorm", &h, act.clone(), 2);
    let q = lpbq_proj(&mut b, "model.layers.0.self_attn.q_proj", &hn, act.clone(), 10);
    let k = lpbq_proj(&mut b, "model.layers.0.self_attn.k_proj", &hn, act.clone(), 20);
    let v = lpbq_proj(&mut b, "model.layers.0.self_attn.v_proj", &hn, act.clone(), 30);
    let q = rms_norm(&mut b, "model.layers.0.self_attn.q_norm", &q, act.clone(), 3);

    // RoPE on q: q * cos + rotate_half(q) * sin, tables gathered by position.
    let rope_enc = u16_range(-1.0, 1.0);
    let rope_table = |b: &mut GraphBuilder, name: &str, f: fn(f32) -> f32| {
        let values: Vec<f32> = (0..MAX_POS * HIDDEN)
            .map(|i| {
                let (p, d) = (i / HIDDEN, i % HIDDEN % (HIDDEN / 2));
                f(p as f32 / 10000f32.powf(2.0 * d as f32 / HIDDEN as f32))
            })
            .collect();
        let t = b.static_tensor(
            format!("model.mllm_max_{name}_embedding"),
            U16,
            &[MAX_POS, HIDDEN],
            rope_enc.clone(),
            codes_u16(&rope_enc, &values),
        );
        b.node(format!("model.{name}_gather"), OpType::Gather)
            .input(&t)
            .input(&pos)
            .scalar("axis", Scalar::Int32(0))
            .output(name, U16, &[SEQ, HIDDEN], rope_enc.clone())
            .finish_one()
    };
    let cos = rope_table(&mut b, "cos", f32::cos);
    let sin = rope_table(&mut b, "sin", f32::sin);
    let half = HIDDEN as i32 / 2;
    let slice = |b: &mut GraphBuilder, name: &str, begin: i32, end: i32| {
        b.node(name, OpType::StridedSlice)
            .input(&q)
            .tensor_param_i32("ranges", &[4, 3], &[0, 1, 1, 0, 1, 1, 0, SEQ as i32, 1, begin, end, 1])
            .output(format!("{name}.out"), U16, &[1, 1, SEQ, HIDDEN / 2], act.clone())
            .finish_one()
    };
    let q1 = slice(&mut b, "model.layers.0.self_attn.q_rope.slice_lo", 0, half);
    let q2 = slice(&mut b, "model.layers.0.self_attn.q_rope.slice_hi", half, 2 * half);
    let nq2 = b
        .node("model.layers.0.self_attn.q_rope.neg", OpType::ElementWiseNeg)
        .input(&q2)
        .output("q_rope.neg", U16, &[1, 1, SEQ, HIDDEN / 2], act.clone())
        .finish_one();
    let rot = b
        .node("model.layers.0.self_attn.q_rope.cat", OpType::Concat)
        .input(&nq2)
        .input(&q1)
        .scalar("axis", Scalar::UInt32(3))
        .output("q_rope.rot", U16, &[1, 1, SEQ, HIDDEN], act.clone())
        .finish_one();
    let qc = b
        .node("model.layers.0.self_attn.q_rope.mul_cos", OpType::ElementWiseMultiply)
        .input(&q)
        .input(&cos)
        .output("q_rope.qc", U16, &[1, 1, SEQ, HIDDEN], act.clone())
        .finish_one();
    let rs = b
        .node("model.layers.0.self_attn.q_rope.mul_sin", OpType::ElementWiseMultiply)
        .input(&rot)
        .input(&sin)
        .output("q_rope.rs", U16, &[1, 1, SEQ, HIDDEN], act.clone())
        .finish_one();
    let q = b
        .node("model.layers.0.self_attn.q_rope.add", OpType::ElementWiseAdd)
        .input(&qc)
        .input(&rs)
        .output("q_rope", U16, &[1, 1, SEQ, HIDDEN], act.clone())
        .finish_one();

    // KV cache: K stored transposed [B, H, D, ctx]; new entries are uint8 symmetric outputs.
    let kt = b
        .node("model.layers.0.self_attn.k_transpose", OpType::Transpose)
        .input(&k)
        .tensor_param_u32("perm", &[4], &[0, 1, 3, 2])
        .output("k_t", U16, &[1, 1, HIDDEN, SEQ], act.clone())
        .finish_one();
    let present_k = b
        .node("model.layers.0.self_attn.k_cast", OpType::Convert)
        .input(&kt)
        .graph_output("present_key", U8, &[1, 1, HIDDEN, SEQ], kv())
        .finish_one();
    let present_v = b
        .node("model.layers.0.self_attn.v_cast", OpType::Convert)
        .input(&v)
        .graph_output("present_value", U8, &[1, 1, SEQ, HIDDEN], kv())
        .finish_one();
    let k_all = b
        .node("model.layers.0.self_attn.k_cat", OpType::Concat)
        .input(&past_k)
        .input(&present_k)
        .scalar("axis", Scalar::UInt32(3))
        .output("k_all", U8, &[1, 1, HIDDEN, PAST + SEQ], kv())
        .finish_one();
    let v_all = b
        .node("model.layers.0.self_attn.v_cat", OpType::Concat)
        .input(&past_v)
        .input(&present_v)
        .scalar("axis", Scalar::UInt32(2))
        .output("v_all", U8, &[1, 1, PAST + SEQ, HIDDEN], kv())
        .finish_one();

    // Scores, scaling and masked softmax.
    let score_enc = u16_range(-40.0, 40.0);
    let dims_s = [1, 1, SEQ, PAST + SEQ];
    let s = b
        .node("model.layers.0.self_attn.qk", OpType::MatMul)
        .input(&q)
        .input(&k_all)
        .output("scores", U16, &dims_s, score_enc.clone())
        .finish_one();
    let scaling =
        constant(&mut b, "model.layers.0.self_attn.scaling", u16_range(0.0, 1.0), 1.0 / (HIDDEN as f32).sqrt());
    let scaled_enc = u16_range(-15.0, 15.0);
    let s = b
        .node("model.layers.0.self_attn.scale", OpType::ElementWiseMultiply)
        .input(&s)
        .input(&scaling)
        .output("scores_scaled", U16, &dims_s, scaled_enc.clone())
        .finish_one();
    let mn = b
        .node("model.layers.0.self_attn.amin", OpType::ReduceMin)
        .input(&s)
        .tensor_param_u32("axes", &[1], &[3])
        .scalar("keep_dims", Scalar::Bool8(true))
        .output("scores_min", U16, &[1, 1, SEQ, 1], scaled_enc.clone())
        .finish_one();
    let neg20 = constant(&mut b, "model.layers.0.self_attn.neg_20", u16_range(-20.0, 0.0), -20.0);
    let low_enc = u16_range(-40.0, 0.0);
    let low = b
        .node("model.layers.0.self_attn.min_minus_20", OpType::ElementWiseAdd)
        .input(&mn)
        .input(&neg20)
        .output("scores_low", U16, &[1, 1, SEQ, 1], low_enc.clone())
        .finish_one();
    let zero = b.static_tensor(
        "model.layers.0.self_attn.constant_zero",
        U16,
        &[1],
        mask_enc.clone(),
        codes_u16(&mask_enc, &[0.0]),
    );
    let attend = b
        .node("model.layers.0.self_attn.mask_eq", OpType::ElementWiseEqual)
        .input(&mask)
        .input(&zero)
        .output("attend", DataType::Bool8, &dims_s, Encoding::Undefined)
        .finish_one();
    let masked = b
        .node("model.layers.0.self_attn.where", OpType::ElementWiseSelect)
        .inputs([&attend, &s, &low])
        .output("scores_masked", U16, &dims_s, low_enc)
        .finish_one();
    let p = b
        .node("model.layers.0.self_attn.softmax", OpType::Softmax)
        .input(&masked)
        .scalar("axis", Scalar::UInt32(3))
        .scalar("beta", Scalar::Float32(1.0))
        .output("probs", U16, &dims_s, Encoding::from_zero_point(1.0 / 65535.0, 0))
        .finish_one();
    let o = b
        .node("model.layers.0.self_attn.pv", OpType::MatMul)
        .input(&p)
        .input(&v_all)
        .output("attn", U16, &[1, 1, SEQ, HIDDEN], act.clone())
        .finish_one();
    let o = lpbq_proj(&mut b, "model.layers.0.self_attn.o_proj", &o, act.clone(), 40);
    let h2 = b
        .node("model.layers.0.residual", OpType::ElementWiseAdd)
        .input(&h)
        .input(&o)
        .output("h2", U16, &[1, 1, SEQ, HIDDEN], act.clone())
        .finish_one();

    // SiLU as x * sigmoid(x); sigmoid output uses mllm's fixed 1/65536 encoding.
    let sg = b
        .node("model.layers.0.act.sigmoid", OpType::Sigmoid)
        .input(&h2)
        .output("sigmoid", U16, &[1, 1, SEQ, HIDDEN], Encoding::from_zero_point(1.0 / 65536.0, 0))
        .finish_one();
    let a = b
        .node("model.layers.0.act.mul", OpType::ElementWiseMultiply)
        .input(&h2)
        .input(&sg)
        .output("silu", U16, &[1, 1, SEQ, HIDDEN], act.clone())
        .finish_one();
    let a =
        b.node("lm_head.view", OpType::Reshape).input(&a).output("lm_head.in", U16, &[SEQ, HIDDEN], act).finish_one();

    // Head: FullyConnected with an int8 per-channel weight [VOCAB, HIDDEN].
    let w: Vec<i8> = pseudo((VOCAB * HIDDEN) as usize, 50).iter().map(|v| (v * 127.0).round() as i8).collect();
    let scales: Vec<ScaleOffset> =
        pseudo(VOCAB as usize, 51).iter().map(|v| ScaleOffset { scale: 0.002 + 0.001 * v.abs(), offset: 0 }).collect();
    let w = b.static_tensor(
        "lm_head.weight",
        DataType::SFixedPoint8,
        &[VOCAB, HIDDEN],
        Encoding::AxisScaleOffset { axis: 0, scale_offsets: scales.into() },
        StaticData::new(w.iter().map(|&v| v as u8).collect::<Vec<_>>()),
    );
    b.node("lm_head", OpType::FullyConnected)
        .input(&a)
        .input(&w)
        .scalar("keep_dims", Scalar::Bool8(false))
        .graph_output("logits", U16, &[SEQ, VOCAB], u16_range(-8.0, 8.0))
        .finish();
    b.finish().expect("the example graph is valid")
}

//! Llama, Llama 3 and Qwen2 carried through the whole AOT flow, like Qwen3 in `qwen3_lowering.rs`:
//! each tiny float fixture (hidden 32, 2 layers, 4 query / 2 KV heads, vocab 128) is calibrated and
//! quantized in Rust (W4A16 LPBQ block 16, KV8; [`AotModel::calibrated`]), traced at chunk 4 and
//! chunk 1 with context 16, run through `Pipeline::qnn_aot` and lowered with one `QnnLowering`.
//!
//! - Both graphs validate and follow mllm's I/O contract.
//! - The QNN reference interpreter's logits match the CPU fake-quant run of the same IR within
//!   SQNR >= 35 dB, new K/V within one u8 step.
//! - The op census shows each model's structure: no q/k RMSNorms (Llama, Qwen2), a bias on
//!   Qwen2's q/k/v convs (QNN int32, scale = input scale × channel scale).
//! - The chunk-1 graph's structure (node list and summary) is snapshotted per model.

mod model_common;

use backend_qnn::graph::StaticData;
use backend_qnn::{DataType, Encoding, OpType, QnnGraph, TensorType};
use compiler::passes::{ParamError, QuantParamProvider, StoredTensor};
use model_common::{op_census, AotModel, CHUNK};

/// Op census of the chunk-N graph of a 2-layer model without q/k norm; `bias` = Qwen2.
fn expected_census() -> Vec<(String, usize)> {
    [
        ("Concat", 8),
        ("Conv2d", 15),
        ("Dequantize", 4),
        ("ElementWiseAdd", 10),
        ("ElementWiseEqual", 2),
        ("ElementWiseMultiply", 14),
        ("ElementWiseNeg", 4),
        ("ElementWiseSelect", 2),
        // Embedding, 2 RoPE tables, 4 GQA repeats.
        ("Gather", 7),
        ("MatMul", 4),
        ("Quantize", 4),
        ("ReduceMin", 2),
        ("Reshape", 27),
        // 2 per layer and the final norm: no q/k norm.
        ("RmsNorm", 5),
        ("Sigmoid", 2),
        ("Softmax", 2),
        ("StridedSlice", 8),
        ("Transpose", 10),
    ]
    .iter()
    .map(|(t, n)| (t.to_string(), *n))
    .collect()
}

fn check(fixture: &str) -> (AotModel, QnnGraph, QnnGraph) {
    let model = AotModel::calibrated(fixture);
    let (sn, s1) = model.lowered_pair();
    let l = model.cfg.num_hidden_layers;
    for (g, chunk) in [(&sn, CHUNK), (&s1, 1)] {
        backend_qnn::validate(g).unwrap_or_else(|e| panic!("{fixture}: {e}"));
        assert_eq!(g.name, format!("model.0.s{chunk}"));
        let mut inputs = vec!["input_ids".to_string(), "position_ids".into(), "attention_mask".into()];
        inputs.extend((0..l).map(|i| format!("past_key_{i}")));
        inputs.extend((0..l).map(|i| format!("past_value_{i}")));
        assert_eq!(g.inputs, inputs, "{fixture}");
        let db = model.logits_sqnr(g, chunk);
        eprintln!("{fixture} chunk {chunk}: logits SQNR (QNN reference interpreter vs CPU fake-quant) = {db:.2} dB");
        assert!(db >= 35.0, "{fixture} chunk {chunk}: logits SQNR {db:.2} dB < 35 dB");
    }
    eprintln!("{fixture} s{CHUNK} census: {:?}", op_census(&sn));
    (model, sn, s1)
}

fn snapshot(name: &str, g: &QnnGraph) {
    insta::with_settings!({
        snapshot_path => concat!(env!("CARGO_MANIFEST_DIR"), "/../snapshots"),
        prepend_module_to_snapshot => false,
        omit_expression => true,
    }, {
        insta::assert_snapshot!(name, backend_qnn::artifacts::summary::structure(g));
    });
}

#[test]
fn llama_lowers_and_matches_fake_quant() {
    let (_, sn, s1) = check("llama-dev-f32");
    assert_eq!(op_census(&sn), expected_census());
    snapshot("llama__model__qnn_s1", &s1);
}

#[test]
fn llama3_with_rope_scaling_lowers_and_matches_fake_quant() {
    let (_, sn, _) = check("llama3-dev-f32");
    assert_eq!(op_census(&sn), expected_census());
    // head_dim 16 != hidden / heads: the RoPE tables are [1, 1024, 16], o_proj's filter is [.., 64, 32].
    assert_eq!(sn.tensor("model_mllm_max_sin_embedding").unwrap().dims, vec![1, 1024, 16]);
    assert_eq!(sn.tensor("model_layers_0_self_attn_o_proj_weight").unwrap().dims, vec![1, 1, 64, 32]);
    // The llama3-scaled table is what the graph holds: dequantized row 100 is within one step of
    // sin(100 · inv_freq) with the frequencies HF computed (`inv_freq.safetensors`).
    let t = sn.tensor("model_mllm_max_sin_embedding").unwrap();
    let Encoding::ScaleOffset(so) = t.encoding else { panic!() };
    let codes = t.data.as_ref().unwrap().bytes().chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]]));
    let row: Vec<f32> = codes.skip(100 * 16).take(16).map(|c| (i32::from(c) + so.offset) as f32 * so.scale).collect();
    let hf = checkpoint::SafetensorsCheckpoint::open_file(model_common::fixture("llama3-dev-f32/inv_freq.safetensors"));
    let inv = hf.unwrap().read_f32("llama3_inv_freq").unwrap();
    assert_eq!(inv.len(), 8);
    for (i, f) in inv.iter().enumerate() {
        let want = (100.0 * f).sin();
        assert!((row[i] - want).abs() <= so.scale, "sin row 100 col {i}: {} vs {want}", row[i]);
    }
}

#[test]
fn qwen2_lowers_with_int32_biases_and_matches_fake_quant() {
    let (model, sn, s1) = check("qwen2-dev-f32");
    assert_eq!(op_census(&sn), expected_census());
    // q/k/v convs take a third input, the int32 bias; o_proj, the MLP and lm_head do not.
    let with_bias: Vec<&str> = sn
        .nodes
        .iter()
        .filter(|n| n.op_type == OpType::Conv2d && n.inputs.len() == 3)
        .map(|n| n.name.as_str())
        .collect();
    assert_eq!(with_bias.len(), 6, "{with_bias:?}");
    assert!(with_bias.iter().all(|n| n.ends_with("q_proj") || n.ends_with("k_proj") || n.ends_with("v_proj")));
    let conv = sn.nodes.iter().find(|n| n.name == "model.layers.1.self_attn.k_proj").unwrap();
    let (x, w, b) =
        (sn.tensor(&conv.inputs[0]).unwrap(), sn.tensor(&conv.inputs[1]).unwrap(), sn.tensor(&conv.inputs[2]).unwrap());
    assert_eq!((b.dtype, b.tensor_type, b.dims.clone()), (DataType::SFixedPoint32, TensorType::Static, vec![16]));
    let (
        Encoding::ScaleOffset(xs),
        Encoding::BlockwiseExpansion(bw),
        Encoding::AxisScaleOffset { axis, scale_offsets },
    ) = (&x.encoding, &w.encoding, &b.encoding)
    else {
        panic!("encodings {:?} {:?} {:?}", x.encoding, w.encoding, b.encoding)
    };
    assert_eq!(*axis, 0);
    let float_bias = {
        let ckpt = checkpoint::SafetensorsCheckpoint::open(model_common::fixture("qwen2-dev-f32")).unwrap();
        ckpt.read_f32("model.layers.1.self_attn.k_proj.bias").unwrap()
    };
    assert!(float_bias.iter().any(|&v| v.abs() > 1e-3), "the fixture's biases are non-zero");
    let codes: Vec<i32> = b
        .data
        .as_ref()
        .unwrap()
        .bytes()
        .chunks_exact(4)
        .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    for (c, so) in scale_offsets.iter().enumerate() {
        // scale = input scale × the LPBQ channel scale (scale2), offset 0, codes round(b / scale).
        assert_eq!((so.scale, so.offset), (xs.scale * bw.scale_offsets[c].scale, 0), "channel {c}");
        assert_eq!(codes[c], (float_bias[c] / so.scale).round() as i32, "channel {c}");
    }
    // One bias buffer for both graphs.
    let b1 = s1.tensor(&b.name).unwrap();
    assert!(b.data.as_ref().unwrap().shares_buffer_with(b1.data.as_ref().unwrap()));
    // Without the biases the logits move far more than the 35 dB budget: they are really applied.
    let mut no_bias = sn.clone();
    for t in no_bias.tensors.iter_mut().filter(|t| t.dtype == DataType::SFixedPoint32) {
        let n = t.dims[0] as usize;
        t.data = Some(StaticData::from_i32(&vec![0; n]));
    }
    let qnn = model.run_qnn(&no_bias, CHUNK)[0].to_real().unwrap();
    let cpu = model.run_cpu_fake_quant(&model.compiled(CHUNK), CHUNK);
    let db = model_common::sqnr_db(&qnn, cpu[0].as_f32().unwrap());
    eprintln!("qwen2 without biases: logits SQNR {db:.2} dB");
    assert!(db < 35.0, "dropping the biases gives {db:.2} dB; the check would not see them");
    snapshot("qwen2__model__qnn_s1", &s1);
}

#[test]
fn a_bias_that_does_not_fit_its_conv_is_named() {
    let model = AotModel::calibrated("qwen2-dev-f32");
    let short = ShortBias { inner: &model.ckpt, key: "model.layers.1.self_attn.v_proj.bias" };
    let err = backend_qnn::QnnLowering::new(&short, backend_qnn::LowerOptions::default())
        .lower_program(&model.compiled(1))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(
            "graph `model.0.s1`: weight `model.layers.1.self_attn.v_proj.bias`: has 15 values, the filter has 16"
        ),
        "{err}"
    );
}

/// A checkpoint whose bias `key` lost its last value.
struct ShortBias<'a> {
    inner: &'a checkpoint::SafetensorsCheckpoint,
    key: &'static str,
}

impl QuantParamProvider for ShortBias<'_> {
    fn name(&self) -> String {
        QuantParamProvider::name(self.inner)
    }
    fn tensor(&self, key: &str) -> Result<Option<StoredTensor>, ParamError> {
        self.inner.tensor(key)
    }
    fn read_f32(&self, key: &str) -> Result<Vec<f32>, ParamError> {
        let mut v = QuantParamProvider::read_f32(self.inner, key)?;
        if key == self.key {
            v.pop();
        }
        Ok(v)
    }
    fn read_i32(&self, key: &str) -> Result<Vec<i32>, ParamError> {
        QuantParamProvider::read_i32(self.inner, key)
    }
    fn int_range(&self, key: &str) -> Result<Option<(i64, i64)>, ParamError> {
        self.inner.int_range(key)
    }
    fn read_bytes(&self, key: &str) -> Result<Vec<u8>, ParamError> {
        QuantParamProvider::read_bytes(self.inner, key)
    }
}

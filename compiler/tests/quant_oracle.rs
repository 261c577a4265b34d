//! The quantization math against pymllm's own export of the tiny Qwen3 checkpoint.
//!
//! `qwen3-dev-f32` holds the float weights; `pymllm-qwen3-dev-f32` is what mllm's Python made
//! of them (see `tests/data/PROVENANCE.md`). Weights are compared exactly; activation parameters
//! are recomputed from the observer ranges pymllm stored next to them.

use std::collections::BTreeMap;
use std::path::PathBuf;

use compiler::quant::fake_quant::quantize_slice_u16;
use compiler::quant::lpbq::{decode_lpbq, lpbq_block_quantize, sign_extend_nibble, LpbqShape};
use compiler::quant::observer::{calculate_qparams, ObserverScheme};
use compiler::quant::spec::{EPS_16BIT, EPS_8BIT, KV_ZERO_POINT, SIGMOID_SCALE};
use compiler::quant::uint16::{export_u16, quantize_u16_weight};
use safetensors::{Dtype, SafeTensors};

fn data(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data").join(rel)
}

/// A loaded safetensors file with typed accessors.
struct Checkpoint {
    bytes: Vec<u8>,
}

impl Checkpoint {
    fn open(rel: &str) -> Self {
        let path = data(rel);
        let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        Checkpoint { bytes }
    }

    fn tensors(&self) -> SafeTensors<'_> {
        SafeTensors::deserialize(&self.bytes).expect("valid safetensors")
    }

    fn metadata(&self) -> BTreeMap<String, String> {
        let (_, meta) = SafeTensors::read_metadata(&self.bytes).expect("header");
        meta.metadata().clone().map(|m| m.into_iter().collect()).unwrap_or_default()
    }

    fn has(&self, name: &str) -> bool {
        self.tensors().tensor(name).is_ok()
    }

    fn raw(&self, name: &str, dtype: Dtype) -> (Vec<usize>, Vec<u8>) {
        let st = self.tensors();
        let t = st.tensor(name).unwrap_or_else(|e| panic!("tensor `{name}`: {e}"));
        assert_eq!(t.dtype(), dtype, "dtype of `{name}`");
        (t.shape().to_vec(), t.data().to_vec())
    }

    fn f32(&self, name: &str) -> (Vec<usize>, Vec<f32>) {
        let (shape, b) = self.raw(name, Dtype::F32);
        let v = b.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
        (shape, v)
    }

    fn i32(&self, name: &str) -> Vec<i32> {
        let (_, b) = self.raw(name, Dtype::I32);
        b.chunks_exact(4).map(|c| i32::from_le_bytes(c.try_into().unwrap())).collect()
    }

    fn u16(&self, name: &str) -> Vec<u16> {
        let (_, b) = self.raw(name, Dtype::U16);
        b.chunks_exact(2).map(|c| u16::from_le_bytes(c.try_into().unwrap())).collect()
    }

    fn i8(&self, name: &str) -> (Vec<usize>, Vec<i8>) {
        let (shape, b) = self.raw(name, Dtype::I8);
        (shape, b.into_iter().map(|v| v as i8).collect())
    }

    fn u8(&self, name: &str) -> Vec<u8> {
        self.raw(name, Dtype::U8).1
    }

    fn scalar_f32(&self, name: &str) -> f32 {
        let (_, v) = self.f32(name);
        assert_eq!(v.len(), 1, "`{name}` is a scalar");
        v[0]
    }

    fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.tensors().names().into_iter().map(str::to_string).collect();
        names.sort();
        names
    }
}

fn float_model() -> Checkpoint {
    Checkpoint::open("qwen3-dev-f32/model.safetensors")
}

fn pymllm_model() -> Checkpoint {
    Checkpoint::open("pymllm-qwen3-dev-f32/model.safetensors")
}

fn block_size() -> usize {
    let text = std::fs::read_to_string(data("pymllm-qwen3-dev-f32/config.json")).unwrap();
    let cfg: serde_json::Value = serde_json::from_str(&text).unwrap();
    cfg["linear_block_size"].as_u64().unwrap() as usize
}

/// Every LPBQ linear of the export, with the float weight it came from (lm_head is tied).
fn linears(float: &Checkpoint, export: &Checkpoint) -> Vec<(String, String)> {
    export
        .names()
        .into_iter()
        .filter_map(|n| n.strip_suffix(".scale1").map(str::to_string))
        .map(|op| {
            let source = if op == "lm_head" { "model.embed_tokens.weight".to_string() } else { format!("{op}.weight") };
            assert!(float.has(&source), "float weight `{source}` for `{op}`");
            (op, source)
        })
        .collect()
}

#[test]
fn lpbq_reproduces_pymllm_export_for_every_linear() {
    let (float, export) = (float_model(), pymllm_model());
    let bs = block_size();
    assert_eq!(bs, 16);
    let ops = linears(&float, &export);
    assert_eq!(ops.len(), 15, "7 linears per layer x 2 layers + lm_head");

    let mut worst_scale2_rel = 0f64;
    for (op, source) in &ops {
        let (hf_shape, w) = float.f32(source);
        let (n_out, n_in) = (hf_shape[0], hf_shape[1]);
        let shape = LpbqShape::new(n_out, n_in, bs).unwrap();
        let bq = lpbq_block_quantize(&w, shape).unwrap();
        let ours = bq.to_export();

        let (exp_shape, exp_weight) = export.i8(&format!("{op}.weight"));
        assert_eq!(exp_shape, vec![1, 1, n_in, n_out], "`{op}.weight` is HWIO");
        assert_eq!(ours.weight_hwio, exp_weight, "`{op}.weight` nibbles");
        assert_eq!(ours.scale1, export.u8(&format!("{op}.scale1")), "`{op}.scale1`");
        let (_, exp_scale2) = export.f32(&format!("{op}.scale2"));
        assert_eq!(exp_scale2.len(), n_out);
        for (o, (a, b)) in ours.scale2.iter().zip(&exp_scale2).enumerate() {
            let rel = ((a - b).abs() / b.abs()) as f64;
            worst_scale2_rel = worst_scale2_rel.max(rel);
            assert!(rel <= 1e-6, "`{op}.scale2[{o}]`: ours {a}, pymllm {b}");
        }

        // The deployed weight decodes the same from pymllm's tensors and ours.
        let deployed =
            decode_lpbq(&exp_weight, &export.u8(&format!("{op}.scale1")), &exp_scale2, n_in, n_out, bs).unwrap();
        assert_eq!(deployed, ours.decode().unwrap(), "`{op}` deployed weights");

        // pymllm's nibbles times our fp32 block scales are our fake-quant weights.
        let fq = bq.fake_quant_weights();
        for o in 0..n_out {
            for i in 0..n_in {
                let q = f32::from(sign_extend_nibble(exp_weight[i * n_out + o]));
                let s = bq.block_scales[o * (n_in / bs) + i / bs];
                assert_eq!(fq[o * n_in + i], q * s, "`{op}` fake-quant [{o}][{i}]");
            }
        }
    }
    // The export is expected to be bit-exact; the 1e-6 bound above is the contract.
    assert_eq!(worst_scale2_rel, 0.0, "scale2 is computed in f32 exactly as pymllm does");
}

/// RMSNorm weights (no `.fake_quant` in their keys) and the embedding.
fn u16_weights(export: &Checkpoint) -> Vec<String> {
    export
        .names()
        .into_iter()
        .filter_map(|n| n.strip_suffix(".zero_point").map(str::to_string))
        .filter(|op| !op.ends_with(".fake_quant") && !op.contains("activation_post_process"))
        .collect()
}

#[test]
fn u16_weights_reproduce_pymllm_export() {
    let (float, export) = (float_model(), pymllm_model());
    let ops = u16_weights(&export);
    assert_eq!(ops.len(), 10, "9 RMSNorms + the embedding: {ops:?}");
    for op in &ops {
        let (_, w) = float.f32(&format!("{op}.weight"));
        let ours = quantize_u16_weight(&w).unwrap();
        let scale = export.scalar_f32(&format!("{op}.scale"));
        let zp = export.i32(&format!("{op}.zero_point"));
        assert_eq!(
            ours.params.scale.to_bits(),
            scale.to_bits(),
            "`{op}.scale`: ours {}, pymllm {scale}",
            ours.params.scale
        );
        assert_eq!(vec![ours.params.zero_point], zp, "`{op}.zero_point`");
        let expected = export.u16(&format!("{op}.weight"));
        let differing = ours.codes.iter().zip(&expected).filter(|(a, b)| a != b).count();
        assert_eq!(differing, 0, "`{op}.weight`: {differing} codes differ");
    }
}

#[test]
fn embedding_export_and_fake_quant_roundings_differ_as_documented() {
    let (float, export) = (float_model(), pymllm_model());
    let (_, w) = float.f32("model.embed_tokens.weight");
    let exported = export.u16("model.embed_tokens.weight");
    let params = quantize_u16_weight(&w).unwrap().params;
    assert_eq!(export_u16(&w, &params).unwrap(), exported);
    let fake = quantize_slice_u16(&w, &params).unwrap();
    let diffs: Vec<i32> =
        fake.iter().zip(&exported).filter(|(a, b)| a != b).map(|(&a, &b)| i32::from(a) - i32::from(b)).collect();
    assert_eq!(diffs.len(), 13, "README: 13 of 4096 entries differ");
    assert!(diffs.iter().all(|d| d.abs() == 1), "each by one LSB: {diffs:?}");
}

/// Finds the observer buffer of a QDQ, following save_model's de-duplication of shared tensors.
fn observer_value(export: &Checkpoint, meta: &BTreeMap<String, String>, name: &str) -> f32 {
    if export.has(name) {
        export.scalar_f32(name)
    } else {
        let kept = meta.get(name).unwrap_or_else(|| panic!("`{name}` neither stored nor de-duplicated"));
        export.scalar_f32(kept)
    }
}

#[test]
fn observers_reproduce_every_activation_qdq() {
    let export = pymllm_model();
    let meta = export.metadata();
    let qdqs: Vec<String> =
        export.names().into_iter().filter_map(|n| n.strip_suffix(".fake_quant.scale").map(str::to_string)).collect();
    assert_eq!(qdqs.len(), 68 + 2 + 4, "activation + sigmoid + KV QDQs");

    let (mut affine, mut kv, mut fixed, mut shared) = (0, 0, 0, 0);
    for qdq in &qdqs {
        let scale = export.scalar_f32(&format!("{qdq}.fake_quant.scale"));
        let zp = export.i32(&format!("{qdq}.fake_quant.zero_point"))[0];
        if qdq.ends_with("sigmoid_output_qdq") {
            assert_eq!((scale, zp), (SIGMOID_SCALE, 0), "`{qdq}` fixed params");
            fixed += 1;
            continue;
        }
        let obs = format!("{qdq}.fake_quant.activation_post_process");
        let min_name = format!("{obs}.min_val");
        if !export.has(&min_name) {
            shared += 1;
        }
        let min = observer_value(&export, &meta, &min_name);
        let max = observer_value(&export, &meta, &format!("{obs}.max_val"));
        let eps = export.scalar_f32(&format!("{obs}.eps"));
        let scheme = if qdq.ends_with("_cast_to_int8_qdq") {
            assert_eq!(eps, EPS_8BIT, "`{qdq}` eps");
            assert_eq!(zp, KV_ZERO_POINT, "`{qdq}` KV zero point");
            kv += 1;
            ObserverScheme::KvSymmetricU8 { eps }
        } else {
            assert_eq!(eps, EPS_16BIT, "`{qdq}` eps");
            affine += 1;
            ObserverScheme::activation_u16()
        };
        let p = calculate_qparams(scheme, min, max).unwrap();
        assert_eq!(
            p.scale.to_bits(),
            scale.to_bits(),
            "`{qdq}` scale from range [{min}, {max}]: ours {}, pymllm {scale}",
            p.scale
        );
        assert_eq!(p.zero_point, zp, "`{qdq}` zero point");
    }
    assert_eq!((affine, kv, fixed), (68, 4, 2));
    assert_eq!(shared, 4, "the q/k rope_neg_half QDQs share their norm output's range");
}

//! Mixed 4/8-bit weights (`--weight-budget`) on the tiny Qwen3, against figures HF transformers
//! made (fixtures/mixed/make_sensitivity_reference.py): each linear's sensitivity (KL of the float
//! model with that linear alone at pymllm's int4 weights, which the `rtn` method reproduces) and
//! its per-channel int8 rounding. The choice spends at most the budget, raises the linears most
//! sensitive per byte, writes them as int8 into the checkpoint, and the checkpoint runs in
//! fake-quant and compiles to QNN graphs whose raised linears are `SFIXED_POINT_8` per-channel
//! tensors (checked by the QNN reference interpreter against fake-quant).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use aot::mixed::{choose_eight_bit, LinearCandidate, WeightBudget};
use backend_cpu::quant::Sqnr;
use checkpoint::{SafetensorsCheckpoint, StDtype};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures").join(name)
}

struct Reference {
    sensitivity: f64,
    int8_scales: Vec<f32>,
    int8_abs_code_sum: i64,
}

fn reference() -> BTreeMap<String, Reference> {
    let text = std::fs::read_to_string(fixture("mixed/sensitivity_qwen3-dev-f32.json")).unwrap();
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    json["linears"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(op, v)| {
            let r = Reference {
                sensitivity: v["sensitivity"].as_f64().unwrap(),
                int8_scales: v["int8"]["scales"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|s| s.as_f64().unwrap() as f32)
                    .collect(),
                int8_abs_code_sum: v["int8"]["abs_code_sum"].as_i64().unwrap(),
            };
            (op.clone(), r)
        })
        .collect()
}

#[test]
fn the_budget_raises_the_most_sensitive_linears_to_int8_and_they_lower_to_qnn() {
    let refs = reference();
    let out = tempfile::tempdir().unwrap();
    let budget: WeightBudget = "0.10".parse().unwrap();
    let opts = aot::AotOptions {
        source: aot::ModelSource::Float(fixture("qwen3-dev-f32")),
        calibration: vec![aot::CalibSource::Ids(fixture("pymllm-qwen3-dev-f32/calib_ids.safetensors"))],
        chunks: vec![32, 1],
        context_lens: vec![256],
        max_positions: 256,
        weight_method: backend_cpu::quant::WeightMethod::Rtn,
        weight_budget: Some(budget),
        progress: aot::progress::silent(),
        context_binary: aot::htp::ContextBinary::Off,
        ..aot::AotOptions::embedded(out.path().join("aot"))
    };
    let report = aot::run(&opts).unwrap();
    eprintln!("{}", report.summary());
    let qdir = out.path().join("aot/quantized");
    let bits: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(qdir.join(aot::mixed::WEIGHT_BITS_FILE)).unwrap()).unwrap();

    // 1. Each linear's measured sensitivity is HF's (same int4 weights, same text, float elsewhere).
    let linears = bits["linears"].as_array().unwrap();
    assert_eq!(linears.len(), refs.len());
    let mut candidates = Vec::new();
    for l in linears {
        let op = l["op"].as_str().unwrap();
        let ours = l["sensitivity_kl"].as_f64().unwrap();
        let hf = refs[op].sensitivity;
        assert!((ours - hf).abs() <= 1e-3 * hf + 1e-9, "{op}: sensitivity {ours} vs HF's {hf}");
        candidates.push(LinearCandidate {
            op: op.to_string(),
            out_features: l["out_features"].as_u64().unwrap() as usize,
            in_features: l["in_features"].as_u64().unwrap() as usize,
            block_size: l["block_size"].as_u64().unwrap() as usize,
            sensitivity: hf,
        });
    }

    // 2. The budget's accounting, from the checkpoint's own tensors: every linear's int4 bytes
    //    (codes at 4 bits + one byte per block scale + f32 channel scales) summed, 10 % of it
    //    allowed, the raised ones costing int8's bytes less int4's.
    let ckpt = SafetensorsCheckpoint::open(&qdir).unwrap();
    let numel = |k: &str| ckpt.info(k).unwrap().1.iter().product::<usize>();
    let mut int4_bytes = 0;
    let mut extra = 0;
    let raised: Vec<&str> = bits["eight_bit"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    for op in refs.keys() {
        let (n, out_ch) = (numel(&format!("{op}.weight")), ckpt.info(&format!("{op}.weight")).unwrap().1[3]);
        let int4 = n / 2 + n / 16 + 4 * out_ch;
        int4_bytes += int4;
        if raised.contains(&op.as_str()) {
            extra += n + 4 * out_ch - int4;
        }
    }
    assert_eq!(bits["int4_bytes"], int4_bytes);
    assert_eq!(bits["budget_bytes"], (0.10 * int4_bytes as f64).floor() as usize);
    assert_eq!(bits["extra_bytes"], extra);
    assert!(!raised.is_empty() && extra <= (0.10 * int4_bytes as f64) as usize, "{bits}");

    // 3. The choice is the greedy one on HF's sensitivities (per extra byte, within the budget).
    let expected = choose_eight_bit(&candidates, budget);
    assert_eq!(raised, expected.eight_bit, "chosen on our measurement vs on HF's");
    // The first raised linear is the most sensitive per byte of all.
    let per_byte = |c: &LinearCandidate| c.sensitivity / c.extra_bytes() as f64;
    let best = candidates.iter().max_by(|a, b| per_byte(a).total_cmp(&per_byte(b))).unwrap();
    assert_eq!(raised[0], best.op);

    // 4. Raised linears are per-channel int8 in the checkpoint (codes -127..=127, no LPBQ scales),
    //    rounded as HF's per-channel int8 is; the rest stay LPBQ and equal pymllm's codes.
    let pymllm = SafetensorsCheckpoint::open(fixture("pymllm-qwen3-dev-f32")).unwrap();
    for op in refs.keys() {
        let key = format!("{op}.weight");
        assert_eq!(ckpt.info(&key).unwrap().0, StDtype::I8);
        let codes = ckpt.read_i8(&key).unwrap();
        if raised.contains(&op.as_str()) {
            assert!(!ckpt.contains(&format!("{op}.scale1")), "{op}");
            assert!(codes.iter().all(|&c| c >= -127), "{op}");
            let scales = ckpt.read_f32(&format!("{op}.scale")).unwrap();
            for (o, (a, b)) in scales.iter().zip(&refs[op].int8_scales).enumerate() {
                assert!((a - b).abs() <= 1e-6 * b.abs(), "{op} channel {o}: scale {a} vs HF's {b}");
            }
            let sum: i64 = codes.iter().map(|&c| i64::from(c).abs()).sum();
            assert_eq!(sum, refs[op].int8_abs_code_sum, "{op}: sum of |codes|");
        } else {
            assert_eq!(codes, pymllm.read_i8(&key).unwrap(), "{op}: int4 codes vs pymllm's");
        }
    }

    // 5. The compiled graphs: the QNN reference interpreter on the lowered graphs (with the int8
    //    linears as SFIXED_POINT_8 per-channel tensors) agrees with fake-quant.
    let rows: Vec<_> = report.ledger.iter().filter(|e| e.stage == "qnn_vs_fakequant").collect();
    assert_eq!(rows.len(), 2, "{:?}", report.ledger);
    for e in rows {
        let c = &e.comparison;
        let ok = match c.sqnr() {
            Sqnr::Db(db) => db >= 30.0,
            Sqnr::Identical => true,
            Sqnr::NonFinite => false,
        };
        assert!(ok && c.top1_agreement >= 0.95, "{:?}: {:?}, top-1 {}", e.graph, c.sqnr(), c.top1_agreement);
    }
    let fq = report.ledger.iter().find(|e| e.stage == "fakequant_vs_float").unwrap();
    assert!(matches!(fq.comparison.sqnr(), Sqnr::Db(_)), "{fq:?}");
    // Each graph's C++ declares the raised linears' filters as per-channel SFIXED_POINT_8 and the
    // others as blockwise int4.
    for graph in ["model.0.s32", "model.0.s1"] {
        let cpp = std::fs::read_to_string(out.path().join(format!("aot/qnn/{graph}.cpp"))).unwrap();
        for op in refs.keys() {
            let raised_op = raised.contains(&op.as_str());
            let decl = filter_declaration(&cpp, op).unwrap_or_else(|| {
                let names: Vec<&str> = cpp.lines().filter(|l| l.contains("model.addTensor(")).collect();
                panic!("{graph}: no filter of `{op}` in {names:#?}")
            });
            let (dtype, encoding) = if raised_op {
                ("QNN_DATATYPE_SFIXED_POINT_8", "QNN_QUANTIZATION_ENCODING_AXIS_SCALE_OFFSET")
            } else {
                ("QNN_DATATYPE_SFIXED_POINT_4", "QNN_QUANTIZATION_ENCODING_BLOCKWISE_EXPANSION")
            };
            assert!(decl.contains(dtype) && decl.contains(encoding), "{graph} `{op}`:\n{decl}");
        }
    }
}

#[test]
fn a_budget_needs_the_deployed_calibration() {
    let out = tempfile::tempdir().unwrap();
    let ids = aot::load_id_sequences(&fixture("pymllm-qwen3-dev-f32/calib_ids.safetensors"), "calib_ids", 128).unwrap();
    let err = aot::quantize(&aot::QuantizeOptions {
        mode: backend_cpu::quant::CalibrationMode::MllmCompatible,
        max_positions: 64,
        weight_budget: Some(WeightBudget::new(0.1).unwrap()),
        ..aot::QuantizeOptions::new(fixture("qwen3-dev-f32"), ids, out.path().join("q"))
    })
    .err()
    .expect("pymllm's recipe has no weight budget");
    assert!(err.to_string().contains("QuantizeOptions::weight_budget"), "{err}");
}

/// The `addTensor_*` function of a graph's C++ that declares the filter `<op>.weight` (named
/// with `_` for `.` in the graph).
fn filter_declaration<'a>(cpp: &'a str, op: &str) -> Option<&'a str> {
    let needle = format!("\"{}_weight\"", op.replace('.', "_"));
    cpp.split("static ModelError_t addTensor_").find(|f| f.contains(&needle))
}

//! The LPBQ weight methods (`--weight-method`) and activation ranges (`--act-range`,
//! docs/quantization.md) on the tiny fixture: the searched, SeqMSE and GPTQ-rounded weights and
//! the MSE ranges must not leave fake-quant further from float than pymllm's recipe, and
//! `--mllm-compatible` must ignore them (pymllm's parameters, bit for bit). A model rotated first
//! (`--rotation hadamard`) quantizes into the same format; `--mllm-compatible` refuses a rotation.

use aot::{load_id_sequences, quantize, QuantizeOptions, QuantizeOutcome};
use backend_cpu::quant::{CalibrationMode, Rotation, WeightMethod};
use checkpoint::SafetensorsCheckpoint;
use compiler::quant::act_range::{ActRange, ActRanges};
use mllm_dsl::QdqKind;
use std::path::{Path, PathBuf};

mod scratch;
use scratch::{remove_scratch, scratch};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures").join(name)
}

/// The tiny Qwen3 quantized on pymllm's calibration ids with the given options.
fn quantize_fixture(
    mode: CalibrationMode,
    method: WeightMethod,
    ranges: ActRanges,
    rotation: Rotation,
    out: &Path,
) -> aot::Result<QuantizeOutcome> {
    let calibration =
        load_id_sequences(&fixture("pymllm-qwen3-dev-f32").join("calib_ids.safetensors"), "calib_ids", 128)?;
    quantize(&QuantizeOptions {
        mode,
        weight_method: method,
        act_ranges: ranges,
        rotation,
        ..QuantizeOptions::new(fixture("qwen3-dev-f32"), calibration, out)
    })
}

fn run(mode: CalibrationMode, method: WeightMethod, ranges: ActRanges, out: &Path) -> QuantizeOutcome {
    quantize_fixture(mode, method, ranges, Rotation::None, out)
        .unwrap_or_else(|e| panic!("{} weights: {e:#}", method.name()))
}

#[test]
fn searched_and_gptq_weights_are_no_worse_than_pymllm_rounding() {
    let mut logits = Vec::new();
    for method in
        [WeightMethod::Rtn, WeightMethod::Mse, WeightMethod::Gptq, WeightMethod::SeqMse, WeightMethod::SeqMseGptq]
    {
        let out = scratch(method.name());
        let outcome = run(CalibrationMode::Deployed, method, ActRanges::default(), &out);
        let row = outcome.report.rows.last().unwrap().clone();
        let report: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(out.join("report.json")).unwrap()).unwrap();
        assert_eq!(report["weight_method"], method.name());
        assert_eq!(outcome.input_stats_seconds > 0.0, method != WeightMethod::Rtn);
        println!("{:>11}: logits SQNR {:.2} dB, top-1 {:.1} %", method.name(), row.sqnr_db, 100.0 * row.top1_agreement);
        logits.push((method, row));
        remove_scratch(&out);
    }
    let rtn = &logits[0].1;
    for (method, row) in &logits[1..] {
        assert!(
            row.sqnr_db >= rtn.sqnr_db && row.top1_agreement >= rtn.top1_agreement,
            "{}: {:.2} dB / {:.3} vs rtn {:.2} dB / {:.3}",
            method.name(),
            row.sqnr_db,
            row.top1_agreement,
            rtn.sqnr_db,
            rtn.top1_agreement
        );
    }
}

#[test]
fn mllm_compatible_mode_ignores_the_weight_method_and_ranges() {
    let (a, b) = (scratch("mllm-rtn"), scratch("mllm-gptq"));
    run(CalibrationMode::MllmCompatible, WeightMethod::Rtn, ActRanges::default(), &a);
    let outcome = run(CalibrationMode::MllmCompatible, WeightMethod::SeqMseGptq, "mse".parse().unwrap(), &b);
    assert_eq!(outcome.input_stats_seconds, 0.0, "no statistics pass in mllm-compatible mode");
    let bytes = |d: &Path| std::fs::read(d.join("model.safetensors")).unwrap();
    assert!(
        bytes(&a) == bytes(&b),
        "mllm-compatible checkpoints differ with --weight-method seqmse-gptq --act-range mse"
    );
    remove_scratch(&a);
    remove_scratch(&b);
}

#[test]
fn range_methods_shrink_only_the_kinds_they_are_given() {
    let minmax = run(CalibrationMode::Deployed, WeightMethod::Rtn, ActRanges::default(), &scratch("range-minmax"));
    let base = &minmax.calibration.params;
    let logits = |o: &QuantizeOutcome| o.report.rows.last().unwrap().clone();
    println!(
        "{:>16}: logits SQNR {:.2} dB, top-1 {:.1} %",
        "minmax",
        logits(&minmax).sqnr_db,
        100.0 * logits(&minmax).top1_agreement
    );
    for ranges in ["mse", "kv=mse", "percentile:99.99", "act=percentile:99.9"] {
        let out = scratch(&format!("range-{}", ranges.replace([':', '='], "-")));
        let parsed: ActRanges = ranges.parse().unwrap();
        let outcome = run(CalibrationMode::Deployed, WeightMethod::Rtn, parsed, &out);
        let report: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(out.join("report.json")).unwrap()).unwrap();
        assert_eq!(report["act_range"], parsed.to_string());
        let row = logits(&outcome);
        println!("{ranges:>16}: logits SQNR {:.2} dB, top-1 {:.1} %", row.sqnr_db, 100.0 * row.top1_agreement);
        // Each point's range lies inside its min/max range, and only the kinds given a method move.
        let mut shrunk = [0usize; 2];
        for (point, p) in outcome.calibration.params.iter() {
            let m = base.get(&point.key).unwrap();
            let method = match point.kind {
                QdqKind::Activation => Some((0, parsed.activations)),
                QdqKind::KvCache => Some((1, parsed.kv_cache)),
                _ => None,
            };
            match method {
                Some((kind, method)) if method != ActRange::MinMax => {
                    assert!(p.scale <= m.scale * (1.0 + 1e-6), "{}: {} > min/max {}", point.key, p.scale, m.scale);
                    shrunk[kind] += usize::from(p.scale < m.scale * 0.999);
                }
                _ => assert_eq!(p, m, "{} has no range method but moved", point.key),
            }
        }
        println!("{ranges:>16}: {} activation and {} KV scales shrunk by > 0.1 %", shrunk[0], shrunk[1]);
        for (kind, method) in [(0, parsed.activations), (1, parsed.kv_cache)] {
            if let ActRange::Percentile(_) = method {
                assert!(shrunk[kind] > 0, "{ranges}: a percentile range clipped nothing");
            }
        }
        if parsed.kv_cache == ActRange::Mse {
            assert!(shrunk[1] > 0, "{ranges}: the u8 KV cache's MSE range clipped nothing");
        }
        remove_scratch(&out);
    }
    remove_scratch(&scratch("range-minmax"));
}

/// A rotated model quantizes into the same pymllm key set (the rotation only changes numbers),
/// the report names the rotation, and the rotated float copy is gone afterwards.
#[test]
fn rotated_checkpoint_quantizes_into_the_pymllm_format() {
    let (plain, rot) = (scratch("q-none"), scratch("q-hadamard"));
    quantize_fixture(CalibrationMode::Deployed, WeightMethod::Gptq, ActRanges::default(), Rotation::None, &plain)
        .unwrap();
    let outcome =
        quantize_fixture(CalibrationMode::Deployed, WeightMethod::Gptq, ActRanges::default(), Rotation::Hadamard, &rot)
            .unwrap();
    assert!(outcome.rotation.is_some());
    let keys = |d: &Path| {
        let mut k: Vec<String> =
            SafetensorsCheckpoint::open(d).unwrap().keys().into_iter().map(str::to_string).collect();
        k.sort();
        k
    };
    assert_eq!(keys(&plain), keys(&rot));
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(rot.join("report.json")).unwrap()).unwrap();
    assert_eq!(report["rotation"], "hadamard");
    assert!(!rot.join("rotated-float").exists(), "the rotated float copy is removed");
    let row = outcome.report.rows.last().unwrap();
    println!(
        "hadamard + gptq on the tiny fixture: logits SQNR {:.2} dB, top-1 {:.1} %",
        row.sqnr_db,
        100.0 * row.top1_agreement
    );
    // The quantized checkpoint runs in fake-quant mode like any other.
    let loaded = aot::load_model(&rot, 64, aot::RunMode::Auto).unwrap();
    assert!(loaded.fake_quant && loaded.unused.is_empty(), "unused: {:?}", loaded.unused);
    remove_scratch(&plain);
    remove_scratch(&rot);
}

#[test]
fn mllm_compatible_mode_refuses_a_rotation() {
    let out = scratch("mllm");
    let Err(err) = quantize_fixture(
        CalibrationMode::MllmCompatible,
        WeightMethod::Gptq,
        ActRanges::default(),
        Rotation::Hadamard,
        &out,
    ) else {
        panic!("--mllm-compatible accepted --rotation hadamard")
    };
    assert!(
        format!("{err:#}").contains("QuantizeOptions::rotation hadamard is not part of pymllm's recipe"),
        "{err:#}"
    );
    assert!(!out.exists(), "nothing written");
    remove_scratch(&out);
}

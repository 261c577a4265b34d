//! The LPBQ weight methods (`--weight-method`, docs/quantization.md) on the tiny fixture: the
//! searched and GPTQ-rounded weights must not leave fake-quant further from float than pymllm's
//! rounding, and `--mllm-compatible` must ignore them (pymllm's parameters, bit for bit).

use aot::{load_id_sequences, quantize, QuantizeOptions, QuantizeOutcome};
use backend_cpu::quant::{CalibrationMode, WeightMethod};
use std::path::{Path, PathBuf};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures").join(name)
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("mllm-weight-methods-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn run(mode: CalibrationMode, method: WeightMethod, out: &Path) -> QuantizeOutcome {
    let calibration =
        load_id_sequences(&fixture("pymllm-qwen3-dev-f32").join("calib_ids.safetensors"), "calib_ids", 128).unwrap();
    quantize(&QuantizeOptions {
        model: fixture("qwen3-dev-f32"),
        aot_config: None,
        calibration,
        evaluation: None,
        mode,
        out: out.to_path_buf(),
        max_positions: 1024,
        progress: aot::progress::silent(),
        weight_method: method,
        rotation: backend_cpu::quant::Rotation::None,
    })
    .unwrap_or_else(|e| panic!("{} weights: {e:#}", method.name()))
}

#[test]
fn searched_and_gptq_weights_are_no_worse_than_pymllm_rounding() {
    let mut logits = Vec::new();
    for method in [WeightMethod::Rtn, WeightMethod::Mse, WeightMethod::Gptq] {
        let out = scratch(method.name());
        let outcome = run(CalibrationMode::Deployed, method, &out);
        let row = outcome.report.rows.last().unwrap().clone();
        let report: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(out.join("report.json")).unwrap()).unwrap();
        assert_eq!(report["weight_method"], method.name());
        assert_eq!(outcome.input_stats_seconds > 0.0, method != WeightMethod::Rtn);
        println!("{:>5}: logits SQNR {:.2} dB, top-1 {:.1} %", method.name(), row.sqnr_db, 100.0 * row.top1_agreement);
        logits.push((method, row));
        let _ = std::fs::remove_dir_all(&out);
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
fn mllm_compatible_mode_ignores_the_weight_method() {
    let (a, b) = (scratch("mllm-rtn"), scratch("mllm-gptq"));
    run(CalibrationMode::MllmCompatible, WeightMethod::Rtn, &a);
    let outcome = run(CalibrationMode::MllmCompatible, WeightMethod::Gptq, &b);
    assert_eq!(outcome.input_stats_seconds, 0.0, "no statistics pass in mllm-compatible mode");
    let bytes = |d: &Path| std::fs::read(d.join("model.safetensors")).unwrap();
    assert!(bytes(&a) == bytes(&b), "mllm-compatible checkpoints differ with --weight-method gptq");
    let _ = (std::fs::remove_dir_all(&a), std::fs::remove_dir_all(&b));
}

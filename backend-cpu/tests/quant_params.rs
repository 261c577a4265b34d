//! QDQ parameters read from a checkpoint and applied by the fake-quant hook: values by hand, the
//! KV range and zero point rule, fixed points checked against stored copies, errors naming keys.

use backend_cpu::quant::{FakeQuantHook, QdqParams, QuantizationError};
use backend_cpu::QdqHook;
use checkpoint::{write_safetensors_atomic, SafetensorsCheckpoint, StDtype};
use mllm_dsl::{QdqAttr, QdqKind};
use std::collections::BTreeMap;
use std::path::PathBuf;

fn point(kind: QdqKind, key: &str) -> QdqAttr {
    QdqAttr { kind, key: key.into() }
}

/// A checkpoint with `(key, scale, zero point)` QDQ entries.
fn checkpoint(name: &str, entries: &[(&str, f32, i32)]) -> (PathBuf, SafetensorsCheckpoint) {
    let path = std::env::temp_dir().join(format!("quant-params-{}-{name}.safetensors", std::process::id()));
    let owned: Vec<(String, Vec<u8>, String, Vec<u8>)> = entries
        .iter()
        .map(|(k, s, z)| {
            (
                format!("{k}.fake_quant.scale"),
                s.to_le_bytes().to_vec(),
                format!("{k}.fake_quant.zero_point"),
                z.to_le_bytes().to_vec(),
            )
        })
        .collect();
    let mut tensors = Vec::new();
    for (sk, sb, zk, zb) in &owned {
        tensors.push((sk.as_str(), StDtype::F32, &[1usize][..], sb.as_slice()));
        tensors.push((zk.as_str(), StDtype::I32, &[1usize][..], zb.as_slice()));
    }
    write_safetensors_atomic(&path, &tensors, &BTreeMap::new()).unwrap();
    let ckpt = SafetensorsCheckpoint::open_file(&path).unwrap();
    (path, ckpt)
}

const SIGMOID: QdqKind = QdqKind::Fixed { scale: 1.0 / 65536.0, zero_point: 0 };

#[test]
fn fake_quant_uses_each_points_range_and_torch_rounding() {
    let (path, ckpt) =
        checkpoint("ok", &[("m.a", 0.5, 10), ("m.k", 0.1, 128), ("m.s", 1.0 / 65536.0, 0), ("m.c", 0.25, 65535)]);
    let act = point(QdqKind::Activation, "m.a");
    let kv = point(QdqKind::KvCache, "m.k");
    let sig = point(SIGMOID, "m.s");
    let konst = point(QdqKind::Constant, "m.c");
    let global = point(QdqKind::Global { scale: 0.001 / 65535.0, zero_point: 65535 }, "constant_zero");
    let points = [act.clone(), kv.clone(), sig.clone(), konst.clone(), global.clone()];
    let params = QdqParams::from_checkpoint(&ckpt, &points).unwrap();
    assert_eq!(params.len(), 5);
    assert!(ckpt.unused_keys().is_empty(), "every stored parameter was consumed: {:?}", ckpt.unused_keys());
    assert_eq!(params.source_keys().len(), 8);
    let hook = FakeQuantHook::new(&params);
    let run = |p: &QdqAttr, x: &[f32]| hook.apply(p, x, &[x.len()]).unwrap().unwrap();

    // u16, scale 0.5, zp 10: 1.25 -> 2.5 -> 2 (ties to even) -> 1.0; -6 clamps at code 0 -> -5.0;
    // 40000 clamps at 65535 -> 32762.5.
    assert_eq!(run(&act, &[1.25, 1.75, -6.0, 40000.0]), vec![1.0, 2.0, -5.0, 32762.5]);
    // u8 KV, scale 0.1, zp 128: 20 -> code 255 -> 12.7; -13 -> code 0 -> -12.8.
    let y = run(&kv, &[20.0, -13.0, 0.26]);
    assert!((y[0] - 12.7).abs() < 1e-5 && (y[1] + 12.8).abs() < 1e-5 && (y[2] - 0.3).abs() < 1e-6, "{y:?}");
    // Sigmoid 1/65536, zp 0: 1.0 is above 65535/65536 and clamps.
    assert_eq!(run(&sig, &[1.0, 0.5]), vec![65535.0 / 65536.0, 0.5]);
    // zp 65535, scale 0.25: only values <= 0 are representable.
    assert_eq!(run(&konst, &[-20.0, 3.0]), vec![-20.0, 0.0]);
    // The mask encoding: 0.0 stays 0.0, -0.001 stays (almost) -0.001.
    let z = run(&global, &[0.0, -0.001]);
    assert_eq!(z[0], 0.0);
    assert!((z[1] + 0.001).abs() < 1e-9);

    let err = hook.apply(&point(QdqKind::Activation, "unknown"), &[1.0], &[1]).unwrap_err();
    assert!(matches!(&err, backend_cpu::QdqHookError::NoParameters { key } if key == "unknown"), "{err}");
    assert!(err.to_string().contains("`unknown`"), "{err}");
    let err = hook.apply(&point(QdqKind::KvCache, "m.a"), &[1.0], &[1]).unwrap_err();
    assert!(matches!(err, backend_cpu::QdqHookError::KindMismatch { .. }), "kind must match the trace: {err}");
    let _ = std::fs::remove_file(path);
}

#[test]
fn kv_zero_point_must_be_128() {
    let (path, ckpt) = checkpoint("kv", &[("m.k", 0.1, 127)]);
    let err = QdqParams::from_checkpoint(&ckpt, &[point(QdqKind::KvCache, "m.k")]).unwrap_err();
    assert!(matches!(err, QuantizationError::KvZeroPoint { found: 127, .. }), "{err}");
    assert!(err.to_string().contains("m.k.fake_quant.zero_point"), "{err}");
    let _ = std::fs::remove_file(path);
}

#[test]
fn stored_fixed_parameters_must_match_the_model_file() {
    let (path, ckpt) = checkpoint("fixed", &[("m.s", 1.0 / 65535.0, 0)]);
    let err = QdqParams::from_checkpoint(&ckpt, &[point(SIGMOID, "m.s")]).unwrap_err();
    assert!(matches!(err, QuantizationError::FixedMismatch { .. }), "{err}");
    // Absent is fine: the model file's parameters apply.
    let params = QdqParams::from_checkpoint(&ckpt, &[point(SIGMOID, "m.other")]).unwrap();
    assert_eq!(params.get("m.other").unwrap().scale, 1.0 / 65536.0);
    let _ = std::fs::remove_file(path);
}

#[test]
fn missing_and_malformed_parameters_name_the_key() {
    let (path, ckpt) = checkpoint("bad", &[("m.neg", -1.0, 0), ("m.zp", 0.5, 70000)]);
    let err = QdqParams::from_checkpoint(&ckpt, &[point(QdqKind::Activation, "m.missing")]).unwrap_err();
    assert!(err.to_string().contains("m.missing.fake_quant.scale"), "{err}");
    let err = QdqParams::from_checkpoint(&ckpt, &[point(QdqKind::Activation, "m.neg")]).unwrap_err();
    assert!(err.to_string().contains("m.neg.fake_quant.scale"), "{err}");
    let err = QdqParams::from_checkpoint(&ckpt, &[point(QdqKind::Rope, "m.zp")]).unwrap_err();
    assert!(err.to_string().contains("zero_point"), "{err}");
    let _ = std::fs::remove_file(path);
}

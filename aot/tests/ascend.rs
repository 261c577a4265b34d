//! AscendV1 exports of the tiny Qwen3 fixture against msModelSlim's own: the same keys, dtypes,
//! shapes, description tags and `model_quant_type`, and the same parameters (weights, scales,
//! offsets, `deq_scale`, `quant_bias`, `scale_bias`, C8 KV scales) on the same weights and
//! calibration ids. The references were written by msModelSlim 26.1.0's quantization functions
//! and AscendV1 saver (fixtures/ascend/make_reference.py, provenance in fixtures/PROVENANCE.md).
//! Then the refusals: an unknown quant type, a `--float` pattern that matches nothing, a linear
//! the type cannot store, each a named error that leaves an earlier export as it was. Last, the
//! same exports against what vLLM Ascend's own code allocates and loads for them
//! (fixtures/ascend/vllm_ascend_expect.json, from fixtures/ascend/vllm_ascend_expect.py).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use aot::ascend::format::unpack_int4_rows;
use aot::ascend::{ascend_quality, decode_dir, export_ascend, AscendError, AscendOptions, QuantType};
use aot::AotError;
use backend_cpu::quant::{Rotation, Sqnr};
use checkpoint::{SafetensorsCheckpoint, StDtype};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn options(quant_type: QuantType, kv_c8: bool, out: &Path) -> AscendOptions {
    let model = root().join("fixtures/qwen3-dev-f32");
    let calibration =
        aot::load_id_sequences(&root().join("fixtures/ascend/calib_ids.safetensors"), "calib_ids", 128).unwrap();
    AscendOptions {
        model,
        calibration,
        quant_type,
        float_patterns: vec!["lm_head".into()],
        kv_c8,
        part_bytes: None,
        rotation: Rotation::None,
        group_size: 0,
        weight_method: backend_cpu::quant::WeightMethod::Rtn,
        out: out.to_path_buf(),
        max_positions: 64,
        progress: aot::progress::silent(),
    }
}

fn description(dir: &Path) -> serde_json::Map<String, serde_json::Value> {
    let text = std::fs::read_to_string(dir.join("quant_model_description.json")).unwrap();
    serde_json::from_str::<serde_json::Value>(&text).unwrap().as_object().unwrap().clone()
}

/// Values of a tensor as f64, whatever its dtype.
fn values(ckpt: &SafetensorsCheckpoint, key: &str) -> Vec<f64> {
    match ckpt.info(key).unwrap().0 {
        StDtype::I8 => ckpt.read_i8(key).unwrap().into_iter().map(f64::from).collect(),
        StDtype::I32 => ckpt.read_i32(key).unwrap().into_iter().map(f64::from).collect(),
        // deq_scale: the f32 bit pattern in an int64; compare the f32 it holds.
        StDtype::I64 => {
            ckpt.read_i64(key).unwrap().into_iter().map(|v| f64::from(f32::from_bits(v as i32 as u32))).collect()
        }
        _ => ckpt.read_float_param(key).unwrap().into_iter().map(f64::from).collect(),
    }
}

/// Per element of W4A8_DYNAMIC's `scale_bias` `[O, splits]`: `8 * sum |w_deq|` over the inputs it
/// sums, from the reference's own weight and scale. A float sum is only as exact as this allows:
/// msModelSlim's own values differ from the exact sums of its weights by up to 8.6e-8 of it (34 of
/// its 2432 elements in this fixture by more than 2e-5 of the sum itself, where the terms cancel).
fn scale_bias_magnitude(ckpt: &SafetensorsCheckpoint, key: &str, shape: &[usize]) -> Vec<f64> {
    let linear = key.strip_suffix(".scale_bias").unwrap();
    let wkey = format!("{linear}.weight");
    let (_, wshape) = ckpt.info(&wkey).unwrap();
    let (out, inp) = (wshape[0] * 2, wshape[1]);
    let q = unpack_int4_rows(&ckpt.read_i8(&wkey).unwrap(), out, inp);
    let scale = ckpt.read_float_param(&format!("{linear}.weight_scale")).unwrap();
    let splits = shape[1];
    let part = inp / splits;
    (0..out * splits)
        .map(|e| {
            let (r, s) = (e / splits, e % splits);
            let row = &q[r * inp + s * part..r * inp + (s + 1) * part];
            8.0 * row.iter().map(|&v| f64::from(v).abs() * f64::from(scale[r])).sum::<f64>()
        })
        .collect()
}

fn compare(reference: &Path, ours: &Path) {
    let (rd, od) = (description(reference), description(ours));
    let (rk, ok): (BTreeSet<_>, BTreeSet<_>) = (rd.keys().collect(), od.keys().collect());
    assert_eq!(rk, ok, "description keys of {} vs ours", reference.display());
    for (k, v) in &rd {
        assert_eq!(Some(v), od.get(k), "description entry `{k}`");
    }
    let r = SafetensorsCheckpoint::open_file(reference.join("quant_model_weights.safetensors")).unwrap();
    let o = SafetensorsCheckpoint::open_file(ours.join("quant_model_weights.safetensors")).unwrap();
    let (rkeys, okeys): (BTreeSet<_>, BTreeSet<_>) = (r.keys().into_iter().collect(), o.keys().into_iter().collect());
    assert_eq!(rkeys, okeys, "tensor keys");
    for key in rkeys {
        let (rt, rs) = r.info(key).unwrap();
        let (ot, os) = o.info(key).unwrap();
        assert_eq!((rt, rs), (ot, os), "dtype and shape of `{key}`");
        let (a, b) = (values(&r, key), values(&o, key));
        let integer = matches!(rt, StDtype::I8 | StDtype::I32);
        let magnitude = key.ends_with(".scale_bias").then(|| scale_bias_magnitude(&r, key, rs));
        let mut off = 0usize;
        for (i, (x, y)) in a.iter().zip(&b).enumerate() {
            if integer {
                // A value on a rounding boundary may round the other way after f32 sums in
                // another order: allowed as a one-step difference on a rare element.
                assert!((x - y).abs() <= 1.0, "`{key}`[{i}]: msModelSlim {x}, ours {y}");
                off += usize::from(x != y);
            } else {
                // A sum is compared relative to the size of its terms, any other value to itself.
                let size = magnitude.as_ref().map_or(x.abs(), |m| m[i]);
                let tol = 2e-5 * size.max(1e-6);
                assert!((x - y).abs() <= tol, "`{key}`[{i}]: msModelSlim {x}, ours {y}");
            }
        }
        assert!(off * 200 <= a.len().max(200), "`{key}`: {off} of {} integers differ by one", a.len());
    }
}

/// msModelSlim's reference exports of the fixture (`fixtures/ascend/qwen3-dev-f32/<name>`): the
/// quant type and whether the KV cache is C8.
const REFERENCE_EXPORTS: [(&str, QuantType, bool); 5] = [
    ("W8A8", QuantType::W8A8, false),
    ("W8A8_DYNAMIC", QuantType::W8A8Dynamic, false),
    ("W8A16", QuantType::W8A16, false),
    ("W4A8_DYNAMIC", QuantType::W4A8Dynamic, false),
    ("W8A8_C8", QuantType::W8A8, true),
];

#[test]
fn exports_match_msmodelslim_per_quant_type() {
    let tmp = tempfile::tempdir().unwrap();
    for (name, qt, c8) in REFERENCE_EXPORTS {
        let out = tmp.path().join(name);
        let outcome = export_ascend(&options(qt, c8, &out)).unwrap();
        assert_eq!(outcome.shards, 1);
        compare(&root().join("fixtures/ascend/qwen3-dev-f32").join(name), &out);
    }
}

#[test]
fn sharded_export_has_an_index_and_reads_back() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("w8a8");
    let mut opts = options(QuantType::W8A8, true, &out);
    opts.part_bytes = Some(20_000);
    let outcome = export_ascend(&opts).unwrap();
    assert!(outcome.shards > 1, "{} shards", outcome.shards);
    let index: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("quant_model_weights.safetensors.index.json")).unwrap())
            .unwrap();
    let map = index["weight_map"].as_object().unwrap();
    assert_eq!(map.len(), outcome.tensors);
    let last = format!("quant_model_weights-{:05}-of-{:05}.safetensors", outcome.shards, outcome.shards);
    assert!(out.join(&last).is_file(), "{last}");
    assert!(!out.join("quant_model_weights.safetensors").exists());
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("config.json")).unwrap()).unwrap();
    assert!(config.get("quantization_config").is_none());
    assert!(out.join("generation_config.json").is_file());
    // Decoded with the format's formulas, every linear is close to its float weight.
    let hf = models::hf::HfConfig::from_dir(&out).unwrap();
    let decoded = decode_dir(&out, &hf, 64).unwrap();
    let float = SafetensorsCheckpoint::open(root().join("fixtures/qwen3-dev-f32")).unwrap();
    for (key, _, w) in &decoded.tensors {
        if key.ends_with("proj.weight") {
            let f = float.read_float_param(key).unwrap();
            let (s, n): (f64, f64) = f
                .iter()
                .zip(w)
                .fold((0.0, 0.0), |(s, n), (&a, &b)| (s + f64::from(a * a), n + f64::from((a - b) * (a - b))));
            let sqnr = 10.0 * (s / n).log10();
            assert!(sqnr > 35.0, "`{key}`: decoded int8 weight SQNR {sqnr:.1} dB");
        }
    }
    assert_eq!(decoded.points.len(), 4 * 2 + 2 * 2, "q/k/v, o, gate/up, down inputs and K, V per layer");
}

#[test]
fn fake_quant_run_of_the_export_stays_close_to_float() {
    let tmp = tempfile::tempdir().unwrap();
    let ids: Vec<i64> = (0..40).map(|i| (i * 7 + 3) % 128).collect();
    let mut exports = Vec::new();
    for (name, qt) in [("W8A8", QuantType::W8A8), ("W8A8_DYNAMIC", QuantType::W8A8Dynamic)] {
        let out = tmp.path().join(name);
        export_ascend(&options(qt, false, &out)).unwrap();
        exports.push((name.to_string(), out));
    }
    let model = root().join("fixtures/qwen3-dev-f32");
    let q = ascend_quality(&model, &exports, &ids, 20, tmp.path(), aot::progress::silent()).unwrap();
    assert_eq!(q.rows.len(), 3);
    for r in &q.rows[1..] {
        assert!(matches!(r.logits_sqnr, Sqnr::Db(db) if db > 20.0), "{}: {}", r.name, r.logits_sqnr);
        assert!((r.perplexity / q.rows[0].perplexity - 1.0).abs() < 0.05, "{}", q.table());
    }
}

fn ascend_error(e: &AotError) -> &AscendError {
    match e {
        AotError::Ascend(a) => a,
        AotError::Step { cause, .. } => ascend_error(cause),
        other => panic!("expected an AscendV1 error, got {other}"),
    }
}

#[test]
fn bad_input_is_a_named_error_and_leaves_the_earlier_export() {
    let e = "W3A8".parse::<QuantType>().unwrap_err();
    assert!(matches!(&e, AscendError::UnknownQuantType { name, .. } if name == "W3A8"), "{e}");

    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    export_ascend(&options(QuantType::W8A8Dynamic, false, &out)).unwrap();
    let before = std::fs::read(out.join("quant_model_description.json")).unwrap();

    let mut opts = options(QuantType::W8A8, false, &out);
    opts.float_patterns = vec!["model.layers.7".into()];
    let e = export_ascend(&opts).unwrap_err();
    assert!(
        matches!(ascend_error(&e), AscendError::PatternMatchesNothing { pattern, .. } if pattern == "model.layers.7"),
        "{e}"
    );

    // lm_head quantized as W4A8_DYNAMIC: msModelSlim's scale_bias needs a parallelism its name does not give.
    let mut opts = options(QuantType::W4A8Dynamic, false, &out);
    opts.float_patterns.clear();
    let e = export_ascend(&opts).unwrap_err();
    assert!(matches!(ascend_error(&e), AscendError::UnknownParallelism { linear } if linear == "lm_head"), "{e}");

    assert_eq!(std::fs::read(out.join("quant_model_description.json")).unwrap(), before, "the earlier export changed");
    let leftovers: Vec<String> = std::fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("staging") || n.contains("scratch"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

// ---- vLLM Ascend ---------------------------------------------------------------------------------

/// The same export against what vLLM Ascend's own code allocates and loads for it,
/// fixtures/ascend/vllm_ascend_expect.json, written by fixtures/ascend/vllm_ascend_expect.py, which
/// runs vllm-ascend's `AscendModelSlimConfig` (vllm_ascend/quantization/modelslim_config.py) and
/// scheme classes (vllm_ascend/quantization/methods/) on msModelSlim's reference exports for every
/// params dtype: per checkpoint tensor its dtype, shape and how vLLM loads it, the description keys
/// the config looked up, and what msModelSlim's own export gets wrong under those rules.
fn vllm_expectations() -> serde_json::Value {
    let text = std::fs::read_to_string(root().join("fixtures/ascend/vllm_ascend_expect.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// A tensor's values as f64 as stored (an int64 `deq_scale` as the integer it is).
fn raw_values(ckpt: &SafetensorsCheckpoint, key: &str) -> Vec<f64> {
    match ckpt.info(key).unwrap().0 {
        StDtype::I8 => ckpt.read_i8(key).unwrap().into_iter().map(f64::from).collect(),
        StDtype::I32 => ckpt.read_i32(key).unwrap().into_iter().map(f64::from).collect(),
        StDtype::I64 => ckpt.read_i64(key).unwrap().into_iter().map(|v| v as f64).collect(),
        _ => ckpt.read_float_param(key).unwrap().into_iter().map(f64::from).collect(),
    }
}

fn strings(v: &serde_json::Value) -> Vec<String> {
    v.as_array().unwrap().iter().map(|s| s.as_str().unwrap().to_string()).collect()
}

fn usizes(v: &serde_json::Value) -> Vec<usize> {
    v.as_array().unwrap().iter().map(|s| s.as_u64().unwrap() as usize).collect()
}

/// What vLLM's loader would do wrong with `ckpt` (the rules of vllm_ascend_expect.py's
/// `mismatches`): a tensor vLLM allocates a parameter for and the reference carries is missing; a
/// shape differs from the (shard of the) parameter's, which vLLM's linear weight loader asserts; a
/// dtype `param.data.copy_` cannot carry: an int64 `deq_scale` of f32 bits ("bits") from anything
/// but int64, a float parameter from an integer tensor, an integer parameter from a float tensor
/// not holding integers in its range; C8 KV scales ("squeeze_cast": squeezed and cast) not a float
/// tensor of one or `num_kv_heads * head_dim` values; per-tensor values that fused shards
/// (q/k/v, gate/up) load into the same parameter and that differ; a tensor of a quantized linear
/// that has no parameter of its name.
fn vllm_mismatches(
    ckpt: &SafetensorsCheckpoint,
    expect: &serde_json::Map<String, serde_json::Value>,
    allowed_absent: &BTreeSet<String>,
) -> Vec<String> {
    const FLOATS: [StDtype; 3] = [StDtype::F32, StDtype::F16, StDtype::BF16];
    let keys: BTreeSet<&str> = ckpt.keys().into_iter().collect();
    let mut out = Vec::new();
    let sorted: BTreeSet<&String> = expect.keys().collect();
    for key in sorted {
        let e = &expect[key];
        if !keys.contains(key.as_str()) {
            if !allowed_absent.contains(key) {
                out.push(format!("{key}: missing"));
            }
            continue;
        }
        let (dt, shape) = ckpt.info(key).unwrap();
        let want = e["dtype"].as_str().unwrap();
        let load = e["load"].as_str().unwrap();
        if load == "squeeze_cast" {
            let numel = usizes(&e["numel"]);
            if !FLOATS.contains(&dt) || !numel.contains(&shape.iter().product()) {
                out.push(format!("{key}: {dt:?} {shape:?}, wanted a float of {numel:?} values"));
            }
            continue;
        }
        let want_shape = usizes(&e["shape"]);
        if shape != want_shape.as_slice() {
            out.push(format!("{key}: shape {shape:?}, wanted {want_shape:?}"));
        }
        let ok = if load == "bits" {
            format!("{dt:?}") == want
        } else if ["F32", "F16", "BF16"].contains(&want) {
            FLOATS.contains(&dt)
        } else {
            let (lo, hi) = match want {
                "I8" => (-128.0, 127.0),
                "I32" => (-2f64.powi(31), 2f64.powi(31) - 1.0),
                _ => (-2f64.powi(63), 2f64.powi(63) - 1.0),
            };
            format!("{dt:?}") == want
                || (FLOATS.contains(&dt)
                    && raw_values(ckpt, key).iter().all(|v| v.fract() == 0.0 && (lo..=hi).contains(v)))
        };
        if !ok {
            out.push(format!("{key}: {dt:?}, wanted {want} ({load})"));
        }
        if let Some(shared) = e.get("shared") {
            for other in strings(shared) {
                if keys.contains(other.as_str()) && raw_values(ckpt, &other) != raw_values(ckpt, key) {
                    out.push(format!("{key}: differs from {other}, loaded into the same parameter"));
                }
            }
        }
    }
    let quantized: BTreeSet<&str> = expect
        .iter()
        .filter(|(_, e)| e["load"] != "squeeze_cast")
        .map(|(k, _)| k.rsplit_once('.').unwrap().0)
        .collect();
    for key in keys {
        if quantized.contains(key.rsplit_once('.').map_or("", |p| p.0)) && !expect.contains_key(key) {
            out.push(format!("{key}: no parameter of that name"));
        }
    }
    out
}

/// The layer index of each layer whose `k_proj.kv_cache_scale` the description names: how
/// modelslim_config.py's `_add_kvcache_quant_metadata` finds the C8 layers.
fn c8_layers(description: &serde_json::Map<String, serde_json::Value>) -> Vec<u64> {
    let ids: BTreeSet<u64> = description
        .keys()
        .filter(|k| k.contains("k_proj.kv_cache_scale"))
        .map(|k| k.strip_prefix("model.layers.").unwrap().split('.').next().unwrap().parse().unwrap())
        .collect();
    ids.into_iter().collect()
}

/// The fixture with its config saying bfloat16 (the weights stay f32): an export for a bf16 model.
fn bf16_model(dir: &Path) -> PathBuf {
    let model = dir.join("qwen3-dev-bf16");
    std::fs::create_dir_all(&model).unwrap();
    for entry in std::fs::read_dir(root().join("fixtures/qwen3-dev-f32")).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), model.join(entry.file_name())).unwrap();
    }
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(model.join("config.json")).unwrap()).unwrap();
    config["dtype"] = "bfloat16".into();
    std::fs::write(model.join("config.json"), serde_json::to_string_pretty(&config).unwrap()).unwrap();
    model
}

#[test]
fn exports_load_as_vllm_ascend_expects() {
    let expectations = vllm_expectations();
    let tmp = tempfile::tempdir().unwrap();
    let bf16 = bf16_model(tmp.path());
    for (name, qt, c8) in REFERENCE_EXPORTS {
        let ours = tmp.path().join(name);
        export_ascend(&options(qt, c8, &ours)).unwrap();
        let ours_bf16 = tmp.path().join(format!("{name}-bf16"));
        export_ascend(&AscendOptions { model: bf16.clone(), ..options(qt, c8, &ours_bf16) }).unwrap();
        let reference = root().join("fixtures/ascend/qwen3-dev-f32").join(name);
        let desc = description(&ours);
        let open = |dir: &Path| SafetensorsCheckpoint::open_file(dir.join("quant_model_weights.safetensors")).unwrap();
        let (o, ob, r) = (open(&ours), open(&ours_bf16), open(&reference));
        for (source, s) in expectations["sources"].as_object().unwrap() {
            let q = &s["quant_types"][name];
            let registered = strings(&s["registered_schemes"]);
            // Every description key vllm-ascend's config looked up reads the same in ours (absent
            // where it was absent), and so resolves every layer to the same scheme (or error).
            for (key, value) in q["description_consulted"].as_object().unwrap() {
                let got = desc.get(key).cloned().unwrap_or(serde_json::Value::Null);
                assert_eq!(&got, value, "{source} {name}: description `{key}`");
            }
            let c8: Vec<u64> = q["c8_layers"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
            assert_eq!(c8_layers(&desc), c8, "{source} {name}: C8 layers");
            let mut errors = 0;
            for layers in q["layers"].as_object().unwrap().values() {
                for (prefix, layer) in layers.as_object().unwrap() {
                    errors += usize::from(layer.get("error").is_some());
                    for key in layer.get("float_keys").map(strings).unwrap_or_default() {
                        assert_eq!(desc[&key], "FLOAT", "{source} {name}: `{key}` keeps `{prefix}` float");
                    }
                }
            }
            // The tags of the quantized linears are schemes vllm-ascend registers for linears,
            // except W4A8_DYNAMIC: vllm-ascend main registers it for MoE only
            // (vllm_ascend/quantization/methods/w4a8.py at 182b75ea),
            // and the release that still has the linear scheme divides by the description's
            // `group_size`, 0 for per-channel weights (msModelSlim's own export says the same).
            let tags: BTreeSet<&str> = q["description_consulted"]
                .as_object()
                .unwrap()
                .iter()
                .filter(|(k, v)| k.ends_with("proj.weight") && *v != "FLOAT")
                .map(|(_, v)| v.as_str().unwrap())
                .collect();
            for tag in &tags {
                let known = registered.contains(&format!("{tag}/linear"));
                assert_eq!(known && errors == 0, *tag != "W4A8_DYNAMIC", "{source} {name}: `{tag}`, {errors} errors");
            }
            for (dtype, p) in q["params_dtypes"].as_object().unwrap() {
                let expect = p["expect"].as_object().unwrap();
                let absent: BTreeSet<String> = strings(&p["absent_from_msmodelslim_export"]).into_iter().collect();
                let recorded = strings(&p["msmodelslim_export_mismatches"]);
                let theirs = vllm_mismatches(&r, expect, &absent);
                assert_eq!(
                    theirs, recorded,
                    "{source} {name} {dtype}: msModelSlim's export, checked here and by the script"
                );
                let mine = vllm_mismatches(&o, expect, &absent);
                assert_eq!(mine, theirs, "{source} {name} {dtype}: ours loads as msModelSlim's own export does");
                // An f32 or f16 model's export is for float16 params (deq_scale as int64 bits), a
                // bf16 model's for bfloat16 (deq_scale f32): there, nothing is off.
                if dtype == "float16" {
                    assert!(mine.is_empty(), "{source} {name} float16: {mine:#?}");
                }
                if dtype == "bfloat16" {
                    let mine = vllm_mismatches(&ob, expect, &absent);
                    assert!(mine.is_empty(), "{source} {name} bfloat16, bf16 model: {mine:#?}");
                }
            }
        }
    }
}

// ---- W4A8_DYNAMIC per group ------------------------------------------------------------------------

/// Per-group W4A8_DYNAMIC (`group_size` G > 0): the tensors vLLM Ascend's dense W4A8_DYNAMIC scheme
/// allocates for a version 1.0.0 description (vllm_ascend/quantization/methods/w4a8.py,
/// `AscendW4A8DynamicLinearMethod.get_weight` / `get_pergroup_param`, release v0.26.0rc: `weight`
/// i8 `[O/2, I]`, `weight_scale` / `weight_offset` `[O, 1]`, `weight_scale_second` /
/// `weight_offset_second` `[O, I/G]`, `scale_bias` `[O, 1]`, `[O, 16]` for o/down projections),
/// decoded as its `process_scale_second` and `apply` compute: `q * (weight_scale *
/// weight_scale_second)` per group.
#[test]
fn per_group_w4a8_has_vllm_ascends_tensors_and_decodes_as_it_dequantizes() {
    let tmp = tempfile::tempdir().unwrap();
    let float = SafetensorsCheckpoint::open(root().join("fixtures/qwen3-dev-f32")).unwrap();
    for method in [backend_cpu::quant::WeightMethod::Rtn, backend_cpu::quant::WeightMethod::Gptq] {
        let out = tmp.path().join(method.name());
        let mut opts = options(QuantType::W4A8Dynamic, false, &out);
        opts.group_size = 16;
        opts.weight_method = method;
        export_ascend(&opts).unwrap();
        let desc = description(&out);
        assert_eq!(desc["group_size"], 16);
        assert_eq!(desc["version"], "1.0.0");
        let ckpt = SafetensorsCheckpoint::open_file(out.join("quant_model_weights.safetensors")).unwrap();
        let hf = models::hf::HfConfig::from_dir(&out).unwrap();
        let decoded = decode_dir(&out, &hf, 64).unwrap();
        let mut linears = 0;
        for (key, shape, w) in &decoded.tensors {
            let Some(linear) = key.strip_suffix(".weight").filter(|k| k.ends_with("proj")) else { continue };
            linears += 1;
            let (o, i) = (shape[0], shape[1]);
            let row = linear.ends_with("o_proj") || linear.ends_with("down_proj");
            let want: [(&str, StDtype, Vec<usize>); 6] = [
                ("weight", StDtype::I8, vec![o / 2, i]),
                ("weight_scale", StDtype::F32, vec![o, 1]),
                ("weight_offset", StDtype::F32, vec![o, 1]),
                ("weight_scale_second", StDtype::F32, vec![o, i / 16]),
                ("weight_offset_second", StDtype::F32, vec![o, i / 16]),
                ("scale_bias", StDtype::F32, vec![o, if row { 16 } else { 1 }]),
            ];
            for (suffix, dtype, shape) in want {
                let k = format!("{linear}.{suffix}");
                let (d, s) = ckpt.info(&k).unwrap();
                assert_eq!((d, s.to_vec()), (dtype, shape), "`{k}`");
                assert_eq!(desc[&k], "W4A8_DYNAMIC", "`{k}`");
            }
            // vLLM Ascend's dequantization, recomputed from the stored tensors.
            let q = unpack_int4_rows(&ckpt.read_i8(&format!("{linear}.weight")).unwrap(), o, i);
            let s1 = ckpt.read_float_param(&format!("{linear}.weight_scale")).unwrap();
            let s2 = ckpt.read_float_param(&format!("{linear}.weight_scale_second")).unwrap();
            let g = i / 16;
            for (n, (&v, &d)) in q.iter().zip(w).enumerate() {
                let (r, k) = (n / i, n % i);
                assert_eq!(d, v as f32 * (s1[r] * s2[r * g + k / 16]), "`{linear}`[{r}, {k}]");
            }
            // Per-group int4 keeps the fixture's weights far closer than per-channel int4 would.
            let f = float.read_float_param(key).unwrap();
            let (s, e) = f
                .iter()
                .zip(w)
                .fold((0.0, 0.0), |(s, e), (&a, &b)| (s + f64::from(a * a), e + f64::from((a - b) * (a - b))));
            assert!(
                10.0 * (s / e).log10() > 14.0,
                "`{key}` ({}): SQNR {:.1} dB",
                method.name(),
                10.0 * (s / e).log10()
            );
        }
        assert_eq!(linears, 14, "q/k/v/o, gate/up/down of two layers");
    }

    // The decoder holds the description to the tensors: a group size that does not match the
    // per-group scales, or none with them, is a named error.
    let out = tmp.path().join("rtn");
    let path = out.join("quant_model_description.json");
    let text = std::fs::read_to_string(&path).unwrap();
    let hf = models::hf::HfConfig::from_dir(&out).unwrap();
    for (g, says) in [(8, "weight_scale_second"), (0, "group_size 0")] {
        std::fs::write(&path, text.replace("\"group_size\": 16", &format!("\"group_size\": {g}"))).unwrap();
        let e = decode_dir(&out, &hf, 64).err().expect("a mismatched group_size decodes");
        assert!(e.to_string().contains(says) || format!("{e:#}").contains(says), "group_size {g}: {e:#}");
    }
}

#[test]
fn per_group_options_that_cannot_apply_are_named_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    // A group size that does not divide a linear's input names the linear, the size and the dims.
    let mut opts = options(QuantType::W4A8Dynamic, false, &out);
    opts.group_size = 24;
    let e = export_ascend(&opts).unwrap_err();
    match ascend_error(&e) {
        AscendError::CannotPack { linear, in_features, problem, .. } => {
            assert!(linear.starts_with("model.layers.0."), "{e}");
            assert!(problem.contains("24") && problem.contains(&in_features.to_string()), "{e}");
        }
        other => panic!("{other}"),
    }
    // Per-group weights on another type, a weight method on per-channel weights.
    let mut opts = options(QuantType::W8A8Dynamic, false, &out);
    opts.group_size = 16;
    let e = export_ascend(&opts).unwrap_err();
    assert!(matches!(ascend_error(&e), AscendError::Argument(m) if m.contains("AscendOptions::group_size 16")), "{e}");
    let mut opts = options(QuantType::W4A8Dynamic, false, &out);
    opts.weight_method = backend_cpu::quant::WeightMethod::Gptq;
    let e = export_ascend(&opts).unwrap_err();
    assert!(
        matches!(ascend_error(&e), AscendError::Argument(m) if m.contains("AscendOptions::weight_method gptq")),
        "{e}"
    );
    assert!(!out.exists(), "a refused export wrote {}", out.display());
}

/// Per-group W4A8_DYNAMIC against what vLLM Ascend's code allocates for it: the entry
/// `W4A8_DYNAMIC_G16` of vllm_ascend_expect.json, computed by vllm_ascend_expect.py from this
/// exporter's description of the fixture with `--group-size 16`
/// (fixtures/ascend/qwen3-dev-f32-w4a8-g16/, no msModelSlim export exists to compare with). A
/// source that registers a dense W4A8_DYNAMIC scheme (v0.25.1rc1) takes every layer and loads every
/// tensor of ours with nothing off, for every params dtype; one that does not (main) refuses them.
#[test]
fn per_group_w4a8_loads_as_vllm_ascend_expects() {
    let expectations = vllm_expectations();
    let tmp = tempfile::tempdir().unwrap();
    let bf16 = bf16_model(tmp.path());
    let export = |model: &Path, out: &Path| {
        let mut opts = options(QuantType::W4A8Dynamic, false, out);
        opts.model = model.to_path_buf();
        opts.group_size = 16;
        opts.weight_method = backend_cpu::quant::WeightMethod::Gptq;
        export_ascend(&opts).unwrap();
        SafetensorsCheckpoint::open_file(out.join("quant_model_weights.safetensors")).unwrap()
    };
    let (ours, ours_bf16) = (tmp.path().join("f32"), tmp.path().join("bf16"));
    let (o, ob) = (export(&root().join("fixtures/qwen3-dev-f32"), &ours), export(&bf16, &ours_bf16));
    let desc = description(&ours);
    assert_eq!(
        desc,
        description(&root().join("fixtures/ascend/qwen3-dev-f32-w4a8-g16")),
        "the description vllm_ascend_expect.py read is this exporter's"
    );
    let mut supported = 0;
    for (source, s) in expectations["sources"].as_object().unwrap() {
        let q = &s["quant_types"]["W4A8_DYNAMIC_G16"];
        for (key, value) in q["description_consulted"].as_object().unwrap() {
            let got = desc.get(key).cloned().unwrap_or(serde_json::Value::Null);
            assert_eq!(&got, value, "{source}: description `{key}`");
        }
        let registered = strings(&s["registered_schemes"]).contains(&"W4A8_DYNAMIC/linear".to_string());
        let mut errors = 0;
        for layers in q["layers"].as_object().unwrap().values() {
            for layer in layers.as_object().unwrap().values() {
                errors += usize::from(layer.get("error").is_some());
            }
        }
        assert_eq!(errors == 0, registered, "{source}: {errors} layers refused");
        if !registered {
            continue;
        }
        supported += 1;
        for (dtype, p) in q["params_dtypes"].as_object().unwrap() {
            let expect = p["expect"].as_object().unwrap();
            assert!(expect.keys().any(|k| k.ends_with("weight_scale_second")), "{source} {dtype}");
            for (name, ckpt) in [("f32 model", &o), ("bf16 model", &ob)] {
                let off = vllm_mismatches(ckpt, expect, &BTreeSet::new());
                assert!(off.is_empty(), "{source} {dtype}, {name}: {off:#?}");
            }
        }
    }
    assert!(supported > 0, "no source of vllm_ascend_expect.json registers a dense W4A8_DYNAMIC scheme");
}

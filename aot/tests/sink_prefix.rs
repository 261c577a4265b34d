//! The attention-sink prefix (`--sink-prefix`, `backend_cpu::quant::SinkPrefix`) on the tiny
//! Qwen3 fixture: a prefill after the prefix's K/V is the longer prefill of prefix + text; a
//! quantized checkpoint ships the prefix on its K/V grid beside pymllm's files; the CPU runtime's
//! generation starts from it exactly as the calibration's prefill does; bad files and pymllm's
//! recipe are refused with named errors. (SmolLM2's ledger with the prefix: tests/smollm2.rs.)

use std::path::{Path, PathBuf};

use aot::load::open_model;
use aot::text_quality::load_fake_quant;
use aot::{quantize, QuantizeOptions, RunMode, Runner};
use backend_cpu::quant::{prefill_logits, CalibrationMode, SinkPrefix, SINK_PREFIX_FILE};
use backend_cpu::CpuBackend;
use checkpoint::SafetensorsCheckpoint;
use models::hf::HfConfig;
use runtime::GenerationConfig;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures").join(name)
}

const PREFIX: [i64; 2] = [1, 7];
const TEXT: [i64; 12] = [17, 4, 99, 23, 56, 8, 120, 3, 41, 64, 12, 90];

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, |m: f32, d| if m.is_nan() || d.is_nan() { f32::NAN } else { m.max(d) })
}

#[test]
fn a_prefill_after_the_prefix_is_the_prefill_of_prefix_and_text() {
    let dir = fixture("qwen3-dev-f32");
    let hf = HfConfig::from_dir(&dir).unwrap();
    let backend = CpuBackend::float();
    let (model, _store) = open_model(&dir, &hf, 64, &backend).unwrap();
    let prefix = SinkPrefix::compute(model.as_ref(), &backend, &PREFIX).unwrap();
    assert_eq!((prefix.len(), prefix.num_layers()), (2, hf.num_hidden_layers));

    let after = prefill_logits(model.as_ref(), &backend, Some(&prefix), &TEXT).unwrap();
    let whole: Vec<i64> = PREFIX.iter().chain(&TEXT).copied().collect();
    let longer = prefill_logits(model.as_ref(), &backend, None, &whole).unwrap();
    let vocab = hf.vocab_size;
    let diff = max_diff(&after, &longer[PREFIX.len() * vocab..]);
    assert!(diff < 1e-5, "logits after the prefix differ from the longer prefill by {diff}");
    // And the prefix matters: without it the text's logits are different.
    let alone = prefill_logits(model.as_ref(), &backend, None, &TEXT).unwrap();
    assert!(max_diff(&after, &alone) > 1e-2);
}

fn quantize_tiny(
    out: &Path,
    mode: CalibrationMode,
    sink_prefix: Option<Vec<i64>>,
) -> aot::Result<aot::QuantizeOutcome> {
    let ids = fixture("pymllm-qwen3-dev-f32/calib_ids.safetensors");
    let calibration = aot::load_id_sequences(&ids, "calib_ids", 128).unwrap();
    quantize(&QuantizeOptions { mode, sink_prefix, ..QuantizeOptions::new(fixture("qwen3-dev-f32"), calibration, out) })
}

#[test]
fn a_quantized_checkpoint_ships_its_prefix_on_the_kv_grid_and_generation_starts_from_it() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("quantized");
    let outcome = quantize_tiny(&out, CalibrationMode::Deployed, Some(PREFIX.to_vec())).unwrap();
    let summary = outcome.sink_prefix.expect("the outcome reports the prefix");
    assert_eq!(summary.ids, PREFIX);
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("report.json")).unwrap()).unwrap();
    assert_eq!(report["sink_prefix"]["ids"], serde_json::json!(PREFIX));
    assert_eq!(report["sink_prefix"]["file"], SINK_PREFIX_FILE);

    // pymllm's files are untouched: the prefix is a file of its own.
    let ckpt = SafetensorsCheckpoint::open(&out).unwrap();
    assert!(ckpt.keys().iter().all(|k| !k.contains("sink")));
    // Every value on its layer's u8 K/V grid (zero point 128).
    let shipped = SinkPrefix::load_beside(&out).unwrap().expect("sink_prefix.safetensors");
    assert_eq!(shipped.ids, PREFIX);
    for layer in 0..shipped.num_layers() {
        for (which, data) in [("k", &shipped.keys[layer]), ("v", &shipped.values[layer])] {
            let key = format!("model.layers.{layer}.self_attn.{which}_cast_to_int8_qdq.fake_quant.scale");
            let scale = ckpt.read_f32(&key).unwrap()[0];
            for &v in data {
                let code = v / scale;
                assert!((code - code.round()).abs() < 1e-3 && (-128.0..=127.0).contains(&code.round()), "{key}: {v}");
            }
        }
    }

    // The CPU runtime (what `generate` runs) starts from the shipped prefix: its prompt logits,
    // prefilled as one chunk of 32 (12 tokens and padding), are the calibration's prefill after
    // the prefix. (Smaller chunks differ at the 1e-3 level with or without a prefix: the softmax
    // input's row minimum then spans other masked columns and flips u16 codes.)
    let (model, backend, _) = load_fake_quant(&out).unwrap();
    let reference = prefill_logits(model.as_ref(), &backend, Some(&shipped), &TEXT).unwrap();
    let mut runner = Runner::cpu(&out, 64, RunMode::Auto).unwrap();
    assert!(runner.notes.iter().any(|n| n.contains("attention-sink prefix")), "{:?}", runner.notes);
    let config = GenerationConfig {
        max_new_tokens: 1,
        prefill_chunk: 32,
        collect_prompt_logits: true,
        ..GenerationConfig::default()
    };
    let prompt: Vec<u32> = TEXT.iter().map(|&i| i as u32).collect();
    let out_ids = runner.generate(&prompt, &config, None, &mut std::io::sink()).unwrap();
    let diff = max_diff(out_ids.prompt_logits.as_ref().unwrap(), &reference);
    assert!(diff < 1e-5, "runtime vs one-chunk prefill after the prefix: {diff}");
    // A second generation starts from the prefix again, not from the first one's cache.
    let again = runner.generate(&prompt, &config, None, &mut std::io::sink()).unwrap();
    assert_eq!(again.prompt_logits, out_ids.prompt_logits);
}

#[test]
fn pymllms_recipe_and_malformed_prefix_files_are_refused_by_name() {
    let tmp = tempfile::tempdir().unwrap();
    let Err(err) = quantize_tiny(&tmp.path().join("q"), CalibrationMode::MllmCompatible, Some(vec![1])) else {
        panic!("--mllm-compatible accepted a sink prefix");
    };
    let msg = format!("{err:#}");
    assert!(msg.contains("QuantizeOptions::sink_prefix") && msg.contains("CalibrationMode::MllmCompatible"), "{msg}");
    assert!(!tmp.path().join("q").exists(), "nothing is written");

    // A prefix file whose value tensor is missing, and one whose K has the wrong prefix length.
    let dir = fixture("qwen3-dev-f32");
    let hf = HfConfig::from_dir(&dir).unwrap();
    let backend = CpuBackend::float();
    let (model, _store) = open_model(&dir, &hf, 64, &backend).unwrap();
    let prefix = SinkPrefix::compute(model.as_ref(), &backend, &PREFIX).unwrap();
    let good = tmp.path().join("good");
    std::fs::create_dir_all(&good).unwrap();
    prefix.save(&good).unwrap();
    assert_eq!(SinkPrefix::load_beside(&good).unwrap().unwrap(), prefix);
    assert!(SinkPrefix::load_beside(tmp.path()).unwrap().is_none());

    // Layer 1's value is missing.
    let bad = tmp.path().join("bad");
    std::fs::create_dir_all(&bad).unwrap();
    let f32s = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let ids: Vec<u8> = PREFIX.iter().flat_map(|i| i.to_le_bytes()).collect();
    let (h, d) = (prefix.kv_heads, prefix.head_dim);
    let (k0, v0, k1) = (f32s(&prefix.keys[0]), f32s(&prefix.values[0]), f32s(&prefix.keys[1]));
    let (ks, vs) = ([h, d, 2], [h, 2, d]);
    let tensors: Vec<checkpoint::TensorBytes<'_>> = vec![
        ("ids", checkpoint::StDtype::I64, &[2], &ids),
        ("layers.0.key", checkpoint::StDtype::F32, &ks, &k0),
        ("layers.0.value", checkpoint::StDtype::F32, &vs, &v0),
        ("layers.1.key", checkpoint::StDtype::F32, &ks, &k1),
    ];
    checkpoint::write_safetensors_atomic(bad.join(SINK_PREFIX_FILE), &tensors, &Default::default()).unwrap();
    let msg = SinkPrefix::load_beside(&bad).unwrap_err().to_string();
    assert!(msg.contains(SINK_PREFIX_FILE) && msg.contains("layers.1.value"), "{msg}");

    // Three prefix ids for K/V of two positions.
    let ids3: Vec<u8> = [1i64, 7, 3].iter().flat_map(|i| i.to_le_bytes()).collect();
    let v1 = f32s(&prefix.values[1]);
    let tensors: Vec<checkpoint::TensorBytes<'_>> = vec![
        ("ids", checkpoint::StDtype::I64, &[3], &ids3),
        ("layers.0.key", checkpoint::StDtype::F32, &ks, &k0),
        ("layers.0.value", checkpoint::StDtype::F32, &vs, &v0),
        ("layers.1.key", checkpoint::StDtype::F32, &ks, &k1),
        ("layers.1.value", checkpoint::StDtype::F32, &vs, &v1),
    ];
    checkpoint::write_safetensors_atomic(bad.join(SINK_PREFIX_FILE), &tensors, &Default::default()).unwrap();
    let msg = SinkPrefix::load_beside(&bad).unwrap_err().to_string();
    assert!(msg.contains(SINK_PREFIX_FILE) && msg.contains("3 prefix tokens"), "{msg}");

    // A prefix for another model shape is refused before any run.
    let mut other = prefix.clone();
    other.keys.pop();
    other.values.pop();
    let msg = prefill_logits(model.as_ref(), &backend, Some(&other), &TEXT).unwrap_err().to_string();
    assert!(msg.contains("attention-sink prefix") && msg.contains("layers"), "{msg}");
}

//! Calibration and export in Rust against mllm's Python: quantizing fixtures/qwen3-dev-f32 with
//! the oracle's `calib_ids` in mllm-compatible mode must reproduce pymllm's exported checkpoint
//! (fixtures/pymllm-qwen3-dev-f32/model.safetensors): the same keys (bookkeeping aside), every
//! `fake_quant.scale` / `zero_point` within 1e-4 relative, LPBQ nibbles and `scale1` exactly,
//! `scale2` within 1e-6 relative, uint16 weights exactly.

use aot::{load_id_sequences, load_model, quantize, QuantizeOptions, QuantizeOutcome, RunMode};
use backend_cpu::quant::accuracy::Comparison;
use backend_cpu::quant::CalibrationMode;
use checkpoint::{SafetensorsCheckpoint, StDtype};
use runtime::{GenerationConfig, Generator, Sampling};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

mod scratch;
use scratch::{remove_scratch, scratch};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures").join(name)
}

fn calib_ids() -> Vec<Vec<i64>> {
    load_id_sequences(&fixture("pymllm-qwen3-dev-f32").join("calib_ids.safetensors"), "calib_ids", 128).unwrap()
}

fn run(mode: CalibrationMode, out: &Path) -> QuantizeOutcome {
    quantize(&QuantizeOptions { mode, ..QuantizeOptions::new(fixture("qwen3-dev-f32"), calib_ids(), out) }).unwrap()
}

/// pymllm's bookkeeping: observer state nothing reads.
fn bookkeeping(key: &str) -> bool {
    key.contains("activation_post_process")
        || key.ends_with("_enabled")
        || key.contains("_concat_observer")
        || key.ends_with(".eps")
}

fn rel(a: f64, b: f64) -> f64 {
    if a == b {
        0.0
    } else {
        (a - b).abs() / b.abs()
    }
}

#[test]
fn mllm_compatible_calibration_reproduces_pymllm() {
    let out = scratch("mllm");
    let outcome = run(CalibrationMode::MllmCompatible, &out);
    let ours = SafetensorsCheckpoint::open(&out).unwrap();
    let theirs = SafetensorsCheckpoint::open(fixture("pymllm-qwen3-dev-f32")).unwrap();

    let our_keys: BTreeSet<&str> = ours.keys().into_iter().collect();
    let their_keys: BTreeSet<&str> = theirs.keys().into_iter().filter(|k| !bookkeeping(k)).collect();
    assert_eq!(our_keys, their_keys, "key sets differ");
    assert_eq!(outcome.block_size, 16);

    let (mut worst_scale, mut worst_zp, mut worst_s2, mut rope_off_by_one) = (0f64, 0f64, 0f64, 0usize);
    for key in &our_keys {
        let (dtype, shape) = ours.info(key).unwrap();
        assert_eq!((dtype, shape), theirs.info(key).unwrap(), "`{key}` dtype/shape");
        match dtype {
            StDtype::F32 => {
                let (a, b) = (ours.read_f32(key).unwrap(), theirs.read_f32(key).unwrap());
                let tol = if key.ends_with(".scale2") { 1e-6 } else { 1e-4 };
                for (x, y) in a.iter().zip(&b) {
                    let r = rel(f64::from(*x), f64::from(*y));
                    assert!(r <= tol, "`{key}`: ours {x:e}, pymllm {y:e} (relative {r:e})");
                    if key.ends_with(".scale2") {
                        worst_s2 = worst_s2.max(r);
                    } else {
                        worst_scale = worst_scale.max(r);
                    }
                }
            }
            StDtype::I32 => {
                let (a, b) = (ours.read_i32(key).unwrap(), theirs.read_i32(key).unwrap());
                for (x, y) in a.iter().zip(&b) {
                    let r = rel(f64::from(*x), f64::from(*y));
                    assert!(r <= 1e-4, "`{key}`: ours {x}, pymllm {y}");
                    worst_zp = worst_zp.max(r);
                }
            }
            StDtype::I8 => assert_eq!(ours.read_i8(key).unwrap(), theirs.read_i8(key).unwrap(), "`{key}` nibbles"),
            StDtype::U8 => assert_eq!(ours.read_u8(key).unwrap(), theirs.read_u8(key).unwrap(), "`{key}` scale1"),
            StDtype::U16 if key.ends_with("_embedding") => {
                // RoPE tables: sin/cos of our own f32 tables vs torch's, quantized with parameters
                // equal to 1e-4: codes may differ by one step.
                let (a, b) = (ours.read_u16(key).unwrap(), theirs.read_u16(key).unwrap());
                for (x, y) in a.iter().zip(&b) {
                    assert!(x.abs_diff(*y) <= 1, "`{key}`: codes {x} vs {y}");
                    rope_off_by_one += usize::from(x != y);
                }
            }
            StDtype::U16 => assert_eq!(ours.read_u16(key).unwrap(), theirs.read_u16(key).unwrap(), "`{key}` codes"),
            other => panic!("`{key}`: unexpected dtype {other}"),
        }
    }
    eprintln!(
        "mllm-compatible: worst relative error: QDQ scale {worst_scale:e}, zero point {worst_zp:e}, scale2 \
         {worst_s2:e}; RoPE codes off by one: {rope_off_by_one} of {}",
        2 * 1024 * 8
    );
    eprint!("{}", outcome.report.table());

    // The written checkpoint runs in fake-quant mode like mllm's own export does.
    let r = SafetensorsCheckpoint::open_file(fixture("pymllm-qwen3-dev-f32").join("reference.safetensors")).unwrap();
    let ids: Vec<u32> = r.read_i64("input_ids").unwrap().into_iter().map(|v| v as u32).collect();
    let loaded = load_model(&out, 64, RunMode::Auto).unwrap();
    assert!(loaded.fake_quant);
    assert!(loaded.unused.is_empty(), "unused: {:?}", loaded.unused);
    let cfg = GenerationConfig {
        max_new_tokens: 1,
        prefill_chunk: ids.len(),
        sampling: Sampling::Greedy,
        eos_ids: vec![],
        collect_prompt_logits: true,
    };
    let logits = Generator::new(loaded.model).unwrap().generate(&ids, &cfg).unwrap().prompt_logits.unwrap();
    let c = Comparison::new("logits", &r.read_f32("deployedsim_logits").unwrap(), &logits, 128).unwrap();
    eprintln!("our export, fake-quant vs pymllm's deployedsim: {:.2} dB, top-1 {}", c.sqnr_db, c.top1_agreement);
    assert!(c.sqnr_db >= 40.0, "{} dB", c.sqnr_db);
    assert_eq!(c.top1_agreement, 1.0);
    remove_scratch(&out);
}

#[test]
fn deployed_mode_calibrates_the_deployed_model_and_reports() {
    let out = scratch("deployed");
    let outcome = run(CalibrationMode::Deployed, &out);
    eprint!("{}", outcome.report.table());
    let rows = &outcome.report.rows;
    assert_eq!(rows.len(), 3, "two decoder layers and the logits");
    assert!(rows[0].name.contains("model.layers.1.input_layernorm_input_qdq"), "{}", rows[0].name);
    assert!(rows[1].name.contains("model.norm_input_qdq"), "{}", rows[1].name);
    assert_eq!(rows[2].name, "logits");
    assert!(rows.iter().all(|r| r.sqnr_db.is_finite() && r.sqnr_db > 5.0 && r.rows == 8 * 32));
    // The report file says the same.
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("report.json")).unwrap()).unwrap();
    assert_eq!(report["calibration_mode"], "deployed");
    assert_eq!(report["accuracy"]["rows"].as_array().unwrap().len(), 3);
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("config.json")).unwrap()).unwrap();
    assert_eq!(config["linear_block_size"], 16);

    // Observing every position of the head widens its range compared with pymllm's last-position
    // observation (and the deployed weights move the rest).
    let ours = SafetensorsCheckpoint::open(&out).unwrap();
    let theirs = SafetensorsCheckpoint::open(fixture("pymllm-qwen3-dev-f32")).unwrap();
    let key = "lm_head_output_qdq.fake_quant.scale";
    let (a, b) = (ours.read_f32(key).unwrap()[0], theirs.read_f32(key).unwrap()[0]);
    assert!(a > b, "all positions ({a}) vs last position ({b})");
    remove_scratch(&out);
}

/// A model directory with qwen3-dev-f32's weights and a config edited by `edit`.
fn model_with_config(name: &str, edit: impl FnOnce(&mut serde_json::Value)) -> PathBuf {
    let dir = scratch(name);
    std::fs::create_dir_all(&dir).unwrap();
    let src = fixture("qwen3-dev-f32");
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    edit(&mut config);
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    std::fs::copy(src.join("model.safetensors"), dir.join("model.safetensors")).unwrap();
    dir
}

fn quantize_error(model: PathBuf, aot_config: Option<PathBuf>) -> String {
    let opts = QuantizeOptions { aot_config, ..QuantizeOptions::new(model, calib_ids(), scratch("never-written")) };
    let err = quantize(&opts).err().expect("quantize must refuse this configuration");
    eprintln!("{err:#}");
    assert!(!opts.out.join("model.safetensors").exists());
    remove_scratch(&opts.out);
    format!("{err:#}")
}

#[test]
fn block_size_conflicts_are_reported_before_calibration() {
    // HF linear_block_size 32 vs the built-in AOT config's 16.
    let model = model_with_config("bs32", |c| c["linear_block_size"] = serde_json::json!(32));
    let msg = quantize_error(model.clone(), None);
    assert!(msg.contains("linear_block_size") && msg.contains("32") && msg.contains("16"), "{msg}");
    remove_scratch(&model);

    // An AOT block size that does not divide the hidden width (32).
    let aot_text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../compiler/tests/data/mllm/qwen3-1.7b-qnn-aot-config.json"),
    )
    .unwrap();
    let aot = scratch("aot24.json");
    // mllm's config is for Qwen3-1.7B's 28 layers; the tiny model has 2 (a mismatch is its own error).
    let aot_text = aot_text.replace("\"layers\": 28", "\"layers\": 2");
    std::fs::write(&aot, aot_text.replace("\"block_size\": 16", "\"block_size\": 24")).unwrap();
    let model = model_with_config("nobs", |c| {
        c.as_object_mut().unwrap().remove("linear_block_size");
    });
    let msg = quantize_error(model.clone(), Some(aot.clone()));
    assert!(msg.contains("24") && msg.contains("does not divide"), "{msg}");
    remove_scratch(&model);
    remove_scratch(&aot);
}

#[test]
fn text_calibration_splits_paragraphs_and_truncates() {
    let text = scratch("calib.txt");
    std::fs::write(&text, "Alice was reading a book.\n\n\n  \nTwinkle, twinkle, little star.\nHow I wonder.\n")
        .unwrap();
    let tokenizer = fixture("tokenizer-tiny").join("tokenizer.json");
    let seqs = aot::load_text_sequences(&text, &tokenizer, 5, 10, None).unwrap();
    assert_eq!(seqs.len(), 2, "{seqs:?}");
    // expected.json: "Alice was reading a book." -> [81, 92, 113, 127, 78, 126, 8], cut to 5.
    assert_eq!(seqs[0], vec![81, 92, 113, 127, 78]);
    assert!(seqs[1].len() == 5);
    let template = checkpoint::ChatTemplate::from_dir(&fixture("tokenizer-tiny")).unwrap();
    let chat = aot::load_text_sequences(&text, &tokenizer, 1000, 1, Some(&template)).unwrap();
    assert_eq!(chat.len(), 1);
    assert_eq!(chat[0][0], 1, "the chat template starts with <|im_start|>");
    remove_scratch(&text);
}

//! The `generate` command as a user runs it: ids in, ids out; text prompts through tokenizer.json
//! (with and without the chat template); logits written to safetensors; clear errors.

use backend_cpu::checkpoint::SafetensorsCheckpoint;
use clap::Parser;
use mllm_examples::generate_cli::{run_generate, GenerateArgs};
use std::path::{Path, PathBuf};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures")
}

fn run(args: &[&str]) -> anyhow::Result<Vec<String>> {
    let mut argv = vec!["generate"];
    argv.extend_from_slice(args);
    run_generate(&GenerateArgs::try_parse_from(argv)?)
}

/// qwen3-dev-f32 plus the tiny tokenizer (same 128-id vocabulary) in a fresh directory.
fn model_with_tokenizer(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    std::fs::create_dir_all(&dir).unwrap();
    for f in ["config.json", "generation_config.json", "model.safetensors"] {
        std::fs::copy(fixtures().join("qwen3-dev-f32").join(f), dir.join(f)).unwrap();
    }
    std::fs::copy(fixtures().join("tokenizer-tiny/tokenizer.json"), dir.join("tokenizer.json")).unwrap();
    dir
}

fn expected_json() -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(fixtures().join("tokenizer-tiny/expected.json")).unwrap()).unwrap()
}

fn ids_line(lines: &[String]) -> Vec<u32> {
    lines[0].strip_prefix("ids: ").unwrap().split(',').map(|s| s.parse().unwrap()).collect()
}

#[test]
fn prompt_ids_give_prompt_then_hf_greedy_ids() {
    // The HF reference prompt of qwen3-dev-f32 and its greedy continuation.
    let r = SafetensorsCheckpoint::open_file(fixtures().join("qwen3-dev-f32/reference.safetensors")).unwrap();
    let prompt: Vec<String> = r.read_i64("input_ids").unwrap().iter().map(|v| v.to_string()).collect();
    let greedy: Vec<u32> = r.read_i64("greedy_ids").unwrap().iter().map(|&v| v as u32).collect();
    let model = fixtures().join("qwen3-dev-f32");
    let lines = run(&[
        "--model",
        model.to_str().unwrap(),
        "--prompt-ids",
        &prompt.join(","),
        "--max-new-tokens",
        "8",
        "--context",
        "64",
        "--timings",
    ])
    .unwrap();
    assert_eq!(ids_line(&lines), greedy);
    assert!(lines.last().unwrap().starts_with("prefill_tok_s="), "{lines:?}");
}

#[test]
fn logits_out_writes_prompt_logits() {
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("logits_out.safetensors");
    let model = fixtures().join("qwen3-dev-f32");
    run(&[
        "--model",
        model.to_str().unwrap(),
        "--prompt-ids",
        "5,17,42",
        "--max-new-tokens",
        "2",
        "--context",
        "64",
        "--logits-out",
        out.to_str().unwrap(),
    ])
    .unwrap();
    let f = SafetensorsCheckpoint::open_file(&out).unwrap();
    let (dtype, shape) = f.info("logits").unwrap();
    assert_eq!(format!("{dtype:?}"), "F32");
    assert_eq!(shape, &[1, 3, 128]);
    assert!(f.read_f32("logits").unwrap().iter().all(|v| v.is_finite()));
}

#[test]
fn text_prompt_is_tokenized_with_tokenizer_json() {
    let dir = model_with_tokenizer("gen_tok_plain");
    let case = &expected_json()["encode"][0];
    let lines = run(&[
        "--model",
        dir.to_str().unwrap(),
        "--prompt",
        case["text"].as_str().unwrap(),
        "--max-new-tokens",
        "3",
        "--context",
        "64",
    ])
    .unwrap();
    let want: Vec<u32> = case["ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
    assert_eq!(ids_line(&lines)[..want.len()], want[..]);
    assert!(lines[1].starts_with("text: "), "{lines:?}");
}

#[test]
fn chat_applies_qwen3_non_thinking_template() {
    let dir = model_with_tokenizer("gen_tok_chat");
    let chat = &expected_json()["chat"];
    let lines = run(&[
        "--model",
        dir.to_str().unwrap(),
        "--prompt",
        chat["prompt"].as_str().unwrap(),
        "--chat",
        "--max-new-tokens",
        "2",
        "--context",
        "64",
    ])
    .unwrap();
    let want: Vec<u32> = chat["ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
    assert_eq!(ids_line(&lines)[..want.len()], want[..]);
}

#[test]
fn bad_inputs_are_clear_errors() {
    let model = fixtures().join("qwen3-dev-f32");
    let m = model.to_str().unwrap();
    let err = run(&["--model", m, "--prompt-ids", "5,500"]).unwrap_err().to_string();
    assert!(err.contains("500") && err.contains("vocabulary"), "{err}");
    let err = run(&["--model", "/nonexistent/model", "--prompt-ids", "5"]).unwrap_err().to_string();
    assert!(err.contains("/nonexistent/model"), "{err}");
    let err = run(&["--model", m, "--prompt", "hi"]).unwrap_err().to_string();
    assert!(err.contains("tokenizer.json"), "{err}");
    let err = run(&["--model", m, "--prompt-ids", "5", "--context", "32"]).unwrap_err().to_string();
    assert!(err.contains("--chunk 32") && err.contains("--context 32"), "{err}");
    // Neither --prompt nor --prompt-ids.
    assert!(run(&["--model", m]).is_err());
}

//! The `generate` command as a user runs it: ids in, ids out; text prompts through tokenizer.json
//! (with and without the chat template); logits written to safetensors; clear errors.

use aot::lower_for_context;
use checkpoint::SafetensorsCheckpoint;
use clap::Parser;

/// The example's own source: these tests run its `run_generate` on parsed arguments.
#[allow(dead_code)]
#[path = "../generate.rs"]
mod generate;

use generate::{run_generate, GenerateArgs};
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
    for f in ["tokenizer.json", "chat_template.jinja"] {
        std::fs::copy(fixtures().join("tokenizer-tiny").join(f), dir.join(f)).unwrap();
    }
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

/// `--bf16-products` on the bf16 fixture gives the greedy ids of the NumPy forward that rounds each
/// linear's input to bf16.
#[test]
fn bf16_products_give_the_rounded_references_greedy_ids() {
    let r = SafetensorsCheckpoint::open_file(fixtures().join("qwen3-dev-bf16/reference_bf16_products.safetensors"))
        .unwrap();
    let prompt: Vec<String> = r.read_i64("input_ids").unwrap().iter().map(|v| v.to_string()).collect();
    let greedy: Vec<u32> = r.read_i64("greedy_ids").unwrap().iter().map(|&v| v as u32).collect();
    let model = fixtures().join("qwen3-dev-bf16");
    let args = ["--model", model.to_str().unwrap(), "--prompt-ids", &prompt.join(","), "--max-new-tokens", "8"];
    let lines = run(&[&args[..], &["--context", "64", "--bf16-products"]].concat()).unwrap();
    assert_eq!(ids_line(&lines), greedy);
    let err = run(&[&args[..], &["--bf16-products", "--qnn-context", "x.bin"]].concat()).unwrap_err();
    assert!(err.to_string().contains("--qnn-context"), "{err}");
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

/// The directory's chat template (tokenizer-tiny's Qwen3-style one) in non-thinking mode gives the
/// ids of mllm's runner prompt (expected.json).
#[test]
fn chat_applies_the_directory_template_non_thinking() {
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

/// A context binary of the tiny quantized Qwen3 (chunk 4 + 1, context 16), run by `--qnn-context
/// --qnn-emulate` on backend-qnn's reference interpreter, generates the CPU fake-quant run's ids.
#[test]
fn a_qnn_context_binary_generates_like_the_cpu_fake_quant_model() {
    use backend_qnn::context::write_context_binary;
    use backend_qnn::sdk::RecordingApi;
    use backend_qnn::target::HtpTarget;
    let model = fixtures().join("pymllm-qwen3-dev-f32");
    let graphs = lower_for_context(&model, 4, 16).unwrap();
    let target = HtpTarget::new(&compiler::aot_config::AotConfig::w4a16_kv8().target_machine);
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("qnn-context");
    std::fs::create_dir_all(&dir).unwrap();
    let binary = dir.join("qwen3-tiny.bin");
    write_context_binary(&graphs, &target, &mut RecordingApi::new(), &binary).unwrap();

    let m = model.to_str().unwrap();
    let common =
        ["--model", m, "--prompt-ids", "5,17,99,3,64,8", "--max-new-tokens", "8", "--chunk", "4", "--context", "16"];
    let cpu = run(&common).unwrap();
    let bin = binary.to_str().unwrap();
    let with = |extra: &[&'static str]| -> Vec<String> { common.iter().chain(extra).map(|s| s.to_string()).collect() };
    let strs = |v: &[String]| -> anyhow::Result<Vec<String>> { run(&v.iter().map(String::as_str).collect::<Vec<_>>()) };
    let mut args = with(&["--qnn-emulate", "--qnn-context"]);
    args.push(bin.to_string());
    let qnn = strs(&args).unwrap();
    assert_eq!(ids_line(&qnn), ids_line(&cpu));
    assert_eq!(ids_line(&qnn).len(), 6 + 8);

    // Graphs for another chunk length are not this binary's.
    let other: Vec<String> = args.iter().map(|a| if a == "4" { "2".to_string() } else { a.clone() }).collect();
    let err = format!("{:#}", strs(&other).unwrap_err());
    assert!(err.contains("qwen3-tiny.bin") && err.contains("`model.0.s4`"), "{err}");
    // Without --qnn-emulate the binary goes to Qualcomm's backend: it refuses the recording API's
    // fake bytes (the error names the file); without its libraries, the error says how to get them.
    let mut args = with(&["--qnn-context"]);
    args.push(bin.to_string());
    let err = format!("{:#}", strs(&args).unwrap_err());
    if backend_qnn::sdk::LibraryPaths::find().is_ok() {
        assert!(err.contains("qwen3-tiny.bin"), "{err}");
    } else {
        assert!(err.contains("scripts/fetch-qnn-sdk") && err.contains("--qnn-emulate"), "{err}");
    }
}

//! Qualcomm's HTP backend through the two commands, as a user runs them: `qwen3_aot` builds
//! `qnn/context.bin` (weight-shared, for the device) and `qnn/context.x86.bin` with the real
//! `libQnnHtp.so` and prints `htp_*` ledger rows; `generate --qnn-context qnn/context.x86.bin`
//! runs the binary on Qualcomm's x86 HTP emulation through the runtime (prompt processor, token
//! generator, KV cache manager) and, on every tiny fixture, its 16 greedy tokens are the CPU
//! fake-quant model's. Fails, naming `scripts/fetch-qnn-sdk`, when the libraries are absent.

use std::path::{Path, PathBuf};

use clap::Parser;

#[allow(dead_code)]
#[path = "../generate.rs"]
mod generate;
/// The examples' own sources: these tests run their entry points on parsed arguments.
#[allow(dead_code)]
#[path = "../qwen3_aot.rs"]
mod qwen3_aot;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures")
}

fn temp(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("qnn_htp").join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn generated_ids(args: &[&str]) -> Vec<u32> {
    let argv = ["generate"].iter().chain(args).copied();
    let lines = generate::run_generate(&generate::GenerateArgs::try_parse_from(argv).unwrap())
        .unwrap_or_else(|e| panic!("generate {args:?}: {e:#}"));
    lines[0].strip_prefix("ids: ").unwrap().split(',').map(|s| s.parse().unwrap()).collect()
}

/// Prompt of 6 ids, 16 new tokens: one padded prefill chunk of 32 (the default prefill graph),
/// then decode.
const PROMPT: &str = "5,17,99,3,64,8";

/// `qwen3_aot` on `source` (the default graphs, chunk 32 and 1, at context 64) with Qualcomm's
/// backend required, then `generate` on the CPU fake-quant model and on the x86 binary. Chunk 32
/// is where the backend's implicit select broadcast went wrong (`SelectBroadcast::Explicit`).
fn greedy_tokens_match_on_the_htp_emulation(name: &str, source: &[&str]) {
    // Qualcomm's HTP backend is a process-wide singleton: one test at a time uses it.
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    assert!(backend_qnn::sdk::LibraryPaths::find().is_ok(), "{}", backend_qnn::sdk::FETCH_HINT);
    let out = temp(name);
    let o = out.to_str().unwrap();
    let shape = ["--chunk", "32", "--chunk", "1", "--context-len", "64", "--context-binary", "on", "--out", o];
    let argv = ["qwen3_aot", "--quiet"].iter().chain(source).chain(&shape).copied();
    let report = qwen3_aot::run_aot(&qwen3_aot::AotArgs::try_parse_from(argv).unwrap()).unwrap();
    for stage in ["htp_vs_fakequant", "htp_vs_interp"] {
        let rows: Vec<_> = report.ledger.iter().filter(|e| e.stage == stage).collect();
        let graphs: Vec<_> = rows.iter().map(|e| e.graph.as_deref().unwrap()).collect();
        assert_eq!(graphs, ["model.0.s32", "model.0.s1"], "{name} {stage}");
        for e in rows {
            eprintln!("{name} {stage} {}: {:.2} dB", e.graph.as_deref().unwrap(), e.comparison.sqnr_db);
            assert!(e.comparison.sqnr_db >= 35.0, "{name} {stage}: {:?}", e.comparison);
        }
    }
    // The quantized checkpoint the graphs were built from: pymllm's export, or the calibrated one.
    let quantized = match source {
        ["--quantized", dir] => PathBuf::from(dir),
        _ => out.join("quantized"),
    };
    let q = quantized.to_str().unwrap();
    let common = ["--model", q, "--prompt-ids", PROMPT, "--max-new-tokens", "16", "--chunk", "32", "--context", "64"];
    let cpu = generated_ids(&common);
    let binary = out.join("qnn/context.x86.bin");
    let on_htp = generated_ids(&[&common[..], &["--qnn-context", binary.to_str().unwrap()]].concat());
    assert_eq!(cpu.len(), 6 + 16);
    assert_eq!(on_htp, cpu, "{name}: greedy ids on Qualcomm's HTP emulation vs the CPU fake-quant model");
    // The weight-shared binary next to it is the device's: refused on x86 (the emulation would
    // crash on it), naming the unshared one.
    let shared = out.join("qnn/context.bin");
    let shared_arg = ["--qnn-context", shared.to_str().unwrap()];
    let argv = ["generate"].iter().chain(&common).chain(&shared_arg).copied();
    let err = generate::run_generate(&generate::GenerateArgs::try_parse_from(argv).unwrap()).unwrap_err();
    assert!(format!("{err:#}").contains("context.x86.bin"), "{name}: {err:#}");
}

/// The fixture calibrated with pymllm's rounding as deployed (`--recipe rtn`, the recipe these
/// figures were measured with; a float `--model` defaults to its family's best).
fn calibrated(fixture: &str) -> [String; 6] {
    let calib = fixtures().join("pymllm-qwen3-dev-f32/calib_ids.safetensors");
    let model = fixtures().join(fixture);
    ["--model", &model.display().to_string(), "--calib-ids", &calib.display().to_string(), "--recipe", "rtn"]
        .map(String::from)
}

fn check_calibrated(fixture: &str) {
    let args = calibrated(fixture);
    greedy_tokens_match_on_the_htp_emulation(fixture, &args.iter().map(String::as_str).collect::<Vec<_>>());
}

#[test]
fn qwen3_generates_the_same_tokens_on_qualcomms_htp_emulation() {
    let dir = fixtures().join("pymllm-qwen3-dev-f32");
    greedy_tokens_match_on_the_htp_emulation("qwen3", &["--quantized", dir.to_str().unwrap()]);
}

#[test]
fn llama_generates_the_same_tokens_on_qualcomms_htp_emulation() {
    check_calibrated("llama-dev-f32");
}

#[test]
fn llama3_generates_the_same_tokens_on_qualcomms_htp_emulation() {
    check_calibrated("llama3-dev-f32");
}

#[test]
fn qwen2_generates_the_same_tokens_on_qualcomms_htp_emulation() {
    check_calibrated("qwen2-dev-f32");
}

/// Every layer slides (window 8): the 22 positions of the prompt and its tokens outgrow the window,
/// so the graphs' second mask plane decides the tokens.
#[test]
fn mistral_sliding_window_generates_the_same_tokens_on_qualcomms_htp_emulation() {
    check_calibrated("mistral-dev-f32");
}

/// Fused qkv_proj / gate_up_proj, window 12.
#[test]
fn phi3_generates_the_same_tokens_on_qualcomms_htp_emulation() {
    check_calibrated("phi3-dev-f32");
}

/// Layer 0 full, layer 1 sliding (window 8): one graph reads both mask planes.
#[test]
fn qwen2_sliding_window_generates_the_same_tokens_on_qualcomms_htp_emulation() {
    check_calibrated("qwen2-sw-dev-f32");
}

/// Gemma 3: (1 + w) norms (gamma + 1 requantized at lowering), four norms per layer, GELU-tanh,
/// sliding layers with their own RoPE tables, softcapped logits.
#[test]
fn gemma3_generates_the_same_tokens_on_qualcomms_htp_emulation() {
    check_calibrated("gemma3-dev-f32");
}

/// A graph family (chunks 8, 4, 1 at contexts 32 and 64) built by `qwen3_aot` into one context
/// binary with Qualcomm's backend; `generate` choosing every step's graph by its modelled cost on
/// the x86 binary, with a prompt that moves the sequence to the larger context, gives the fixed
/// pair's greedy ids (chunk 4 + decode at context 64 on the CPU fake-quant model).
#[test]
fn a_graph_family_generates_the_fixed_pairs_tokens_on_qualcomms_htp_emulation() {
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    assert!(backend_qnn::sdk::LibraryPaths::find().is_ok(), "{}", backend_qnn::sdk::FETCH_HINT);
    let dir = fixtures().join("pymllm-qwen3-dev-f32");
    let q = dir.to_str().unwrap();
    let out = temp("family");
    let o = out.to_str().unwrap();
    let argv = [
        "qwen3_aot",
        "--quiet",
        "--quantized",
        q,
        "--chunk",
        "8",
        "--chunk",
        "4",
        "--chunk",
        "1",
        "--context-len",
        "32",
        "--context-len",
        "64",
        "--context-binary",
        "on",
        "--out",
        o,
    ];
    let report = qwen3_aot::run_aot(&qwen3_aot::AotArgs::try_parse_from(argv).unwrap()).unwrap();
    let graphs: Vec<&str> = report.graphs.iter().map(|g| g.name.as_str()).collect();
    assert_eq!(
        graphs,
        ["model.0.s8", "model.0.s4", "model.0.s1", "model.0.s8_cl64", "model.0.s4_cl64", "model.0.s1_cl64"]
    );
    assert!(report.shared_static_bytes * 5 < report.unshared_static_bytes, "{report:?}");
    for e in report.ledger.iter().filter(|e| e.stage == "htp_vs_fakequant") {
        assert!(e.comparison.sqnr_db >= 35.0, "{:?}: {:?}", e.graph, e.comparison);
    }
    // 26 prompt ids + 16 new: 42 positions outgrow context 32.
    let prompt = "5,17,99,3,64,8,21,77,42,9,100,11,60,33,2,90,14,55,71,6,38,120,47,29,81,12";
    let fixed = generated_ids(&[
        "--model",
        q,
        "--prompt-ids",
        prompt,
        "--max-new-tokens",
        "16",
        "--chunk",
        "4",
        "--context",
        "64",
    ]);
    let binary = out.join("qnn/context.x86.bin");
    let family = [
        "--model",
        q,
        "--prompt-ids",
        prompt,
        "--max-new-tokens",
        "16",
        "--chunk",
        "8",
        "--chunk",
        "4",
        "--context",
        "32",
        "--context",
        "64",
        "--qnn-context",
        binary.to_str().unwrap(),
        "--verbose",
    ];
    let argv = ["generate"].iter().chain(&family).copied();
    let lines = generate::run_generate(&generate::GenerateArgs::try_parse_from(argv).unwrap()).unwrap();
    let on_htp: Vec<u32> = lines[0].strip_prefix("ids: ").unwrap().split(',').map(|s| s.parse().unwrap()).collect();
    assert_eq!(fixed.len(), 26 + 16);
    assert_eq!(on_htp, fixed, "greedy ids of the family on Qualcomm's HTP emulation vs the fixed pair on the CPU");
    assert!(lines.iter().any(|l| l.starts_with("graph: move: context 32 -> 64")), "{lines:#?}");
    assert!(lines.iter().any(|l| l.starts_with("graph: prompt") && l.contains("chunk 8")), "{lines:#?}");
}

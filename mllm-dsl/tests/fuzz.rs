//! Fuzz targets over the parsers of untrusted text (issue #14): the HF config, mllm's AOT config
//! JSON and the IR text. A parser must answer every input with a value or an error, never a
//! panic; what parses must be usable without one too (RoPE frequencies, printing the IR).
//! `MLLM_FUZZ_SECONDS=600 cargo test -p mllm-dsl --test fuzz -- --test-threads 1` runs each
//! target ten minutes (default: 2 s each). Crash inputs become regression tests below.

use std::path::{Path, PathBuf};

use mllm_dsl::config::aot::AotConfig;
use mllm_dsl::config::hf::HfConfig;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn read_all(paths: impl IntoIterator<Item = PathBuf>) -> Vec<Vec<u8>> {
    paths.into_iter().map(|p| std::fs::read(&p).unwrap_or_else(|e| panic!("seed {}: {e}", p.display()))).collect()
}

fn hf_target(bytes: &[u8]) {
    let text = String::from_utf8_lossy(bytes);
    let path = Path::new("fuzz/config.json");
    if let Ok(mut config) = HfConfig::parse(&text, path) {
        let freqs = config.rope_inv_freq();
        assert_eq!(freqs.len(), config.head_dim / 2);
        let _ = config.model_kind();
        let _ = config.merge_generation_config(&text, path);
    }
}

fn aot_target(bytes: &[u8]) {
    if let Ok(config) = AotConfig::from_json_str(&String::from_utf8_lossy(bytes)) {
        // What parses prints back to JSON that parses to the same config.
        let again = AotConfig::from_json(&config.to_json()).expect("a parsed config round-trips");
        assert_eq!(again.to_json(), config.to_json());
        let _ = config.warnings();
    }
}

fn ir_target(bytes: &[u8]) {
    if let Ok(program) = mllm_dsl::ir::parse(&String::from_utf8_lossy(bytes)) {
        let _ = program.to_string();
    }
}

#[test]
fn fuzz_hf_config() {
    let mut seeds = read_all(
        ["qwen3-dev-f32", "qwen2-dev-f32", "llama3-dev-f32", "pymllm-qwen3-dev-f32"]
            .map(|d| repo().join("fixtures").join(d).join("config.json")),
    );
    seeds.extend(read_all([repo().join("fixtures/llama3-dev-f32/generation_config.json")]));
    let runs = mllm_dsl::fuzz::run("hf_config", &seeds, hf_target);
    assert!(runs >= seeds.len() as u64);
}

#[test]
fn fuzz_aot_config() {
    let mut seeds = read_all(
        ["qwen3-1.7b-qnn-aot-config.json", "qwen3-4b-qnn-aot-config.json"]
            .map(|f| Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/mllm").join(f)),
    );
    seeds.push(AotConfig::w4a16_kv8().to_json().to_string().into_bytes());
    mllm_dsl::fuzz::run("aot_config", &seeds, aot_target);
}

#[test]
fn fuzz_ir_text() {
    let mut seeds: Vec<Vec<u8>> = ["qwen3__mlp__trace.snap", "qwen3__attention__trace.snap"]
        .iter()
        .map(|f| {
            let text = std::fs::read_to_string(repo().join("snapshots").join(f)).unwrap();
            // The IR after insta's `---` header.
            text.splitn(3, "---\n").nth(2).unwrap().as_bytes().to_vec()
        })
        .collect();
    // Every kind of value name and a spec table.
    seeds.push(std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/ir/named.mir")).unwrap());
    for seed in &seeds {
        mllm_dsl::ir::parse(std::str::from_utf8(seed).unwrap()).expect("seeds are valid IR");
    }
    mllm_dsl::fuzz::run("ir_text", &seeds, ir_target);
}

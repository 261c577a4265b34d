//! Fuzz target over the HF config parser: every input gets a config or an error, never a panic;
//! what parses must be usable without one too (RoPE frequencies, the model kind).
//! `MLLM_FUZZ_SECONDS=600 cargo test -p models --test fuzz_hf_config` runs it ten minutes
//! (default: 2 s). Crash inputs become regression tests below.

use std::path::{Path, PathBuf};

use models::hf::HfConfig;

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

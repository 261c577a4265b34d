//! Fuzz target over mllm's AOT config JSON parser: every input gets a config or an error, never
//! a panic; what parses round-trips through its JSON.
//! `MLLM_FUZZ_SECONDS=600 cargo test -p compiler --test fuzz_aot_config` runs it ten minutes
//! (default: 2 s). Crash inputs become regression tests below.

use std::path::{Path, PathBuf};

use compiler::aot_config::AotConfig;

fn read_all(paths: impl IntoIterator<Item = PathBuf>) -> Vec<Vec<u8>> {
    paths.into_iter().map(|p| std::fs::read(&p).unwrap_or_else(|e| panic!("seed {}: {e}", p.display()))).collect()
}

fn aot_target(bytes: &[u8]) {
    if let Ok(config) = AotConfig::from_json_str(&String::from_utf8_lossy(bytes)) {
        // What parses prints back to JSON that parses to the same config.
        let again = AotConfig::from_json(&config.to_json()).expect("a parsed config round-trips");
        assert_eq!(again.to_json(), config.to_json());
        let _ = config.warnings();
    }
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

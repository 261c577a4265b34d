//! What `--model` accepts, as a user meets it: an HF checkpoint directory or a GGUF file (converted
//! once into the cache, `$MLLM_DSL_CACHE/gguf/`); any other path is an error saying what it is and
//! what was expected.
//!
//! `fixtures/gguf-tiny/llama-tiny.gguf` is `fixtures/llama-dev-f32` as llama.cpp's converter writes
//! it, so `generate` on the GGUF must give HF transformers' greedy ids for `llama-dev-f32`.

use checkpoint::SafetensorsCheckpoint;
use clap::Parser;
use std::path::{Path, PathBuf};
use std::sync::Once;

/// The examples' own sources: these tests run their entry points on parsed arguments.
#[allow(dead_code)]
#[path = "../generate.rs"]
mod generate;
#[allow(dead_code)]
#[path = "../qwen3_aot.rs"]
mod qwen3_aot;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures")
}

/// This test binary's cache (empty when the binary starts), so conversions are seen to happen.
fn cache() -> PathBuf {
    static INIT: Once = Once::new();
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("model-paths-cache");
    INIT.call_once(|| {
        let _ = std::fs::remove_dir_all(&dir);
        std::env::set_var("MLLM_DSL_CACHE", &dir);
    });
    dir
}

fn generate(args: &[&str]) -> anyhow::Result<Vec<String>> {
    cache();
    let mut argv = vec!["generate"];
    argv.extend_from_slice(args);
    generate::run_generate(&generate::GenerateArgs::try_parse_from(argv)?)
}

/// The cache's conversions, without the staging locks (`.<dir>.lock`) beside them; nothing else
/// may be there (no staging directory left behind).
fn conversions() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    for entry in std::fs::read_dir(cache().join("gguf")).unwrap() {
        let (path, name) = (entry.as_ref().unwrap().path(), entry.unwrap().file_name().into_string().unwrap());
        if name.starts_with('.') {
            assert!(name.ends_with(".lock"), "{}", path.display());
        } else {
            dirs.push(path);
        }
    }
    dirs.sort();
    dirs
}

fn ids_line(lines: &[String]) -> Vec<u32> {
    lines[0].strip_prefix("ids: ").unwrap().split(',').map(|s| s.parse().unwrap()).collect()
}

#[test]
fn generate_runs_a_gguf_file_like_the_hf_checkpoint_it_was_made_from() {
    let r = SafetensorsCheckpoint::open_file(fixtures().join("llama-dev-f32/reference.safetensors")).unwrap();
    let prompt: Vec<String> = r.read_i64("input_ids").unwrap().iter().map(|v| v.to_string()).collect();
    let greedy: Vec<u32> = r.read_i64("greedy_ids").unwrap().iter().map(|&v| v as u32).collect();
    let gguf = fixtures().join("gguf-tiny/llama-tiny.gguf");
    let args = ["--model", gguf.to_str().unwrap(), "--prompt-ids", &prompt.join(","), "--max-new-tokens", "8"];
    let lines = generate(&[&args[..], &["--context", "64"]].concat()).unwrap();
    assert_eq!(ids_line(&lines), greedy);

    // Converted once: one directory in the cache (beside it only the lock of its staging
    // directory, `.<dir>.lock`), found again by the second run.
    let converted = conversions();
    assert_eq!(converted.len(), 1, "{converted:?}");
    let dir = &converted[0];
    assert!(dir.file_name().unwrap().to_str().unwrap().starts_with("llama-tiny-"), "{}", dir.display());
    let stamp = std::fs::metadata(dir.join("model.safetensors")).unwrap().modified().unwrap();
    let lines = generate(&[&args[..], &["--context", "48"]].concat()).unwrap();
    assert_eq!(ids_line(&lines), greedy);
    assert_eq!(std::fs::metadata(dir.join("model.safetensors")).unwrap().modified().unwrap(), stamp);
    assert_eq!(conversions(), converted);
}

#[test]
fn other_paths_name_what_they_are_and_what_was_expected() {
    let expected = "expected an HF checkpoint directory (config.json + model.safetensors or shards) or a GGUF file";
    let not_gguf = fixtures().join("llama-dev-f32/model.safetensors");
    let no_config = fixtures().join("gguf-tiny");
    let missing = fixtures().join("no-such-model");
    let cases = [
        (&not_gguf, "a file that is not GGUF"),
        (&no_config, "a directory without config.json"),
        (&missing, "no such file or directory"),
    ];
    for (path, what) in cases {
        let path = path.to_str().unwrap();
        let err = generate(&["--model", path, "--prompt-ids", "5"]).unwrap_err().to_string();
        assert!(err.contains(path) && err.contains(what) && err.contains(expected), "generate: {err}");
        let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("model-paths-aot");
        let argv = ["qwen3_aot", "--model", path, "--calib-ids", "x.safetensors", "--out", out.to_str().unwrap()];
        let err = qwen3_aot::run_aot(&qwen3_aot::AotArgs::try_parse_from(argv).unwrap()).unwrap_err().to_string();
        assert!(err.contains(path) && err.contains(what) && err.contains(expected), "qwen3_aot: {err}");
        assert!(!out.exists(), "a refused model leaves no output");
    }
}

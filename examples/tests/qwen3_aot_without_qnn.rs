//! `qwen3_aot` on a machine without Qualcomm's QNN libraries: by default it runs everything else
//! and says in one warning how to get them; `--context-binary on` fails before any work. Its own
//! test binary (own process) because it points `QNN_SDK_ROOT` at a directory without them.

use std::path::{Path, PathBuf};

use clap::Parser;

/// The example's own source: these tests run its `run_aot` on parsed arguments.
#[allow(dead_code)]
#[path = "../qwen3_aot.rs"]
mod qwen3_aot;

fn temp(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("qwen3_aot_without_qnn").join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn run(args: &[&str]) -> anyhow::Result<aot::AotReport> {
    let argv = ["qwen3_aot", "--quiet"].iter().chain(args).copied();
    qwen3_aot::run_aot(&qwen3_aot::AotArgs::try_parse_from(argv)?)
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

#[test]
fn without_the_libraries_the_run_says_how_to_get_them() {
    let dir = temp("run");
    let no_sdk = dir.join("no-qnn-sdk");
    // The only test of this process: nothing else reads the variable.
    std::env::set_var("QNN_SDK_ROOT", &no_sdk);
    let missing = no_sdk.join("lib/x86_64-linux-clang/libQnnHtp.so");
    let model = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/pymllm-qwen3-dev-f32");
    let out = dir.join("out");
    let args = ["--quantized", model.to_str().unwrap(), "--chunk", "4", "--context-len", "16"];
    let with_out = |extra: &[&'static str]| -> Vec<String> {
        args.iter().chain(extra).map(|s| s.to_string()).chain(["--out".into(), out.display().to_string()]).collect()
    };

    // Required: an error naming the missing library and the script, before any work.
    let err = format!("{:#}", run(&strs(&with_out(&["--context-binary"]))).unwrap_err());
    assert!(err.contains("--context-binary needs Qualcomm's QNN libraries"), "{err}");
    assert!(err.contains(&missing.display().to_string()) && err.contains("scripts/fetch-qnn-sdk"), "{err}");
    assert!(!out.exists(), "nothing may be written");

    // Default (auto): everything else runs; one warning says how to get them.
    let report = run(&strs(&with_out(&[]))).unwrap();
    let warnings: Vec<_> = report.warnings.iter().filter(|w| w.contains("scripts/fetch-qnn-sdk")).collect();
    assert_eq!(warnings.len(), 1, "{:?}", report.warnings);
    assert!(warnings[0].contains("qnn/context.bin") && warnings[0].contains("skipped"), "{}", warnings[0]);
    assert!(report.summary().contains(&format!("warning: {}", warnings[0])), "{}", report.summary());
    assert!(report.ledger.iter().all(|e| !e.stage.starts_with("htp_")));
    assert!(report.ledger.iter().any(|e| e.stage == "qnn_vs_fakequant"));
    assert!(out.join("qnn/model.0.s4.json").is_file() && !out.join("qnn/context.bin").exists());

    // Off: no warning.
    let report = run(&strs(&with_out(&["--context-binary", "off"]))).unwrap();
    assert!(report.warnings.iter().all(|w| !w.contains("scripts/fetch-qnn-sdk")), "{:?}", report.warnings);
}

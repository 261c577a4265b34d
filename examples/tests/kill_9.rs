//! A run killed with SIGKILL mid-way leaves `--out` byte-identical, and the next run removes the
//! staging directory it left behind: `qwen3_aot` (the embedded tiny model, through the example's
//! own `run_aot`) and `quantize` (through `aot::quantize`, what the example calls).
//!
//! The killed run is a real process: this test binary started again with only
//! [`child_run`] selected and the run described in environment variables.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use clap::Parser;

#[allow(dead_code)]
#[path = "../qwen3_aot.rs"]
mod qwen3_aot;

/// Which run the child process makes (`aot` or `quantize`), and into which `--out`.
const CHILD_RUN: &str = "MLLM_DSL_KILL9_RUN";
const CHILD_OUT: &str = "MLLM_DSL_KILL9_OUT";

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures")
}

fn temp(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("kill_9").join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// One run into `out`: the embedded model through `qwen3_aot`, or the tiny float fixture through
/// `quantize` (deployed mode, pymllm's calibration ids).
fn run_into(which: &str, out: &Path) {
    let out = out.to_str().unwrap();
    match which {
        "aot" => {
            let args = qwen3_aot::AotArgs::try_parse_from(["qwen3_aot", "--quiet", "--out", out]).unwrap();
            qwen3_aot::run_aot(&args).unwrap();
        }
        "quantize" => {
            let ids = fixtures().join("pymllm-qwen3-dev-f32/calib_ids.safetensors");
            aot::quantize(&aot::QuantizeOptions {
                model: fixtures().join("qwen3-dev-f32"),
                aot_config: None,
                calibration: aot::load_id_sequences(&ids, "calib_ids", 128).unwrap(),
                evaluation: None,
                mode: backend_cpu::quant::CalibrationMode::Deployed,
                out: out.into(),
                max_positions: 1024,
                progress: aot::progress::silent(),
                weight_method: backend_cpu::quant::WeightMethod::Rtn,
                rotation: backend_cpu::quant::Rotation::None,
            })
            .unwrap();
        }
        other => panic!("{CHILD_RUN}={other}: expected aot or quantize"),
    }
}

/// The killed process: runs only when the parent test selects it and says what to run.
#[test]
#[ignore = "the child process of the kill -9 tests, which run it with --ignored"]
fn child_run() {
    let which = std::env::var(CHILD_RUN).expect("started by a kill -9 test, which sets the run");
    let out = std::env::var_os(CHILD_OUT).expect("started by a kill -9 test, which sets --out");
    run_into(&which, Path::new(&out));
}

/// Every file under `dir`, relative, with its bytes.
fn files(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, Vec<u8>>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(root, &path, out);
            } else {
                let rel = path.strip_prefix(root).unwrap().to_string_lossy().replace('\\', "/");
                out.insert(rel, std::fs::read(&path).unwrap());
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, dir, &mut out);
    out
}

/// The staging directories next to `out` (`.out.staging-*`).
fn staging_dirs(parent: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(parent)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with(".out.staging-"))
        .collect()
}

/// A good run into `out`, then a child run into it killed with SIGKILL once its staging
/// directory appears; `out` must be untouched, and the next run must clear the orphan.
fn killed_run_leaves_out_untouched(which: &str) {
    let dir = temp(which);
    let out = dir.join("out");
    run_into(which, &out);
    let before = files(&out);
    assert!(before.contains_key("report.json") || before.contains_key("quantized/report.json"), "{:?}", before.keys());

    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["child_run", "--exact", "--ignored", "--nocapture"])
        .env(CHILD_RUN, which)
        .env(CHILD_OUT, &out)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Kill once the run is under way: its staging directory exists (made before calibration).
    let start = Instant::now();
    let staging = loop {
        if let Some(s) = staging_dirs(&dir).pop() {
            break s;
        }
        if let Some(status) = child.try_wait().unwrap() {
            panic!("the child run ended ({status}) before it was killed: no staging directory seen");
        }
        assert!(start.elapsed() < Duration::from_secs(300), "no staging directory appeared in 300 s");
        std::thread::sleep(Duration::from_millis(2));
    };
    child.kill().unwrap(); // SIGKILL on Unix: no destructor, no cleanup runs.
    let status = child.wait().unwrap();
    assert!(!status.success(), "{status}");

    assert_eq!(files(&out), before, "--out changed under a killed {which} run");
    assert!(staging.exists(), "the killed run's staging directory {} should be left behind", staging.display());

    // The next run removes the orphan and ends with a complete output.
    run_into(which, &out);
    assert_eq!(staging_dirs(&dir), Vec::<PathBuf>::new());
    assert_eq!(files(&out).keys().collect::<Vec<_>>(), before.keys().collect::<Vec<_>>());
}

#[test]
fn kill_9_during_qwen3_aot_leaves_out_untouched() {
    killed_run_leaves_out_untouched("aot");
}

#[test]
fn kill_9_during_quantize_leaves_out_untouched() {
    killed_run_leaves_out_untouched("quantize");
}

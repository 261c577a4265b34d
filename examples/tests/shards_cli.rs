//! `qwen3_aot --shards` and `generate --qnn-context` on a shard set, as a user runs them: the
//! tiny Qwen3 (2 layers) cut into 2 shards, each binary built by a child process (the
//! `qwen3_aot` example binary), the chained shards' ledger rows on Qualcomm's x86 HTP emulation,
//! and the same greedy tokens from the shard set as from the CPU fake-quant model; bad
//! `--shards` values and shard sets fail naming what is wrong, leaving the previous `--out`.

use std::path::{Path, PathBuf};

use clap::Parser;

#[allow(dead_code)]
#[path = "../generate.rs"]
mod generate;
#[allow(dead_code)]
#[path = "../qwen3_aot.rs"]
mod qwen3_aot;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures")
}

fn temp(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("shards_cli").join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The `qwen3_aot` example binary cargo builds beside this test (`target/<profile>/examples`):
/// the program the shard builds run as.
fn qwen3_aot_exe() -> PathBuf {
    let deps = std::env::current_exe().unwrap().parent().unwrap().to_path_buf();
    let exe = deps.parent().unwrap().join("examples/qwen3_aot");
    assert!(exe.is_file(), "{} is missing: build the examples (cargo test builds them)", exe.display());
    exe
}

/// Qualcomm's HTP backend is a process-wide singleton, and one test sets an environment variable
/// every child sees: these tests take turns.
fn turn() -> std::sync::MutexGuard<'static, ()> {
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    ONE_AT_A_TIME.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn aot(args: &[&str]) -> anyhow::Result<aot::AotReport> {
    let argv = ["qwen3_aot", "--quiet"].iter().chain(args).copied();
    qwen3_aot::run_aot(&qwen3_aot::AotArgs::try_parse_from(argv)?)
}

/// `generate`'s output lines (`ids: ...` first; with `--verbose`, a `graph: ...` line per step).
fn generate_lines(args: &[&str]) -> anyhow::Result<Vec<String>> {
    let argv = ["generate"].iter().chain(args).copied();
    generate::run_generate(&generate::GenerateArgs::try_parse_from(argv)?)
}

fn generated(args: &[&str]) -> anyhow::Result<Vec<u32>> {
    let lines = generate_lines(args)?;
    Ok(lines[0].strip_prefix("ids: ").unwrap().split(',').map(|s| s.parse().unwrap()).collect())
}

#[test]
fn two_shards_chain_on_the_htp_emulation_and_generate_the_fake_quant_tokens() {
    let _turn = turn();
    assert!(backend_qnn::sdk::LibraryPaths::find().is_ok(), "{}", backend_qnn::sdk::FETCH_HINT);
    let out = temp("two");
    let o = out.to_str().unwrap();
    let exe = qwen3_aot_exe();
    let e = exe.to_str().unwrap();
    let pymllm = fixtures().join("pymllm-qwen3-dev-f32");
    let q = pymllm.to_str().unwrap();
    let shape = ["--chunk", "32", "--chunk", "1", "--context-len", "64"];
    let report = aot(&[
        &["--quantized", q, "--context-binary", "on", "--shards", "2", "--shard-exe", e, "--out", o][..],
        &shape[..],
    ]
    .concat())
    .unwrap();
    for stage in ["qnn_vs_fakequant", "htp_vs_fakequant", "htp_vs_interp"] {
        let rows: Vec<_> = report.ledger.iter().filter(|r| r.stage == stage).collect();
        let graphs: Vec<_> = rows.iter().map(|r| r.graph.as_deref().unwrap()).collect();
        assert_eq!(graphs, ["model.0..1.s32", "model.0..1.s1"], "{stage}");
        for r in rows {
            eprintln!("{stage} {}: {:.2} dB", r.graph.as_deref().unwrap(), r.comparison.sqnr_db);
            assert!(r.comparison.sqnr_db >= 35.0, "{stage}: {:?}", r.comparison);
        }
    }
    for f in ["context_1_of_2.bin", "context_2_of_2.bin", "context_1_of_2.x86.bin", "context_2_of_2.x86.bin"] {
        assert!(out.join("qnn").join(f).is_file(), "{f}");
    }
    assert!(!out.join("qnn/context.bin").exists());
    // The token embedding is gathered on the CPU from its own table.
    assert!(out.join("qnn/embedding.safetensors").is_file());
    assert!(report.shards.iter().any(|l| l.contains("2 shard(s), the count asked for")), "{:?}", report.shards);
    let names: Vec<_> = report.graphs.iter().map(|g| g.name.as_str()).collect();
    assert_eq!(names, ["model.0.s32", "model.0.s1", "model.1.s32", "model.1.s1"]);

    // The runtime chains the shard set; its greedy tokens are the CPU fake-quant model's.
    let common =
        ["--model", q, "--prompt-ids", "5,17,99,3,64,8", "--max-new-tokens", "32", "--chunk", "32", "--context", "64"];
    let cpu = generated(&common).unwrap();
    assert_eq!(cpu.len(), 6 + 32);
    let qnn_dir = out.join("qnn");
    let set = generated(&[&common[..], &["--qnn-context", qnn_dir.to_str().unwrap()]].concat()).unwrap();
    assert_eq!(set, cpu, "greedy ids of the chained shards on Qualcomm's HTP emulation vs the CPU fake-quant model");
    let first = qnn_dir.join("context_1_of_2.x86.bin");
    let by_file = generated(&[&common[..], &["--qnn-context", first.to_str().unwrap()]].concat()).unwrap();
    assert_eq!(by_file, cpu);

    // A set with a missing shard, or an extra one, is refused naming the file.
    let broken = temp("broken");
    let first_only = "context_1_of_2.x86.bin";
    std::fs::copy(qnn_dir.join(first_only), broken.join(first_only)).unwrap();
    let err = generated(&[&common[..], &["--qnn-context", broken.to_str().unwrap()]].concat()).unwrap_err();
    let msg = format!("{err:#}");
    assert!(msg.contains("context_2_of_2.x86.bin") && msg.contains("missing"), "{msg}");
    std::fs::copy(qnn_dir.join("context_2_of_2.x86.bin"), broken.join("context_2_of_2.x86.bin")).unwrap();
    // Without the embedding table: refused, naming it.
    let err = generated(&[&common[..], &["--qnn-context", broken.to_str().unwrap()]].concat()).unwrap_err();
    let msg = format!("{err:#}");
    assert!(msg.contains("embedding.safetensors") && msg.contains("missing"), "{msg}");
    std::fs::copy(qnn_dir.join("embedding.safetensors"), broken.join("embedding.safetensors")).unwrap();
    let fixed = generated(&[&common[..], &["--qnn-context", broken.to_str().unwrap()]].concat()).unwrap();
    assert_eq!(fixed, cpu);
    std::fs::copy(qnn_dir.join("context_2_of_2.x86.bin"), broken.join("context_3_of_3.x86.bin")).unwrap();
    let err = generated(&[&common[..], &["--qnn-context", broken.to_str().unwrap()]].concat()).unwrap_err();
    assert!(format!("{err:#}").contains("different splits"), "{err:#}");
    // Shard 1 twice (shard 2's place taken by a copy of shard 1): refused, naming it.
    std::fs::remove_file(broken.join("context_3_of_3.x86.bin")).unwrap();
    std::fs::copy(qnn_dir.join("context_1_of_2.x86.bin"), broken.join("context_2_of_2.x86.bin")).unwrap();
    let err = generated(&[&common[..], &["--qnn-context", broken.to_str().unwrap()]].concat()).unwrap_err();
    let msg = format!("{err:#}");
    assert!(msg.contains("context_2_of_2.x86.bin"), "{msg}");
}

#[test]
fn bad_shard_counts_are_named_errors_and_keep_the_previous_out() {
    let _turn = turn();
    let out = temp("bad");
    let o = out.to_str().unwrap();
    let pymllm = fixtures().join("pymllm-qwen3-dev-f32");
    let q = pymllm.to_str().unwrap();
    let base = ["--quantized", q, "--chunk", "4", "--chunk", "1", "--context-len", "16", "--context-binary", "off"];
    aot(&[&base[..], &["--out", o]].concat()).unwrap();
    let before = std::fs::read(out.join("report.json")).unwrap();
    let err = aot(&[&base[..], &["--out", o, "--shards", "0"]].concat()).unwrap_err();
    assert!(format!("{err:#}").contains("'--shards <N|auto>'") && format!("{err:#}").contains("0 shards"), "{err:#}");
    let err = aot(&[&base[..], &["--out", o, "--shards", "3"]].concat()).unwrap_err();
    assert!(format!("{err:#}").contains("more than the model's 2 decoder layers"), "{err:#}");
    let err = aot(&[&base[..], &["--out", o, "--shards", "1", "--max-context-bytes", "1000"]].concat()).unwrap_err();
    assert!(format!("{err:#}").contains("--max-context-bytes 1000"), "{err:#}");
    let err = aot(&[&base[..], &["--out", o, "--max-context-bytes", "1000"]].concat()).unwrap_err();
    assert!(format!("{err:#}").contains("no cut of the layers fits"), "{err:#}");
    // Shards hold one context length with mllm's names: a wider family is refused before any work.
    let err = aot(&[&base[..], &["--out", o, "--shards", "2", "--context-len", "32"]].concat()).unwrap_err();
    assert!(format!("{err:#}").contains("2 shards of a family with context lengths [16, 32]"), "{err:#}");
    let err = aot(&[&base[..], &["--out", o, "--shards", "2", "--graph-names", "genie"]].concat()).unwrap_err();
    assert!(format!("{err:#}").contains("Genie names"), "{err:#}");
    assert_eq!(std::fs::read(out.join("report.json")).unwrap(), before, "the previous --out is intact");
}

#[test]
fn a_failing_child_build_reaches_the_user_and_keeps_the_previous_out() {
    let _turn = turn();
    assert!(backend_qnn::sdk::LibraryPaths::find().is_ok(), "{}", backend_qnn::sdk::FETCH_HINT);
    let out = temp("killed");
    let o = out.to_str().unwrap();
    std::fs::write(out.join("keep.txt"), "previous").unwrap();
    let exe = qwen3_aot_exe();
    let pymllm = fixtures().join("pymllm-qwen3-dev-f32");
    let args = [
        "--quantized",
        pymllm.to_str().unwrap(),
        "--chunk",
        "4",
        "--chunk",
        "1",
        "--context-len",
        "16",
        "--context-binary",
        "on",
        "--shards",
        "2",
        "--jobs",
        "1",
        "--shard-exe",
        exe.to_str().unwrap(),
        "--out",
        o,
    ];
    // Shard 2's child aborts (SIGABRT) before building.
    std::env::set_var(aot::shard_build::ABORT_ENV, "2");
    let err = aot(&args).unwrap_err();
    std::env::remove_var(aot::shard_build::ABORT_ENV);
    let msg = format!("{err:#}");
    assert!(msg.contains("context_2_of_2") && msg.contains("killed by signal 6"), "{msg}");
    assert!(msg.contains("aborting before the build"), "the child's own stderr reaches the user: {msg}");
    assert_eq!(std::fs::read_to_string(out.join("keep.txt")).unwrap(), "previous");
}

/// SmolLM2-135M-Instruct calibrated once for these tests (round to nearest, with the
/// attention-sink prefix its recipe uses) and built as one binary with mllm's pair (chunk 32 and 1
/// at context 256); Qualcomm's emulation of both graphs is at 35 dB or more against the CPU
/// fake-quant run.
struct SmolLm2 {
    /// The quantized checkpoint.
    quantized: PathBuf,
    /// The one x86 context binary.
    whole: PathBuf,
}

/// Chunks and context of the one binary.
const SMOLLM2_PAIR: [&str; 8] = ["--chunk", "32", "--chunk", "1", "--context-len", "256", "--context-binary", "on"];

fn smollm2() -> &'static SmolLm2 {
    static BUILT: std::sync::OnceLock<SmolLm2> = std::sync::OnceLock::new();
    BUILT.get_or_init(|| {
        assert!(backend_qnn::sdk::LibraryPaths::find().is_ok(), "{}", backend_qnn::sdk::FETCH_HINT);
        let model = aot::smollm2_dir().unwrap_or_else(|e| panic!("{e:#}"));
        let calib = temp("smollm2-calib").join("calib.txt");
        std::fs::write(
            &calib,
            "The cache holds the keys and values of every earlier position, so each new token attends to the \
             whole conversation without recomputing it. A phone's NPU runs the decoder layers in fixed-size chunks.\n",
        )
        .unwrap();
        let one = temp("smollm2-1");
        let calibrate = [
            "--model",
            model.to_str().unwrap(),
            "--calib-text",
            calib.to_str().unwrap(),
            "--recipe",
            "rtn",
            "--sink-prefix",
            "<|endoftext|>",
            "--shards",
            "1",
            "--out",
            one.to_str().unwrap(),
        ];
        let report = aot(&[&calibrate[..], &SMOLLM2_PAIR[..]].concat()).unwrap();
        let rows: Vec<_> = report.ledger.iter().filter(|r| r.stage == "htp_vs_fakequant").collect();
        let graphs: Vec<_> = rows.iter().map(|r| r.graph.as_deref().unwrap()).collect();
        assert_eq!(graphs, ["model.0.s32", "model.0.s1"]);
        for r in rows {
            let db = r.comparison.sqnr_db;
            eprintln!("--shards 1: htp_vs_fakequant {}: {db:.2} dB", r.graph.as_deref().unwrap());
            assert!(db.is_finite() && db >= 35.0, "--shards 1: {r:?}");
        }
        SmolLm2 { quantized: one.join("quantized"), whole: one.join("qnn/context.x86.bin") }
    })
}

/// SmolLM2's quantized checkpoint built as one binary and as 2 and 3 shards, each run by
/// `generate --qnn-context` on Qualcomm's HTP emulation: the same 32 greedy tokens, and every
/// chained graph's `htp_vs_fakequant` row at 35 dB or more.
#[test]
fn smollm2_in_one_two_and_three_shards_generates_the_same_tokens() {
    let _turn = turn();
    let built = smollm2();
    let exe = qwen3_aot_exe();
    let e = exe.to_str().unwrap();
    let q = built.quantized.to_str().unwrap();
    let prompt =
        ["--prompt", "The capital of France is", "--max-new-tokens", "32", "--chunk", "32", "--context", "256"];
    let tokens = |binary: &std::path::Path| {
        generated(&[&["--model", q][..], &prompt[..], &["--qnn-context", binary.to_str().unwrap()][..]].concat())
            .unwrap()
    };
    let whole = tokens(&built.whole);
    for n in ["2", "3"] {
        let out = temp(&format!("smollm2-{n}"));
        let o = out.to_str().unwrap();
        let report =
            aot(&[&["--quantized", q, "--shards", n, "--shard-exe", e, "--out", o][..], &SMOLLM2_PAIR[..]].concat())
                .unwrap();
        let chained: Vec<_> = report.ledger.iter().filter(|r| r.stage == "htp_vs_fakequant").collect();
        assert_eq!(chained.len(), 2, "one chained row per chunk size: {chained:?}");
        for r in chained {
            let db = r.comparison.sqnr_db;
            eprintln!("--shards {n}: htp_vs_fakequant {}: {db:.2} dB", r.graph.as_deref().unwrap());
            assert!(db.is_finite() && db >= 35.0, "--shards {n}: {r:?}");
        }
        let set = tokens(&out.join("qnn"));
        assert_eq!(set, whole, "--shards {n}: greedy ids of the chained shards vs the one binary");
    }
    eprintln!("32 greedy tokens in 1, 2 and 3 shards: {:?}", &whole[whole.len() - 32..]);
}

/// Graph selection on the real model: SmolLM2's checkpoint built as a family (chunk 32 and 1 at
/// contexts 64 and 256, one weight-shared binary) generates 12 tokens after a 55-token prompt, so
/// that the sequence (sink prefix + prompt + 12 = 68 positions) outgrows context 64 and moves to
/// 256 once; the tokens equal the fixed pair's (chunk 32 and 1 at context 256), on the CPU
/// fake-quant model and on Qualcomm's HTP emulation (the one binary above).
/// 55 tokens of SmolLM2's tokenizer.
const LONG_PROMPT: &str = "A phone runs a language model in fixed-size steps: the prompt in chunks of \
    thirty-two tokens, then one token at a time. Each step reads the cache of keys and values that \
    the earlier positions left behind, and writes its own. The capital of France is";

#[test]
fn smollm2_family_selection_generates_the_fixed_pairs_tokens() {
    let _turn = turn();
    let built = smollm2();
    let q = built.quantized.to_str().unwrap();
    let out = temp("smollm2-family");
    let family = ["--chunk", "32", "--chunk", "1", "--context-len", "64", "--context-len", "256"];
    let report = aot(&[
        &["--quantized", q, "--shards", "1", "--context-binary", "on", "--out", out.to_str().unwrap()][..],
        &family,
    ]
    .concat())
    .unwrap();
    for r in report.ledger.iter().filter(|r| r.stage == "htp_vs_fakequant") {
        let db = r.comparison.sqnr_db;
        eprintln!("family: htp_vs_fakequant {}: {db:.2} dB", r.graph.as_deref().unwrap());
        assert!(db.is_finite() && db >= 35.0, "family: {r:?}");
    }
    let prompt = ["--model", q, "--prompt", LONG_PROMPT, "--max-new-tokens", "12"];
    let fixed = ["--chunk", "32", "--context", "256"];
    let selecting = ["--chunk", "32", "--chunk", "1", "--context", "64", "--context", "256", "--verbose"];
    let run = |args: &[&str]| generate_lines(args).unwrap();
    let ids = |lines: &[String]| lines[0].strip_prefix("ids: ").unwrap().to_string();
    let moves = |lines: &[String]| lines.iter().filter(|l| l.starts_with("graph: move: context 64 -> 256")).count();
    let family_binary = out.join("qnn/context.x86.bin");
    let whole = built.whole.to_str().unwrap();
    for (backend, extra_fixed, extra_selecting) in [
        ("CPU fake-quant", vec![], vec![]),
        ("HTP emulation", vec!["--qnn-context", whole], vec!["--qnn-context", family_binary.to_str().unwrap()]),
    ] {
        let fixed = run(&[&prompt[..], &fixed, &extra_fixed].concat());
        let chosen = run(&[&prompt[..], &selecting, &extra_selecting].concat());
        assert_eq!(ids(&chosen), ids(&fixed), "{backend}: selection vs the fixed pair");
        assert_eq!(moves(&chosen), 1, "{backend}: {chosen:#?}");
        eprintln!("{backend}: selection = fixed pair: {}", ids(&fixed));
    }
}

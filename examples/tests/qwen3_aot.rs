//! `qwen3_aot` as a user runs it, through its command-line entry ([`run_aot`] on parsed
//! arguments): the embedded default writes every artifact with a sane accuracy ledger, a rerun
//! writes the same bytes, pymllm's quantized export compiles, and each bad input fails with a
//! message naming the file or field.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use aot::AotReport;
use backend_cpu::quant::Sqnr;
use checkpoint::{write_safetensors_atomic, SafetensorsCheckpoint, TensorBytes};
use clap::{CommandFactory, Parser};
use compiler::aot_config::AotConfig;

/// The example's own source: these tests run its `run_aot` on parsed arguments.
#[allow(dead_code)]
#[path = "../qwen3_aot.rs"]
mod qwen3_aot;

use qwen3_aot::{run_aot, AotArgs};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures")
}

/// A fresh directory for one test.
fn temp(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("qwen3_aot").join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn run(args: &[&str]) -> anyhow::Result<AotReport> {
    let mut argv = vec!["qwen3_aot", "--quiet"];
    argv.extend_from_slice(args);
    run_aot(&AotArgs::try_parse_from(argv)?)
}

/// The full error chain.
fn error(args: &[&str]) -> String {
    match run(args) {
        Ok(_) => panic!("{args:?} succeeded"),
        Err(e) => format!("{e:#}"),
    }
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

fn report_json(dir: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(dir.join("report.json")).unwrap()).unwrap()
}

/// Ledger rows of `stage`.
fn rows<'a>(report: &'a serde_json::Value, stage: &str) -> Vec<&'a serde_json::Value> {
    report["ledger"].as_array().unwrap().iter().filter(|r| r["stage"] == stage).collect()
}

/// A context binary's graphs as Qualcomm's `libQnnSystem.so` reads them back: per graph, its
/// name and each I/O tensor's name, dtype, dims and encoding (not the tensor ids, which the
/// backend numbers anew on every build in a process).
fn context_metadata(binary: &[u8]) -> Vec<(String, Vec<String>)> {
    let paths = backend_qnn::sdk::LibraryPaths::find().expect(backend_qnn::sdk::FETCH_HINT);
    let system = backend_qnn::sdk::ffi::SystemApi::load(&paths.system).unwrap();
    let info = system.binary_info(binary).unwrap();
    assert_eq!(info.graphs.len(), 2, "a context binary of both graphs");
    let io = |t: &backend_qnn::IoTensor| format!("{} {:?} {:?} {:?}", t.name, t.dtype, t.dims, t.quant);
    info.graphs.iter().map(|g| (g.name.clone(), g.inputs.iter().chain(&g.outputs).map(io).collect())).collect()
}

/// A ledger row's SQNR in dB: `"identical"` is +∞; `"non-finite"` (a NaN or infinity in the
/// logits), `null` or anything else fails the test.
fn db(row: &serde_json::Value) -> f64 {
    match Sqnr::from_json(&row["sqnr_db"]) {
        Some(Sqnr::Db(db)) => db,
        Some(Sqnr::Identical) => f64::INFINITY,
        Some(Sqnr::NonFinite) | None => panic!("ledger row without a finite SQNR: {row}"),
    }
}

/// Op types and their counts, from the graph's QNN Netron JSON (independent of the report's
/// own count, which comes from the graph summary).
fn netron_ops(path: &Path) -> BTreeMap<String, u64> {
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    let mut ops = BTreeMap::new();
    for node in json["graph"]["nodes"].as_object().unwrap().values() {
        *ops.entry(node["type"].as_str().unwrap().to_string()).or_insert(0) += 1;
    }
    ops
}

const STAGES: [&str; 10] = [
    "00-trace",
    "01-mark_qnn_graph",
    "02-op_naming",
    "03-merge_llm_head",
    "04-llm_quant_recipe",
    "05-ptq",
    "06-lpbq_canonicalize",
    "07-split_llm_graph",
    "08-mark_tensor_io",
    "09-tensor_renaming",
];

#[test]
fn the_default_run_writes_every_artifact_with_a_sane_ledger_and_the_same_bytes_twice() {
    let out = temp("default");
    let out_s = out.to_str().unwrap();
    assert!(backend_qnn::sdk::LibraryPaths::find().is_ok(), "{}", backend_qnn::sdk::FETCH_HINT);
    let report = run(&["--out", out_s]).unwrap();
    let written = files(&out);

    // Every artifact, and the report lists exactly the files on disk.
    let mut expected = vec![
        "embedded/calib_ids.safetensors",
        "embedded/qwen3-dev-f32/config.json",
        "embedded/qwen3-dev-f32/model.safetensors",
        "embedded/qwen3-dev-f32/reference.safetensors",
        "quantized/config.json",
        "quantized/model.safetensors",
        "quantized/report.json",
        "report.json",
        // Built by Qualcomm's backend (the libraries are required here: scripts/fetch-qnn-sdk).
        "qnn/context.bin",
        "qnn/context.x86.bin",
        // The graphs' static buffers, once for both (their model.bin).
        "qnn/weights.bin",
    ]
    .into_iter()
    .map(String::from)
    .collect::<Vec<_>>();
    for graph in ["model.0.s32", "model.0.s1"] {
        expected.extend(STAGES.iter().map(|s| format!("ir/{graph}/{s}.mir")));
        expected.extend(["json", "cpp", "summary.txt"].iter().map(|e| format!("qnn/{graph}.{e}")));
    }
    expected.sort();
    assert_eq!(written.keys().cloned().collect::<Vec<_>>(), expected);
    let json = report_json(&out);
    let listed: Vec<String> =
        json["artifacts"].as_array().unwrap().iter().map(|a| a.as_str().unwrap().into()).collect();
    assert_eq!(listed, expected);
    assert_eq!(report.artifacts, expected);

    // The embedded checkpoint is the fixture, byte for byte.
    for f in ["config.json", "model.safetensors", "reference.safetensors"] {
        let fixture = std::fs::read(fixtures().join("qwen3-dev-f32").join(f)).unwrap();
        assert_eq!(written[&format!("embedded/qwen3-dev-f32/{f}")], fixture, "{f}");
    }
    // The quantized checkpoint is in pymllm's format: LPBQ codes and scales, QDQ parameters.
    let q = SafetensorsCheckpoint::open(out.join("quantized")).unwrap();
    for key in [
        "model.layers.0.mlp.up_proj.weight",
        "model.layers.0.mlp.up_proj.scale1",
        "model.layers.0.mlp.up_proj.scale2",
        "model.layers.1.self_attn.k_cast_to_int8_qdq.fake_quant.scale",
        "model.mllm_max_sin_embedding",
    ] {
        assert!(q.contains(key), "quantized checkpoint lacks `{key}`");
    }

    // The ledger: every stage, with figures that make sense for a random tiny model in W4A16.
    assert_eq!(json["model"], "embedded:qwen3-dev-f32");
    let float = rows(&json, "float_vs_reference");
    assert_eq!(float.len(), 1);
    assert!(db(float[0]) > 80.0 && float[0]["top1_agreement"] == 1.0, "float vs HF reference: {}", float[0]);
    let fq = rows(&json, "fakequant_vs_float");
    assert_eq!(fq.len(), 1);
    assert_eq!(fq[0]["rows"], 8 * 32, "8 calibration sequences of 32 tokens");
    let (fq_db, fq_top1) = (db(fq[0]), fq[0]["top1_agreement"].as_f64().unwrap());
    assert!((5.0..60.0).contains(&fq_db), "fake-quant vs float SQNR {fq_db} dB");
    assert!(fq_top1 > 0.5 && fq_top1 <= 1.0, "fake-quant vs float top-1 {fq_top1}");
    assert!(fq[0]["max_abs_err"].as_f64().unwrap() > 0.0);
    for (stage, floor) in [("passes_vs_eager", 35.0), ("qnn_vs_fakequant", 35.0)] {
        let r = rows(&json, stage);
        let graphs: Vec<&str> = r.iter().map(|r| r["graph"].as_str().unwrap()).collect();
        assert_eq!(graphs, ["model.0.s32", "model.0.s1"], "{stage}");
        for row in r {
            assert!(db(row) >= floor, "{stage}: {row}");
            assert!(row["top1_agreement"].as_f64().unwrap() >= 0.9, "{stage}: {row}");
        }
    }
    // Qualcomm's x86 HTP emulation: both graphs agree with both references. model.0.s32 gave
    // -1.1 dB until the attention mask's select got its operands broadcast explicitly for
    // Qualcomm's backend (backend_qnn::SelectBroadcast; docs/ledger.md).
    for stage in ["htp_vs_fakequant", "htp_vs_interp"] {
        let r = rows(&json, stage);
        let graphs: Vec<&str> = r.iter().map(|r| r["graph"].as_str().unwrap()).collect();
        assert_eq!(graphs, ["model.0.s32", "model.0.s1"], "{stage}");
        for row in r {
            assert!(db(row) >= 35.0 && row["top1_agreement"] == 1.0, "{stage}: {row}");
        }
    }
    assert_eq!(rows(&json, "qnn_vs_fakequant")[0]["rows"], 32);
    assert_eq!(rows(&json, "qnn_vs_fakequant")[1]["rows"], 1);

    // Graphs: op counts agree with the QNN JSON; weights are shared by name, so both graphs
    // carry the same static bytes.
    let graphs = json["graphs"].as_array().unwrap();
    assert_eq!(graphs.len(), 2);
    for g in graphs {
        let name = g["name"].as_str().unwrap();
        let ops: BTreeMap<String, u64> =
            g["ops"].as_object().unwrap().iter().map(|(k, v)| (k.clone(), v.as_u64().unwrap())).collect();
        assert_eq!(ops, netron_ops(&out.join(format!("qnn/{name}.json"))), "{name}");
        assert_eq!(ops["Conv2d"], 15, "{name}: 7 linears per layer x 2 + lm_head");
        assert!(g["tensors"].as_u64().unwrap() > 100);
    }
    assert_eq!(graphs[0]["static_bytes"], graphs[1]["static_bytes"]);
    assert!(graphs[0]["static_bytes"].as_u64().unwrap() > 10_000);
    // Each graph's modelled cost per call on both targets, and the cost model with its sources.
    for g in graphs {
        let cost = &g["cost"];
        assert!(cost["macs"].as_u64().unwrap() > 0 && cost["kv_read_bytes"].as_u64().unwrap() > 0, "{cost}");
        let rate = if cost["chunk"] == 1 { "decode_tok_s" } else { "prefill_tok_s" };
        for target in ["SM8650 (v75)", "SM8750 (v79)"] {
            assert!(cost["modelled"][target][rate].as_f64().unwrap() > 0.0, "{target}: {cost}");
        }
    }
    let targets = json["cost_model"]["targets"].as_array().unwrap();
    assert_eq!(targets.len(), 2);
    assert!(targets.iter().all(|t| t["sources"].as_array().unwrap().len() >= 3), "{targets:?}");
    let ratio = json["cost_model"]["vs_mllm_qwen3_1_7b_sm8650"]["decode_tok_s"]["ratio"].as_f64().unwrap();
    assert!((0.5..=2.0).contains(&ratio), "{ratio}");
    // The weights are held once for both graphs.
    let (shared, unshared) =
        (json["static_bytes"]["shared"].as_u64().unwrap(), json["static_bytes"]["unshared"].as_u64().unwrap());
    assert!(shared < unshared && unshared <= 2 * shared, "{shared} {unshared}");
    let timings = json["timings_s"].as_object().unwrap();
    for key in
        ["load", "rotate", "input_stats", "calibrate", "evaluate", "trace", "passes", "lower", "validate", "total"]
    {
        assert!(timings[key].as_f64().unwrap() >= 0.0, "timings_s.{key}");
    }
    for key in ["context_binary", "context_binary_x86"] {
        assert!(timings[key].as_f64().unwrap() > 0.0, "timings_s.{key}: Qualcomm's backend ran");
    }
    let summary = report.summary();
    for needle in ["qnn_vs_fakequant", "model.0.s32", "Conv2d", "modelled cost per call", "SM8650"] {
        assert!(summary.contains(needle), "summary lacks {needle}:\n{summary}");
    }

    // A second run with the same inputs: the same bytes, except report.json's timings.
    let first_report = {
        let mut j = json.clone();
        j.as_object_mut().unwrap().remove("timings_s");
        j
    };
    run(&["--out", out_s]).unwrap();
    let again = files(&out);
    assert_eq!(again.keys().collect::<Vec<_>>(), written.keys().collect::<Vec<_>>());
    for (name, bytes) in &written {
        if name.starts_with("qnn/context") {
            // Qualcomm's serializer does not reproduce its bytes, nor its size: padded to 4 KiB
            // pages, it moved by one page in local runs and by two in a CI run (327680 then
            // 335872 bytes). What must not move is what the binary holds: graph names, I/O
            // names, dtypes, dims and encodings as Qualcomm's system library reads them back
            // (and the htp_* rows below, executed from the x86 binary, are equal).
            assert_eq!(context_metadata(&again[name]), context_metadata(bytes), "{name}");
        } else if name != "report.json" {
            assert!(&again[name] == bytes, "{name} differs between two runs");
        }
    }
    let mut second_report = report_json(&out);
    second_report.as_object_mut().unwrap().remove("timings_s");
    assert_eq!(first_report, second_report);
}

#[test]
fn pymllms_quantized_export_compiles_without_calibration() {
    let out = temp("pymllm");
    let ckpt = fixtures().join("pymllm-qwen3-dev-f32");
    let report = run(&[
        "--quantized",
        ckpt.to_str().unwrap(),
        "--chunk",
        "4",
        "--chunk",
        "1",
        "--context-len",
        "16",
        "--out",
        out.to_str().unwrap(),
    ])
    .unwrap();
    let json = report_json(&out);
    assert!(rows(&json, "float_vs_reference").is_empty(), "no float checkpoint to compare");
    // Our fake-quant run of pymllm's checkpoint vs pymllm's float logits.
    let fq = rows(&json, "fakequant_vs_float");
    assert_eq!(fq.len(), 1);
    // pymllm's own simulation of its deployed checkpoint (`deployedsim_logits`: fake-quant with
    // every weight decoded from the export) against its float logits, computed here naively.
    let reference = SafetensorsCheckpoint::open_file(ckpt.join("reference.safetensors")).unwrap();
    let (float, sim) = (reference.read_f32("float_logits").unwrap(), reference.read_f32("deployedsim_logits").unwrap());
    let signal: f64 = float.iter().map(|&f| f64::from(f).powi(2)).sum();
    let noise: f64 = float.iter().zip(&sim).map(|(&f, &s)| (f64::from(s) - f64::from(f)).powi(2)).sum();
    let pymllm_db = 10.0 * (signal / noise).log10();
    assert!((db(fq[0]) - pymllm_db).abs() < 0.05, "ours {} dB, pymllm's deployed simulation {pymllm_db:.3} dB", fq[0]);
    assert_eq!(fq[0]["rows"], 8);
    for row in rows(&json, "qnn_vs_fakequant") {
        assert!(db(row) >= 35.0, "{row}");
    }
    assert_eq!(report.graphs.iter().map(|g| g.name.as_str()).collect::<Vec<_>>(), ["model.0.s4", "model.0.s1"]);
    let written = files(&out);
    assert!(!written.keys().any(|k| k.starts_with("quantized/") || k.starts_with("embedded/")));
    assert!(written.contains_key("ir/model.0.s4/09-tensor_renaming.mir"));
    assert!(written.contains_key("qnn/model.0.s1.cpp"));
    // The two graphs read the same weights: one model.bin holds them, not one per graph.
    assert!(written.contains_key("qnn/weights.bin"));
    assert!(!written.keys().any(|k| k.starts_with("qnn/model.") && k.ends_with(".bin")), "{:?}", written.keys());
}

/// qwen3-dev-f32 (config.json and weights) copied into `dir/model`, without `drop_tensor`.
fn float_copy(dir: &Path, drop_tensor: Option<&str>) -> PathBuf {
    let src = fixtures().join("qwen3-dev-f32");
    let model = dir.join("model");
    std::fs::create_dir_all(&model).unwrap();
    std::fs::copy(src.join("config.json"), model.join("config.json")).unwrap();
    let ckpt = SafetensorsCheckpoint::open(&src).unwrap();
    let keys: Vec<String> = ckpt.keys().into_iter().filter(|k| Some(*k) != drop_tensor).map(String::from).collect();
    let data: Vec<(String, _, Vec<usize>, Vec<u8>)> = keys
        .iter()
        .map(|k| {
            let (dtype, shape) = ckpt.info(k).unwrap();
            (k.clone(), dtype, shape.to_vec(), ckpt.read_bytes(k).unwrap())
        })
        .collect();
    let tensors: Vec<TensorBytes<'_>> =
        data.iter().map(|(k, d, s, b)| (k.as_str(), *d, s.as_slice(), b.as_slice())).collect();
    write_safetensors_atomic(model.join("model.safetensors"), &tensors, &BTreeMap::new()).unwrap();
    model
}

fn calib_ids() -> String {
    fixtures().join("pymllm-qwen3-dev-f32/calib_ids.safetensors").to_str().unwrap().to_string()
}

#[test]
fn bad_inputs_fail_with_messages_naming_the_file_or_field() {
    let dir = temp("errors");
    let out = dir.join("out");
    let out = out.to_str().unwrap();

    // No config.json.
    let empty = dir.join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let err = error(&["--model", empty.to_str().unwrap(), "--calib-ids", &calib_ids(), "--out", out]);
    assert!(err.contains("config.json"), "{err}");
    // Malformed config.json.
    let bad = float_copy(&dir.join("malformed"), None);
    std::fs::write(bad.join("config.json"), "{\"model_type\": \"qwen3\", \"hidden_size\": ").unwrap();
    let err = error(&["--model", bad.to_str().unwrap(), "--calib-ids", &calib_ids(), "--out", out]);
    assert!(err.contains("config.json"), "{err}");

    // An AOT config field with a value mllm does not know.
    let mut cfg = AotConfig::w4a16_kv8().to_json();
    cfg["target_machine"]["htp_arch"] = "V99".into();
    let cfg_path = dir.join("bad_arch.json");
    std::fs::write(&cfg_path, cfg.to_string()).unwrap();
    let pymllm = fixtures().join("pymllm-qwen3-dev-f32");
    let quantized = ["--quantized", pymllm.to_str().unwrap(), "--chunk", "4", "--context-len", "16", "--out", out];
    let err = error(&[&quantized[..], &["--aot-config", cfg_path.to_str().unwrap()][..]].concat());
    assert!(err.contains("bad_arch.json") && err.contains("target_machine.htp_arch"), "{err}");

    // A block size that does not divide the linears' input width (32).
    let mut cfg = AotConfig::w4a16_kv8().to_json();
    cfg["quant_recipe"]["builtin_llm_pass"]["linear"]["fallback"]["block_size"] = 24.into();
    cfg["quant_recipe"]["layers"] = 2.into(); // the tiny model's, so the block size is what fails
    let cfg_path = dir.join("block24.json");
    std::fs::write(&cfg_path, cfg.to_string()).unwrap();
    let err = error(&[&quantized[..], &["--aot-config", cfg_path.to_str().unwrap()][..]].concat());
    assert!(err.contains("block size 24 does not divide") && err.contains("block_size"), "{err}");
    let model = float_copy(&dir.join("for_block24"), None);
    let err = error(&[
        "--model",
        model.to_str().unwrap(),
        "--calib-ids",
        &calib_ids(),
        "--aot-config",
        cfg_path.to_str().unwrap(),
        "--out",
        out,
    ]);
    assert!(err.contains("24") && err.contains("block_size"), "{err}");

    // A checkpoint missing a tensor.
    let missing = float_copy(&dir.join("missing"), Some("model.layers.1.mlp.down_proj.weight"));
    let err = error(&["--model", missing.to_str().unwrap(), "--calib-ids", &calib_ids(), "--out", out]);
    assert!(err.contains("model.layers.1.mlp.down_proj.weight"), "{err}");

    // A float checkpoint passed as quantized, and a float one without calibration data.
    let err = error(&["--quantized", model.to_str().unwrap(), "--out", out]);
    assert!(err.contains("float checkpoint") && err.contains("--model"), "{err}");
    let err = error(&["--model", model.to_str().unwrap(), "--out", out]);
    assert!(err.contains("--calib-ids"), "{err}");
    // Chunk sizes the context cannot hold.
    let err = error(&[&quantized[..], &["--chunk", "16"][..]].concat());
    assert!(err.contains("--chunk 16 must be smaller than the context length 16"), "{err}");
    // Arguments that exclude each other.
    let err = error(&["--model", "a", "--quantized", "b"]);
    assert!(err.contains("--quantized"), "{err}");

    // Attention-sink prefixes: outside the vocabulary, a token's text without a tokenizer, one for
    // a quantized checkpoint (which ships its own), and pymllm's recipe are refused.
    let calibrate = ["--model", model.to_str().unwrap(), "--calib-ids", &calib_ids(), "--out", out];
    let err = error(&[&calibrate[..], &["--sink-prefix", "id:128"][..]].concat());
    assert!(err.contains("--sink-prefix id:128") && err.contains("outside the vocabulary 0..128"), "{err}");
    let err = error(&[&calibrate[..], &["--sink-prefix", "<|endoftext|>"][..]].concat());
    assert!(err.contains("--sink-prefix <|endoftext|>") && err.contains("tokenizer.json"), "{err}");
    let err = error(&[&quantized[..], &["--sink-prefix", "id:1"][..]].concat());
    assert!(err.contains("--sink-prefix") && err.contains("ships its own prefix"), "{err}");
    assert!(!Path::new(out).exists(), "no output from refused runs");
}

#[test]
fn help_documents_every_argument_and_the_report() {
    AotArgs::command().debug_assert();
    let help = AotArgs::command().render_long_help().to_string();
    for flag in [
        "--model",
        "--quantized",
        "--aot-config",
        "--calib-ids",
        "--calib-text",
        "--context-len",
        "--chunk",
        "--out",
        "--context-binary",
    ] {
        assert!(help.contains(flag), "--help lacks {flag}");
    }
    for needle in ["report.json", "timings_s", "qnn_vs_fakequant", "byte-identical", "ir/<graph>"] {
        assert!(help.contains(needle), "--help lacks {needle}");
    }
    // The defaults as documented.
    let args = AotArgs::try_parse_from(["qwen3_aot"]).unwrap();
    let opts = args.options().unwrap();
    assert_eq!((opts.chunks, opts.context_lens), (vec![32, 1], vec![1024]));
    assert!(opts.out.ends_with("qwen3_aot"));
}

#[test]
fn calibration_text_goes_through_the_model_directorys_tokenizer() {
    let dir = temp("calib-text");
    let model = float_copy(&dir, None);
    let tokenizer = fixtures().join("tokenizer-tiny/tokenizer.json");
    std::fs::copy(&tokenizer, model.join("tokenizer.json")).unwrap();
    let paragraphs = ["the cat sat on a mat.", "it was warm, and it was quiet!"];
    let text = dir.join("calib.txt");
    std::fs::write(&text, paragraphs.join("\n\n")).unwrap();
    let out = dir.join("out");
    run(&[
        "--model",
        model.to_str().unwrap(),
        "--calib-text",
        text.to_str().unwrap(),
        "--recipe",
        "rtn",
        "--chunk",
        "4",
        "--context-len",
        "16",
        "--out",
        out.to_str().unwrap(),
    ])
    .unwrap();
    // The fake-quant rows are the calibration tokens, as the tokenizer cuts them.
    let tok = tokenizers::Tokenizer::from_file(&tokenizer).unwrap();
    let tokens: usize = paragraphs.iter().map(|p| tok.encode(*p, false).unwrap().get_ids().len()).sum();
    let json = report_json(&out);
    assert_eq!(rows(&json, "fakequant_vs_float")[0]["rows"], tokens);
    assert_eq!(json["model"], model.to_str().unwrap());
    assert!(out.join("quantized/tokenizer.json").is_file());
}

/// Issue #14: the output directory is replaced whole or not at all.
#[test]
fn outputs_are_transactional_and_inputs_are_never_outputs() {
    let dir = temp("transactional");
    let out = dir.join("out");
    let ckpt = fixtures().join("pymllm-qwen3-dev-f32");
    let base = ["--quantized", ckpt.to_str().unwrap(), "--context-len", "16", "--out", out.to_str().unwrap()];
    fn join<'a>(base: &[&'a str], extra: &[&'a str]) -> Vec<&'a str> {
        base.iter().chain(extra).copied().collect()
    }
    run(&join(&base, &["--chunk", "4", "--chunk", "1"])).unwrap();
    let before = files(&out);
    assert!(before.contains_key("qnn/model.0.s4.cpp"));

    // A config that disagrees with the model fails before any work, naming the field; the
    // previous output is byte-identical and no staging directory is left behind.
    let mut cfg = AotConfig::w4a16_kv8().to_json();
    cfg["quant_recipe"]["layers"] = 3.into();
    let cfg_path = dir.join("three_layers.json");
    std::fs::write(&cfg_path, cfg.to_string()).unwrap();
    let err = error(&join(&base, &["--chunk", "4", "--aot-config", cfg_path.to_str().unwrap()]));
    assert!(err.contains("quant_recipe.layers") && err.contains('3') && err.contains("num_hidden_layers 2"), "{err}");
    let mut cfg = AotConfig::w4a16_kv8().to_json();
    cfg["op_on_qnn"] = serde_json::json!([]);
    cfg["quant_recipe"]["layers"] = 2.into();
    std::fs::write(&cfg_path, cfg.to_string()).unwrap();
    let err = error(&join(&base, &["--chunk", "4", "--aot-config", cfg_path.to_str().unwrap()]));
    assert!(err.contains("op_on_qnn"), "{err}");
    let q = ckpt.to_str().unwrap();
    let err = error(&["--quantized", q, "--context-len", "1000000000", "--chunk", "4", "--out", out.to_str().unwrap()]);
    assert!(err.contains("--context") && err.contains("1000000000"), "{err}");
    assert_eq!(files(&out), before);
    let mut names: Vec<_> =
        std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    assert_eq!(names, [".out.lock", "out", "three_layers.json"]);

    // A successful rerun with other graphs leaves none of the earlier run's files.
    run(&join(&base, &["--chunk", "2"])).unwrap();
    let after = files(&out);
    assert!(after.keys().all(|k| !k.contains("model.0.s4")), "{:?}", after.keys());
    assert!(after.contains_key("qnn/model.0.s2.cpp"));

    // The input checkpoint cannot be the output (nor contain it).
    let err = error(&["--quantized", ckpt.to_str().unwrap(), "--context-len", "16", "--out", ckpt.to_str().unwrap()]);
    assert!(err.contains("would overwrite or remove the input"), "{err}");
    let err = error(&["--quantized", ckpt.to_str().unwrap(), "--out", fixtures().to_str().unwrap()]);
    assert!(err.contains("would overwrite or remove the input"), "{err}");
}

// A run killed with SIGKILL mid-way leaves `--out` byte-identical, and the next run removes the
// staging directory it left behind: `qwen3_aot` (the embedded tiny model, through `run_aot`) and
// `quantize` (through `aot::quantize`, what the example calls). The killed run is a real
// process: this test binary started again with only `child_run` selected and the run described
// in environment variables.

/// Which run the child process makes (`aot` or `quantize`), and into which `--out`.
const CHILD_RUN: &str = "MLLM_DSL_KILL9_RUN";
const CHILD_OUT: &str = "MLLM_DSL_KILL9_OUT";

/// One run into `out`: the embedded model through `qwen3_aot`, or the tiny float fixture through
/// `quantize` (deployed mode, pymllm's calibration ids).
fn run_into(which: &str, out: &Path) {
    let out = out.to_str().unwrap();
    match which {
        "aot" => {
            let args = AotArgs::try_parse_from(["qwen3_aot", "--quiet", "--out", out]).unwrap();
            run_aot(&args).unwrap();
        }
        "quantize" => {
            let ids = fixtures().join("pymllm-qwen3-dev-f32/calib_ids.safetensors");
            let calibration = aot::load_id_sequences(&ids, "calib_ids", 128).unwrap();
            aot::quantize(&aot::QuantizeOptions::new(fixtures().join("qwen3-dev-f32"), calibration, out)).unwrap();
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
    let dir = temp(&format!("kill_9_{which}"));
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

/// `--recipe`: a float `--model` gets its family's best recipe by default (the tiny Qwen3 has no
/// tokenizer, so no prefix token), `--recipe mllm` is pymllm's calibration, an individual flag
/// replaces one setting, and combinations that cannot hold are refused naming the setting.
#[test]
fn recipes_by_name_default_to_the_familys_best_and_refuse_conflicts() {
    let dir = temp("recipes");
    let model = float_copy(&dir, None);
    let small = ["--chunk", "4", "--context-len", "16", "--context-binary", "off"];
    let quantized_report = |out: &Path| -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(out.join("quantized/report.json")).unwrap()).unwrap()
    };
    let recipe_of = |json: &serde_json::Value| {
        ["calibration_mode", "weight_method", "act_range", "rotation"].map(|k| json[k].as_str().unwrap().to_string())
    };
    let calibrate = |out: &Path, extra: &[&str]| {
        let m = ["--model", model.to_str().unwrap(), "--calib-ids", &calib_ids(), "--out", out.to_str().unwrap()];
        run(&[&m[..], &small[..], extra].concat()).unwrap();
        quantized_report(out)
    };

    let default = calibrate(&dir.join("default"), &[]);
    assert_eq!(recipe_of(&default), ["deployed", "gptq", "minmax", "hadamard"]);
    assert!(default["sink_prefix"].is_null(), "no <|endoftext|> in a model without a tokenizer");
    let mllm = calibrate(&dir.join("mllm"), &["--recipe", "mllm"]);
    assert_eq!(recipe_of(&mllm), ["mllm-compatible", "rtn", "minmax", "none"]);
    // Asked for by name, `recommended` keeps its `<|endoftext|>` prefix, which a model without a
    // tokenizer cannot spell: refused naming the token; a prefix given by id refines it.
    let err = error(&[
        "--model",
        model.to_str().unwrap(),
        "--calib-ids",
        &calib_ids(),
        "--out",
        dir.join("no-token").to_str().unwrap(),
        "--recipe",
        "recommended",
    ]);
    assert!(err.contains("<|endoftext|>") && err.contains("tokenizer.json"), "{err}");
    let refined =
        calibrate(&dir.join("refined"), &["--recipe", "recommended", "--rotation", "none", "--sink-prefix", "id:1"]);
    assert_eq!(recipe_of(&refined), ["deployed", "gptq", "minmax", "none"]);
    assert_eq!(refined["sink_prefix"]["ids"], serde_json::json!([1]));

    // The embedded run keeps pymllm's rounding as deployed.
    let embedded = dir.join("embedded");
    run(&[&["--out", embedded.to_str().unwrap()][..], &small[..]].concat()).unwrap();
    assert_eq!(recipe_of(&quantized_report(&embedded)), ["deployed", "rtn", "minmax", "none"]);

    let out = dir.join("refused");
    let out = out.to_str().unwrap();
    let m = ["--model", model.to_str().unwrap(), "--calib-ids", &calib_ids(), "--out", out];
    let err = error(&[&m[..], &["--recipe", "mllm", "--weight-method", "gptq"][..]].concat());
    assert!(err.contains("--recipe mllm") && err.contains("weight method is rtn, not gptq"), "{err}");
    let err = error(&[&m[..], &["--recipe", "mllm", "--rotation", "hadamard"][..]].concat());
    assert!(err.contains("rotation is none, not hadamard"), "{err}");
    let err = error(&[&m[..], &["--recipe", "best"][..]].concat());
    assert!(err.contains("best") && err.contains("recommended"), "{err}");
    let pymllm = fixtures().join("pymllm-qwen3-dev-f32");
    let err = error(&["--quantized", pymllm.to_str().unwrap(), "--recipe", "rtn", "--out", out]);
    assert!(err.contains("--recipe") && err.contains("quantized already"), "{err}");
    assert!(!Path::new(out).exists(), "no output from refused runs");
}

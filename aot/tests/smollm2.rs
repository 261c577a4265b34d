//! The real model: SmolLM2-135M-Instruct (a 30-layer Llama with real activation statistics).
//!
//! The model directory is `$MLLM_DSL_SMOLLM2_DIR`, else `${MLLM_DSL_CACHE:-~/.cache/mllm-dsl}/smollm2-135m-instruct-hf`
//! (`scripts/fetch-smollm2` makes it). When it is absent these tests FAIL with that message: the
//! suite never passes without having run the real model.

use std::path::{Path, PathBuf};

use aot::text_quality::{load_text_ids, text_quality, RtnBaseline, TextQualityOptions};

fn model_dir() -> PathBuf {
    aot::smollm2_dir().unwrap_or_else(|e| panic!("{e:#}"))
}

fn fixture(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures").join(rel)
}

/// A float in a JSON object, by path.
fn num(v: &serde_json::Value, path: &[&str]) -> f64 {
    path.iter().fold(v, |v, k| &v[k]).as_f64().unwrap_or_else(|| panic!("reference has no number at {path:?}"))
}

/// Float, each quantized checkpoint and the RTN baseline scored on `ids` in one window (printed).
fn score_on_eval_text(
    dir: PathBuf,
    ids: Vec<i64>,
    quantized: Vec<(String, PathBuf)>,
) -> aot::text_quality::TextQuality {
    let q = text_quality(&TextQualityOptions {
        model: dir,
        quantized,
        rtn: Some(RtnBaseline::default()),
        bf16_products: false,
        ids,
        window: 256,
        progress: aot::progress::silent(),
    })
    .unwrap();
    eprintln!("{}", q.table());
    q
}

/// Float and RTN perplexity, KL and top-1 on the first 256 tokens of the evaluation text equal HF
/// transformers' (fixtures/text/eval_reference_smollm2.json, made by make_eval_reference.py).
#[test]
fn perplexity_float_and_rtn_match_transformers() {
    let dir = model_dir();
    let reference: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("text/eval_reference_smollm2.json")).unwrap()).unwrap();
    let ids = load_text_ids(&fixture("text/eval.txt"), &dir.join("tokenizer.json"), 256).unwrap();
    let first: Vec<i64> = reference["first_ids"].as_array().unwrap().iter().map(|v| v.as_i64().unwrap()).collect();
    assert_eq!(ids[..first.len()], first[..], "tokenization differs from the reference's");
    assert_eq!(ids.len() as f64, num(&reference, &["tokens"]));
    let q = score_on_eval_text(dir, ids, vec![]);
    let (float, rtn) = (&q.rows[0], &q.rows[1]);
    let rel = |a: f64, b: f64| (a / b - 1.0).abs();
    assert!(rel(float.perplexity, num(&reference, &["float", "perplexity"])) < 1e-4, "{float:?}");
    assert!(rel(rtn.perplexity, num(&reference, &["rtn_int4_b16", "perplexity"])) < 2e-3, "{rtn:?}");
    assert!(rel(rtn.mean_kl, num(&reference, &["rtn_int4_b16", "mean_kl"])) < 1e-2, "{rtn:?}");
    assert!((rtn.top1_agreement - num(&reference, &["rtn_int4_b16", "top1_agreement"])).abs() <= 2.0 / 255.0);
}

/// The calibration texts of the recommended recipe (fixtures/text, written for the project;
/// never the evaluation text).
const CALIBRATION_TEXTS: [&str; 3] = ["calibration.txt", "calibration-extra.txt", "calibration-more.txt"];

/// The whole AOT flow on the real model with the recommended recipe of docs/quantization.md (GPTQ
/// weights, `--rotation hadamard`, the `<|endoftext|>` attention-sink prefix, calibrated on the
/// three shipped calibration texts; graphs `model.0.s32` and `model.0.s1` at context 1024), each
/// per-graph ledger stage on probes of real text whose past K/V come from the model's own
/// prefill after the prefix, against issue 16's targets:
/// - `passes_vs_eager`: ≥ 60 dB and the same top-1 (it is exact);
/// - `qnn_vs_fakequant`: ≥ 35 dB and top-1 ≥ 95 % at both graphs (39.0 / 58.0 dB, 100 % measured;
///   without the prefix `model.0.s32` stopped at 32–34 dB: the first token's massive activation
///   set the residual stream's u16 step from layer 11 on, docs/ledger.md), and every node of the
///   lowered graph, run alone on the fake-quant run's inputs, within one step of its output
///   encoding;
///
/// then its quantized checkpoint scored on the first 256 tokens of fixtures/text/eval.txt against
/// the float model after the same prefix: perplexity ≤ 1.10 × float and top-1 agreement ≥ 85 %
/// (1.070 ×, 85.9 % measured), and better than the naive weight-only RTN baseline in perplexity
/// and KL.
///
/// (Float parity against HF is pinned by examples/tests/smollm2.rs.)
#[test]
fn the_recommended_recipe_meets_every_ledger_and_quality_target() {
    let dir = model_dir();
    let out = tempfile::tempdir().unwrap();
    let opts = aot::AotOptions {
        source: aot::ModelSource::Float(dir.clone()),
        calibration: CALIBRATION_TEXTS
            .iter()
            .map(|t| aot::CalibSource::Text { path: fixture(&format!("text/{t}")), chat: false })
            .collect(),
        chunks: vec![32, 1],
        weight_method: backend_cpu::quant::WeightMethod::Gptq,
        rotation: backend_cpu::quant::Rotation::Hadamard,
        sink_prefix: vec!["<|endoftext|>".into()],
        progress: aot::progress::silent(),
        ledger_ops: true,
        // Qualcomm's backend on the real model is measured in docs/ledger.md, not here.
        context_binary: aot::htp::ContextBinary::Off,
        ..aot::AotOptions::embedded(out.path().join("aot"))
    };
    let report = aot::run(&opts).unwrap();
    eprintln!("{}", report.summary());
    let rows = |stage: &str| report.ledger.iter().filter(|e| e.stage == stage).collect::<Vec<_>>();
    let graphs = ["model.0.s32", "model.0.s1"];
    for (stage, min_db, min_top1) in [("passes_vs_eager", 60.0, 1.0), ("qnn_vs_fakequant", 35.0, 0.95)] {
        let found = rows(stage);
        assert_eq!(found.iter().map(|e| e.graph.as_deref().unwrap()).collect::<Vec<_>>(), graphs, "{stage}");
        for e in found {
            assert!(
                e.detail.contains("of the calibration sequences") && e.detail.contains("1-token attention-sink prefix"),
                "{stage}: not a probe of the text after the prefix: {}",
                e.detail
            );
            let c = &e.comparison;
            assert!(c.sqnr_db >= min_db, "{stage} {:?}: {:.2} dB < {min_db} dB ({})", e.graph, c.sqnr_db, e.detail);
            assert!(c.top1_agreement >= min_top1, "{stage} {:?}: top-1 {:.3} < {min_top1}", e.graph, c.top1_agreement);
        }
    }
    assert_eq!(rows("fakequant_vs_float").len(), 1);
    // The node-by-node comparison (--ledger-ops); its last column is each node's own error.
    for graph in graphs {
        let path = out.path().join(format!("aot/ledger_ops/{graph}.txt"));
        let table = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let nodes: Vec<(&str, f32)> = table
            .lines()
            .skip(1)
            .map(|l| (l.split_whitespace().next().unwrap(), l.split_whitespace().last().unwrap().parse().unwrap()))
            .collect();
        assert!(nodes.len() > 1800, "{graph}: {} nodes compared", nodes.len());
        let (node, steps) = nodes.iter().copied().max_by(|a, b| a.1.total_cmp(&b.1)).unwrap();
        assert!(steps <= 1.0, "{graph}: node `{node}` alone is {steps} steps off the fake-quant run");
    }

    // The prefix ships beside pymllm's files, and the residual stream's widest range is no longer
    // the sink's (~2,900 after the rotation alone; ~350 with the prefix).
    let quantized = out.path().join("aot/quantized");
    let q_report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(quantized.join("report.json")).unwrap()).unwrap();
    assert_eq!(q_report["sink_prefix"]["ids"], serde_json::json!([0]), "<|endoftext|> is id 0");
    let widest = num(&q_report, &["largest_residual_range", "range"]);
    assert!(widest < 1000.0, "widest residual range {widest}");

    // Quality on held-out text, every model after the same prefix token.
    let ids = load_text_ids(&fixture("text/eval.txt"), &dir.join("tokenizer.json"), 256).unwrap();
    let q = score_on_eval_text(dir, ids, vec![("W4A16KV8 recommended recipe".into(), quantized)]);
    let (float, quant, rtn) = (&q.rows[0], &q.rows[1], &q.rows[2]);
    assert!(quant.perplexity <= 1.10 * float.perplexity, "{quant:?} vs float {float:?}");
    assert!(quant.top1_agreement >= 0.85, "{quant:?}");
    assert!(quant.perplexity < rtn.perplexity && quant.mean_kl < rtn.mean_kl, "{quant:?} vs RTN {rtn:?}");
}

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
    let q = text_quality(&TextQualityOptions {
        model: dir,
        quantized: vec![],
        rtn: Some(RtnBaseline::default()),
        ids,
        window: 256,
        progress: aot::progress::silent(),
    })
    .unwrap();
    eprintln!("{}", q.table());
    let (float, rtn) = (&q.rows[0], &q.rows[1]);
    let rel = |a: f64, b: f64| (a / b - 1.0).abs();
    assert!(rel(float.perplexity, num(&reference, &["float", "perplexity"])) < 1e-4, "{float:?}");
    assert!(rel(rtn.perplexity, num(&reference, &["rtn_int4_b16", "perplexity"])) < 2e-3, "{rtn:?}");
    assert!(rel(rtn.mean_kl, num(&reference, &["rtn_int4_b16", "mean_kl"])) < 1e-2, "{rtn:?}");
    assert!((rtn.top1_agreement - num(&reference, &["rtn_int4_b16", "top1_agreement"])).abs() <= 2.0 / 255.0);
}

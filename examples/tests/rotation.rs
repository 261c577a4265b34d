//! Rotations folded into the weights (`--rotation hadamard`, docs/quantization.md): the rotated
//! float model still matches HF transformers' own logits (fixtures/, see fixtures/PROVENANCE.md),
//! on the tiny fixtures of every model file and on SmolLM2-135M-Instruct. Quantizing a rotated
//! checkpoint is tested with the other quantization options, in quant_weight_methods.rs.

use aot::load_float;
use backend_cpu::quant::{rotate_checkpoint, OrthogonalKind};
use checkpoint::SafetensorsCheckpoint;
use models::hf::HfConfig;
use runtime::{GenerationConfig, Generator, Sampling};
use std::path::{Path, PathBuf};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures").join(name)
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("mllm-rotation-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// `dir` rotated into a scratch directory.
fn rotated(dir: &Path, name: &str) -> PathBuf {
    let out = scratch(name);
    let hf = HfConfig::from_dir(dir).unwrap();
    let summary = rotate_checkpoint(dir, &hf, &out).unwrap_or_else(|e| panic!("rotating {name}: {e}"));
    eprintln!("{name}: {}", summary.describe());
    out
}

/// Prompt logits of the float model in `dir` and its greedy continuation of `new_tokens`.
fn run_float(dir: &Path, prompt: &[u32], new_tokens: usize, context: usize) -> (Vec<f32>, Vec<u32>) {
    let loaded = load_float(dir, context).unwrap();
    assert!(loaded.unused.is_empty(), "{}: unused tensors {:?}", dir.display(), loaded.unused);
    let config = GenerationConfig {
        max_new_tokens: new_tokens,
        prefill_chunk: 32,
        sampling: Sampling::Greedy,
        eos_ids: vec![],
        collect_prompt_logits: true,
    };
    let out = Generator::new(loaded.model).unwrap().generate(prompt, &config).unwrap();
    (out.prompt_logits.unwrap(), out.ids)
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, |m: f32, d| if m.is_nan() || d.is_nan() { f32::NAN } else { m.max(d) })
}

/// The tiny fixtures (Qwen3 tied, Llama, Llama 3 RoPE, Qwen2 with q/k/v biases, bf16 weights):
/// rotated, their logits stay within 1e-4 of HF's and the greedy ids are HF's.
#[test]
fn rotated_tiny_fixtures_match_hf() {
    let cases = [
        ("qwen3-dev-f32", "reference.safetensors"),
        ("qwen3-dev-f32", "reference_long.safetensors"),
        ("qwen3-dev-bf16", "reference_f32rope.safetensors"),
        ("llama-dev-f32", "reference.safetensors"),
        ("llama3-dev-f32", "reference.safetensors"),
        ("qwen2-dev-f32", "reference.safetensors"),
    ];
    for (name, file) in cases {
        let dir = rotated(&fixture(name), name);
        let r = SafetensorsCheckpoint::open_file(fixture(name).join(file)).unwrap();
        let ids = |k: &str| r.read_i64(k).unwrap().into_iter().map(|v| v as u32).collect::<Vec<_>>();
        let (prompt, greedy) = (ids("input_ids"), ids("greedy_ids"));
        let (logits, out) = run_float(&dir, &prompt, greedy.len() - prompt.len(), 64);
        let diff = max_diff(&logits, &r.read_f32("logits").unwrap());
        eprintln!("{name}/{file} rotated: max |logits - HF| = {diff:e}");
        assert!(diff <= 1e-4, "{name}/{file} rotated: max |logits - HF| = {diff}");
        assert_eq!(out, greedy[prompt.len()..], "{name}/{file} rotated: greedy ids");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// What the rotated directory holds: norms folded (all ones), the lm_head untied with the config
/// saying so, the embedding really rotated, and a Hadamard construction for hidden 32 / head 8.
#[test]
fn rotated_checkpoint_is_an_untied_float_checkpoint() {
    let src = fixture("qwen3-dev-f32");
    let out = scratch("layout");
    let hf = HfConfig::from_dir(&src).unwrap();
    let summary = rotate_checkpoint(&src, &hf, &out).unwrap();
    assert_eq!(summary.residual, OrthogonalKind::Hadamard { factors: vec![32] }, "Paley I over GF(31)");
    assert!(matches!(summary.head, OrthogonalKind::Hadamard { .. }));
    assert!(summary.untied);
    let rotated_hf = HfConfig::from_dir(&out).unwrap();
    assert!(!rotated_hf.tie_word_embeddings);
    let (a, b) = (SafetensorsCheckpoint::open(&src).unwrap(), SafetensorsCheckpoint::open(&out).unwrap());
    for key in ["model.norm.weight", "model.layers.1.input_layernorm.weight"] {
        assert!(b.read_f32(key).unwrap().iter().all(|&g| g == 1.0), "{key} is folded");
    }
    let (e0, e1) = (a.read_f32("model.embed_tokens.weight").unwrap(), b.read_f32("model.embed_tokens.weight").unwrap());
    assert!(max_diff(&e0, &e1) > 1e-2, "the embedding is rotated");
    // Row norms are kept: Q is orthogonal.
    let norm = |v: &[f32]| v.iter().map(|x| x * x).sum::<f32>().sqrt();
    assert!((norm(&e0[..32]) - norm(&e1[..32])).abs() < 1e-5);
    assert!(b.contains("lm_head.weight") && !a.contains("lm_head.weight"));
    let _ = std::fs::remove_dir_all(&out);
}

/// SmolLM2-135M rotated (576 = 72 ⊗ 8 Hadamard, head 64 = 32 ⊗ 2): float logits within the same 2e-4 of
/// HF at the reference positions, greedy continuations identical (as `tests/smollm2.rs` checks
/// the unrotated model).
#[test]
fn rotated_smollm2_matches_hf() {
    let src = aot::smollm2_dir().unwrap_or_else(|e| panic!("{e:#}"));
    let dir = rotated(&src, "smollm2");
    let r = SafetensorsCheckpoint::open_file(fixture("smollm2").join("reference.safetensors")).unwrap();
    let vocab = HfConfig::from_dir(&dir).unwrap().vocab_size;
    for case in ["plain", "digits", "chat", "passage"] {
        let ids = |k: &str| r.read_i64(&format!("{case}.{k}")).map(|v| v.into_iter().map(|x| x as u32).collect());
        let (prompt, greedy): (Vec<u32>, Vec<u32>) = (ids("input_ids").unwrap(), ids("greedy_ids").unwrap_or_default());
        let positions = r.read_i64(&format!("{case}.positions")).unwrap();
        let want = r.read_f32(&format!("{case}.logits")).unwrap();
        let (logits, out) = run_float(&dir, &prompt, greedy.len(), 128);
        let mut diff = 0.0f32;
        for (row, &p) in positions.iter().enumerate() {
            let p = p as usize;
            diff = diff.max(max_diff(&logits[p * vocab..(p + 1) * vocab], &want[row * vocab..(row + 1) * vocab]));
        }
        eprintln!("smollm2 {case} rotated: max |logits - HF| = {diff:e}");
        assert!(diff <= 2e-4, "{case} rotated: max |logits - HF| = {diff}");
        assert_eq!(out, greedy, "{case} rotated: greedy ids");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

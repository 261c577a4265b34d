//! The model files in float on the CPU against HF transformers' own outputs (fixtures/, see
//! fixtures/PROVENANCE.md): prompt logits within 1e-4 and identical greedy ids, for prefill chunk
//! sizes 32, 5 and 1. bf16 products (`Bf16Products::Bf16`) against the fixtures' float64 NumPy
//! forward with bf16-rounded linear inputs.

use aot::{load_float, load_float_with, CpuModel};
use backend_cpu::Bf16Products;
use checkpoint::SafetensorsCheckpoint;
use runtime::{GenerationConfig, Generator, Sampling};
use std::path::{Path, PathBuf};

const TOLERANCE: f32 = 1e-4;
const CONTEXT: usize = 64;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures").join(name)
}

struct Reference {
    input_ids: Vec<u32>,
    logits: Vec<f32>,
    greedy_ids: Vec<u32>,
}

fn reference(path: &Path) -> Reference {
    let r = SafetensorsCheckpoint::open_file(path).unwrap();
    let ids = |k: &str| r.read_i64(k).unwrap().into_iter().map(|v| v as u32).collect::<Vec<_>>();
    Reference { input_ids: ids("input_ids"), logits: r.read_f32("logits").unwrap(), greedy_ids: ids("greedy_ids") }
}

/// Runs the fixture's model on its reference prompt with each chunk size and checks logits and ids.
fn check(dir: &str, reference_file: &str) {
    check_with(dir, reference_file, |dir| load_float(dir, CONTEXT).unwrap());
}

/// [`check`] with the model loaded by `load`; returns the largest difference of any chunk size.
fn check_with(dir: &str, reference_file: &str, load: impl Fn(&Path) -> CpuModel) -> f32 {
    let r = reference(&fixture(dir).join(reference_file));
    let new_tokens = r.greedy_ids.len() - r.input_ids.len();
    let mut largest = 0.0f32;
    for chunk in [32, 5, 1] {
        let loaded = load(&fixture(dir));
        assert!(loaded.unused.is_empty(), "{dir}: unused tensors {:?}", loaded.unused);
        let cfg = GenerationConfig {
            max_new_tokens: new_tokens,
            prefill_chunk: chunk,
            sampling: Sampling::Greedy,
            eos_ids: loaded.config.eos_token_ids.clone(),
            collect_prompt_logits: true,
        };
        let mut generator = Generator::new(loaded.model).unwrap();
        let out = generator.generate(&r.input_ids, &cfg).unwrap();
        // Without prompt logits the model computes the lm_head of each chunk's last row only.
        let last_row_only = GenerationConfig { collect_prompt_logits: false, ..cfg.clone() };
        let ids = generator.generate(&r.input_ids, &last_row_only).unwrap().ids;
        assert_eq!(ids, r.greedy_ids[r.input_ids.len()..], "{dir}/{reference_file} chunk {chunk}: last-row-only ids");
        let logits = out.prompt_logits.unwrap();
        assert_eq!(logits.len(), r.logits.len(), "{dir}: logits size");
        let max_diff = logits.iter().zip(&r.logits).map(|(a, b)| (a - b).abs()).fold(0.0f32, |m: f32, d| {
            if m.is_nan() || d.is_nan() {
                f32::NAN
            } else {
                m.max(d)
            }
        });
        eprintln!("{dir}/{reference_file} chunk {chunk}: max diff {max_diff:e}");
        assert!(max_diff <= TOLERANCE, "{dir}/{reference_file} chunk {chunk}: max |logits - reference| = {max_diff}");
        assert_eq!(out.ids, r.greedy_ids[r.input_ids.len()..], "{dir}/{reference_file} chunk {chunk}: greedy ids");
        largest = largest.max(max_diff);
    }
    largest
}

#[test]
fn qwen3_f32() {
    check("qwen3-dev-f32", "reference.safetensors");
}

#[test]
fn qwen3_f32_long_prompt_spans_two_chunks() {
    check("qwen3-dev-f32", "reference_long.safetensors");
}

#[test]
fn qwen3_bf16() {
    // References are f32 computations on the bf16 weights (RoPE frequencies kept in f32).
    check("qwen3-dev-bf16", "reference_f32rope.safetensors");
}

/// bf16 products round each linear's input to bf16: the logits follow the NumPy forward that
/// rounds them the same way, and stay well away from the f32 references (so the mode is not a
/// no-op that the tolerance would hide).
#[test]
fn qwen3_bf16_products() {
    let load = |dir: &Path| load_float_with(dir, CONTEXT, Bf16Products::Bf16).unwrap();
    let near = check_with("qwen3-dev-bf16", "reference_bf16_products.safetensors", load);
    let f32_products = reference(&fixture("qwen3-dev-bf16").join("reference_f32rope.safetensors")).logits;
    let rounded = reference(&fixture("qwen3-dev-bf16").join("reference_bf16_products.safetensors")).logits;
    let apart = f32_products.iter().zip(&rounded).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
    eprintln!("bf16 products: {near:e} from their reference, which is {apart:e} from the f32 products'");
    assert!(apart > 10.0 * TOLERANCE, "the two references are too close to tell the modes apart");
}

#[test]
fn qwen3_f16() {
    check("qwen3-dev-f16", "reference.safetensors");
}

#[test]
fn qwen3_sharded() {
    check("qwen3-dev-sharded", "reference.safetensors");
}

#[test]
fn llama_f32() {
    // The oracle's Llama: default RoPE with theta 5e5, head_dim 8.
    check("llama-dev-f32", "reference.safetensors");
}

#[test]
fn llama3_f32_rope_scaling() {
    // `rope_parameters` of type llama3, head_dim 16 ≠ hidden / heads, 40-token prompt (two chunks of 32).
    check("llama3-dev-f32", "reference.safetensors");
}

#[test]
fn qwen2_f32_qkv_bias() {
    // Non-zero q/k/v biases, untied lm_head, 40-token prompt.
    check("qwen2-dev-f32", "reference.safetensors");
}

/// The llama3 RoPE frequencies from config.json equal HF's `ROPE_INIT_FUNCTIONS["llama3"]`
/// (fixtures/llama3-dev-f32/inv_freq.safetensors), and the scaling really changes them.
#[test]
fn llama3_inv_freq_matches_hf() {
    let dir = fixture("llama3-dev-f32");
    let hf = models::hf::HfConfig::from_dir(&dir).unwrap();
    let ours = hf.rope_inv_freq();
    let file = SafetensorsCheckpoint::open_file(dir.join("inv_freq.safetensors")).unwrap();
    let (expected, default) = (file.read_f32("llama3_inv_freq").unwrap(), file.read_f32("default_inv_freq").unwrap());
    // Bit for bit: HfConfig repeats torch's f32 operation order.
    assert_eq!(ours, expected, "llama3 inv_freq: ours vs HF");
    // Entry 0 is a high frequency (kept), 1 is smoothed, 2..7 are divided by the factor.
    let changed = ours.iter().zip(&default).filter(|(a, b)| (*a / *b - 1.0).abs() > 1e-3).count();
    assert_eq!(changed, 7, "llama3 scaling should change 7 of 8 frequencies");
}

#[test]
fn gemma3_sliding_window_local_rope_softcap() {
    // Layers 0, 1, 3 slide (window 8, RoPE base 1e4), layer 2 is global (1e6); (1 + w) norms,
    // GELU-tanh, embeddings x sqrt(32), final logit softcapping 3.0; 40-token prompt.
    check("gemma3-dev-f32", "reference.safetensors");
}

#[test]
fn mistral_sliding_window() {
    // Every layer slides with window 8 over a 40-token prompt.
    check("mistral-dev-f32", "reference.safetensors");
}

#[test]
fn phi3_fused_projections_sliding_window() {
    // qkv_proj and gate_up_proj fused; window 12.
    check("phi3-dev-f32", "reference.safetensors");
}

#[test]
fn qwen2_sliding_window_above_max_window_layers() {
    // use_sliding_window with max_window_layers 1: layer 0 full, layer 1 slides (window 8).
    check("qwen2-sw-dev-f32", "reference.safetensors");
}

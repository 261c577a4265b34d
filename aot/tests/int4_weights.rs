//! Quantized checkpoints run with their LPBQ weights kept 4-bit (W4A16 kernels) and their uint16
//! embedding kept as codes give the logits of the same checkpoint with those weights decoded to
//! f32 (the weights are the same numbers; only the f32 summation order differs): pymllm's export
//! of the tiny Qwen3 (fixtures/pymllm-qwen3-dev-f32) and this project's own export of its float
//! source. The int4 model holds about an eighth of the decoded model's matrix bytes.

use std::path::{Path, PathBuf};

use aot::{load_model_with, RunMode};
use backend_cpu::QuantizedWeights;
use runtime::{GenerationConfig, Generator, Sampling};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures").join(name)
}

/// Prompt logits `[prompt, vocab]`, the greedy continuation and the matrix bytes of `dir` loaded
/// with `weights`, prefilling in chunks of `chunk`.
fn run(dir: &Path, weights: QuantizedWeights, prompt: &[u32], chunk: usize) -> (Vec<f32>, Vec<u32>, usize) {
    let loaded = load_model_with(dir, 64, RunMode::Auto, weights).unwrap();
    assert!(loaded.fake_quant, "{}: not loaded as a quantized checkpoint", dir.display());
    let bytes = loaded.matrix_bytes;
    let mut generator = Generator::new(loaded.model).unwrap();
    let config = GenerationConfig {
        max_new_tokens: 8,
        prefill_chunk: chunk,
        sampling: Sampling::Greedy,
        eos_ids: Vec::new(),
        collect_prompt_logits: true,
    };
    let out = generator.generate(prompt, &config).unwrap();
    (out.prompt_logits.unwrap(), out.ids, bytes)
}

fn check_same_logits(dir: &Path) {
    let vocab = models::hf::HfConfig::from_dir(dir).unwrap().vocab_size;
    let prompt: Vec<u32> = (0..13).map(|i| ((i * 37 + 5) % vocab) as u32).collect();
    // Where the CPU has AVX-512 VNNI both run the integer tile on their QDQ'd rows (chunks of 5
    // as prefill tiles, chunks of 1 as decode rows); elsewhere the f32 tiles.
    for chunk in [5, 1] {
        check_chunk(dir, vocab, &prompt, chunk);
    }
}

fn check_chunk(dir: &Path, vocab: usize, prompt: &[u32], chunk: usize) {
    let (int4, int4_ids, int4_bytes) = run(dir, QuantizedWeights::Packed, prompt, chunk);
    let (f32s, f32_ids, f32_bytes) = run(dir, QuantizedWeights::F32, prompt, chunk);
    assert_eq!(int4.len(), prompt.len() * vocab);
    let mut worst = 0f32;
    for (r, (a, b)) in int4.chunks(vocab).zip(f32s.chunks(vocab)).enumerate() {
        let scale = b.iter().fold(0f32, |m, v| m.max(v.abs()));
        assert!(scale > 0.0 && scale.is_finite(), "{}: row {r} of the f32 logits: max |x| = {scale}", dir.display());
        for (i, (x, y)) in a.iter().zip(b).enumerate() {
            assert!(x.is_finite(), "{}: row {r} logit {i} is {x}", dir.display());
            worst = worst.max((x - y).abs() / scale);
        }
    }
    eprintln!("{}, chunks of {chunk}: largest |int4 - f32| / max |f32| = {worst:e}", dir.display());
    // A uint16 activation code that rounds the other way under another summation order moves the
    // logits by more than the sums' own rounding (which backend-cpu/tests/packed_int4.rs bounds
    // per product), and rows one at a time go through more QDQ points per logit row. Measured, of
    // the row's largest: chunks of 1 up to 1.1e-3 with the f32 tiles and 1.4e-4 with the integer
    // tile; chunks of 5 6e-5 with the f32 tiles and 1.3e-4 with the integer tile. The integer
    // sums are exact where the decoded-weight product rounds every term: on pymllm's export the
    // integer tile's logits differ from the f32 ones by the same 1.27e-4 in chunks of 5 and of 1.
    let tol = 2e-3;
    assert!(worst <= tol, "{}, chunks of {chunk}: logits differ by {worst:e} of the row's largest", dir.display());
    assert_eq!(int4_ids, f32_ids, "{}: greedy continuations", dir.display());
    // int4 codes + u8 block scales (bs 16) + f32 channel scales + i32 code sums (for the integer
    // tile) in 32-column panels vs 4 bytes per weight: 4.6x on this tiny model (19,456 vs 90,112
    // bytes), whose 64-row, 16- to 128-column matrices make the per-column values and the panel
    // padding of the 16-column k/v projections weigh; about 7x on real shapes. Weights held as
    // bf16 would be 2x, decoded to f32 1x.
    assert!(int4_bytes * 9 < f32_bytes * 2, "{}: int4 holds {int4_bytes} matrix bytes, f32 {f32_bytes}", dir.display());
}

#[test]
fn pymllm_export_gives_the_same_logits_with_int4_weights() {
    check_same_logits(&fixture("pymllm-qwen3-dev-f32"));
}

#[test]
fn own_export_gives_the_same_logits_with_int4_weights() {
    // The checkpoint inside a directory of its own, which takes its staging lock along when removed.
    let dir = std::env::temp_dir().join(format!("mllm-int4-weights-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let out = dir.join("checkpoint");
    let ids = aot::load_id_sequences(&fixture("pymllm-qwen3-dev-f32/calib_ids.safetensors"), "calib_ids", 128).unwrap();
    aot::quantize(&aot::QuantizeOptions {
        max_positions: 64,
        ..aot::QuantizeOptions::new(fixture("qwen3-dev-f32"), ids, &out)
    })
    .unwrap();
    check_same_logits(&out);
    let _ = std::fs::remove_dir_all(&dir);
}

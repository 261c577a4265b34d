//! A quantized checkpoint run with its KV cache kept as the 8-bit codes of its KV QDQ points
//! (`CpuChunkModel::into_kv8`) gives exactly the logits of the same model with an f32 cache: every
//! cached K and V comes out of those points, so the codes stand for the same f32 values, and the
//! attention products decode them with the fake quantizer's own operations. Checked on pymllm's
//! export of the tiny Qwen3 (fixtures/pymllm-qwen3-dev-f32), whose KV points are pymllm's.

use std::path::{Path, PathBuf};

use aot::{load_model, RunMode};
use runtime::{ChunkModel, GenerationConfig, Generator, Sampling};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures").join(name)
}

/// Prompt logits and the greedy continuation of `model`, prefilling in chunks of `chunk`.
fn generate<M: ChunkModel>(model: M, prompt: &[u32], chunk: usize) -> (Vec<f32>, Vec<u32>) {
    let mut generator = Generator::new(model).unwrap();
    let config = GenerationConfig {
        max_new_tokens: 12,
        prefill_chunk: chunk,
        sampling: Sampling::Greedy,
        eos_ids: Vec::new(),
        collect_prompt_logits: true,
    };
    let out = generator.generate(prompt, &config).unwrap();
    (out.prompt_logits.unwrap(), out.ids)
}

#[test]
fn an_8bit_kv_cache_gives_the_f32_caches_logits_bit_for_bit() {
    let dir = fixture("pymllm-qwen3-dev-f32");
    let vocab = models::hf::HfConfig::from_dir(&dir).unwrap().vocab_size;
    let prompt: Vec<u32> = (0..21).map(|i| ((i * 37 + 5) % vocab) as u32).collect();
    // Chunks of 1: every product over the past has the 2 query rows of one KV head (the 8-bit
    // tile); chunks of 7: 14 rows, over the decoded codes.
    for chunk in [1, 7] {
        let f32_cache = load_model(&dir, 64, RunMode::Auto).unwrap();
        let (want, want_ids) = generate(f32_cache.model, &prompt, chunk);
        let kv8 = load_model(&dir, 64, RunMode::Auto).unwrap();
        let grids = kv8.kv8_grids.expect("pymllm's export has 8-bit K and V points in every layer");
        assert!(grids.iter().flatten().all(|g| g.zero_point == 128 && g.scale > 0.0), "{grids:?}");
        let (got, got_ids) = generate(kv8.model.into_kv8(grids).unwrap(), &prompt, chunk);
        assert_eq!(got.len(), prompt.len() * vocab);
        assert!(want.iter().all(|x| x.is_finite()), "chunks of {chunk}: the f32 cache's logits are not all finite");
        let differ = got.iter().zip(&want).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
        assert_eq!(differ, 0, "chunks of {chunk}: {differ} of {} logits differ", want.len());
        assert_eq!(got_ids, want_ids, "chunks of {chunk}: greedy continuations");
    }
}

#[test]
fn a_float_checkpoint_has_no_8bit_kv_grids() {
    let loaded = load_model(&fixture("qwen3-dev-f32"), 64, RunMode::Auto).unwrap();
    assert!(!loaded.fake_quant && loaded.kv8_grids.is_none());
    let quantized = load_model(&fixture("pymllm-qwen3-dev-f32"), 64, RunMode::Float).unwrap();
    assert!(quantized.kv8_grids.is_none(), "float mode puts nothing on the KV grids");
}

//! Gemma 3 270M (Google's pretrained base model), converted from its Q4_K_M GGUF by the project's own
//! code (`scripts/fetch-gemma3`: K-quant dequantization, Gemma's norm shift, a SentencePiece
//! tokenizer.json built from the GGUF's pieces and scores), against references made elsewhere
//! (fixtures/gemma3/reference.json, see fixtures/PROVENANCE.md):
//! - token ids equal those of Google's Gemma 3 tokenizer (EmbeddingGemma's tokenizer.json);
//! - float perplexity of the second half of the first 512 tokens is within 1.5 % of llama.cpp's on
//!   the GGUF itself (llama.cpp's dot products quantize activations to 8 bits, hence not closer).
//!
//! The converted directory is `$MLLM_DSL_GEMMA3_DIR`, else `$MLLM_DSL_CACHE/gemma3-270m-hf`
//! (cache default `~/.cache/mllm-dsl`). Without it the test fails, naming the script that makes it.

use aot::load_float;
use aot::text_quality::load_text_ids;
use runtime::{GenerationConfig, Generator, Sampling};
use std::path::{Path, PathBuf};

fn fixture(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures").join(rel)
}

#[test]
fn tokenizer_and_float_perplexity_match_google_and_llama_cpp() {
    let dir = aot::gemma3_dir().unwrap_or_else(|e| panic!("{e:#}"));
    let reference: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("gemma3/reference.json")).unwrap()).unwrap();
    let want: Vec<i64> = reference["first_ids"].as_array().unwrap().iter().map(|v| v.as_i64().unwrap()).collect();
    let ids = load_text_ids(&fixture("text/held-out-alice.txt"), &dir.join("tokenizer.json"), want.len()).unwrap();
    assert_eq!(ids, want, "token ids differ from Google's Gemma 3 tokenizer");

    let loaded = load_float(&dir, 1024).unwrap();
    assert!(loaded.unused.is_empty(), "unused tensors {:?}", loaded.unused);
    let vocab = loaded.config.vocab_size;
    let mut generator = Generator::new(loaded.model).unwrap();
    let config = GenerationConfig {
        max_new_tokens: 1,
        prefill_chunk: 64,
        sampling: Sampling::Greedy,
        eos_ids: vec![],
        collect_prompt_logits: true,
    };
    let prompt: Vec<u32> = ids.iter().map(|&i| i as u32).collect();
    let logits = generator.generate(&prompt, &config).unwrap().prompt_logits.unwrap();
    // llama.cpp's first chunk of 512 scores the predictions of positions 256..=510.
    let nll: Vec<f64> = (256..511)
        .map(|p| {
            let row = &logits[p * vocab..(p + 1) * vocab];
            let max = row.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x)) as f64;
            let lse = max + row.iter().map(|&x| (x as f64 - max).exp()).sum::<f64>().ln();
            lse - row[prompt[p + 1] as usize] as f64
        })
        .collect();
    let ppl = (nll.iter().sum::<f64>() / nll.len() as f64).exp();
    let theirs = reference["llama_cpp_chunk1_ppl"].as_f64().unwrap();
    eprintln!("gemma3 270M: perplexity of predictions 256..510 {ppl:.4}, llama.cpp {theirs}");
    assert!(ppl.is_finite() && (ppl / theirs - 1.0).abs() < 0.015, "perplexity {ppl} against llama.cpp's {theirs}");
}

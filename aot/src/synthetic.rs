//! Synthetic checkpoints for benches: Qwen3-shaped HF float checkpoints (bf16, tied embeddings,
//! deterministic random weights) written by project code, so a bench needs no download. The
//! shapes are data ([`QWEN3_0_6B`], [`QWEN3_1_7B`]); the layer count is a parameter, for machines
//! that cannot hold all of them.
//!
//! ```no_run
//! use aot::synthetic::{write_qwen3, QWEN3_1_7B};
//! write_qwen3(std::path::Path::new("target/qwen3-1.7b-synthetic"), &QWEN3_1_7B, QWEN3_1_7B.layers)?;
//! # Ok::<(), aot::AotError>(())
//! ```

use std::collections::BTreeMap;
use std::path::Path;

use crate::error::{ensure, Context, Result};
use checkpoint::{write_safetensors_atomic, StDtype};
use mllm_dsl::files::write_atomic_bytes;
use models::keys;

/// The shapes of one Qwen3 size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Qwen3Shape {
    /// For messages: `Qwen3-1.7B`.
    pub name: &'static str,
    pub vocab: usize,
    pub hidden: usize,
    pub intermediate: usize,
    /// The real model's decoder layers.
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
}

/// Qwen3-0.6B's shapes (its HF `config.json`).
pub const QWEN3_0_6B: Qwen3Shape = Qwen3Shape {
    name: "Qwen3-0.6B",
    vocab: 151_936,
    hidden: 1024,
    intermediate: 3072,
    layers: 28,
    heads: 16,
    kv_heads: 8,
    head_dim: 128,
};

/// Qwen3-1.7B's shapes (mllm's `config_1.7B.json`).
pub const QWEN3_1_7B: Qwen3Shape = Qwen3Shape {
    name: "Qwen3-1.7B",
    vocab: 151_936,
    hidden: 2048,
    intermediate: 6144,
    layers: 28,
    heads: 16,
    kv_heads: 8,
    head_dim: 128,
};

/// Qwen3-4B's shapes (its HF `config.json`; written with tied embeddings like the others).
pub const QWEN3_4B: Qwen3Shape = Qwen3Shape {
    name: "Qwen3-4B",
    vocab: 151_936,
    hidden: 2560,
    intermediate: 9728,
    layers: 36,
    heads: 32,
    kv_heads: 8,
    head_dim: 128,
};

/// Qwen3-8B's shapes (its HF `config.json`; its real lm_head is untied, which the quantized
/// checkpoint has either way: the lm_head is quantized to int4 apart from the u16 embedding).
pub const QWEN3_8B: Qwen3Shape = Qwen3Shape {
    name: "Qwen3-8B",
    vocab: 151_936,
    hidden: 4096,
    intermediate: 12288,
    layers: 36,
    heads: 32,
    kv_heads: 8,
    head_dim: 128,
};

/// The shape named `0.6b`, `1.7b`, `4b` or `8b`.
pub fn shape_by_name(name: &str) -> Option<Qwen3Shape> {
    match name.to_ascii_lowercase().trim_start_matches("qwen3-") {
        "0.6b" => Some(QWEN3_0_6B),
        "1.7b" => Some(QWEN3_1_7B),
        "4b" => Some(QWEN3_4B),
        "8b" => Some(QWEN3_8B),
        _ => None,
    }
}

impl Qwen3Shape {
    /// The HF `config.json` of this shape with `layers` decoder layers.
    pub fn config(&self, layers: usize) -> serde_json::Value {
        serde_json::json!({
            "architectures": ["Qwen3ForCausalLM"],
            "model_type": "qwen3",
            "vocab_size": self.vocab,
            "hidden_size": self.hidden,
            "intermediate_size": self.intermediate,
            "num_hidden_layers": layers,
            "num_attention_heads": self.heads,
            "num_key_value_heads": self.kv_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": 1e-6,
            "max_position_embeddings": 40960,
            "rope_theta": 1000000,
            "tie_word_embeddings": true,
            "attention_bias": false,
            "torch_dtype": "bfloat16",
            "bos_token_id": 151643,
            "eos_token_id": 151645,
            "linear_block_size": 16
        })
    }

    /// `(name, shape)` of every tensor of the HF checkpoint with `layers` layers.
    fn tensor_list(&self, layers: usize) -> Vec<(String, Vec<usize>)> {
        let (h, i, v, d) = (self.hidden, self.intermediate, self.vocab, self.head_dim);
        let (q, kv) = (self.heads * d, self.kv_heads * d);
        let mut t = vec![(keys::EMBED_TOKENS.to_string(), vec![v, h]), (keys::FINAL_NORM.into(), vec![h])];
        for l in 0..layers {
            let p = |s: &str| keys::layer_key(l, s);
            t.extend([
                (p("input_layernorm.weight"), vec![h]),
                (p("post_attention_layernorm.weight"), vec![h]),
                (p("self_attn.q_proj.weight"), vec![q, h]),
                (p("self_attn.k_proj.weight"), vec![kv, h]),
                (p("self_attn.v_proj.weight"), vec![kv, h]),
                (p("self_attn.o_proj.weight"), vec![h, q]),
                (p("self_attn.q_norm.weight"), vec![d]),
                (p("self_attn.k_norm.weight"), vec![d]),
                (p("mlp.gate_proj.weight"), vec![i, h]),
                (p("mlp.up_proj.weight"), vec![i, h]),
                (p("mlp.down_proj.weight"), vec![h, i]),
            ]);
        }
        t
    }
}

/// Deterministic bf16 weights: small values with rare outliers, norms near 1.
fn synthetic_bf16(n: usize, seed: u64, norm: bool) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(n * 2);
    for k in 0..n {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let u = (state >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
        let v = if norm { 1.0 + u * 0.2 } else { u * 0.05 * if k % 1009 == 0 { 8.0 } else { 1.0 } };
        out.extend_from_slice(&((v.to_bits() >> 16) as u16).to_le_bytes());
    }
    out
}

/// Writes a bf16 checkpoint of `shape` with `layers` layers into `dir` (config.json, one
/// safetensors shard per layer plus one for the rest, and the index), so generating it never
/// holds more than one shard in memory.
pub fn write_qwen3(dir: &Path, shape: &Qwen3Shape, layers: usize) -> Result<()> {
    ensure!(layers >= 1, "a synthetic {} needs at least one layer", shape.name);
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    // A single-file checkpoint left by an older writer would shadow the shards when opened.
    let single = dir.join(checkpoint::SINGLE_FILE);
    if single.is_file() {
        std::fs::remove_file(&single).with_context(|| format!("removing the stale {}", single.display()))?;
    }
    let mut shards: BTreeMap<String, Vec<(String, Vec<usize>)>> = BTreeMap::new();
    for (name, dims) in shape.tensor_list(layers) {
        let shard = match name.strip_prefix("model.layers.").and_then(|r| r.split('.').next()) {
            Some(l) => format!("model-layer-{:02}.safetensors", l.parse::<usize>()?),
            None => "model-rest.safetensors".to_string(),
        };
        shards.entry(shard).or_default().push((name, dims));
    }
    let mut weight_map = serde_json::Map::new();
    for (s, (file, list)) in shards.iter().enumerate() {
        let data: Vec<Vec<u8>> = list
            .iter()
            .enumerate()
            .map(|(k, (name, dims))| {
                synthetic_bf16(dims.iter().product(), (s * 1000 + k) as u64 + 1, name.contains("norm"))
            })
            .collect();
        let views: Vec<(&str, StDtype, &[usize], &[u8])> = list
            .iter()
            .zip(&data)
            .map(|((n, sh), d)| (n.as_str(), StDtype::BF16, sh.as_slice(), d.as_slice()))
            .collect();
        write_safetensors_atomic(dir.join(file), &views, &BTreeMap::new())?;
        for (name, _) in list {
            weight_map.insert(name.clone(), serde_json::json!(file));
        }
    }
    let index = serde_json::json!({ "metadata": {}, "weight_map": weight_map });
    write_atomic_bytes(&dir.join("model.safetensors.index.json"), serde_json::to_string_pretty(&index)?.as_bytes())?;
    write_atomic_bytes(&dir.join("config.json"), serde_json::to_string_pretty(&shape.config(layers))?.as_bytes())?;
    Ok(())
}

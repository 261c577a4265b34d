//! Synthetic checkpoints for benches: a Qwen3-1.7B-shaped HF float checkpoint (bf16, tied
//! embeddings, deterministic random weights) written by project code, so a bench needs no
//! download. The layer count is a parameter, for machines that cannot hold all 28 layers.
//!
//! ```no_run
//! let dir = std::path::Path::new("target/qwen3-1.7b-synthetic");
//! aot::synthetic::write_qwen3_1_7b(dir, 28)?;
//! # Ok::<(), aot::AotError>(())
//! ```

use std::collections::BTreeMap;
use std::path::Path;

use crate::error::{ensure, Context, Result};
use checkpoint::{write_safetensors_atomic, StDtype};
use mllm_dsl::files::write_atomic_bytes;

/// Qwen3-1.7B's shapes (mllm's `config_1.7B.json`).
const HIDDEN: usize = 2048;
const INTERMEDIATE: usize = 6144;
const VOCAB: usize = 151_936;
const HEAD_DIM: usize = 128;
const HEADS: usize = 16;
const KV_HEADS: usize = 8;
/// The real model's layer count.
pub const QWEN3_1_7B_LAYERS: usize = 28;

/// Qwen3-1.7B's `config.json` with `layers` decoder layers.
pub fn qwen3_1_7b_config(layers: usize) -> serde_json::Value {
    serde_json::json!({
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "vocab_size": VOCAB,
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": layers,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
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
fn tensor_list(layers: usize) -> Vec<(String, Vec<usize>)> {
    let (h, i, v, d) = (HIDDEN, INTERMEDIATE, VOCAB, HEAD_DIM);
    let mut t = vec![("model.embed_tokens.weight".to_string(), vec![v, h]), ("model.norm.weight".into(), vec![h])];
    for l in 0..layers {
        let p = |s: &str| format!("model.layers.{l}.{s}");
        t.extend([
            (p("input_layernorm.weight"), vec![h]),
            (p("post_attention_layernorm.weight"), vec![h]),
            (p("self_attn.q_proj.weight"), vec![HEADS * d, h]),
            (p("self_attn.k_proj.weight"), vec![KV_HEADS * d, h]),
            (p("self_attn.v_proj.weight"), vec![KV_HEADS * d, h]),
            (p("self_attn.o_proj.weight"), vec![h, HEADS * d]),
            (p("self_attn.q_norm.weight"), vec![d]),
            (p("self_attn.k_norm.weight"), vec![d]),
            (p("mlp.gate_proj.weight"), vec![i, h]),
            (p("mlp.up_proj.weight"), vec![i, h]),
            (p("mlp.down_proj.weight"), vec![h, i]),
        ]);
    }
    t
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

/// Writes a Qwen3-1.7B-shaped bf16 checkpoint with `layers` layers into `dir` (config.json, one
/// safetensors shard per layer plus one for the rest, and the index), so generating it never
/// holds more than one shard in memory.
pub fn write_qwen3_1_7b(dir: &Path, layers: usize) -> Result<()> {
    ensure!(layers >= 1, "a synthetic Qwen3-1.7B needs at least one layer");
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut shards: BTreeMap<String, Vec<(String, Vec<usize>)>> = BTreeMap::new();
    for (name, shape) in tensor_list(layers) {
        let shard = match name.strip_prefix("model.layers.").and_then(|r| r.split('.').next()) {
            Some(l) => format!("model-layer-{:02}.safetensors", l.parse::<usize>()?),
            None => "model-rest.safetensors".to_string(),
        };
        shards.entry(shard).or_default().push((name, shape));
    }
    let mut weight_map = serde_json::Map::new();
    for (s, (file, list)) in shards.iter().enumerate() {
        let data: Vec<Vec<u8>> = list
            .iter()
            .enumerate()
            .map(|(k, (name, shape))| {
                synthetic_bf16(shape.iter().product(), (s * 1000 + k) as u64 + 1, name.contains("norm"))
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
    write_atomic_bytes(&dir.join("config.json"), serde_json::to_string_pretty(&qwen3_1_7b_config(layers))?.as_bytes())?;
    Ok(())
}

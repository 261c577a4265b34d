//! A llama- or gemma3-architecture GGUF file written out as a Hugging Face checkpoint directory:
//! tensors dequantized to f32 under HF names (llama: q/k rows back in HF's rotary layout; gemma3:
//! norm weights back to HF's `w` of `(1 + w)`), and the config, generation config and tokenizer
//! files built from the metadata.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::{json, Value};

use super::{tokenizer_config_json, tokenizer_json, GgufError, GgufFile};
use crate::{write_safetensors_atomic, StDtype, TensorBytes};
use mllm_dsl::files::{write_atomic_bytes, StagingDir};

/// The architectures converted (`general.architecture`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    /// Llama (SmolLM2, Llama 2/3 without rope scaling).
    Llama,
    /// Gemma 3 text models (`Gemma3ForCausalLM`).
    Gemma3,
}

impl Arch {
    fn from_name(name: &str) -> Option<Self> {
        match name {
            "llama" => Some(Arch::Llama),
            "gemma3" => Some(Arch::Gemma3),
            _ => None,
        }
    }

    /// The metadata key prefix and GGUF name.
    pub fn name(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Gemma3 => "gemma3",
        }
    }
}

const SUPPORTED_ARCHS: &str = "llama, gemma3";

/// HF's name for a llama.cpp tensor name of the llama architecture, or `None` for names it does
/// not map (e.g. `rope_freqs.weight`).
pub fn hf_tensor_name(gguf_name: &str) -> Option<String> {
    hf_tensor_name_of(Arch::Llama, gguf_name)
}

/// HF's name for a llama.cpp tensor name of `arch`.
pub fn hf_tensor_name_of(arch: Arch, gguf_name: &str) -> Option<String> {
    let fixed = match gguf_name {
        "token_embd.weight" => Some("model.embed_tokens.weight"),
        "output_norm.weight" => Some("model.norm.weight"),
        "output.weight" => Some("lm_head.weight"),
        _ => None,
    };
    if let Some(name) = fixed {
        return Some(name.to_string());
    }
    let rest = gguf_name.strip_prefix("blk.")?;
    let (layer, leaf) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let hf_leaf = match (arch, leaf) {
        (Arch::Gemma3, "ffn_norm.weight") => "pre_feedforward_layernorm.weight",
        (Arch::Gemma3, "post_attention_norm.weight") => "post_attention_layernorm.weight",
        (Arch::Gemma3, "post_ffw_norm.weight") => "post_feedforward_layernorm.weight",
        (Arch::Gemma3, "attn_q_norm.weight") => "self_attn.q_norm.weight",
        (Arch::Gemma3, "attn_k_norm.weight") => "self_attn.k_norm.weight",
        (_, leaf) => match leaf {
            "attn_norm.weight" => "input_layernorm.weight",
            "ffn_norm.weight" => "post_attention_layernorm.weight",
            "attn_q.weight" => "self_attn.q_proj.weight",
            "attn_k.weight" => "self_attn.k_proj.weight",
            "attn_v.weight" => "self_attn.v_proj.weight",
            "attn_output.weight" => "self_attn.o_proj.weight",
            "ffn_gate.weight" => "mlp.gate_proj.weight",
            "ffn_up.weight" => "mlp.up_proj.weight",
            "ffn_down.weight" => "mlp.down_proj.weight",
            _ => return None,
        },
    };
    Some(format!("model.layers.{layer}.{hf_leaf}"))
}

/// The model's hyper-parameters, from the `{arch}.*` metadata.
struct LlamaHparams {
    arch: Arch,
    layers: u64,
    hidden: u64,
    intermediate: u64,
    heads: u64,
    kv_heads: u64,
    head_dim: u64,
    context: u64,
    rms_eps: f64,
    rope_theta: f64,
    vocab: u64,
    /// Gemma 3: the sliding window of its local layers.
    sliding_window: Option<u64>,
}

impl LlamaHparams {
    fn read(gguf: &GgufFile) -> Result<Self, GgufError> {
        let name = gguf.get_str("general.architecture")?;
        let Some(arch) = Arch::from_name(name) else {
            return Err(GgufError::InvalidKey {
                path: gguf.path().to_path_buf(),
                key: "general.architecture".into(),
                reason: format!("'{name}' is not supported (supported: {SUPPORTED_ARCHS})"),
            });
        };
        let key = |k: &str| format!("{}.{k}", arch.name());
        let invalid =
            |k: &str, reason: String| GgufError::InvalidKey { path: gguf.path().to_path_buf(), key: key(k), reason };
        let positive = |k: &str| -> Result<u64, GgufError> {
            match gguf.get_u64(&key(k))? {
                0 => Err(invalid(k, "must be at least 1".into())),
                v => Ok(v),
            }
        };
        let hidden = positive("embedding_length")?;
        let heads = positive("attention.head_count")?;
        let kv_heads = match gguf.metadata().get(&key("attention.head_count_kv")) {
            None => heads,
            Some(_) => positive("attention.head_count_kv")?,
        };
        if heads % kv_heads != 0 {
            return Err(invalid("attention.head_count_kv", format!("{kv_heads} does not divide head_count {heads}")));
        }
        let head_dim = match gguf.metadata().get(&key("rope.dimension_count")) {
            Some(_) => positive("rope.dimension_count")?,
            // Gemma's heads are wider than hidden / heads; the key length is the head size.
            None if arch == Arch::Gemma3 => {
                let (k, v) = (positive("attention.key_length")?, positive("attention.value_length")?);
                if k != v {
                    return Err(invalid("attention.value_length", format!("{v} differs from key_length {k}")));
                }
                k
            }
            None if hidden % heads == 0 => hidden / heads,
            None => {
                return Err(invalid("embedding_length", format!("{hidden} is not a multiple of head_count {heads}")))
            }
        };
        if head_dim % 2 != 0 {
            return Err(invalid("rope.dimension_count", format!("{head_dim} is odd; rotary embeddings rotate pairs")));
        }
        if let Some(v) = gguf.metadata().get(&key("rope.scaling.type")) {
            if v.as_str() != Some("none") {
                return Err(invalid("rope.scaling.type", format!("{v}: RoPE scaling is not supported")));
            }
        }
        let rope_theta = match gguf.metadata().get(&key("rope.freq_base")) {
            Some(_) => gguf.get_f64(&key("rope.freq_base"))?,
            // llama.cpp's default for llama models without the key.
            None => 10_000.0,
        };
        let vocab = match gguf.metadata().get(&key("vocab_size")) {
            Some(_) => positive("vocab_size")?,
            None => gguf.get_str_array("tokenizer.ggml.tokens")?.len() as u64,
        };
        let sliding_window = match arch {
            Arch::Gemma3 => Some(positive("attention.sliding_window")?),
            Arch::Llama => None,
        };
        Ok(LlamaHparams {
            arch,
            sliding_window,
            layers: positive("block_count")?,
            hidden,
            intermediate: positive("feed_forward_length")?,
            heads,
            kv_heads,
            head_dim,
            context: positive("context_length")?,
            rms_eps: gguf.get_f64(&key("attention.layer_norm_rms_epsilon"))?,
            rope_theta,
            vocab,
        })
    }
}

/// Reads `gguf` and writes an HF checkpoint directory at `out`, which must not exist yet. Everything
/// is written into a staging directory next to `out` ([`mllm_dsl::files::StagingDir`]) and moved
/// to `out` at the end, so `out` either does not exist or is complete; a killed run's staging
/// directory is removed by the next run.
pub fn convert_to_hf_dir(gguf: &GgufFile, out: &Path) -> Result<(), GgufError> {
    if out.exists() {
        return Err(GgufError::Write {
            path: out.to_path_buf(),
            reason: "already exists; remove it or choose another directory".into(),
        });
    }
    let hp = LlamaHparams::read(gguf)?;
    let staging = StagingDir::new(out)?;
    write_all(gguf, &hp, staging.path())?;
    Ok(staging.commit()?)
}

fn write_all(gguf: &GgufFile, hp: &LlamaHparams, dir: &Path) -> Result<(), GgufError> {
    let tied = write_tensors(gguf, hp, &dir.join("model.safetensors"))?;
    let tokenizer = tokenizer_json(gguf)?;
    let (tokenizer_config, special) = tokenizer_config_json(gguf)?;
    write_json(&dir.join("config.json"), &config_json(hp, tied, &special))?;
    write_json(&dir.join("generation_config.json"), &generation_config_json(&special))?;
    write_json(&dir.join("tokenizer.json"), &tokenizer)?;
    write_json(&dir.join("tokenizer_config.json"), &tokenizer_config)?;
    Ok(())
}

/// Writes every tensor as f32 under its HF name; returns whether the embedding is tied (the file
/// has no `output.weight`).
fn write_tensors(gguf: &GgufFile, hp: &LlamaHparams, path: &Path) -> Result<bool, GgufError> {
    let mut converted: Vec<(String, Vec<usize>, Vec<f32>)> = Vec::with_capacity(gguf.tensors().len());
    for info in gguf.tensors() {
        let bad = |reason: String| GgufError::BadTensor {
            path: gguf.path().to_path_buf(),
            tensor: info.name.clone(),
            reason,
        };
        let hf_name = hf_tensor_name_of(hp.arch, &info.name)
            .ok_or_else(|| bad(format!("no Hugging Face {} tensor corresponds to this name", hp.arch.name())))?;
        let shape = info.shape();
        let expected = expected_shape(hp, &hf_name);
        if shape != expected {
            return Err(bad(format!("shape {shape:?} (HF {hf_name}), the metadata implies {expected:?}")));
        }
        let mut data = gguf.read_f32(&info.name)?;
        match hp.arch {
            // llama.cpp's converter interleaves the two rotary halves of every q/k head; HF keeps
            // them as two contiguous halves.
            Arch::Llama if hf_name.ends_with("q_proj.weight") => {
                data = unpermute_rows(&data, hp.heads as usize, shape[1])
            }
            Arch::Llama if hf_name.ends_with("k_proj.weight") => {
                data = unpermute_rows(&data, hp.kv_heads as usize, shape[1])
            }
            // Gemma's RMSNorm scales by (1 + w); llama.cpp's converter stores 1 + w
            // (`norm_shift` in convert_hf_to_gguf.py's Gemma3Model) and does not permute q/k.
            Arch::Gemma3 if hf_name.ends_with("norm.weight") => data.iter_mut().for_each(|w| *w -= 1.0),
            _ => {}
        }
        converted.push((hf_name, shape, data));
    }
    let names: Vec<&str> = converted.iter().map(|(n, _, _)| n.as_str()).collect();
    let mut required = vec!["model.embed_tokens.weight".to_string(), "model.norm.weight".to_string()];
    let gemma_leaves: &[&str] = match hp.arch {
        Arch::Gemma3 => {
            &["pre_feedforward_layernorm", "post_feedforward_layernorm", "self_attn.q_norm", "self_attn.k_norm"]
        }
        Arch::Llama => &[],
    };
    for layer in 0..hp.layers {
        for leaf in [
            "input_layernorm",
            "post_attention_layernorm",
            "self_attn.q_proj",
            "self_attn.k_proj",
            "self_attn.v_proj",
            "self_attn.o_proj",
            "mlp.gate_proj",
            "mlp.up_proj",
            "mlp.down_proj",
        ]
        .iter()
        .chain(gemma_leaves)
        {
            required.push(format!("model.layers.{layer}.{leaf}.weight"));
        }
    }
    if let Some(missing) = required.iter().find(|r| !names.contains(&r.as_str())) {
        return Err(GgufError::MissingTensor {
            path: gguf.path().to_path_buf(),
            tensor: format!("{missing} (HF name; {}.block_count is {})", hp.arch.name(), hp.layers),
        });
    }
    let tied = !names.contains(&"lm_head.weight");
    let tensors: Vec<TensorBytes<'_>> = converted
        .iter()
        .map(|(name, shape, data)| (name.as_str(), StDtype::F32, shape.as_slice(), bytemuck::cast_slice(data)))
        .collect();
    let metadata = BTreeMap::from([("format".to_string(), "pt".to_string())]);
    write_safetensors_atomic(path, &tensors, &metadata)
        .map_err(|e| GgufError::Write { path: path.to_path_buf(), reason: e.to_string() })?;
    Ok(tied)
}

/// The HF shape a tensor must have, from the hyper-parameters.
fn expected_shape(hp: &LlamaHparams, hf_name: &str) -> Vec<usize> {
    let (h, i, q, kv, v) = (
        hp.hidden as usize,
        hp.intermediate as usize,
        (hp.heads * hp.head_dim) as usize,
        (hp.kv_heads * hp.head_dim) as usize,
        hp.vocab as usize,
    );
    let leaf = hf_name.rsplit_once(".layers.").map_or(hf_name, |(_, rest)| rest.split_once('.').map_or(rest, |p| p.1));
    match leaf {
        "model.embed_tokens.weight" | "lm_head.weight" => vec![v, h],
        "model.norm.weight"
        | "input_layernorm.weight"
        | "post_attention_layernorm.weight"
        | "pre_feedforward_layernorm.weight"
        | "post_feedforward_layernorm.weight" => vec![h],
        "self_attn.q_norm.weight" | "self_attn.k_norm.weight" => vec![hp.head_dim as usize],
        "self_attn.q_proj.weight" => vec![q, h],
        "self_attn.k_proj.weight" | "self_attn.v_proj.weight" => vec![kv, h],
        "self_attn.o_proj.weight" => vec![h, q],
        "mlp.gate_proj.weight" | "mlp.up_proj.weight" => vec![i, h],
        "mlp.down_proj.weight" => vec![h, i],
        _ => vec![],
    }
}

/// Undoes llama.cpp's q/k row permutation: within each head, GGUF row `2 * i + half` holds HF
/// row `half * head_dim / 2 + i` (llama.cpp's `permute`, transformers' `reverse_permute_weights`).
pub(crate) fn unpermute_rows(data: &[f32], heads: usize, row_len: usize) -> Vec<f32> {
    let rows = data.len() / row_len;
    let head_dim = rows / heads;
    let half_dim = head_dim / 2;
    let mut out = vec![0.0f32; data.len()];
    for head in 0..heads {
        for r in 0..head_dim {
            let (half, i) = (r / half_dim, r % half_dim);
            let src = head * head_dim + 2 * i + half;
            let dst = head * head_dim + r;
            out[dst * row_len..(dst + 1) * row_len].copy_from_slice(&data[src * row_len..(src + 1) * row_len]);
        }
    }
    out
}

/// Special token ids the config files repeat (EOS: `eos_token_id`, then `eot`/`eom` ids if the GGUF has them).
#[derive(Debug, Default)]
pub struct SpecialIds {
    pub bos: Option<u32>,
    pub eos: Vec<u32>,
    pub pad: Option<u32>,
    pub unk: Option<u32>,
}

fn one_or_list(ids: &[u32]) -> Value {
    match ids {
        [one] => json!(one),
        many => json!(many),
    }
}

fn config_json(hp: &LlamaHparams, tied: bool, special: &SpecialIds) -> Value {
    let mut config = match hp.arch {
        Arch::Llama => llama_config_json(hp, tied),
        Arch::Gemma3 => gemma3_config_json(hp, tied),
    };
    add_special_ids(&mut config, special);
    config
}

/// Gemma 3's config. What the GGUF does not carry is what llama.cpp assumes for every gemma3 file
/// (src/llama-model.cpp, `LLM_ARCH_GEMMA3`): every 6th layer global, the others sliding with RoPE
/// base 10 000, queries scaled by `head_dim^-0.5` (`hidden / heads` for the 62-layer 27B), no
/// softcapping, GELU-tanh.
fn gemma3_config_json(hp: &LlamaHparams, tied: bool) -> Value {
    let layer_types: Vec<&str> =
        (0..hp.layers).map(|l| if (l + 1) % 6 == 0 { "full_attention" } else { "sliding_attention" }).collect();
    let query_pre_attn_scalar = if hp.layers == 62 { hp.hidden / hp.heads } else { hp.head_dim };
    let mut config = shared_config_json(hp, tied);
    let map = config.as_object_mut().expect("config is an object");
    for (key, value) in [
        ("architectures", json!(["Gemma3ForCausalLM"])),
        ("model_type", json!("gemma3_text")),
        ("hidden_activation", json!("gelu_pytorch_tanh")),
        ("rope_local_base_freq", json!(10_000.0)),
        ("rope_scaling", Value::Null),
        ("sliding_window", json!(hp.sliding_window)),
        ("layer_types", json!(layer_types)),
        ("query_pre_attn_scalar", json!(query_pre_attn_scalar)),
        ("attn_logit_softcapping", Value::Null),
        ("final_logit_softcapping", Value::Null),
    ] {
        map.insert(key.into(), value);
    }
    config
}

fn llama_config_json(hp: &LlamaHparams, tied: bool) -> Value {
    let mut config = shared_config_json(hp, tied);
    let map = config.as_object_mut().expect("config is an object");
    for (key, value) in [
        ("architectures", json!(["LlamaForCausalLM"])),
        ("model_type", json!("llama")),
        ("mlp_bias", json!(false)),
        ("hidden_act", json!("silu")),
    ] {
        map.insert(key.into(), value);
    }
    config
}

/// The config fields every converted architecture writes the same way.
fn shared_config_json(hp: &LlamaHparams, tied: bool) -> Value {
    json!({
        "attention_bias": false,
        "hidden_size": hp.hidden,
        "intermediate_size": hp.intermediate,
        "num_hidden_layers": hp.layers,
        "num_attention_heads": hp.heads,
        "num_key_value_heads": hp.kv_heads,
        "head_dim": hp.head_dim,
        "max_position_embeddings": hp.context,
        "rms_norm_eps": hp.rms_eps,
        "rope_theta": hp.rope_theta,
        "tie_word_embeddings": tied,
        "vocab_size": hp.vocab,
        "torch_dtype": "float32",
        "use_cache": true,
    })
}

fn generation_config_json(special: &SpecialIds) -> Value {
    let mut config = json!({ "_from_model_config": true });
    add_special_ids(&mut config, special);
    config
}

fn add_special_ids(config: &mut Value, special: &SpecialIds) {
    let map = config.as_object_mut().expect("config is an object");
    if let Some(bos) = special.bos {
        map.insert("bos_token_id".into(), json!(bos));
    }
    if !special.eos.is_empty() {
        map.insert("eos_token_id".into(), one_or_list(&special.eos));
    }
    if let Some(pad) = special.pad {
        map.insert("pad_token_id".into(), json!(pad));
    }
}

fn write_json(path: &Path, value: &Value) -> Result<(), GgufError> {
    let text = serde_json::to_string_pretty(value).expect("JSON values serialize");
    Ok(write_atomic_bytes(path, (text + "\n").as_bytes())?)
}

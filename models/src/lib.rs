//! Model files written with mllm-dsl.
//!
//! Each model is one short file in mllm's QNN-AOT form that also runs in float on plain HF
//! checkpoints: [`qwen3`], [`qwen2`], [`llama`]. A file writes what is its own (the attention);
//! [`blocks`] holds the shared MLP and attention steps and [`decoder`] the shared decoder skeleton.
//! [`io`] describes the graph inputs every model takes (ids, positions, mask, KV cache).
//! `docs/new-model.md` walks through writing a new one.

pub mod blocks;
pub mod config;
pub mod decoder;
pub mod gemma3;
pub mod hf;
pub mod io;
pub mod keys;
pub mod llama;
pub mod mistral;
pub mod phi3;
pub mod qwen2;
pub mod qwen3;
pub mod rope;

pub use config::TransformerConfig;

use crate::hf::HfConfig;
use mllm_dsl::{CausalLm, Error, Result};

/// A model family as its file declares it: the `model_type`s it serves and how it builds the
/// (unbound) model from the config. Adding a family is its file plus one line in [`FAMILIES`].
pub struct Family {
    pub model_types: &'static [&'static str],
    pub build: fn(&TransformerConfig) -> Result<Box<dyn CausalLm>>,
}

/// Every model file's [`Family`], in the order `model_type`s are looked up.
pub const FAMILIES: &[&Family] =
    &[&qwen3::FAMILY, &qwen2::FAMILY, &llama::FAMILY, &mistral::FAMILY, &phi3::FAMILY, &gemma3::FAMILY];

/// The `model_type`s some model file serves.
pub fn supported_model_types() -> Vec<&'static str> {
    FAMILIES.iter().flat_map(|f| f.model_types.iter().copied()).collect()
}

/// Builds the model file for an HF checkpoint's `model_type` (unbound: bind it to weights or
/// declare symbolic parameters next). RoPE tables cover positions `0..max_positions`.
pub fn build(hf: &HfConfig, max_positions: usize) -> Result<Box<dyn CausalLm>> {
    let kind = hf.model_type.as_str();
    let Some(family) = FAMILIES.iter().find(|f| f.model_types.contains(&kind)) else {
        return Err(Error::msg(format!(
            "{}: unsupported model_type '{kind}' (supported: {})",
            hf.source.display(),
            supported_model_types().join(", ")
        )));
    };
    // `attention_bias` also puts a bias on o_proj (and Llama's `mlp_bias` on the MLP); mllm's files
    // (and these) have neither. Qwen2's q/k/v biases are its architecture, not this option.
    let unsupported = match kind {
        "qwen2" => None,
        _ if hf.attention_bias => Some(("attention_bias", "o_proj")),
        _ if hf.mlp_bias => Some(("mlp_bias", "the MLP projections")),
        _ => None,
    };
    if let Some((field, what)) = unsupported {
        return Err(Error::msg(format!(
            "{}: {field} = true is not supported: the {kind} model file (like mllm's) has no bias on {what}",
            hf.source.display()
        )));
    }
    (family.build)(&TransformerConfig::from_hf(hf, max_positions))
}

#[cfg(test)]
mod tests {
    use super::*;
    use mllm_dsl::DecoderShape;
    use std::path::Path;

    fn config_text(model_type: &str, extra: &str) -> String {
        format!(
            r#"{{"model_type": "{model_type}", "vocab_size": 128, "hidden_size": 32, "intermediate_size": 64,
            "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
            "rms_norm_eps": 1e-6, "max_position_embeddings": 64, "tie_word_embeddings": false {extra}}}"#
        )
    }

    fn config(model_type: &str, extra: &str) -> HfConfig {
        HfConfig::parse(&config_text(model_type, extra), Path::new("/ckpt/config.json")).unwrap()
    }

    /// The printed IR of the model traced in float with symbolic parameters (chunk 2, context 8).
    fn traced(model: &mut dyn CausalLm, cfg: &TransformerConfig) -> String {
        let format = mllm_dsl::ParamFormat::Float;
        model.bind_params(&mllm_dsl::ParamSource::Symbolic(format)).unwrap();
        let inputs = io::trace_inputs(cfg, 2, 8, format);
        let program = mllm_dsl::trace(&inputs, |t| model.forward_graph(t)).unwrap();
        program.to_string()
    }

    #[test]
    fn dispatches_each_model_type() {
        // (model_type, has q/k norm, has q/k/v biases)
        for (model_type, qk_norm, bias) in [("qwen3", true, false), ("qwen2", false, true), ("llama", false, false)] {
            let hf = config(model_type, "");
            let mut model = build(&hf, 32).unwrap();
            let shape =
                DecoderShape { num_layers: 3, num_kv_heads: 2, head_dim: 16, vocab_size: 128, sliding_window: None };
            assert_eq!(model.shape(), shape, "{model_type}");
            let ir = traced(model.as_mut(), &TransformerConfig::from_hf(&hf, 32));
            assert_eq!(ir.contains("@model.layers.2.self_attn.q_norm.weight"), qk_norm, "{model_type}");
            assert_eq!(ir.contains("@model.layers.2.self_attn.v_proj.bias"), bias, "{model_type}");
            assert_eq!(ir.contains("self_attn.q_proj_output_qdq"), !qk_norm, "{model_type}");
        }
    }

    #[test]
    fn rejects_biases_the_model_files_lack() {
        for (model_type, extra, field) in [
            ("llama", r#", "attention_bias": true"#, "attention_bias"),
            ("llama", r#", "mlp_bias": true"#, "mlp_bias"),
            ("qwen3", r#", "attention_bias": true"#, "attention_bias"),
        ] {
            // `mlp_bias` no config accepts (HfConfig refuses it when parsing); `attention_bias` only
            // the model files without q/k/v biases refuse (when building).
            let text = config_text(model_type, extra);
            let err = match HfConfig::parse(&text, Path::new("/ckpt/config.json")) {
                Ok(cfg) => build(&cfg, 32).err().expect(model_type).to_string(),
                Err(e) => e.to_string(),
            };
            assert!(err.contains("/ckpt/config.json") && err.contains(field), "{model_type}: {err}");
        }
        // Qwen2's q/k/v biases are its architecture, not an option.
        assert!(build(&config("qwen2", r#", "attention_bias": true"#), 32).is_ok());
    }
}

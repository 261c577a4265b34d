//! Checkpoint keys that code outside the model files has to name: the one place that maps them.
//!
//! The model files declare every key (`decoder.rs`: the RoPE tables and the residual stream's QDQ
//! points); calibration reports, the checkpoint loaders and the compile path read them from here,
//! and the tests below check that a traced model declares each of them.

/// The token embedding table (`[vocab, hidden]`).
pub const EMBED_TOKENS: &str = "model.embed_tokens.weight";
/// The embedding's module: a quantized checkpoint stores its encoding as `<module>.scale` and
/// `<module>.zero_point`.
pub const EMBED_TOKENS_MODULE: &str = "model.embed_tokens";
/// The LM head (`[vocab, hidden]`); absent from a checkpoint whose config ties it to the embedding.
pub const LM_HEAD: &str = "lm_head.weight";
/// The LM head's module.
pub const LM_HEAD_MODULE: &str = "lm_head";
/// The final norm's weight.
pub const FINAL_NORM: &str = "model.norm.weight";
/// The final norm's module.
pub const FINAL_NORM_MODULE: &str = "model.norm";
/// The decoder layers' module list: layer `i`'s keys start with `model.layers.<i>.`.
pub const LAYERS: &str = "model.layers";

/// The key of `name` (relative to the layer, e.g. `mlp.up_proj.weight`) in decoder layer `layer`.
pub fn layer_key(layer: usize, name: &str) -> String {
    format!("{LAYERS}.{layer}.{name}")
}

/// `(layer, name relative to the layer)` of a decoder layer's key; `None` for other keys.
pub fn split_layer_key(key: &str) -> Option<(usize, &str)> {
    let rest = key.strip_prefix(LAYERS)?.strip_prefix('.')?;
    let (index, name) = rest.split_once('.').unwrap_or((rest, ""));
    if index.is_empty() || !index.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((index.parse().ok()?, name))
}

/// The key that holds `key`'s data: a tied LM head that the checkpoint does not store reads the
/// embedding; every other key reads itself.
pub fn data_key(key: &str, tie_word_embeddings: bool, stored: impl FnOnce(&str) -> bool) -> &str {
    if key == LM_HEAD && tie_word_embeddings && !stored(key) {
        EMBED_TOKENS
    } else {
        key
    }
}

/// Per decoder layer (names relative to the layer): each norm and the linears that read its output.
pub const LAYER_NORM_READERS: [(&str, &[&str]); 2] = [
    ("input_layernorm", &["self_attn.q_proj", "self_attn.k_proj", LAYER_V_PROJ]),
    ("post_attention_layernorm", &["mlp.gate_proj", "mlp.up_proj"]),
];
/// Per decoder layer: the linears that write the residual stream.
pub const LAYER_RESIDUAL_WRITERS: [&str; 2] = [LAYER_O_PROJ, "mlp.down_proj"];
/// Per decoder layer: parameters that never touch the residual stream's basis: Qwen3's per-head
/// q/k norms act in head space, and these biases act on a projection's output.
pub const LAYER_OFF_RESIDUAL: [&str; 6] = [
    "self_attn.q_norm.weight",
    "self_attn.k_norm.weight",
    "self_attn.q_proj.bias",
    "self_attn.k_proj.bias",
    "mlp.gate_proj.bias",
    "mlp.up_proj.bias",
];
/// Layer `i`'s V projection (name relative to the layer), whose rows the head rotation turns.
pub const LAYER_V_PROJ: &str = "self_attn.v_proj";
/// Layer `i`'s output projection, whose columns the head rotation turns.
pub const LAYER_O_PROJ: &str = "self_attn.o_proj";

/// The RoPE sin table (`[1, L, head_dim]`, u16 in a quantized checkpoint).
pub const ROPE_SIN_TABLE: &str = "model.mllm_max_sin_embedding";
/// The RoPE cos table.
pub const ROPE_COS_TABLE: &str = "model.mllm_max_cos_embedding";
/// The QDQ point whose parameters quantize the sin table.
pub const ROPE_SIN_QDQ: &str = "model.sin_embedding_input_qdq";
/// The QDQ point whose parameters quantize the cos table.
pub const ROPE_COS_QDQ: &str = "model.cos_embedding_input_qdq";

/// The sin table of the sliding-window layers of a model whose local layers use another RoPE
/// base (Gemma 3).
pub const ROPE_LOCAL_SIN_TABLE: &str = "model.mllm_max_local_sin_embedding";
/// The cos table of those layers.
pub const ROPE_LOCAL_COS_TABLE: &str = "model.mllm_max_local_cos_embedding";
/// The QDQ point whose parameters quantize the local sin table.
pub const ROPE_LOCAL_SIN_QDQ: &str = "model.local_sin_embedding_input_qdq";
/// The QDQ point whose parameters quantize the local cos table.
pub const ROPE_LOCAL_COS_QDQ: &str = "model.local_cos_embedding_input_qdq";

/// The QDQ point that quantizes a RoPE table, by the table's key.
pub fn rope_table_qdq(table: &str) -> Option<&'static str> {
    match table {
        ROPE_SIN_TABLE => Some(ROPE_SIN_QDQ),
        ROPE_COS_TABLE => Some(ROPE_COS_QDQ),
        ROPE_LOCAL_SIN_TABLE => Some(ROPE_LOCAL_SIN_QDQ),
        ROPE_LOCAL_COS_TABLE => Some(ROPE_LOCAL_COS_QDQ),
        _ => None,
    }
}

/// Whether a QDQ point quantizes the residual stream: a layer's input (`input_layernorm_input_qdq`,
/// layers 1..), the sum after attention (`add_0_output_qdq`) or the final norm's input.
pub fn is_residual_qdq(key: &str) -> bool {
    key == "model.norm_input_qdq"
        || (key.starts_with("model.layers.")
            && (key.ends_with(".input_layernorm_input_qdq") || key.ends_with(".add_0_output_qdq")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hf::HfConfig;
    use crate::{build, io, TransformerConfig};
    use mllm_dsl::{ParamFormat, ParamSource};
    use std::path::Path;

    #[test]
    fn a_traced_model_declares_every_key_named_here() {
        let text = r#"{"model_type": "qwen3", "vocab_size": 64, "hidden_size": 16, "intermediate_size": 32,
            "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8,
            "rms_norm_eps": 1e-6, "max_position_embeddings": 32, "tie_word_embeddings": true}"#;
        let hf = HfConfig::parse(text, Path::new("tiny/config.json")).unwrap();
        let mut model = build(&hf, 16).unwrap();
        let format = ParamFormat::QnnW4A16;
        model.bind_params(&ParamSource::Symbolic(format)).unwrap();
        let cfg = TransformerConfig::from_hf(&hf, 16);
        let program = mllm_dsl::trace(&io::trace_inputs(&cfg, 2, 8, format), |t| model.forward_graph(t)).unwrap();
        let ir = program.to_string();
        for table in [ROPE_SIN_TABLE, ROPE_COS_TABLE] {
            assert!(ir.contains(&format!("@{table}")), "{table} is not a parameter of the traced model");
            let qdq = rope_table_qdq(table).unwrap();
            assert!(ir.contains(&format!("\"{qdq}\"")), "{qdq} is not a QDQ point of the traced model");
        }
        let residual: Vec<String> =
            ["model.layers.1.input_layernorm_input_qdq", "model.layers.0.add_0_output_qdq", "model.norm_input_qdq"]
                .into_iter()
                .map(String::from)
                .collect();
        for key in &residual {
            assert!(is_residual_qdq(key) && ir.contains(&format!("\"{key}\"")), "{key}");
        }
        for key in [EMBED_TOKENS, FINAL_NORM, LM_HEAD] {
            // Tied: the model reads the LM head's key, the store maps it to the embedding.
            assert!(ir.contains(&format!("@{key}")), "{key} is not a parameter of the traced model");
        }
        let layer_params = LAYER_NORM_READERS
            .iter()
            .flat_map(|(norm, readers)| {
                std::iter::once(format!("{norm}.weight")).chain(readers.iter().map(|r| format!("{r}.weight")))
            })
            .chain(LAYER_RESIDUAL_WRITERS.iter().map(|w| format!("{w}.weight")))
            .chain(LAYER_OFF_RESIDUAL[..2].iter().map(|k| k.to_string()))
            .chain([LAYER_V_PROJ, LAYER_O_PROJ].map(|p| format!("{p}.weight")));
        for name in layer_params {
            let key = layer_key(1, &name);
            assert!(ir.contains(&format!("@{key}")), "{key} is not a parameter of the traced model");
            assert_eq!(split_layer_key(&key), Some((1, name.as_str())));
        }
        assert!(!is_residual_qdq("model.layers.0.add_0_lhs_input_qdq"));
        assert!(!is_residual_qdq("model.layers.0.mlp.up_proj_input_qdq"));
    }

    #[test]
    fn layer_keys_split_only_at_a_decimal_index() {
        assert_eq!(split_layer_key("model.layers.12.mlp.up_proj.weight"), Some((12, "mlp.up_proj.weight")));
        assert_eq!(split_layer_key("model.layers.3"), Some((3, "")));
        for other in ["model.layers.+1.mlp", "model.layers..mlp", "model.layersx.1.mlp", "model.norm.weight"] {
            assert_eq!(split_layer_key(other), None, "{other}");
        }
        assert_eq!(data_key(LM_HEAD, true, |_| false), EMBED_TOKENS);
        assert_eq!(data_key(LM_HEAD, true, |_| true), LM_HEAD);
        assert_eq!(data_key(LM_HEAD, false, |_| false), LM_HEAD);
        assert_eq!(EMBED_TOKENS, format!("{EMBED_TOKENS_MODULE}.weight"));
        assert_eq!(LM_HEAD, format!("{LM_HEAD_MODULE}.weight"));
        assert_eq!(FINAL_NORM, format!("{FINAL_NORM_MODULE}.weight"));
    }
}

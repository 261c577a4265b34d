//! Checkpoint keys that code outside the model files has to name: the one place that maps them.
//!
//! The model files declare every key (`decoder.rs`: the RoPE tables and the residual stream's QDQ
//! points); calibration reports, the checkpoint loaders and the compile path read them from here,
//! and the tests below check that a traced model declares each of them.

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
        assert!(!is_residual_qdq("model.layers.0.add_0_lhs_input_qdq"));
        assert!(!is_residual_qdq("model.layers.0.mlp.up_proj_input_qdq"));
    }
}

use super::*;

fn cfg_path() -> PathBuf {
    PathBuf::from("/ckpt/config.json")
}

fn parse(text: &str) -> Result<HfConfig, ConfigError> {
    HfConfig::parse(text, &cfg_path())
}

/// Copy of oracle/qwen3-dev-f32/config.json (transformers 5.23).
const QWEN3_DEV_F32: &str = r#"{
  "architectures": ["Qwen3ForCausalLM"],
  "attention_bias": false, "attention_dropout": 0.0, "bos_token_id": 1, "dtype": "float32",
  "eos_token_id": 2, "head_dim": 8, "hidden_act": "silu", "hidden_size": 32,
  "initializer_range": 0.02, "intermediate_size": 64,
  "layer_types": ["full_attention", "full_attention"],
  "max_position_embeddings": 256, "max_window_layers": 28, "model_type": "qwen3",
  "num_attention_heads": 4, "num_hidden_layers": 2, "num_key_value_heads": 2, "pad_token_id": 0,
  "rms_norm_eps": 1e-06,
  "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"},
  "sliding_window": null, "tie_word_embeddings": true, "transformers_version": "5.23.0",
  "use_cache": true, "use_sliding_window": false, "vocab_size": 128
}"#;

/// Copy of oracle/qwen3-dev-bf16/config.json.
const QWEN3_DEV_BF16: &str = r#"{
  "architectures": ["Qwen3ForCausalLM"],
  "attention_bias": false, "attention_dropout": 0.0, "bos_token_id": 1, "dtype": "bfloat16",
  "eos_token_id": 2, "head_dim": 16, "hidden_act": "silu", "hidden_size": 48,
  "initializer_range": 0.02, "intermediate_size": 96,
  "layer_types": ["full_attention", "full_attention"],
  "max_position_embeddings": 256, "max_window_layers": 28, "model_type": "qwen3",
  "num_attention_heads": 4, "num_hidden_layers": 2, "num_key_value_heads": 1, "pad_token_id": 0,
  "rms_norm_eps": 1e-06,
  "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"},
  "sliding_window": null, "tie_word_embeddings": false, "transformers_version": "5.23.0",
  "use_cache": true, "use_sliding_window": false, "vocab_size": 160
}"#;

/// Copy of oracle/llama-dev-f32/config.json.
const LLAMA_DEV_F32: &str = r#"{
  "architectures": ["LlamaForCausalLM"],
  "attention_bias": false, "attention_dropout": 0.0, "bos_token_id": 1, "dtype": "float32",
  "eos_token_id": 2, "head_dim": 8, "hidden_act": "silu", "hidden_size": 32,
  "initializer_range": 0.02, "intermediate_size": 64, "max_position_embeddings": 256,
  "mlp_bias": false, "model_type": "llama", "num_attention_heads": 4, "num_hidden_layers": 2,
  "num_key_value_heads": 2, "pad_token_id": 0, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
  "rope_parameters": {"rope_theta": 500000.0, "rope_type": "default"},
  "tie_word_embeddings": false, "transformers_version": "5.23.0", "use_cache": true,
  "vocab_size": 128
}"#;

/// Copy of oracle/pymllm-qwen3-dev-f32/config.json (qwen3-dev-f32 + mllm's linear_block_size).
const PYMLLM_QWEN3_DEV_F32: &str = r#"{
  "architectures": ["Qwen3ForCausalLM"],
  "attention_bias": false, "attention_dropout": 0.0, "bos_token_id": 1, "dtype": "float32",
  "eos_token_id": 2, "head_dim": 8, "hidden_act": "silu", "hidden_size": 32,
  "initializer_range": 0.02, "intermediate_size": 64,
  "layer_types": ["full_attention", "full_attention"],
  "max_position_embeddings": 256, "max_window_layers": 28, "model_type": "qwen3",
  "num_attention_heads": 4, "num_hidden_layers": 2, "num_key_value_heads": 2, "pad_token_id": 0,
  "rms_norm_eps": 1e-06,
  "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"},
  "sliding_window": null, "tie_word_embeddings": true, "transformers_version": "5.23.0",
  "use_cache": true, "use_sliding_window": false, "vocab_size": 128, "linear_block_size": 16
}"#;

/// Copy of mllm's Qwen3-1.7B config.json (transformers 4.51 spelling).
const QWEN3_1_7B: &str = r#"{
    "architectures": ["Qwen3ForCausalLM"],
    "bos_token_id": 151643, "eos_token_id": 151645, "attention_bias": false,
    "attention_dropout": 0.0, "head_dim": 128, "hidden_act": "silu", "hidden_size": 2048,
    "initializer_range": 0.02, "intermediate_size": 6144, "max_position_embeddings": 40960,
    "max_window_layers": 28, "model_type": "qwen3", "num_attention_heads": 16,
    "num_hidden_layers": 28, "num_key_value_heads": 8, "rms_norm_eps": 1e-06,
    "rope_scaling": null, "rope_theta": 1000000, "sliding_window": null,
    "tie_word_embeddings": true, "torch_dtype": "bfloat16", "transformers_version": "4.51.0",
    "use_cache": true, "use_sliding_window": false, "vocab_size": 151936,
    "max_cache_length": 2048, "linear_block_size": 16,
    "linear_impl_type": "QNN_LPBQ_w4a16o16_G16"
}"#;

/// Copy of the oracles' generation_config.json.
const ORACLE_GENERATION: &str = r#"{
  "_from_model_config": true, "bos_token_id": 1, "eos_token_id": 2,
  "output_attentions": false, "output_hidden_states": false, "pad_token_id": 0,
  "transformers_version": "5.23.0", "use_cache": true
}"#;

/// Qwen2.5-style config (transformers 4.43): no attention_bias key, no head_dim.
const QWEN2_STYLE: &str = r#"{
  "architectures": ["Qwen2ForCausalLM"], "bos_token_id": 151643, "eos_token_id": 151645,
  "hidden_act": "silu", "hidden_size": 896, "intermediate_size": 4864,
  "max_position_embeddings": 32768, "model_type": "qwen2", "num_attention_heads": 14,
  "num_hidden_layers": 24, "num_key_value_heads": 2, "rms_norm_eps": 1e-06,
  "rope_theta": 1000000.0, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
  "vocab_size": 151936
}"#;

/// Llama-3.2-style config (transformers 4.45): llama3 rope_scaling, eos as a list.
const LLAMA32_STYLE: &str = r#"{
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "bos_token_id": 128000,
  "eos_token_id": [128001, 128008, 128009], "head_dim": 64, "hidden_size": 2048,
  "intermediate_size": 8192, "max_position_embeddings": 131072, "mlp_bias": false,
  "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 16,
  "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
  "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "rope_theta": 500000.0, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
  "vocab_size": 128256
}"#;

#[test]
fn qwen3_dev_f32_transformers5() {
    let c = parse(QWEN3_DEV_F32).unwrap();
    assert_eq!(c.model_kind().unwrap(), ModelType::Qwen3);
    assert_eq!((c.vocab_size, c.hidden_size, c.intermediate_size, c.num_hidden_layers), (128, 32, 64, 2));
    assert_eq!((c.num_attention_heads, c.num_key_value_heads, c.head_dim), (4, 2, 8));
    assert_eq!(c.rms_norm_eps, 1e-6);
    assert_eq!(c.max_position_embeddings, 256);
    assert!(c.tie_word_embeddings);
    assert!(!c.qkv_bias());
    assert!(!c.mlp_bias);
    assert_eq!(c.bos_token_id, Some(1));
    assert_eq!(c.eos_token_ids, vec![2]);
    assert_eq!(c.pad_token_id, Some(0));
    assert_eq!(c.rope_theta, 1_000_000.0);
    assert_eq!(c.rope_scaling, RopeScaling::Default);
    assert_eq!(c.dtype, Some(CheckpointDtype::F32));
    assert_eq!(c.linear_block_size, None);
    assert_eq!(c.source, cfg_path());
}

#[test]
fn qwen3_dev_bf16_single_kv_head() {
    let c = parse(QWEN3_DEV_BF16).unwrap();
    assert_eq!((c.hidden_size, c.head_dim, c.num_key_value_heads), (48, 16, 1));
    // head_dim * heads (64) != hidden (48): head_dim must come from the file, not be derived.
    assert_eq!(c.num_attention_heads * c.head_dim, 64);
    assert_eq!(c.dtype, Some(CheckpointDtype::BF16));
    assert_eq!(c.rope_theta, 10_000.0);
    assert!(!c.tie_word_embeddings);
}

#[test]
fn llama_dev_f32() {
    let c = parse(LLAMA_DEV_F32).unwrap();
    assert_eq!(c.model_kind().unwrap(), ModelType::Llama);
    assert_eq!(c.rope_theta, 500_000.0);
    assert_eq!(c.rms_norm_eps, 1e-5);
    assert!(!c.qkv_bias());
    assert!(!c.mlp_bias);
}

#[test]
fn pymllm_linear_block_size() {
    let c = parse(PYMLLM_QWEN3_DEV_F32).unwrap();
    assert_eq!(c.linear_block_size, Some(16));
    assert_eq!(c, HfConfig { linear_block_size: Some(16), ..parse(QWEN3_DEV_F32).unwrap() });
}

#[test]
fn qwen3_1_7b_transformers4() {
    let c = parse(QWEN3_1_7B).unwrap();
    assert_eq!(c.model_kind().unwrap(), ModelType::Qwen3);
    assert_eq!((c.hidden_size, c.num_attention_heads, c.head_dim), (2048, 16, 128));
    assert_eq!(c.num_key_value_heads, 8);
    assert_eq!(c.num_hidden_layers, 28);
    assert_eq!(c.intermediate_size, 6144);
    assert_eq!(c.vocab_size, 151_936);
    assert_eq!(c.max_position_embeddings, 40_960);
    // Top-level integer rope_theta, rope_scaling null.
    assert_eq!(c.rope_theta, 1_000_000.0);
    assert_eq!(c.rope_scaling, RopeScaling::Default);
    assert_eq!(c.dtype, Some(CheckpointDtype::BF16));
    assert_eq!(c.linear_block_size, Some(16));
    assert_eq!(c.bos_token_id, Some(151_643));
    assert_eq!(c.eos_token_ids, vec![151_645]);
    assert_eq!(c.pad_token_id, None);
    assert_eq!(c.rope_inv_freq().len(), 64);
}

#[test]
fn qwen2_has_qkv_bias_and_derived_head_dim() {
    let c = parse(QWEN2_STYLE).unwrap();
    assert_eq!(c.model_kind().unwrap(), ModelType::Qwen2);
    assert!(!c.attention_bias);
    assert!(c.qkv_bias());
    assert_eq!(c.head_dim, 896 / 14);
    assert_eq!(c.num_key_value_heads, 2);
}

#[test]
fn attention_bias_true_gives_qkv_bias_for_llama() {
    let text = LLAMA_DEV_F32.replace("\"attention_bias\": false", "\"attention_bias\": true");
    assert!(parse(&text).unwrap().qkv_bias());
}

#[test]
fn defaults_when_optional_keys_absent() {
    let text = r#"{"model_type": "llama", "vocab_size": 10, "hidden_size": 16,
        "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 4,
        "rms_norm_eps": 1e-5, "max_position_embeddings": 64}"#;
    let c = parse(text).unwrap();
    assert_eq!(c.num_key_value_heads, 4);
    assert_eq!(c.head_dim, 4);
    assert_eq!(c.rope_theta, 10_000.0);
    assert_eq!(c.rope_scaling, RopeScaling::Default);
    assert!(!c.tie_word_embeddings && !c.attention_bias && !c.mlp_bias);
    assert_eq!(c.dtype, None);
    assert_eq!((c.bos_token_id, c.pad_token_id), (None, None));
    assert!(c.eos_token_ids.is_empty());
}

#[test]
fn llama3_rope_scaling_4x_and_eos_list() {
    let c = parse(LLAMA32_STYLE).unwrap();
    assert_eq!(c.eos_token_ids, vec![128_001, 128_008, 128_009]);
    assert_eq!(
        c.rope_scaling,
        RopeScaling::Llama3 {
            factor: 32.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192,
        }
    );
    assert_eq!(c.rope_theta, 500_000.0);
}

#[test]
fn llama3_rope_parameters_5x() {
    let text = LLAMA_DEV_F32.replace(
        r#""rope_parameters": {"rope_theta": 500000.0, "rope_type": "default"}"#,
        r#""rope_parameters": {"rope_theta": 500000.0, "rope_type": "llama3", "factor": 8.0,
            "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192}"#,
    );
    let c = parse(&text).unwrap();
    assert_eq!(
        c.rope_scaling,
        RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192,
        }
    );
}

#[test]
fn legacy_type_key_in_rope_scaling() {
    let text = QWEN2_STYLE
        .replace("\"rope_theta\": 1000000.0,", "\"rope_theta\": 1000000.0, \"rope_scaling\": {\"type\": \"default\"},");
    assert_eq!(parse(&text).unwrap().rope_scaling, RopeScaling::Default);
}

#[test]
fn generation_config_merges_eos() {
    let mut c = parse(QWEN3_1_7B).unwrap();
    let gen_path = PathBuf::from("/ckpt/generation_config.json");
    // Qwen3 chat checkpoints list <|im_end|> and <|endoftext|> here.
    c.merge_generation_config(
        r#"{"bos_token_id": 151643, "eos_token_id": [151645, 151643], "pad_token_id": 151643}"#,
        &gen_path,
    )
    .unwrap();
    assert_eq!(c.eos_token_ids, vec![151_645, 151_643]);
    assert_eq!(c.pad_token_id, Some(151_643));
    assert_eq!(c.bos_token_id, Some(151_643));

    let mut oracle = parse(QWEN3_DEV_F32).unwrap();
    oracle.merge_generation_config(ORACLE_GENERATION, &gen_path).unwrap();
    assert_eq!(oracle.eos_token_ids, vec![2]);
}

#[test]
fn from_dir_reads_both_files() {
    let dir = std::env::temp_dir().join(format!("mllm-dsl-hf-config-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(CONFIG_FILE), QWEN3_1_7B).unwrap();
    std::fs::write(dir.join(GENERATION_CONFIG_FILE), r#"{"eos_token_id": [151645, 151643]}"#).unwrap();
    let c = HfConfig::from_dir(&dir).unwrap();
    assert_eq!(c.eos_token_ids, vec![151_645, 151_643]);
    assert_eq!(c.source, dir.join(CONFIG_FILE));

    std::fs::remove_file(dir.join(GENERATION_CONFIG_FILE)).unwrap();
    assert_eq!(HfConfig::from_dir(&dir).unwrap().eos_token_ids, vec![151_645]);

    std::fs::remove_dir_all(&dir).unwrap();
    let err = HfConfig::from_dir(&dir).unwrap_err();
    assert!(matches!(err, ConfigError::Io { .. }), "{err}");
    assert!(err.to_string().contains("config.json"), "{err}");
}

// ---- errors ---------------------------------------------------------------------------------

fn err_of(text: &str) -> (ConfigError, String) {
    let err = parse(text).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("/ckpt/config.json"), "message must name the file: {msg}");
    (err, msg)
}

#[test]
fn unsupported_model_type_message() {
    let c = parse(&QWEN3_DEV_F32.replace("\"qwen3\"", "\"mistral\"")).unwrap();
    let err = c.model_kind().unwrap_err();
    assert_eq!(err.to_string(), "unsupported model_type 'mistral' (supported: qwen3, qwen2, llama)");
}

#[test]
fn missing_field() {
    let (err, msg) = err_of(&QWEN3_DEV_F32.replace("\"hidden_size\": 32,", ""));
    assert!(matches!(err, ConfigError::MissingField { ref field, .. } if field == "hidden_size"));
    assert!(msg.contains("missing required field `hidden_size`"), "{msg}");
}

#[test]
fn wrong_type_names_field_and_found_value() {
    let (err, msg) = err_of(&QWEN3_DEV_F32.replace("\"vocab_size\": 128", "\"vocab_size\": \"128\""));
    assert!(matches!(err, ConfigError::WrongType { ref field, .. } if field == "vocab_size"));
    assert!(msg.contains("non-negative integer") && msg.contains("string \"128\""), "{msg}");

    let (_, msg) = err_of(&QWEN3_DEV_F32.replace("\"head_dim\": 8", "\"head_dim\": 8.5"));
    assert!(msg.contains("`head_dim`") && msg.contains("8.5"), "{msg}");

    let (_, msg) = err_of(&QWEN3_DEV_F32.replace("\"tie_word_embeddings\": true", "\"tie_word_embeddings\": 1"));
    assert!(msg.contains("`tie_word_embeddings`") && msg.contains("true or false"), "{msg}");

    let (_, msg) = err_of(&QWEN3_DEV_F32.replace("\"eos_token_id\": 2", "\"eos_token_id\": -1"));
    assert!(msg.contains("`eos_token_id`") && msg.contains("token id"), "{msg}");

    let (_, msg) = err_of(&QWEN3_DEV_F32.replace("\"eos_token_id\": 2", "\"eos_token_id\": [2, \"x\"]"));
    assert!(msg.contains("`eos_token_id`"), "{msg}");
}

#[test]
fn zero_heads_rejected() {
    let (err, msg) = err_of(&QWEN3_DEV_F32.replace("\"num_attention_heads\": 4", "\"num_attention_heads\": 0"));
    assert!(matches!(err, ConfigError::InvalidValue { ref field, .. } if field == "num_attention_heads"));
    assert!(msg.contains("at least 1"), "{msg}");

    let (_, msg) = err_of(&QWEN3_DEV_F32.replace("\"num_key_value_heads\": 2", "\"num_key_value_heads\": 0"));
    assert!(msg.contains("`num_key_value_heads`"), "{msg}");
}

#[test]
fn kv_heads_must_divide_heads() {
    let (_, msg) = err_of(&QWEN3_DEV_F32.replace("\"num_key_value_heads\": 2", "\"num_key_value_heads\": 3"));
    assert!(msg.contains("`num_key_value_heads`") && msg.contains("does not divide"), "{msg}");
}

#[test]
fn hidden_not_divisible_without_head_dim() {
    let text = QWEN2_STYLE.replace("\"hidden_size\": 896", "\"hidden_size\": 900");
    let (err, msg) = err_of(&text);
    assert!(matches!(err, ConfigError::InvalidValue { ref field, .. } if field == "hidden_size"));
    assert!(msg.contains("not divisible by num_attention_heads (14)"), "{msg}");
    // With an explicit head_dim the same sizes are fine (Qwen3 does this).
    let ok = text.replace("\"hidden_size\": 900", "\"hidden_size\": 900, \"head_dim\": 64");
    assert_eq!(parse(&ok).unwrap().head_dim, 64);
}

#[test]
fn odd_head_dim_rejected() {
    let (_, msg) = err_of(&QWEN3_DEV_F32.replace("\"head_dim\": 8", "\"head_dim\": 7"));
    assert!(msg.contains("`head_dim`") && msg.contains("odd"), "{msg}");
}

#[test]
fn unsupported_rope_types_name_the_field() {
    let (err, msg) = err_of(&LLAMA_DEV_F32.replace("\"rope_type\": \"default\"", "\"rope_type\": \"yarn\""));
    assert!(matches!(err, ConfigError::UnsupportedRope { ref field, ref rope_type, .. }
            if field == "rope_parameters.rope_type" && rope_type == "yarn"));
    assert!(msg.contains("'yarn'") && msg.contains("supported: default, linear, llama3"), "{msg}");

    let text = QWEN2_STYLE.replace(
        "\"rope_theta\": 1000000.0,",
        "\"rope_theta\": 1000000.0, \"rope_scaling\": {\"type\": \"dynamic\", \"factor\": 2.0},",
    );
    let (err, _) = err_of(&text);
    assert!(matches!(err, ConfigError::UnsupportedRope { ref field, .. } if field == "rope_scaling.type"));
}

#[test]
fn llama3_missing_and_bad_parameters() {
    let (err, msg) = err_of(&LLAMA32_STYLE.replace("\"low_freq_factor\": 1.0,", ""));
    assert!(matches!(err, ConfigError::MissingField { ref field, .. } if field == "rope_scaling.low_freq_factor"));
    assert!(msg.contains("rope_scaling.low_freq_factor"), "{msg}");

    let (_, msg) = err_of(&LLAMA32_STYLE.replace("\"high_freq_factor\": 4.0", "\"high_freq_factor\": 1.0"));
    assert!(msg.contains("rope_scaling.high_freq_factor") && msg.contains("greater"), "{msg}");
}

/// Per-layer-type RoPE parameters (transformers 5.x Gemma 3) are read — the full layers' are the
/// model's (`sliding_window_layouts`) — but a scaling scheme on the sliding layers is refused,
/// naming the field, and a map without `full_attention` names what is missing.
#[test]
fn per_layer_type_rope_parameters_need_plain_sliding_rope() {
    let per_type = |sliding: &str| {
        QWEN3_DEV_F32.replace(
            r#""rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"}"#,
            &format!(
                r#""rope_parameters": {{"full_attention": {{"rope_theta": 1e6, "rope_type": "default"}},
            "sliding_attention": {sliding}}}"#
            ),
        )
    };
    let c = parse(&per_type(r#"{"rope_theta": 1e4, "rope_type": "default"}"#)).unwrap();
    assert_eq!((c.rope_theta, c.attention.sliding_rope_theta), (1e6, Some(1e4)));
    let (_, msg) = err_of(&per_type(r#"{"rope_theta": 1e4, "rope_type": "linear", "factor": 2.0}"#));
    assert!(msg.contains("rope_parameters.sliding_attention.rope_type") && msg.contains("'linear'"), "{msg}");
    let only_sliding = QWEN3_DEV_F32.replace(
        r#""rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"}"#,
        r#""rope_parameters": {"sliding_attention": {"rope_theta": 1e4, "rope_type": "default"}}"#,
    );
    let (_, msg) = err_of(&only_sliding);
    assert!(msg.contains("full_attention"), "{msg}");
}

#[test]
fn unsupported_dtype_and_bad_json() {
    let (_, msg) = err_of(&QWEN3_DEV_F32.replace("\"float32\"", "\"float64\""));
    assert!(msg.contains("`dtype`") && msg.contains("float64"), "{msg}");
    let (_, msg) = err_of(&QWEN3_1_7B.replace("\"bfloat16\"", "\"int8\""));
    assert!(msg.contains("`torch_dtype`"), "{msg}");

    let (err, _) = err_of("{\"model_type\": ");
    assert!(matches!(err, ConfigError::Json { .. }));
    let (err, msg) = err_of("[1, 2]");
    assert!(matches!(err, ConfigError::NotAnObject { .. }), "{msg}");
}

// ---- RoPE frequencies -----------------------------------------------------------------------

/// The textbook formula in f64, independent of the torch-order f32 evaluation.
fn reference_default(theta: f64, dim: usize) -> Vec<f64> {
    (0..dim / 2).map(|k| theta.powf(-((2 * k) as f64) / dim as f64)).collect()
}

/// Meta's `apply_scaling` (llama-models), written as its piecewise definition, in f64.
fn reference_llama3(freqs: &[f64], factor: f64, low: f64, high: f64, old_ctx: f64) -> Vec<f64> {
    let low_wavelen = old_ctx / low;
    let high_wavelen = old_ctx / high;
    freqs
        .iter()
        .map(|&f| {
            let wavelen = 2.0 * std::f64::consts::PI / f;
            if wavelen < high_wavelen {
                f
            } else if wavelen > low_wavelen {
                f / factor
            } else {
                let smooth = (old_ctx / wavelen - low) / (high - low);
                (1.0 - smooth) * f / factor + smooth * f
            }
        })
        .collect()
}

fn assert_close(actual: &[f32], expected: &[f64], rel: f64) {
    assert_eq!(actual.len(), expected.len());
    for (i, (&a, &e)) in actual.iter().zip(expected).enumerate() {
        let err = (f64::from(a) - e).abs() / e.abs();
        assert!(err <= rel, "entry {i}: {a} vs {e} (relative error {err:e})");
    }
}

#[test]
fn default_inv_freq_exact_values() {
    let mut c = parse(QWEN3_DEV_BF16).unwrap();
    c.head_dim = 8;
    // theta 10000, dim 8: 10000^(-k/4) = 1, 0.1, 0.01, 0.001 exactly representable up to rounding.
    assert_eq!(c.rope_inv_freq(), vec![1.0f32, 0.1, 0.01, 0.001]);
}

#[test]
fn default_inv_freq_matches_formula() {
    for text in [QWEN3_DEV_F32, QWEN3_DEV_BF16, LLAMA_DEV_F32, QWEN3_1_7B, QWEN2_STYLE] {
        let c = parse(text).unwrap();
        let inv = c.rope_inv_freq();
        assert_eq!(inv.len(), c.head_dim / 2);
        assert_eq!(inv[0], 1.0);
        // f32 exponent rounding plus the final f32 rounding: a few ulps at most.
        assert_close(&inv, &reference_default(c.rope_theta, c.head_dim), 2e-6);
        assert!(inv.windows(2).all(|w| w[1] < w[0]), "must be strictly decreasing");
    }
}

#[test]
fn llama3_inv_freq_matches_meta_formula() {
    // Llama 3.1 8B: theta 500000, head_dim 128, factor 8, low 1, high 4, original context 8192.
    let text =
        LLAMA32_STYLE.replace("\"head_dim\": 64", "\"head_dim\": 128").replace("\"factor\": 32.0", "\"factor\": 8.0");
    let c = parse(&text).unwrap();
    let inv = c.rope_inv_freq();
    let base = reference_default(500_000.0, 128);
    let expected = reference_llama3(&base, 8.0, 1.0, 4.0, 8192.0);
    assert_close(&inv, &expected, 1e-5);

    // The three bands, by wavelength 2*pi/f against 8192/4 = 2048 and 8192/1 = 8192.
    let unscaled = {
        let mut d = c.clone();
        d.rope_scaling = RopeScaling::Default;
        d.rope_inv_freq()
    };
    let (mut high, mut medium, mut low) = (0, 0, 0);
    for (k, (&scaled, &plain)) in inv.iter().zip(&unscaled).enumerate() {
        let wavelen = 2.0 * std::f64::consts::PI / base[k];
        if wavelen < 2048.0 {
            high += 1;
            assert_eq!(scaled, plain, "high-frequency entry {k} must be untouched");
        } else if wavelen > 8192.0 {
            low += 1;
            assert_eq!(scaled, plain / 8.0, "low-frequency entry {k} must be divided by factor");
        } else {
            medium += 1;
            assert!(scaled < plain && scaled > plain / 8.0, "entry {k} must be interpolated");
        }
    }
    // Same split as Meta's reference: every band is exercised.
    assert_eq!(high + medium + low, 64);
    assert!(high > 0 && medium > 0 && low > 0, "{high}/{medium}/{low}");
}

#[test]
fn llama32_inv_freq_factor_32() {
    let c = parse(LLAMA32_STYLE).unwrap();
    let base = reference_default(500_000.0, 64);
    let expected = reference_llama3(&base, 32.0, 1.0, 4.0, 8192.0);
    assert_close(&c.rope_inv_freq(), &expected, 1e-5);
}

// ---- issue #14: unsupported features, float ranges, size limits ------------------------------

/// `QWEN3_DEV_F32` with the text `from` replaced by `to` (which must be there).
fn edited(from: &str, to: &str) -> String {
    assert!(QWEN3_DEV_F32.contains(from), "fixture lacks {from}");
    QWEN3_DEV_F32.replace(from, to)
}

fn invalid_field(text: &str) -> (String, String) {
    let (err, msg) = err_of(text);
    match err {
        ConfigError::InvalidValue { field, .. } => (field, msg),
        other => panic!("expected InvalidValue, got {other}"),
    }
}

#[test]
fn unsupported_features_are_errors_not_ignored() {
    let (field, msg) = invalid_field(&edited("\"hidden_act\": \"silu\"", "\"hidden_act\": \"gelu\""));
    assert_eq!(field, "hidden_act");
    assert!(msg.contains("'gelu'") && msg.contains("silu"), "{msg}");

    let (field, _) =
        invalid_field(&edited("\"attention_bias\": false", "\"attention_bias\": false, \"mlp_bias\": true"));
    assert_eq!(field, "mlp_bias");
    // A sliding layer needs a window (this config's is null).
    let (field, msg) = invalid_field(&edited(
        "[\"full_attention\", \"full_attention\"]",
        "[\"full_attention\", \"sliding_attention\"]",
    ));
    assert_eq!(field, "sliding_window");
    assert!(msg.contains("no window"), "{msg}");
    let (field, msg) = invalid_field(&edited(
        "[\"full_attention\", \"full_attention\"]",
        "[\"full_attention\", \"chunked_attention\"]",
    ));
    assert_eq!(field, "layer_types[1]");
    assert!(msg.contains("chunked_attention"), "{msg}");
    let (field, _) = invalid_field(&edited("\"sliding_window\": null", "\"sliding_window\": 0"));
    assert_eq!(field, "sliding_window");
    let (field, msg) = invalid_field(&edited("[\"full_attention\", \"full_attention\"]", "[\"full_attention\"]"));
    assert_eq!(field, "layer_types");
    assert!(msg.contains("1 layers") && msg.contains("num_hidden_layers is 2"), "{msg}");

    for rope_type in ["dynamic", "yarn", "longrope"] {
        let (err, msg) = err_of(&edited("\"rope_type\": \"default\"", &format!("\"rope_type\": \"{rope_type}\"")));
        assert!(matches!(err, ConfigError::UnsupportedRope { .. }), "{msg}");
    }
    // What is supported still parses.
    parse(&edited("\"hidden_act\": \"silu\"", "\"hidden_act\": \"silu\", \"mlp_bias\": false")).unwrap();
}

#[test]
fn float_parameters_must_be_finite_f32() {
    for eps in ["1e300", "1e-50", "0", "-1e-6", "1e39"] {
        let (field, msg) = invalid_field(&edited("\"rms_norm_eps\": 1e-06", &format!("\"rms_norm_eps\": {eps}")));
        assert_eq!(field, "rms_norm_eps", "{eps}");
        assert!(msg.contains("finite"), "{msg}");
    }
    for theta in ["1e39", "1e300", "0"] {
        let (field, msg) = invalid_field(&edited("\"rope_theta\": 1000000.0", &format!("\"rope_theta\": {theta}")));
        assert_eq!(field, "rope_parameters.rope_theta", "{theta}");
        assert!(msg.contains(theta) && msg.contains("finite as f32"), "{msg}");
    }
    let llama = |from: &str, to: &str| {
        assert!(LLAMA32_STYLE.contains(from));
        parse(&LLAMA32_STYLE.replace(from, to)).unwrap_err()
    };
    let err = llama("\"factor\": 32.0", "\"factor\": 1e40");
    assert!(matches!(&err, ConfigError::InvalidValue { field, .. } if field == "rope_scaling.factor"), "{err}");
    let err = llama("\"high_freq_factor\": 4.0", "\"high_freq_factor\": 1e300");
    assert!(
        matches!(&err, ConfigError::InvalidValue { field, .. } if field == "rope_scaling.high_freq_factor"),
        "{err}"
    );
    let err = llama("\"rope_theta\": 500000.0", "\"rope_theta\": 1e300");
    assert!(matches!(&err, ConfigError::InvalidValue { field, .. } if field == "rope_theta"), "{err}");
}

#[test]
fn sizes_are_bounded_before_anything_is_allocated() {
    for (from, to, field) in [
        ("\"num_hidden_layers\": 2", "\"num_hidden_layers\": 100000000", "num_hidden_layers"),
        ("\"head_dim\": 8", "\"head_dim\": 1000000000", "head_dim"),
        ("\"hidden_size\": 32", "\"hidden_size\": 10000000000", "hidden_size"),
        ("\"intermediate_size\": 64", "\"intermediate_size\": 100000000", "intermediate_size"),
        ("\"vocab_size\": 128", "\"vocab_size\": 1000000000", "vocab_size"),
        ("\"num_attention_heads\": 4", "\"num_attention_heads\": 1000000", "num_attention_heads"),
        ("\"max_position_embeddings\": 256", "\"max_position_embeddings\": 1000000000", "max_position_embeddings"),
        // Each within its own limit, but heads * head_dim is not.
        ("\"head_dim\": 8", "\"head_dim\": 4096, \"num_attention_heads\": 4096, \"x\": 0", "head_dim"),
    ] {
        let text = edited(from, to).replace("\"num_attention_heads\": 4,", "");
        let text = if to.contains("num_attention_heads") { text } else { edited(from, to) };
        let (got, msg) = invalid_field(&text);
        assert_eq!(got, field, "{to}: {msg}");
        assert!(msg.contains("limit"), "{msg}");
    }
}

/// The three spellings of "which layers slide" (`hf/layers.rs`), the per-layer-type RoPE parameters of
/// transformers 5.x Gemma 3 configs, and Gemma's activation key.
#[test]
fn sliding_window_layouts() {
    let window = |text: &str| {
        let c = parse(text).unwrap();
        (c.attention.sliding_window, c.attention.sliding_layers)
    };
    // layer_types, as transformers 5.x writes it (Qwen2 with use_sliding_window, Gemma 3).
    let text = edited("[\"full_attention\", \"full_attention\"]", "[\"full_attention\", \"sliding_attention\"]");
    let text = text.replace("\"sliding_window\": null", "\"sliding_window\": 8");
    assert_eq!(window(&text), (Some(8), vec![false, true]));
    // Without layer_types: use_sliding_window + max_window_layers (4.x Qwen2) ...
    let base = QWEN3_DEV_F32.replace("\"layer_types\": [\"full_attention\", \"full_attention\"],", "");
    let qwen = base
        .replace("\"sliding_window\": null", "\"sliding_window\": 8")
        .replace("\"use_sliding_window\": false", "\"use_sliding_window\": true");
    assert_eq!(
        window(&qwen.replace("\"max_window_layers\": 28", "\"max_window_layers\": 1")),
        (Some(8), vec![false, true])
    );
    assert_eq!(window(&qwen), (None, vec![false, false]), "max_window_layers 28 >= 2 layers");
    // ... a window with use_sliding_window false slides nothing (Qwen2.5's configs) ...
    let off = base.replace("\"sliding_window\": null", "\"sliding_window\": 131072");
    assert_eq!(window(&off), (None, vec![false, false]));
    // ... and a window alone slides every layer (Mistral, Phi-3).
    let mistral = off.replace("\"use_sliding_window\": false,", "").replace("131072", "4");
    assert_eq!(window(&mistral), (Some(4), vec![true, true]));
    // Gemma 3 (4.x): every 2nd layer global.
    let gemma = mistral.replace("\"sliding_window\": 4", "\"sliding_window\": 4, \"sliding_window_pattern\": 2");
    assert_eq!(window(&gemma), (Some(4), vec![true, false]));

    // rope_parameters keyed by layer type: the full layers' are the model's.
    let per_type = r#""rope_parameters": {"full_attention": {"rope_theta": 1000000.0, "rope_type": "linear", "factor": 8.0},
        "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"}}"#;
    let text = edited("\"rope_parameters\": {\"rope_theta\": 1000000.0, \"rope_type\": \"default\"}", per_type);
    let c = parse(&text).unwrap();
    assert_eq!((c.rope_theta, c.rope_scaling), (1e6, RopeScaling::Linear { factor: 8.0 }));
    assert_eq!(c.attention.sliding_rope_theta, Some(1e4));
    assert_eq!(c.rope_inv_freq()[0], 1.0 / 8.0);
    let bad = text.replace(
        "\"rope_theta\": 10000.0, \"rope_type\": \"default\"",
        "\"rope_theta\": 10000.0, \"rope_type\": \"yarn\"",
    );
    let (field, _) = invalid_field(&bad);
    assert_eq!(field, "rope_parameters.sliding_attention.rope_type");

    let gelu = edited("\"hidden_act\": \"silu\"", "\"hidden_activation\": \"gelu_pytorch_tanh\"");
    assert_eq!(parse(&gelu).unwrap().hidden_act, HiddenAct::GeluTanh);
}

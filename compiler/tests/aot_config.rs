//! mllm's AOT config JSONs parse, and every kind of bad input is an error naming its field.

use std::path::PathBuf;

use compiler::aot_config::{
    AotConfig, AotConfigError, HtpArch, HtpChipset, HtpPdSession, HtpPerformance, Precision, QuantMethod, Recipe,
};
use serde_json::{json, Value};

fn data(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data").join(rel)
}

fn reference_json(name: &str) -> Value {
    let text = std::fs::read_to_string(data(name)).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn cfg_1_7b() -> Value {
    reference_json("mllm/qwen3-1.7b-qnn-aot-config.json")
}

#[test]
fn qwen3_1_7b_config_parses_and_equals_the_builtin_default() {
    let cfg = AotConfig::from_file(data("mllm/qwen3-1.7b-qnn-aot-config.json")).unwrap();
    let tm = &cfg.target_machine;
    assert_eq!(tm.htp_arch, HtpArch::V75);
    assert_eq!(tm.htp_chipset, HtpChipset::Sm8650);
    assert_eq!(tm.htp_try_best_performance, HtpPerformance::Burst);
    assert_eq!(tm.htp_security_pd_session, HtpPdSession::Signed);
    assert_eq!(tm.htp_vtcm_capability_in_mb, 8);
    assert_eq!(cfg.graph_on_qnn, vec!["model"]);
    assert_eq!(cfg.op_on_qnn, vec!["lm_head"]);
    assert_eq!(cfg.split_graph, 1);
    let qr = &cfg.quant_recipe;
    assert!(qr.llm_recipe);
    assert_eq!(qr.layers, 28);
    let b = &qr.builtin_llm_pass;
    assert_eq!(b.model, "qwen3");
    assert_eq!(b.linear.fallback, Recipe::lpbq_w4a16(16));
    assert!(b.linear.patterns.is_empty());
    assert_eq!(b.kv_cache.key, Recipe::per_tensor_w8a8());
    assert_eq!(b.kv_cache.value, Recipe::per_tensor_w8a8());
    assert_eq!(cfg.linear_block_size("model.layers.3.mlp.down_proj").unwrap().0, 16);
    assert!(cfg.warnings().is_empty());

    assert_eq!(cfg, AotConfig::w4a16_kv8());
    assert_eq!(AotConfig::w4a16_kv8().to_json(), cfg_1_7b());
}

#[test]
fn qwen3_4b_config_parses_and_lm_head_recipe_is_reported_as_ignored() {
    let cfg = AotConfig::from_file(data("mllm/qwen3-4b-qnn-aot-config.json")).unwrap();
    assert_eq!(cfg.target_machine.htp_arch, HtpArch::V79);
    assert_eq!(cfg.target_machine.htp_chipset, HtpChipset::Sm8750);
    assert_eq!(cfg.quant_recipe.layers, 36);
    let b = &cfg.quant_recipe.builtin_llm_pass;
    assert_eq!(b.linear.fallback, Recipe::lpbq_w4a16(32));
    assert_eq!(b.lm_head.fallback.method, QuantMethod::PerChannel);
    assert_eq!(b.lm_head.fallback.precision, Precision::W8A16);
    assert_eq!(b.lm_head.fallback.block_size, None);
    // mllm quantizes lm_head with the `linear` recipe whatever `lm_head` says.
    assert_eq!(cfg.linear_block_size("lm_head").unwrap().0, 32);
    let warnings = cfg.warnings();
    assert_eq!(warnings.len(), 1);
    assert!(warnings[0].contains("quant_recipe.builtin_llm_pass.lm_head.fallback"));
    assert!(warnings[0].contains("LPBQ w4a16 sym block 32"));
    assert_eq!(cfg.to_json(), reference_json("mllm/qwen3-4b-qnn-aot-config.json"));
}

/// Applies `edit` to the 1.7B config and returns the error message.
fn error_of(edit: impl FnOnce(&mut Value)) -> String {
    let mut v = cfg_1_7b();
    edit(&mut v);
    match AotConfig::from_json(&v) {
        Ok(_) => panic!("edited config was accepted: {v}"),
        Err(e) => e.to_string(),
    }
}

fn assert_mentions(message: &str, parts: &[&str]) {
    for part in parts {
        assert!(message.contains(part), "message {message:?} lacks {part:?}");
    }
}

const LINEAR: &str = "quant_recipe.builtin_llm_pass.linear";

#[test]
fn unknown_fields_are_rejected_everywhere() {
    let m = error_of(|v| v["graph_on_npu"] = json!(["model"]));
    assert_mentions(&m, &["`graph_on_npu`", "unknown field", "graph_on_qnn"]);
    let m = error_of(|v| v["target_machine"]["htp_arch_version"] = json!("V75"));
    assert_mentions(&m, &["`target_machine.htp_arch_version`", "unknown field"]);
    let m = error_of(|v| v["quant_recipe"]["builtin_llm_pass"]["linear"]["fallback"]["blocksize"] = json!(16));
    assert_mentions(&m, &[&format!("`{LINEAR}.fallback.blocksize`"), "unknown field"]);
    let m = error_of(|v| v["quant_recipe"]["builtin_llm_pass"]["kv_cache"]["query"] = json!({}));
    assert_mentions(&m, &["`quant_recipe.builtin_llm_pass.kv_cache.query`", "unknown field"]);
    let m = error_of(|v| v["quant_recipe"]["extra"] = json!(1));
    assert_mentions(&m, &["`quant_recipe.extra`"]);
}

/// The target is checked as a whole where it is parsed (the QNN backend only maps it).
#[test]
fn the_target_machine_must_be_a_consistent_known_soc() {
    let m = error_of(|v| v["target_machine"]["htp_chipset"] = json!("SM9999"));
    assert_mentions(&m, &["`target_machine.htp_chipset`", "\"SM9999\"", "SM8650", "SM8845"]);
    let m = error_of(|v| v["target_machine"]["htp_arch"] = json!("V73"));
    assert_mentions(&m, &["`target_machine.htp_arch`", "V73 does not match htp_chipset SM8650, which is V75"]);
    let m = error_of(|v| v["target_machine"]["htp_vtcm_capability_in_mb"] = json!(16));
    assert_mentions(&m, &["`target_machine.htp_vtcm_capability_in_mb`", "16 MB exceeds the 8 MB VTCM of SM8650"]);
    let m = error_of(|v| v["target_machine"]["htp_vtcm_capability_in_mb"] = json!(0));
    assert_mentions(&m, &["`target_machine.htp_vtcm_capability_in_mb`", "greater than 0"]);
    let m = error_of(|v| v["target_machine"]["htp_try_best_performance"] = json!("Turbo"));
    assert_mentions(&m, &["`target_machine.htp_try_best_performance`", "\"Turbo\"", "HtpBurst"]);
    let m = error_of(|v| v["target_machine"]["htp_security_pd_session"] = json!("HtpSecurePd"));
    assert_mentions(&m, &["`target_machine.htp_security_pd_session`", "HtpSignedPd"]);
    let m = error_of(|v| v["target_machine"]["htp_arch"] = json!(75));
    assert_mentions(&m, &["`target_machine.htp_arch`", "found 75"]);
    let m = error_of(|v| v["target_machine"] = json!([1]));
    assert_mentions(&m, &["`target_machine`", "expected an object"]);
    // SM8845's VTCM is not recorded publicly: the config's value is trusted.
    let mut v = cfg_1_7b();
    v["target_machine"]["htp_chipset"] = json!("SM8845");
    v["target_machine"]["htp_arch"] = json!("V81");
    v["target_machine"]["htp_vtcm_capability_in_mb"] = json!(16);
    let cfg = AotConfig::from_json(&v).unwrap();
    assert_eq!(cfg.target_machine.htp_chipset.soc().soc_model, 97);
    assert_eq!(cfg.to_json()["target_machine"], v["target_machine"]);
}

#[test]
fn missing_and_malformed_values_name_the_field() {
    let m = error_of(|v| {
        v["target_machine"].as_object_mut().unwrap().remove("htp_chipset");
    });
    assert_mentions(&m, &["`target_machine.htp_chipset`", "missing"]);
    let m = error_of(|v| v["target_machine"]["htp_arch"] = json!("V99"));
    assert_mentions(&m, &["`target_machine.htp_arch`", "\"V99\"", "V75"]);
    let m = error_of(|v| v["target_machine"]["htp_vtcm_capability_in_mb"] = json!("8"));
    assert_mentions(&m, &["`target_machine.htp_vtcm_capability_in_mb`", "integer", "\"8\""]);
    let m = error_of(|v| v["target_machine"]["htp_vtcm_capability_in_mb"] = json!(-1));
    assert_mentions(&m, &["`target_machine.htp_vtcm_capability_in_mb`"]);
    let m = error_of(|v| v["graph_on_qnn"] = json!("model"));
    assert_mentions(&m, &["`graph_on_qnn`", "list"]);
    let m = error_of(|v| v["op_on_qnn"] = json!(["lm_head", 3]));
    assert_mentions(&m, &["`op_on_qnn[1]`", "string"]);
    let m = error_of(|v| v["quant_recipe"]["llm_recipe"] = json!("true"));
    assert_mentions(&m, &["`quant_recipe.llm_recipe`", "true or false"]);
    let m = error_of(|v| v["quant_recipe"]["llm_recipe"] = json!(false));
    assert_mentions(&m, &["`quant_recipe.llm_recipe`", "expected true"]);
    let m = error_of(|v| v["quant_recipe"]["layers"] = json!(0));
    assert_mentions(&m, &["`quant_recipe.layers`"]);
    let m = error_of(|v| v["quant_recipe"]["builtin_llm_pass"]["linear"] = json!([]));
    assert_mentions(&m, &[&format!("`{LINEAR}`"), "fallback"]);
    let m = error_of(|v| {
        v["quant_recipe"]["builtin_llm_pass"]["linear"] = json!({});
    });
    assert_mentions(&m, &[&format!("`{LINEAR}.fallback`"), "missing"]);
    let m = error_of(|v| v["quant_recipe"]["builtin_llm_pass"]["linear"]["fallback"]["sym"] = json!(1));
    assert_mentions(&m, &[&format!("`{LINEAR}.fallback.sym`"), "true or false"]);
    let m = error_of(|v| v["quant_recipe"]["builtin_llm_pass"]["linear"]["fallback"]["block_size"] = json!(16.5));
    assert_mentions(&m, &[&format!("`{LINEAR}.fallback.block_size`"), "positive integer"]);

    let syntax = AotConfig::from_json_str("{\"split_graph\": 1,").unwrap_err();
    assert!(matches!(syntax, AotConfigError::Syntax(_)), "{syntax}");
    let missing_file = AotConfig::from_file(data("mllm/no-such-config.json")).unwrap_err();
    assert_mentions(&missing_file.to_string(), &["no-such-config.json"]);
}

#[test]
fn unsupported_settings_are_rejected() {
    let m = error_of(|v| v["split_graph"] = json!(0));
    assert_mentions(&m, &["`split_graph`", "expected at least 1", "found 0"]);
    let m = error_of(|v| v["quant_recipe"]["builtin_llm_pass"]["linear"]["fallback"]["method"] = json!("GPTQ"));
    assert_mentions(&m, &[&format!("`{LINEAR}.fallback.method`"), "\"GPTQ\"", "LPBQ"]);
    let m = error_of(|v| v["quant_recipe"]["builtin_llm_pass"]["linear"]["fallback"]["precision"] = json!("w2a16"));
    assert_mentions(&m, &[&format!("`{LINEAR}.fallback.precision`"), "\"w2a16\""]);
    let m = error_of(|v| v["quant_recipe"]["builtin_llm_pass"]["linear"]["fallback"]["precision"] = json!("w8a16"));
    assert_mentions(&m, &[&format!("`{LINEAR}.fallback.precision`"), "expected w4a16"]);
    let m = error_of(|v| v["quant_recipe"]["builtin_llm_pass"]["linear"]["fallback"]["sym"] = json!(false));
    assert_mentions(&m, &[&format!("`{LINEAR}.fallback.sym`"), "symmetric"]);
    let m = error_of(|v| {
        v["quant_recipe"]["builtin_llm_pass"]["linear"]["fallback"] =
            json!({"method": "per-channel", "sym": true, "precision": "w8a16"});
    });
    assert_mentions(&m, &[&format!("`{LINEAR}.fallback.method`"), "per-channel"]);
    let m = error_of(|v| v["quant_recipe"]["builtin_llm_pass"]["linear"]["fallback"]["block_size"] = json!(0));
    assert_mentions(&m, &[&format!("`{LINEAR}.fallback.block_size`"), "greater than 0"]);
    let m = error_of(|v| {
        v["quant_recipe"]["builtin_llm_pass"]["linear"]["fallback"].as_object_mut().unwrap().remove("block_size");
    });
    assert_mentions(&m, &[&format!("`{LINEAR}.fallback.block_size`"), "missing"]);
    let m = error_of(|v| v["quant_recipe"]["builtin_llm_pass"]["kv_cache"]["key"]["block_size"] = json!(16));
    assert_mentions(&m, &["`quant_recipe.builtin_llm_pass.kv_cache.key.block_size`", "only method LPBQ"]);
    let m = error_of(|v| v["quant_recipe"]["builtin_llm_pass"]["kv_cache"]["value"]["precision"] = json!("w4a16"));
    assert_mentions(&m, &["`quant_recipe.builtin_llm_pass.kv_cache.value.precision`", "w8a8"]);
    let m = error_of(|v| {
        v["quant_recipe"]["builtin_llm_pass"]["linear"]["model\\.layers\\.(0"] =
            json!({"method": "LPBQ", "sym": true, "precision": "w4a16", "block_size": 16});
    });
    assert_mentions(&m, &[r#"`quant_recipe.builtin_llm_pass.linear["model\\.layers\\.(0"]`"#, "regular expression"]);
    let m = error_of(|v| {
        v["quant_recipe"]["builtin_llm_pass"]["linear"]["lm_head"] =
            json!({"method": "LPBQ", "sym": true, "precision": "w4a16", "block_size": 0});
    });
    assert_mentions(&m, &["`quant_recipe.builtin_llm_pass.linear.lm_head.block_size`", "greater than 0"]);
}

fn qwen3_dev_widths() -> Vec<(String, usize)> {
    let mut widths = vec![("lm_head".to_string(), 32)];
    for l in 0..2 {
        for (name, w) in [
            ("self_attn.q_proj", 32),
            ("self_attn.k_proj", 32),
            ("self_attn.v_proj", 32),
            ("self_attn.o_proj", 32),
            ("mlp.gate_proj", 32),
            ("mlp.up_proj", 32),
            ("mlp.down_proj", 64),
        ] {
            widths.push((format!("model.layers.{l}.{name}"), w));
        }
    }
    widths
}

#[test]
fn block_size_must_agree_with_hf_config_and_divide_every_width() {
    let cfg = AotConfig::w4a16_kv8();
    let widths = qwen3_dev_widths();
    cfg.check_block_size(Some(16), &widths).unwrap();
    cfg.check_block_size(None, &widths).unwrap();

    let m = cfg.check_block_size(Some(32), &widths).unwrap_err().to_string();
    assert_mentions(
        &m,
        &["`lm_head`", &format!("`{LINEAR}.fallback.block_size`"), "is 16", "`linear_block_size` is 32"],
    );
    assert!(matches!(cfg.check_block_size(Some(0), &widths), Err(AotConfigError::HfBlockSizeZero)));

    let odd = [("model.layers.0.mlp.down_proj", 40usize)];
    let m = cfg.check_block_size(Some(16), &odd).unwrap_err().to_string();
    assert_mentions(&m, &["`model.layers.0.mlp.down_proj`", "block size 16", "input width 40"]);

    // A per-layer override is checked against the HF value too, naming the override's field.
    let mut v = cfg_1_7b();
    v["quant_recipe"]["builtin_llm_pass"]["linear"]["model\\.layers\\.1\\.mlp\\..*"] =
        json!({"method": "LPBQ", "sym": true, "precision": "w4a16", "block_size": 32});
    let cfg = AotConfig::from_json(&v).unwrap();
    assert_eq!(cfg.linear_block_size("model.layers.1.mlp.down_proj").unwrap().0, 32);
    assert_eq!(cfg.linear_block_size("model.layers.10.mlp.down_proj").unwrap().0, 16);
    cfg.check_block_size(None, &widths).unwrap();
    let m = cfg.check_block_size(Some(16), &widths).unwrap_err().to_string();
    assert_mentions(&m, &["`model.layers.1.mlp.gate_proj`", r#"linear["model\\.layers\\.1\\.mlp\\..*"].block_size"#]);
}

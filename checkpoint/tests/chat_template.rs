//! ChatTemplate against HF transformers' `apply_chat_template` (fixtures/smollm2/chat.json, made by
//! make_chat_refs.py): SmolLM2's own template and a template exercising what real ones use.

use std::path::{Path, PathBuf};

use checkpoint::{ChatMessage, ChatTemplate, ChatTemplateError};
use serde_json::Value;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/smollm2")
}

fn chat_json() -> Value {
    serde_json::from_str(&std::fs::read_to_string(fixtures().join("chat.json")).unwrap()).unwrap()
}

fn messages(case: &Value) -> Vec<ChatMessage> {
    case["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| ChatMessage::new(m["role"].as_str().unwrap(), m["content"].as_str().unwrap()))
        .collect()
}

#[test]
fn renders_like_hf_apply_chat_template() {
    let refs = chat_json();
    let smollm2 = ChatTemplate::from_dir(&fixtures()).unwrap();
    let provenance = &refs["provenance"];
    let features = ChatTemplate::new(
        refs["features_template"].as_str().unwrap().to_string(),
        "features".into(),
        provenance["bos_token"].as_str().map(str::to_string),
        provenance["eos_token"].as_str().map(str::to_string),
    )
    .unwrap();
    let cases = refs["cases"].as_object().unwrap();
    assert_eq!(cases.len(), 12);
    for (name, case) in cases {
        let template = match case["template"].as_str().unwrap() {
            "smollm2" => &smollm2,
            _ => &features,
        };
        let text = template.render(&messages(case), case["add_generation_prompt"].as_bool().unwrap()).unwrap();
        assert_eq!(text, case["text"].as_str().unwrap(), "{name}");
    }
}

#[test]
fn template_errors_name_their_origin() {
    let dir = std::env::temp_dir().join(format!("chat-template-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let err = ChatTemplate::from_dir(&dir).unwrap_err();
    assert!(matches!(err, ChatTemplateError::Missing { .. }), "{err}");
    assert!(err.to_string().contains("chat_template.jinja"), "{err}");

    std::fs::write(dir.join("tokenizer_config.json"), r#"{"chat_template": 5}"#).unwrap();
    let err = ChatTemplate::from_dir(&dir).unwrap_err().to_string();
    assert!(err.contains("tokenizer_config.json") && err.contains("must be a string"), "{err}");

    // A list of named templates: "default" is used; bos/eos as AddedToken objects.
    std::fs::write(
        dir.join("tokenizer_config.json"),
        r#"{"chat_template": [{"name": "tool_use", "template": "x"}, {"name": "default", "template": "{{ bos_token }}{{ messages[0].content }}{{ eos_token }}"}],
            "bos_token": {"content": "<s>"}, "eos_token": "</s>"}"#,
    )
    .unwrap();
    let t = ChatTemplate::from_dir(&dir).unwrap();
    assert_eq!(t.render(&[ChatMessage::new("user", "hi")], false).unwrap(), "<s>hi</s>");
    assert_eq!(t.eos_token(), Some("</s>"));

    // Extra variables (apply_chat_template's keyword arguments) reach the template.
    let flag = ChatTemplate::new(
        "{{ messages | length }}{% if enable_thinking is defined and enable_thinking is false %} no-think{% endif %}"
            .into(),
        "inline".into(),
        None,
        None,
    )
    .unwrap();
    let extra: serde_json::Map<String, Value> = serde_json::from_str(r#"{"enable_thinking": false}"#).unwrap();
    assert_eq!(flag.render_with(&[], true, &extra).unwrap(), "0 no-think");
    assert_eq!(flag.render(&[], true).unwrap(), "0");

    std::fs::write(dir.join("chat_template.jinja"), "{% for m in messages %}{{ m.content }").unwrap();
    let err = ChatTemplate::from_dir(&dir).unwrap_err().to_string();
    assert!(err.contains("chat_template.jinja") && err.contains("does not parse"), "{err}");

    std::fs::write(dir.join("chat_template.jinja"), "{{ raise_exception('roles must alternate') }}").unwrap();
    let err = ChatTemplate::from_dir(&dir).unwrap().render(&[], true).unwrap_err().to_string();
    assert!(err.contains("chat_template.jinja") && err.contains("roles must alternate"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

//! A checkpoint directory's own chat template, rendered like HF transformers'
//! `apply_chat_template`: the Jinja source from `chat_template.jinja` or `tokenizer_config.json`'s
//! `chat_template`, with `messages`, `add_generation_prompt`, `bos_token` and `eos_token` in scope,
//! blocks trimmed as HF's Jinja environment trims them (`trim_blocks`, `lstrip_blocks`), Python
//! string methods (`.strip()`, `.startswith()`, …) and `raise_exception` available.
//!
//! ```no_run
//! use checkpoint::{ChatMessage, ChatTemplate};
//! let template = ChatTemplate::from_dir("smollm2-hf".as_ref())?;
//! let prompt = template.render(&[ChatMessage::new("user", "Hi!")], true)?;
//! # Ok::<(), checkpoint::ChatTemplateError>(())
//! ```

use std::path::{Path, PathBuf};

use minijinja::{Environment, Error as JinjaError, ErrorKind};
use serde::Serialize;
use serde_json::Value;

/// The template file transformers ≥ 4.43 writes next to `tokenizer_config.json`; it wins over
/// the config's `chat_template` when both exist, as in transformers.
pub const CHAT_TEMPLATE_FILE: &str = "chat_template.jinja";
pub const TOKENIZER_CONFIG_FILE: &str = "tokenizer_config.json";

#[derive(Debug, thiserror::Error)]
pub enum ChatTemplateError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {reason}")]
    BadConfig { path: PathBuf, reason: String },
    #[error(
        "{dir} has no chat template: expected {CHAT_TEMPLATE_FILE} or a `chat_template` field in \
         {TOKENIZER_CONFIG_FILE}"
    )]
    Missing { dir: PathBuf },
    #[error("{origin}: the chat template does not parse: {reason}")]
    Syntax { origin: String, reason: String },
    #[error("{origin}: rendering the chat template failed: {reason}")]
    Render { origin: String, reason: String },
}

/// One turn of a conversation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        ChatMessage { role: role.into(), content: content.into() }
    }
}

/// A parsed chat template with the special tokens it may refer to.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    /// Where the template came from, for messages.
    origin: String,
    bos_token: Option<String>,
    eos_token: Option<String>,
}

const NAME: &str = "chat_template";

impl ChatTemplate {
    /// The template of the HF directory `dir` (see the module docs for where it is looked up).
    pub fn from_dir(dir: &Path) -> Result<Self, ChatTemplateError> {
        let config_path = dir.join(TOKENIZER_CONFIG_FILE);
        let config = match std::fs::read_to_string(&config_path) {
            Ok(text) => Some(serde_json::from_str::<Value>(&text).map_err(|e| ChatTemplateError::BadConfig {
                path: config_path.clone(),
                reason: format!("not valid JSON: {e}"),
            })?),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(source) => return Err(ChatTemplateError::Io { path: config_path, source }),
        };
        let token = |key: &str| -> Result<Option<String>, ChatTemplateError> {
            match config.as_ref().and_then(|c| c.get(key)) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::String(s)) => Ok(Some(s.clone())),
                // An AddedToken written out in full.
                Some(Value::Object(o)) if o.get("content").is_some_and(Value::is_string) => {
                    Ok(o["content"].as_str().map(str::to_string))
                }
                Some(other) => Err(ChatTemplateError::BadConfig {
                    path: config_path.clone(),
                    reason: format!("field `{key}` must be a string or {{\"content\": ...}}, found {other}"),
                }),
            }
        };
        let (bos_token, eos_token) = (token("bos_token")?, token("eos_token")?);
        let file = dir.join(CHAT_TEMPLATE_FILE);
        let (source, origin) = match std::fs::read_to_string(&file) {
            Ok(source) => (source, file.display().to_string()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let source = config
                    .as_ref()
                    .and_then(|c| c.get("chat_template"))
                    .map(|t| template_from_config(t, &config_path))
                    .transpose()?
                    .ok_or_else(|| ChatTemplateError::Missing { dir: dir.to_path_buf() })?;
                (source, format!("{} (`chat_template`)", config_path.display()))
            }
            Err(source) => return Err(ChatTemplateError::Io { path: file, source }),
        };
        Self::new(source, origin, bos_token, eos_token)
    }

    /// A template from its Jinja source; `origin` names it in errors.
    pub fn new(
        source: String,
        origin: String,
        bos_token: Option<String>,
        eos_token: Option<String>,
    ) -> Result<Self, ChatTemplateError> {
        let mut env = Environment::new();
        // HF renders with jinja2's ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True).
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_filter("tojson", python_tojson);
        env.add_function("raise_exception", |message: String| -> Result<String, JinjaError> {
            Err(JinjaError::new(ErrorKind::InvalidOperation, message))
        });
        env.add_template_owned(NAME, source)
            .map_err(|e| ChatTemplateError::Syntax { origin: origin.clone(), reason: describe(&e) })?;
        Ok(ChatTemplate { env, origin, bos_token, eos_token })
    }

    /// The conversation as the model's prompt text; with `add_generation_prompt` it ends with
    /// the header of the assistant's next turn.
    pub fn render(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String, ChatTemplateError> {
        self.render_with(messages, add_generation_prompt, &serde_json::Map::new())
    }

    /// Like [`render`](Self::render), with extra template variables (HF's `apply_chat_template`
    /// keyword arguments, e.g. Qwen3's `enable_thinking`); templates that do not use one ignore it.
    pub fn render_with(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        extra: &serde_json::Map<String, Value>,
    ) -> Result<String, ChatTemplateError> {
        let template = self.env.get_template(NAME).expect("added in new");
        let base = minijinja::context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos_token.as_deref().unwrap_or(""),
            eos_token => self.eos_token.as_deref().unwrap_or(""),
        };
        // The fixed variables win over `extra`.
        let context = minijinja::context! { ..base, ..minijinja::Value::from_serialize(extra) };
        template
            .render(context)
            .map_err(|e| ChatTemplateError::Render { origin: self.origin.clone(), reason: describe(&e) })
    }

    /// The tokenizer's EOS token (`eos_token` of `tokenizer_config.json`), which ends a turn.
    pub fn eos_token(&self) -> Option<&str> {
        self.eos_token.as_deref()
    }
}

/// transformers' `tojson`: Python's `json.dumps(value, ensure_ascii=False, indent=indent)`, so
/// `", "` and `": "` separators and no HTML escaping (minijinja's own filter is compact and escapes).
fn python_tojson(value: minijinja::Value, indent: Option<usize>) -> Result<minijinja::Value, JinjaError> {
    let json = serde_json::to_value(&value)
        .map_err(|e| JinjaError::new(ErrorKind::InvalidOperation, format!("tojson: cannot serialize: {e}")))?;
    let mut out = String::new();
    write_python_json(&json, indent, 0, &mut out);
    Ok(minijinja::Value::from_safe_string(out))
}

fn write_python_json(value: &Value, indent: Option<usize>, depth: usize, out: &mut String) {
    let (open_sep, item_sep, close_sep) = match indent {
        None => (String::new(), ", ".to_string(), String::new()),
        Some(n) => {
            let pad = |d: usize| format!("\n{}", " ".repeat(n * d));
            (pad(depth + 1), format!(",{}", pad(depth + 1)), pad(depth))
        }
    };
    match value {
        Value::Array(items) if !items.is_empty() => {
            out.push('[');
            out.push_str(&open_sep);
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(&item_sep);
                }
                write_python_json(item, indent, depth + 1, out);
            }
            out.push_str(&close_sep);
            out.push(']');
        }
        Value::Object(map) if !map.is_empty() => {
            out.push('{');
            out.push_str(&open_sep);
            for (i, (key, item)) in map.iter().enumerate() {
                if i > 0 {
                    out.push_str(&item_sep);
                }
                out.push_str(&Value::String(key.clone()).to_string());
                out.push_str(": ");
                write_python_json(item, indent, depth + 1, out);
            }
            out.push_str(&close_sep);
            out.push('}');
        }
        // Scalars, "[]" and "{}" print the same in both.
        other => out.push_str(&other.to_string()),
    }
}

/// `chat_template` is a string, or a list of `{name, template}` of which `default` is used.
fn template_from_config(value: &Value, path: &Path) -> Result<String, ChatTemplateError> {
    let bad = |reason: String| ChatTemplateError::BadConfig { path: path.to_path_buf(), reason };
    match value {
        Value::String(s) => Ok(s.clone()),
        Value::Array(named) => named
            .iter()
            .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
            .and_then(|t| t.get("template")?.as_str().map(str::to_string))
            .ok_or_else(|| {
                bad("`chat_template` is a list without a {\"name\": \"default\", \"template\": ...} entry".into())
            }),
        other => Err(bad(format!("`chat_template` must be a string or a list of named templates, found {other}"))),
    }
}

/// The error with its line and the causes minijinja chains behind it.
fn describe(err: &JinjaError) -> String {
    let mut text = err.to_string();
    let mut source = std::error::Error::source(err);
    while let Some(cause) = source {
        text.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    text
}

//! Chat as the model expects it: a conversation rendered with the checkpoint directory's own chat
//! template (checkpoint::ChatTemplate), the ids that end a turn, and generated ids turned back into
//! text as they arrive.

use std::path::Path;

use crate::error::{AotError, Context, Result};
use checkpoint::{ChatMessage, ChatTemplate};
use serde_json::{Map, Value};

/// Variables every rendering gets: Qwen3's templates switch thinking off with `enable_thinking`
/// (mllm's runner and pymllm's calibration use non-thinking mode); templates without the switch
/// ignore it.
fn template_variables() -> Map<String, Value> {
    Map::from_iter([("enable_thinking".to_string(), Value::Bool(false))])
}

/// The chat template of the HF directory `dir`, with an error that says where it was looked for.
pub fn load_chat_template(dir: &Path) -> Result<ChatTemplate> {
    ChatTemplate::from_dir(dir).with_context(|| format!("loading the chat template of {}", dir.display()))
}

/// One user turn as the model's prompt text, ending with the assistant's header (what `--chat`
/// and `--calib-text --chat` feed the model).
pub fn user_turn_prompt(template: &ChatTemplate, user: &str) -> Result<String> {
    Ok(template.render_with(&[ChatMessage::new("user", user)], true, &template_variables())?)
}

/// A conversation: an optional system prompt, then alternating user and assistant turns.
pub struct Conversation {
    template: ChatTemplate,
    messages: Vec<ChatMessage>,
}

impl Conversation {
    pub fn new(template: ChatTemplate, system: Option<&str>) -> Self {
        let messages = system.map(|s| vec![ChatMessage::new("system", s)]).unwrap_or_default();
        Conversation { template, messages }
    }

    /// Adds the user's turn; returns the whole conversation as the prompt for the answer.
    pub fn user_says(&mut self, text: &str) -> Result<String> {
        self.messages.push(ChatMessage::new("user", text));
        Ok(self.template.render_with(&self.messages, true, &template_variables())?)
    }

    /// Adds the model's answer, so the next turn sees it.
    pub fn assistant_said(&mut self, text: &str) {
        self.messages.push(ChatMessage::new("assistant", text));
    }

    pub fn template(&self) -> &ChatTemplate {
        &self.template
    }
}

/// The ids that end generation: the config's EOS ids plus the chat template's EOS token (the end
/// of a turn) when the tokenizer knows it.
pub fn stop_ids(config_eos: &[u32], template: Option<&ChatTemplate>, tokenizer: &tokenizers::Tokenizer) -> Vec<u32> {
    let mut ids = config_eos.to_vec();
    if let Some(id) = template.and_then(|t| t.eos_token()).and_then(|t| tokenizer.token_to_id(t)) {
        if !ids.contains(&id) {
            ids.push(id);
        }
    }
    ids
}

/// Generated ids decoded into text as they arrive: each call returns only the new text, and holds
/// text back while it ends in an incomplete UTF-8 sequence (byte-level tokens split characters).
pub struct TextStream<'a> {
    tokenizer: &'a tokenizers::Tokenizer,
    ids: Vec<u32>,
    shown: usize,
}

impl<'a> TextStream<'a> {
    pub fn new(tokenizer: &'a tokenizers::Tokenizer) -> Self {
        TextStream { tokenizer, ids: Vec::new(), shown: 0 }
    }

    /// Adds `id`; returns the text it completes (special tokens are not shown).
    pub fn push(&mut self, id: u32) -> Result<String> {
        self.ids.push(id);
        let text = self.tokenizer.decode(&self.ids, true).map_err(|e| AotError::tokenizer("decoding", e))?;
        if text.ends_with('\u{FFFD}') || text.len() < self.shown || !text.is_char_boundary(self.shown) {
            return Ok(String::new());
        }
        let new = text[self.shown..].to_string();
        self.shown = text.len();
        Ok(new)
    }
}

//! Token sequences to calibrate or evaluate on: ids from safetensors, or text paragraphs through
//! the model's tokenizer.

use std::path::{Path, PathBuf};

use crate::error::{bail, ensure, AotError, Context, Result};
use checkpoint::{ChatTemplate, SafetensorsCheckpoint};

use crate::chat::{load_chat_template, user_turn_prompt};
use models::hf::HfConfig;

/// Calibration token sequences.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CalibSource {
    /// Safetensors with `calib_ids`, int64 (or int32) `[N, L]`.
    Ids(PathBuf),
    /// Paragraphs separated by blank lines, tokenized with the model directory's `tokenizer.json`
    /// (each paragraph as a user turn through the model directory's own chat template when `chat`).
    Text { path: PathBuf, chat: bool },
}

impl CalibSource {
    /// The file the sequences are read from.
    pub fn path(&self) -> &Path {
        match self {
            CalibSource::Ids(path) | CalibSource::Text { path, .. } => path,
        }
    }

    /// The sequences for the model in `model_dir`: ids checked against `vocab_size`, or text
    /// paragraphs cut to `max_len` tokens, at most `max_samples` of them.
    pub fn load(
        &self,
        model_dir: &Path,
        vocab_size: usize,
        max_len: usize,
        max_samples: usize,
    ) -> Result<Vec<Vec<i64>>> {
        match self {
            CalibSource::Ids(path) => load_id_sequences(path, "calib_ids", vocab_size),
            CalibSource::Text { path, chat } => {
                let template = if *chat { Some(load_chat_template(model_dir)?) } else { None };
                load_text_sequences(path, &model_dir.join("tokenizer.json"), max_len, max_samples, template.as_ref())
            }
        }
    }

    /// [`CalibSource::load`] of each source in turn, concatenated (at most `max_samples` from each).
    pub fn load_all(
        sources: &[CalibSource],
        model_dir: &Path,
        vocab_size: usize,
        max_len: usize,
        max_samples: usize,
    ) -> Result<Vec<Vec<i64>>> {
        let each: Result<Vec<_>> =
            sources.iter().map(|c| c.load(model_dir, vocab_size, max_len, max_samples)).collect();
        Ok(each?.concat())
    }
}

/// Token sequences from `calib_ids`-style safetensors: an int64 (or int32) `[N, L]` tensor `key`.
pub fn load_id_sequences(path: &Path, key: &str, vocab_size: usize) -> Result<Vec<Vec<i64>>> {
    let file = SafetensorsCheckpoint::open_file(path).with_context(|| format!("opening {}", path.display()))?;
    let (dtype, shape) = file.info(key).with_context(|| format!("{}: tensor `{key}`", path.display()))?;
    let shape = shape.to_vec();
    let [n, len] = shape[..] else {
        bail!("{}: `{key}` has shape {shape:?}, expected [N, L] (sequences x tokens)", path.display());
    };
    ensure!(n > 0 && len > 0, "{}: `{key}` is empty ({shape:?})", path.display());
    let ids: Vec<i64> = match dtype {
        checkpoint::StDtype::I64 => file.read_i64(key)?,
        checkpoint::StDtype::I32 => file.read_i32(key)?.into_iter().map(i64::from).collect(),
        other => bail!("{}: `{key}` is {other}, expected int64 (or int32) token ids", path.display()),
    };
    if let Some((i, id)) = ids.iter().enumerate().find(|(_, &id)| id < 0 || id as usize >= vocab_size) {
        bail!("{}: `{key}` element {i} is token id {id}, outside the vocabulary 0..{vocab_size}", path.display());
    }
    Ok(ids.chunks_exact(len).map(<[i64]>::to_vec).collect())
}

/// Calibration sequences from a text file: paragraphs separated by blank lines, each tokenized
/// with `tokenizer.json` (as one user turn through the model's chat template when `chat` is given,
/// as pymllm's calibration does) and cut to `max_len` tokens; at most `max_samples` of them.
pub fn load_text_sequences(
    path: &Path,
    tokenizer: &Path,
    max_len: usize,
    max_samples: usize,
    chat: Option<&ChatTemplate>,
) -> Result<Vec<Vec<i64>>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let tok = tokenizers::Tokenizer::from_file(tokenizer)
        .map_err(|e| AotError::tokenizer(format!("cannot load tokenizer {}", tokenizer.display()), e))?;
    let mut out = Vec::new();
    for para in text.split("\n\n").map(str::trim).filter(|p| !p.is_empty()).take(max_samples) {
        let input = match chat {
            Some(template) => user_turn_prompt(template, para)?,
            None => para.to_string(),
        };
        // Plain text gets the tokenizer's own special tokens (Gemma's BOS) as HF's `tokenizer(text)`
        // does; a rendered chat template already holds them.
        let enc = tok
            .encode(input, chat.is_none())
            .map_err(|e| AotError::tokenizer(format!("tokenizing {}", path.display()), e))?;
        let ids: Vec<i64> = enc.get_ids().iter().take(max_len).map(|&i| i64::from(i)).collect();
        if !ids.is_empty() {
            out.push(ids);
        }
    }
    ensure!(!out.is_empty(), "{}: no non-empty paragraph to calibrate on", path.display());
    Ok(out)
}

/// The `tokenizer.json` of a model directory.
pub fn load_tokenizer(dir: &Path) -> Result<tokenizers::Tokenizer> {
    let path = dir.join("tokenizer.json");
    tokenizers::Tokenizer::from_file(&path)
        .map_err(|e| AotError::tokenizer(format!("cannot load {}", path.display()), e))
}

/// Whether a prompt is plain text or a rendered chat template.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PromptText {
    /// Gets the tokenizer's special tokens (Gemma's BOS), as HF's `tokenizer(text)` does.
    Plain,
    /// Already holds them (the template writes its BOS).
    Chat,
}

/// The token ids of a prompt text, checked against the vocabulary of `config`.
pub fn encode_prompt(
    tokenizer: &tokenizers::Tokenizer,
    text: &str,
    kind: PromptText,
    config: &HfConfig,
) -> Result<Vec<u32>> {
    let encoding = tokenizer
        .encode(text, kind == PromptText::Plain)
        .map_err(|e| AotError::tokenizer("tokenizing the prompt", e))?;
    let ids = encoding.get_ids().to_vec();
    ensure!(!ids.is_empty(), "the prompt is empty");
    let vocab = config.vocab_size;
    if let Some(&bad) = ids.iter().find(|&&id| id as usize >= vocab) {
        let dir = config.source.parent().unwrap_or(&config.source);
        bail!("{}: tokenizer.json gives id {bad}, outside the model's vocabulary of {vocab} ids", dir.display());
    }
    Ok(ids)
}

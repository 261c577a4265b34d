//! `tokenizer.json` and `tokenizer_config.json` built from a GGUF file's `tokenizer.*` metadata,
//! for gpt2-style byte-level BPE vocabularies (`tokenizer.ggml.model = "gpt2"`: SmolLM2, Qwen,
//! Llama 3) and SentencePiece BPE ones (`"llama"`: Gemma, Llama 2, Mistral), so the `tokenizers`
//! crate encodes like the model's own Hugging Face tokenizer.

use serde_json::{json, Map, Value};

use super::to_hf::SpecialIds;
use super::{GgufError, GgufFile};

const MODEL_KEY: &str = "tokenizer.ggml.model";
const PRE_KEY: &str = "tokenizer.ggml.pre";

/// llama.cpp's token types (`llama_token_type`).
const TOKEN_TYPE_CONTROL: i64 = 3;
const TOKEN_TYPE_USER_DEFINED: i64 = 4;

/// The pre-tokenizer for a `tokenizer.ggml.pre` name: llama.cpp picks its split regexes by this
/// name; these are the same splits in the `tokenizers` crate's vocabulary.
fn pre_tokenizer(gguf: &GgufFile, add_prefix_space: bool) -> Result<Value, GgufError> {
    let byte_level = json!({
        "type": "ByteLevel", "add_prefix_space": add_prefix_space, "trim_offsets": true, "use_regex": true
    });
    let pre = match gguf.metadata().get(PRE_KEY) {
        None => "default",
        Some(_) => gguf.get_str(PRE_KEY)?,
    };
    match pre {
        // GPT-2's regex.
        "default" | "gpt-2" | "gpt2" => Ok(byte_level),
        // Every digit on its own (llama.cpp's `\p{N}` split, the HF tokenizer's
        // `Digits(individual_digits)`), then GPT-2's regex.
        "smollm" | "starcoder" | "refact" => Ok(json!({
            "type": "Sequence",
            "pretokenizers": [{ "type": "Digits", "individual_digits": true }, byte_level],
        })),
        // Qwen2/Qwen3 and Llama 3 split with one regex first; the byte-level step then only maps bytes.
        "qwen2" => Ok(regex_then_bytes(QWEN2_SPLIT)),
        "llama-bpe" | "llama3" => Ok(regex_then_bytes(LLAMA3_SPLIT)),
        other => Err(GgufError::InvalidKey {
            path: gguf.path().to_path_buf(),
            key: PRE_KEY.into(),
            reason: format!(
                "pre-tokenizer '{other}' is not supported (supported: default, gpt2, smollm, starcoder, qwen2, \
                 llama-bpe)"
            ),
        }),
    }
}

/// The split regexes of llama.cpp's `qwen2` and `llama-bpe` pre-tokenizers (the same as the models'
/// HF tokenizers): they differ only in how many digits a number token takes.
const QWEN2_SPLIT: &str =
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

fn regex_then_bytes(pattern: &str) -> Value {
    json!({
        "type": "Sequence",
        "pretokenizers": [
            { "type": "Split", "pattern": { "Regex": pattern }, "behavior": "Isolated", "invert": false },
            { "type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false },
        ],
    })
}

/// The vocabulary's kind (`tokenizer.ggml.model`).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Vocab {
    /// Byte-level BPE with merges.
    Gpt2,
    /// SentencePiece BPE: pieces with scores, `▁` for a space, `<0xNN>` byte pieces.
    SentencePiece,
}

fn vocab_kind(gguf: &GgufFile) -> Result<Vocab, GgufError> {
    match gguf.get_str(MODEL_KEY)? {
        "gpt2" => Ok(Vocab::Gpt2),
        "llama" => Ok(Vocab::SentencePiece),
        model => Err(GgufError::InvalidKey {
            path: gguf.path().to_path_buf(),
            key: MODEL_KEY.into(),
            reason: format!(
                "tokenizer model '{model}' is not supported (supported: gpt2 byte-level BPE, llama SentencePiece BPE)"
            ),
        }),
    }
}

/// An optional token id key, checked to lie inside the vocabulary.
fn token_id(gguf: &GgufFile, key: &str, vocab: usize) -> Result<Option<u32>, GgufError> {
    if !gguf.metadata().contains_key(key) {
        return Ok(None);
    }
    let id = gguf.get_u64(key)?;
    if id as usize >= vocab {
        return Err(GgufError::InvalidKey {
            path: gguf.path().to_path_buf(),
            key: key.into(),
            reason: format!("token id {id} is outside the vocabulary of {vocab} tokens"),
        });
    }
    Ok(Some(id as u32))
}

fn flag(gguf: &GgufFile, key: &str, default: bool) -> Result<bool, GgufError> {
    match gguf.metadata().get(key) {
        None => Ok(default),
        Some(v) => v.as_bool().ok_or_else(|| gguf.wrong_type(key, "a bool", v)),
    }
}

pub(crate) fn special_ids(gguf: &GgufFile, vocab: usize) -> Result<SpecialIds, GgufError> {
    let mut eos = Vec::new();
    for key in ["tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"] {
        if let Some(id) = token_id(gguf, key, vocab)? {
            if !eos.contains(&id) {
                eos.push(id);
            }
        }
    }
    Ok(SpecialIds {
        bos: token_id(gguf, "tokenizer.ggml.bos_token_id", vocab)?,
        eos,
        pad: token_id(gguf, "tokenizer.ggml.padding_token_id", vocab)?,
        unk: token_id(gguf, "tokenizer.ggml.unknown_token_id", vocab)?,
    })
}

/// The vocabulary with each token's type; the types default to normal when the key is absent.
fn tokens_and_types(gguf: &GgufFile) -> Result<(Vec<&str>, Vec<i64>), GgufError> {
    let tokens = gguf.get_str_array("tokenizer.ggml.tokens")?;
    let types = match gguf.metadata().get("tokenizer.ggml.token_type") {
        None => vec![1; tokens.len()],
        Some(_) => gguf.get_int_array("tokenizer.ggml.token_type")?,
    };
    if types.len() != tokens.len() {
        return Err(GgufError::InvalidKey {
            path: gguf.path().to_path_buf(),
            key: "tokenizer.ggml.token_type".into(),
            reason: format!("{} types for {} tokens", types.len(), tokens.len()),
        });
    }
    Ok((tokens, types))
}

/// `tokenizer.json`: byte-level BPE over the GGUF vocabulary and merges, control tokens as
/// special added tokens, user-defined tokens as plain added tokens, the pre-tokenizer
/// `tokenizer.ggml.pre` names, BOS/EOS added as `tokenizer.ggml.add_{bos,eos}_token` say.
pub fn tokenizer_json(gguf: &GgufFile) -> Result<Value, GgufError> {
    if vocab_kind(gguf)? == Vocab::SentencePiece {
        return sentencepiece_json(gguf);
    }
    let (tokens, types) = tokens_and_types(gguf)?;
    let merges = gguf.get_str_array("tokenizer.ggml.merges")?;
    let mut vocab = Map::with_capacity(tokens.len());
    for (id, &token) in tokens.iter().enumerate() {
        if vocab.insert(token.to_string(), json!(id)).is_some() {
            return Err(GgufError::InvalidKey {
                path: gguf.path().to_path_buf(),
                key: "tokenizer.ggml.tokens".into(),
                reason: format!("token {token:?} appears twice (second at id {id})"),
            });
        }
    }
    for (i, merge) in merges.iter().enumerate() {
        let known = merge.split_once(' ').filter(|(a, b)| vocab.contains_key(*a) && vocab.contains_key(*b));
        if known.is_none() {
            return Err(GgufError::InvalidKey {
                path: gguf.path().to_path_buf(),
                key: "tokenizer.ggml.merges".into(),
                reason: format!("merge #{i} {merge:?} is not two vocabulary tokens separated by a space"),
            });
        }
    }
    let added: Vec<Value> = tokens
        .iter()
        .zip(&types)
        .enumerate()
        .filter(|(_, (_, &t))| t == TOKEN_TYPE_CONTROL || t == TOKEN_TYPE_USER_DEFINED)
        .map(|(id, (token, &t))| added_token(id, token, t == TOKEN_TYPE_CONTROL))
        .collect();
    let special = special_ids(gguf, tokens.len())?;
    let add_prefix_space = flag(gguf, "tokenizer.ggml.add_space_prefix", false)?;
    Ok(json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": pre_tokenizer(gguf, add_prefix_space)?,
        "post_processor": post_processor(gguf, &tokens, &special)?,
        "decoder": { "type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true },
        "model": {
            "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
            "vocab": vocab, "merges": merges,
        },
    }))
}

/// BOS before / EOS after the sequence when the GGUF asks for them (`add_bos_token` defaults
/// to false for gpt2 vocabularies, as in llama.cpp).
fn post_processor(gguf: &GgufFile, tokens: &[&str], special: &SpecialIds) -> Result<Value, GgufError> {
    let mut single = Vec::new();
    let mut special_tokens = Map::new();
    let mut add = |id: u32, at_end: bool, single: &mut Vec<Value>| {
        let token = tokens[id as usize];
        special_tokens.insert(token.to_string(), json!({ "id": token, "ids": [id], "tokens": [token] }));
        let item = json!({ "SpecialToken": { "id": token, "type_id": 0 } });
        if at_end {
            single.push(item);
        } else {
            single.insert(0, item);
        }
    };
    single.push(json!({ "Sequence": { "id": "A", "type_id": 0 } }));
    if flag(gguf, "tokenizer.ggml.add_bos_token", false)? {
        let bos = special.bos.ok_or_else(|| GgufError::MissingKey {
            path: gguf.path().to_path_buf(),
            key: "tokenizer.ggml.bos_token_id".into(),
            expected: "the BOS id, since tokenizer.ggml.add_bos_token is true".into(),
        })?;
        add(bos, false, &mut single);
    }
    if flag(gguf, "tokenizer.ggml.add_eos_token", false)? {
        let eos = *special.eos.first().ok_or_else(|| GgufError::MissingKey {
            path: gguf.path().to_path_buf(),
            key: "tokenizer.ggml.eos_token_id".into(),
            expected: "the EOS id, since tokenizer.ggml.add_eos_token is true".into(),
        })?;
        add(eos, true, &mut single);
    }
    let mut pair = single.clone();
    for item in &single {
        let renamed = item.to_string().replace("\"id\":\"A\",\"type_id\":0", "\"id\":\"B\",\"type_id\":1");
        pair.push(serde_json::from_str(&renamed).expect("re-serialized JSON"));
    }
    Ok(json!({ "type": "TemplateProcessing", "single": single, "pair": pair, "special_tokens": special_tokens }))
}

/// `tokenizer_config.json` (chat template, BOS/EOS/PAD/UNK tokens, added tokens) and the special
/// ids the config files repeat.
pub fn tokenizer_config_json(gguf: &GgufFile) -> Result<(Value, SpecialIds), GgufError> {
    vocab_kind(gguf)?;
    let (tokens, types) = tokens_and_types(gguf)?;
    let special = special_ids(gguf, tokens.len())?;
    let mut config = json!({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": flag(gguf, "tokenizer.ggml.add_bos_token", false)?,
        "add_eos_token": flag(gguf, "tokenizer.ggml.add_eos_token", false)?,
        "clean_up_tokenization_spaces": false,
        "model_max_length": context_length(gguf).unwrap_or(2048),
    });
    let map = config.as_object_mut().expect("object");
    let name = |id: Option<u32>| id.map(|id| json!(tokens[id as usize]));
    for (key, id) in [
        ("bos_token", special.bos),
        ("eos_token", special.eos.first().copied()),
        ("pad_token", special.pad),
        ("unk_token", special.unk),
    ] {
        if let Some(token) = name(id) {
            map.insert(key.into(), token);
        }
    }
    if gguf.metadata().contains_key("tokenizer.chat_template") {
        map.insert("chat_template".into(), json!(gguf.get_str("tokenizer.chat_template")?));
    }
    let decoder: Map<String, Value> = tokens
        .iter()
        .zip(&types)
        .enumerate()
        .filter(|(_, (_, &t))| t == TOKEN_TYPE_CONTROL || t == TOKEN_TYPE_USER_DEFINED)
        .map(|(id, (token, &t))| {
            let entry = json!({
                "content": token, "lstrip": false, "normalized": false, "rstrip": false,
                "single_word": false, "special": t == TOKEN_TYPE_CONTROL,
            });
            (id.to_string(), entry)
        })
        .collect();
    map.insert("added_tokens_decoder".into(), Value::Object(decoder));
    Ok((config, special))
}

/// `tokenizer.json` for a SentencePiece BPE vocabulary, laid out as transformers writes one for
/// Gemma: spaces become `▁` (normalizer) and every `▁` starts a new word (pre-tokenizer), pieces
/// merge by the ranks transformers' SentencePiece converter derives from the scores, bytes without
/// a piece fall back to `<0xNN>`, and control and user-defined pieces are added tokens.
fn sentencepiece_json(gguf: &GgufFile) -> Result<Value, GgufError> {
    let (raw, types) = tokens_and_types(gguf)?;
    let scores = gguf.get_f64_array("tokenizer.ggml.scores")?;
    let invalid =
        |key: &str, reason: String| GgufError::InvalidKey { path: gguf.path().to_path_buf(), key: key.into(), reason };
    if scores.len() != raw.len() {
        return Err(invalid("tokenizer.ggml.scores", format!("{} scores for {} tokens", scores.len(), raw.len())));
    }
    // llama.cpp writes some whitespace pieces (runs of spaces) with spaces where the model has `▁`.
    let tokens: Vec<String> = raw.iter().map(|t| t.replace(' ', "\u{2581}")).collect();
    let mut ids = std::collections::HashMap::with_capacity(tokens.len());
    for (id, token) in tokens.iter().enumerate() {
        if ids.insert(token.as_str(), id).is_some() {
            return Err(invalid("tokenizer.ggml.tokens", format!("token {token:?} appears twice (second at id {id})")));
        }
    }
    // llama.cpp writes -1000 for control and user-defined pieces; the SentencePiece model scores
    // them 0, above every learned piece, which is what ranks their merges (whitespace runs) first.
    let ranks: Vec<f64> = scores
        .iter()
        .zip(&types)
        .map(|(&s, &t)| if t == TOKEN_TYPE_CONTROL || t == TOKEN_TYPE_USER_DEFINED { 0.0 } else { s })
        .collect();
    let merges = sentencepiece_merges(&tokens, &ranks, &ids);
    let vocab: Map<String, Value> = tokens.iter().enumerate().map(|(id, t)| (t.clone(), json!(id))).collect();
    let added: Vec<Value> = tokens
        .iter()
        .zip(&types)
        .enumerate()
        .filter(|(_, (t, &ty))| ty == TOKEN_TYPE_CONTROL || (ty == TOKEN_TYPE_USER_DEFINED && !t.contains('\u{2581}')))
        .map(|(id, (token, &ty))| added_token(id, token, ty == TOKEN_TYPE_CONTROL))
        .collect();
    let special = special_ids(gguf, tokens.len())?;
    let unk = special.unk.map(|id| json!(tokens[id as usize])).unwrap_or(Value::Null);
    let mut normalizer = vec![json!({ "type": "Replace", "pattern": { "String": " " }, "content": "\u{2581}" })];
    if flag(gguf, "tokenizer.ggml.add_space_prefix", true)? {
        normalizer.insert(0, json!({ "type": "Prepend", "prepend": "\u{2581}" }));
    }
    let token_strs: Vec<&str> = tokens.iter().map(String::as_str).collect();
    Ok(json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": { "type": "Sequence", "normalizers": normalizer },
        "pre_tokenizer": { "type": "Split", "pattern": { "String": " " }, "behavior": "MergedWithPrevious", "invert": false },
        "post_processor": post_processor(gguf, &token_strs, &special)?,
        "decoder": { "type": "Sequence", "decoders": [
            { "type": "Replace", "pattern": { "String": "\u{2581}" }, "content": " " },
            { "type": "ByteFallback" },
            { "type": "Fuse" },
        ]},
        "model": {
            "type": "BPE", "dropout": null, "unk_token": unk, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": true, "byte_fallback": true, "ignore_merges": false,
            "vocab": vocab, "merges": merges,
        },
    }))
}

/// The merges of a SentencePiece BPE vocabulary as transformers' converter derives them
/// (`generate_merges` in transformers' convert_slow_tokenizer.py): every split of a piece into two
/// pieces of the vocabulary, ordered by the piece's score (highest first), then the longer left
/// part, then the longer right part; ties keep id order (pieces, then (left id, right id)).
fn sentencepiece_merges(tokens: &[String], scores: &[f64], ids: &std::collections::HashMap<&str, usize>) -> Vec<Value> {
    struct Merge<'a> {
        score: f64,
        left_chars: usize,
        right_chars: usize,
        left: &'a str,
        right: &'a str,
    }
    let mut merges = Vec::new();
    for (token, &score) in tokens.iter().zip(scores) {
        let mut local: Vec<(usize, usize, Merge<'_>)> = token
            .char_indices()
            .skip(1)
            .filter_map(|(at, _)| {
                let (left, right) = token.split_at(at);
                let (l, r) = (*ids.get(left)?, *ids.get(right)?);
                let (left_chars, right_chars) = (left.chars().count(), right.chars().count());
                Some((l, r, Merge { score, left_chars, right_chars, left, right }))
            })
            .collect();
        local.sort_by_key(|(l, r, _)| (*l, *r));
        merges.extend(local.into_iter().map(|(_, _, m)| m));
    }
    // A stable sort: equal keys keep the order above.
    merges.sort_by(|a, b| {
        b.score.total_cmp(&a.score).then(b.left_chars.cmp(&a.left_chars)).then(b.right_chars.cmp(&a.right_chars))
    });
    merges.into_iter().map(|m| json!([m.left, m.right])).collect()
}

/// `{architecture}.context_length`, when the file has both keys.
fn context_length(gguf: &GgufFile) -> Option<u64> {
    let arch = gguf.metadata().get("general.architecture")?.as_str()?;
    gguf.metadata().get(&format!("{arch}.context_length"))?.as_u64()
}

/// One `added_tokens` entry of `tokenizer.json`: matched as written, before normalization.
fn added_token(id: usize, content: &str, special: bool) -> Value {
    json!({
        "id": id, "content": content, "single_word": false, "lstrip": false, "rstrip": false,
        "normalized": false, "special": special,
    })
}

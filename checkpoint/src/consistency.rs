//! A config checked against the checkpoint's header before any model is built: layer count and
//! the widths that size the first allocations, so a config that disagrees with its weights
//! fails at once with both numbers instead of warning, allocating, or failing deep in a layer.

use models::hf::HfConfig;

use super::{CheckpointError, SafetensorsCheckpoint};

/// Checks `config` against `ckpt`'s tensor names and shapes (the header only; no data is read):
/// - the decoder layers stored (`model.layers.<i>.…`) are exactly `0..num_hidden_layers`;
/// - `model.embed_tokens.weight` holds `vocab_size x hidden_size` values;
/// - layer 0's q/k projections hold `hidden_size x heads x head_dim` values (any layout: HF rows,
///   pymllm's HWIO).
pub fn check_config(ckpt: &SafetensorsCheckpoint, config: &HfConfig) -> Result<(), CheckpointError> {
    let source = config.source.clone();
    let mismatch = |field: &str, reason: String| CheckpointError::ConfigMismatch {
        config: source.clone(),
        field: field.to_string(),
        checkpoint: ckpt.root().to_path_buf(),
        reason,
    };

    let mut layers = std::collections::BTreeSet::new();
    for key in ckpt.keys() {
        let Some(rest) = key.strip_prefix("model.layers.") else { continue };
        let index = rest.split('.').next().and_then(|i| i.parse::<usize>().ok());
        match index {
            Some(i) => {
                layers.insert(i);
            }
            None => return Err(mismatch("num_hidden_layers", format!("tensor '{key}' has no layer number"))),
        }
    }
    let expected = config.num_hidden_layers;
    if layers.len() != expected || layers.last().is_some_and(|&last| last + 1 != expected) {
        let stored = match (layers.first(), layers.last()) {
            (Some(first), Some(last)) => format!("{} layers (indices {first}..={last})", layers.len()),
            _ => "no decoder layers".to_string(),
        };
        return Err(mismatch("num_hidden_layers", format!("config says {expected}, the checkpoint stores {stored}")));
    }

    let numel = |key: &str| -> Result<Option<usize>, CheckpointError> {
        if !ckpt.contains(key) {
            return Ok(None);
        }
        let (_, shape) = ckpt.info(key)?;
        Ok(Some(shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d)).unwrap_or(usize::MAX)))
    };
    let (hidden, vocab) = (config.hidden_size, config.vocab_size);
    if let Some(n) = numel("model.embed_tokens.weight")? {
        if Some(n) != vocab.checked_mul(hidden) {
            return Err(mismatch(
                "vocab_size",
                format!(
                    "model.embed_tokens.weight has {n} values, config's vocab_size x hidden_size is {vocab} x {hidden}"
                ),
            ));
        }
    }
    let head_dim = config.head_dim;
    for (proj, heads, field) in [
        ("q_proj", config.num_attention_heads, "num_attention_heads"),
        ("k_proj", config.num_key_value_heads, "num_key_value_heads"),
    ] {
        let key = format!("model.layers.0.self_attn.{proj}.weight");
        if let Some(n) = numel(&key)? {
            let want = hidden.checked_mul(heads).and_then(|x| x.checked_mul(head_dim));
            if Some(n) != want {
                return Err(mismatch(
                    field,
                    format!("{key} has {n} values, config's hidden_size x {field} x head_dim is {hidden} x {heads} x {head_dim}"),
                ));
            }
        }
    }
    Ok(())
}

//! Per-layer attention settings and the MLP activation of an HF config.
//!
//! transformers spells "which layers attend through a sliding window" four ways:
//!
//! | config | sliding layers | families |
//! |---|---|---|
//! | `layer_types` (5.x writes it) | those listed as `"sliding_attention"` | Gemma 3, Qwen2/Qwen3 |
//! | `use_sliding_window` + `max_window_layers` (no `layer_types`) | layers `i >= max_window_layers`, when true | Qwen2, Qwen3 (4.x) |
//! | `sliding_window_pattern` `p` (no `layer_types`) | all but every `p`-th layer | Gemma 3 (4.x) |
//! | `sliding_window` alone | every layer, when it is not null | Mistral, Phi-3 |
//!
//! A sliding layer lets the token at position `q` attend position `k` only when
//! `q - k < sliding_window` (transformers' `sliding_window_overlay`).

use serde_json::Value;

use super::{describe, limits, ConfigError, Fields};

/// The MLP's gate activation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum HiddenAct {
    /// `x * sigmoid(x)` (Llama, Qwen, Mistral, Phi-3).
    #[default]
    Silu,
    /// GELU with the tanh approximation, `gelu_pytorch_tanh` (Gemma).
    GeluTanh,
}

/// Which layers attend through a sliding window, how wide it is, and the sliding layers' own RoPE
/// base when they have one.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct AttentionLayout {
    /// The window, `None` when no layer slides.
    pub sliding_window: Option<usize>,
    /// Per layer: whether it attends through the window (all false without a window).
    pub sliding_layers: Vec<bool>,
    /// Gemma 3: the sliding layers' RoPE base (`rope_parameters.sliding_attention.rope_theta`, or
    /// `rope_local_base_freq` in 4.x configs); `None` when they share the model's.
    pub sliding_rope_theta: Option<f64>,
}

impl AttentionLayout {
    /// Whether layer `layer` attends through the sliding window.
    pub fn is_sliding(&self, layer: usize) -> bool {
        self.sliding_layers.get(layer).copied().unwrap_or(false)
    }
}

/// `hidden_act` or `hidden_activation`: `silu`, or `gelu_pytorch_tanh` / `gelu_tanh`.
pub(super) fn hidden_act(fields: &Fields<'_>) -> Result<HiddenAct, ConfigError> {
    let (field, act) = match fields.opt_str("hidden_act")? {
        Some(act) => ("hidden_act", act),
        None => match fields.opt_str("hidden_activation")? {
            Some(act) => ("hidden_activation", act),
            None => return Ok(HiddenAct::Silu),
        },
    };
    match act {
        "silu" | "swish" => Ok(HiddenAct::Silu),
        "gelu_pytorch_tanh" | "gelu_tanh" => Ok(HiddenAct::GeluTanh),
        other => Err(fields
            .invalid(field, format!("'{other}' is not supported (the model files use silu or gelu_pytorch_tanh)"))),
    }
}

/// The sliding-window layout, from whichever spelling the config uses (module docs).
pub(super) fn attention_layout(fields: &Fields<'_>, num_layers: usize) -> Result<AttentionLayout, ConfigError> {
    if fields.opt_bool("use_bidirectional_attention")? == Some(true) {
        return Err(fields.invalid("use_bidirectional_attention", "true is not supported: the model files are causal"));
    }
    let window = match fields.opt_usize("sliding_window")? {
        Some(0) => return Err(fields.invalid("sliding_window", "must be at least 1")),
        Some(w) => Some(fields.bounded("sliding_window", w, limits::POSITIONS)?),
        None => None,
    };
    let sliding_layers = match fields.get("layer_types") {
        Some(Value::Array(types)) => {
            if types.len() != num_layers {
                return Err(fields.invalid(
                    "layer_types",
                    format!("lists {} layers but num_hidden_layers is {num_layers}", types.len()),
                ));
            }
            let mut sliding = Vec::with_capacity(num_layers);
            for (i, t) in types.iter().enumerate() {
                sliding.push(match t.as_str() {
                    Some("full_attention") => false,
                    Some("sliding_attention") => true,
                    _ => {
                        return Err(fields.invalid(
                            &format!("layer_types[{i}]"),
                            format!(
                                "{} is not supported: layers are \"full_attention\" or \"sliding_attention\"",
                                describe(t)
                            ),
                        ))
                    }
                });
            }
            sliding
        }
        Some(other) => return Err(fields.wrong_type("layer_types", "a list of layer types", other)),
        None => match fields.opt_bool("use_sliding_window")? {
            None if pattern(fields)?.is_some() => {
                // Gemma 3 (4.x configs): every `pattern`-th layer is global, the others slide.
                let p = pattern(fields)?.unwrap_or(1);
                (0..num_layers).map(|i| (i + 1) % p != 0).collect()
            }
            Some(use_window) => {
                // transformers' Qwen2 default for max_window_layers.
                let first = fields.opt_usize("max_window_layers")?.unwrap_or(28);
                (0..num_layers).map(|i| use_window && window.is_some() && i >= first).collect()
            }
            None => vec![window.is_some(); num_layers],
        },
    };
    let any = sliding_layers.iter().any(|&s| s);
    if any && window.is_none() {
        let why = "a layer attends through a sliding window (layer_types / use_sliding_window) but no window is given";
        return Err(fields.invalid("sliding_window", why));
    }
    // Qwen2.5 configs carry `"sliding_window": 131072` with `use_sliding_window: false`: no layer slides.
    let sliding_window = if any { window } else { None };
    Ok(AttentionLayout { sliding_window, sliding_layers, sliding_rope_theta: sliding_rope_theta(fields)? })
}

/// Gemma 3's `sliding_window_pattern` (`_sliding_window_pattern` in 5.x), at least 1.
fn pattern(fields: &Fields<'_>) -> Result<Option<usize>, ConfigError> {
    for key in ["sliding_window_pattern", "_sliding_window_pattern"] {
        match fields.opt_usize(key)? {
            Some(0) => return Err(fields.invalid(key, "must be at least 1")),
            Some(p) => return Ok(Some(p)),
            None => {}
        }
    }
    Ok(None)
}

/// The sliding layers' RoPE base when the config gives them their own (Gemma 3).
fn sliding_rope_theta(fields: &Fields<'_>) -> Result<Option<f64>, ConfigError> {
    let theta = match fields.opt_object("rope_parameters")?.and_then(|p| match p.get("sliding_attention") {
        Some(Value::Object(m)) => Some(m),
        _ => None,
    }) {
        Some(local) => {
            let nested = Fields { path: fields.path, prefix: "rope_parameters.sliding_attention".into(), map: local };
            match nested.opt_str("rope_type")? {
                None | Some("default") => {}
                Some(other) => {
                    return Err(nested
                        .invalid("rope_type", format!("'{other}' is not supported for the sliding layers (default)")))
                }
            }
            Some(("rope_parameters.sliding_attention.rope_theta", nested.req_f64("rope_theta")?))
        }
        None => fields.opt_f64("rope_local_base_freq")?.map(|t| ("rope_local_base_freq", t)),
    };
    match theta {
        Some((field, t)) if !(t > 0.0 && t.is_finite() && (t as f32).is_finite()) => Err(ConfigError::InvalidValue {
            path: fields.path.to_path_buf(),
            field: field.into(),
            reason: format!("{t:e} must be > 0 and finite as f32"),
        }),
        other => Ok(other.map(|(_, t)| t)),
    }
}

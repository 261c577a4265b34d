//! Hugging Face `config.json` (+ `generation_config.json`) of a decoder-only checkpoint.
//!
//! Real checkpoints are written by different transformers versions, so one model can be described in
//! two spellings:
//!
//! | what              | transformers 4.x                    | transformers 5.x                      |
//! |-------------------|-------------------------------------|---------------------------------------|
//! | RoPE base         | top-level `rope_theta`              | `rope_parameters.rope_theta`          |
//! | RoPE scaling      | `rope_scaling` (`rope_type`/`type`) | `rope_parameters` (`rope_type`)       |
//! | weight dtype      | `torch_dtype`                       | `dtype`                               |
//!
//! [`HfConfig`] accepts both and normalises them. Fields the runtime does not need are ignored,
//! while the ones it does need are checked here, so a bad file fails at load time with the file,
//! the field and what was expected, instead of as a shape mismatch deep inside a model.
//!
//! [`HfConfig::rope_inv_freq`] reproduces transformers' `_compute_default_rope_parameters` and
//! `_compute_llama3_parameters` operation by operation in `f32`, as torch evaluates them.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use serde_json::{Map, Value};

/// File name of the model configuration inside a checkpoint directory.
pub const CONFIG_FILE: &str = "config.json";
/// File name of the optional generation defaults inside a checkpoint directory.
pub const GENERATION_CONFIG_FILE: &str = "generation_config.json";

/// Why a configuration could not be read. Every variant names the file it came from.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Not a regular file (a FIFO, a device), over [`mllm_dsl::files::CONFIG_SIZE_LIMIT`], not UTF-8.
    #[error(transparent)]
    File(#[from] mllm_dsl::files::FileError),
    #[error("{path} is not valid JSON: {source}")]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("{path}: expected a JSON object at the top level, found {found}")]
    NotAnObject { path: PathBuf, found: String },
    #[error("{path}: missing required field `{field}`")]
    MissingField { path: PathBuf, field: String },
    #[error("{path}: field `{field}` must be {expected}, found {found}")]
    WrongType { path: PathBuf, field: String, expected: &'static str, found: String },
    #[error("{path}: field `{field}` is invalid: {reason}")]
    InvalidValue { path: PathBuf, field: String, reason: String },
    #[error("{path}: field `{field}` has unsupported rope type '{rope_type}' (supported: default, linear, llama3)")]
    UnsupportedRope { path: PathBuf, field: String, rope_type: String },
    #[error("unsupported model_type '{model_type}' (supported: {})", ModelType::supported())]
    UnsupportedModelType { model_type: String },
}

/// Architectures whose HF checkpoints this project can load.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ModelType {
    Qwen3,
    Qwen2,
    Llama,
}

impl ModelType {
    /// Every supported architecture, in the order errors list them.
    pub const ALL: [ModelType; 3] = [ModelType::Qwen3, ModelType::Qwen2, ModelType::Llama];

    /// The `model_type` string transformers writes for this architecture.
    pub fn as_str(self) -> &'static str {
        match self {
            ModelType::Qwen3 => "qwen3",
            ModelType::Qwen2 => "qwen2",
            ModelType::Llama => "llama",
        }
    }

    /// The supported `model_type` strings, comma-separated (for error messages).
    pub fn supported() -> String {
        ModelType::ALL.map(ModelType::as_str).join(", ")
    }

    /// Whether the family's q/k/v projections always carry biases, whatever `attention_bias`
    /// says: Qwen2's do although its `config.json` has no key saying so.
    pub fn always_qkv_bias(self) -> bool {
        matches!(self, ModelType::Qwen2)
    }
}

impl FromStr for ModelType {
    type Err = ConfigError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ModelType::ALL
            .into_iter()
            .find(|kind| kind.as_str() == s)
            .ok_or_else(|| ConfigError::UnsupportedModelType { model_type: s.to_string() })
    }
}

impl fmt::Display for ModelType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Storage dtype the checkpoint declares (`torch_dtype` in 4.x, `dtype` in 5.x).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CheckpointDtype {
    F32,
    BF16,
    F16,
}

impl CheckpointDtype {
    fn parse(name: &str) -> Option<Self> {
        // Very old configs wrote the torch repr ("torch.float32").
        match name.strip_prefix("torch.").unwrap_or(name) {
            "float32" | "float" => Some(CheckpointDtype::F32),
            "bfloat16" => Some(CheckpointDtype::BF16),
            "float16" | "half" => Some(CheckpointDtype::F16),
            _ => None,
        }
    }
}

/// Rotary position embedding frequency scheme.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RopeScaling {
    /// `inv_freq[i] = 1 / theta^(2i / head_dim)`.
    Default,
    /// Llama 3.1 smooth interpolation between scaled (low frequency) and unscaled (high frequency)
    /// bands.
    Llama3 { factor: f64, low_freq_factor: f64, high_freq_factor: f64, original_max_position_embeddings: usize },
    /// Position interpolation: every default frequency divided by `factor` (Gemma 3's global layers).
    Linear { factor: f64 },
}

/// Parsed, validated configuration of a Hugging Face decoder-only checkpoint.
#[derive(Debug, Clone, PartialEq)]
pub struct HfConfig {
    /// The `config.json` this was read from (used in later error messages).
    pub source: PathBuf,
    /// As written; see [`HfConfig::model_kind`] for the checked enum.
    pub model_type: String,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    /// Defaults to `num_attention_heads` (no grouped-query attention).
    pub num_key_value_heads: usize,
    /// From the file when present (Qwen3), else `hidden_size / num_attention_heads`.
    pub head_dim: usize,
    pub rms_norm_eps: f64,
    pub max_position_embeddings: usize,
    pub tie_word_embeddings: bool,
    /// The file's `attention_bias`; use [`HfConfig::qkv_bias`] to know whether q/k/v have biases.
    pub attention_bias: bool,
    pub mlp_bias: bool,
    pub bos_token_id: Option<u32>,
    /// From `config.json`, then any further ids from `generation_config.json`, without repeats.
    pub eos_token_ids: Vec<u32>,
    pub pad_token_id: Option<u32>,
    pub rope_theta: f64,
    pub rope_scaling: RopeScaling,
    pub dtype: Option<CheckpointDtype>,
    /// mllm's LPBQ block size along the input features of quantized linears.
    pub linear_block_size: Option<usize>,
    /// The MLP's activation (`hidden_act`, or Gemma's `hidden_activation`).
    pub hidden_act: HiddenAct,
    /// Which layers attend through a sliding window and how wide it is (see [`AttentionLayout`]).
    pub attention: AttentionLayout,
    /// Gemma 3: the attention scale is `query_pre_attn_scalar^-0.5` instead of `head_dim^-0.5`.
    pub query_pre_attn_scalar: Option<f64>,
    /// Gemma 2/3: logits become `cap * tanh(logits / cap)`.
    pub final_logit_softcapping: Option<f64>,
}

impl HfConfig {
    /// Reads `dir/config.json` and, when present, merges `dir/generation_config.json`.
    pub fn from_dir(dir: impl AsRef<Path>) -> Result<Self, ConfigError> {
        let dir = dir.as_ref();
        let config_path = dir.join(CONFIG_FILE);
        let text = read_text(&config_path)?;
        let mut config = Self::parse(&text, &config_path)?;
        let generation_path = dir.join(GENERATION_CONFIG_FILE);
        if generation_path.is_file() {
            let text = read_text(&generation_path)?;
            config.merge_generation_config(&text, &generation_path)?;
        }
        Ok(config)
    }

    /// Parses the text of a `config.json`; `path` is only used to name the file in errors.
    pub fn parse(text: &str, path: &Path) -> Result<Self, ConfigError> {
        let root = parse_object(text, path)?;
        let fields = Fields::top(path, &root);

        let model_type = fields.req_str("model_type")?.to_string();
        let vocab_size = fields.req_bounded("vocab_size", limits::VOCAB)?;
        let hidden_size = fields.req_bounded("hidden_size", limits::WIDTH)?;
        let intermediate_size = fields.req_bounded("intermediate_size", limits::WIDTH)?;
        let num_hidden_layers = fields.req_bounded("num_hidden_layers", limits::LAYERS)?;
        let num_attention_heads = fields.req_bounded("num_attention_heads", limits::HEADS)?;
        let num_key_value_heads = match fields.opt_usize("num_key_value_heads")? {
            None => num_attention_heads,
            Some(0) => return Err(fields.invalid("num_key_value_heads", "must be at least 1")),
            Some(n) => fields.bounded("num_key_value_heads", n, limits::HEADS)?,
        };
        if num_attention_heads % num_key_value_heads != 0 {
            return Err(fields.invalid(
                "num_key_value_heads",
                format!(
                    "{num_key_value_heads} does not divide num_attention_heads \
                     ({num_attention_heads}); each key/value head must serve a whole group"
                ),
            ));
        }
        let head_dim = match fields.opt_usize("head_dim")? {
            Some(0) => return Err(fields.invalid("head_dim", "must be at least 1")),
            Some(d) => fields.bounded("head_dim", d, limits::HEAD_DIM)?,
            None if hidden_size % num_attention_heads != 0 => {
                return Err(fields.invalid(
                    "hidden_size",
                    format!(
                        "{hidden_size} is not divisible by num_attention_heads \
                         ({num_attention_heads}) and no head_dim is given"
                    ),
                ))
            }
            None => fields.bounded("head_dim", hidden_size / num_attention_heads, limits::HEAD_DIM)?,
        };
        // The widest projection (q: heads * head_dim) must stay a sane width too.
        if num_attention_heads.checked_mul(head_dim).is_none_or(|w| w > limits::WIDTH) {
            return Err(fields.invalid(
                "head_dim",
                format!(
                    "num_attention_heads ({num_attention_heads}) x head_dim ({head_dim}) is over the {} limit",
                    limits::WIDTH
                ),
            ));
        }
        if head_dim % 2 != 0 {
            return Err(
                fields.invalid("head_dim", format!("{head_dim} is odd; rotary embeddings rotate pairs of features"))
            );
        }
        let rms_norm_eps = fields.req_f64("rms_norm_eps")?;
        fields.check_positive_f32("rms_norm_eps", rms_norm_eps)?;
        let max_position_embeddings = fields.req_bounded("max_position_embeddings", limits::POSITIONS)?;
        check_unsupported_features(&fields)?;
        let partial_rotary = fields.opt_f64("partial_rotary_factor")?;
        if partial_rotary.is_some_and(|f| f != 1.0) {
            return Err(fields.invalid("partial_rotary_factor", "only full rotary embeddings (1.0) are supported"));
        }

        let (rope_theta, rope_scaling) = parse_rope(&fields)?;
        let hidden_act = layers::hidden_act(&fields)?;
        let attention = layers::attention_layout(&fields, num_hidden_layers)?;
        let query_pre_attn_scalar = fields.opt_f64("query_pre_attn_scalar")?;
        if let Some(q) = query_pre_attn_scalar {
            fields.check_positive_f32("query_pre_attn_scalar", q)?;
        }
        let final_logit_softcapping = fields.opt_f64("final_logit_softcapping")?;
        if let Some(cap) = final_logit_softcapping {
            fields.check_positive_f32("final_logit_softcapping", cap)?;
        }

        let dtype = match fields.opt_str("dtype")? {
            Some(name) => Some(("dtype", name)),
            None => fields.opt_str("torch_dtype")?.map(|name| ("torch_dtype", name)),
        };
        let dtype = match dtype {
            None => None,
            Some((field, name)) => Some(CheckpointDtype::parse(name).ok_or_else(|| {
                fields.invalid(field, format!("unsupported dtype '{name}' (supported: float32, bfloat16, float16)"))
            })?),
        };

        let linear_block_size = match fields.opt_usize("linear_block_size")? {
            Some(0) => return Err(fields.invalid("linear_block_size", "must be at least 1")),
            other => other,
        };

        Ok(HfConfig {
            source: path.to_path_buf(),
            model_type,
            vocab_size,
            hidden_size,
            intermediate_size,
            num_hidden_layers,
            num_attention_heads,
            num_key_value_heads,
            head_dim,
            rms_norm_eps,
            max_position_embeddings,
            tie_word_embeddings: fields.opt_bool("tie_word_embeddings")?.unwrap_or(false),
            attention_bias: fields.opt_bool("attention_bias")?.unwrap_or(false),
            mlp_bias: fields.opt_bool("mlp_bias")?.unwrap_or(false),
            bos_token_id: fields.opt_token_id("bos_token_id")?,
            eos_token_ids: fields.token_ids("eos_token_id")?,
            pad_token_id: fields.opt_token_id("pad_token_id")?,
            rope_theta,
            rope_scaling,
            dtype,
            linear_block_size,
            hidden_act,
            attention,
            query_pre_attn_scalar,
            final_logit_softcapping,
        })
    }

    /// Merges the text of a `generation_config.json`: its `eos_token_id` ids are added to
    /// [`HfConfig::eos_token_ids`] (chat models list the end-of-turn token only there), and its
    /// `bos_token_id` / `pad_token_id` fill values `config.json` left out.
    pub fn merge_generation_config(&mut self, text: &str, path: &Path) -> Result<(), ConfigError> {
        let root = parse_object(text, path)?;
        let fields = Fields::top(path, &root);
        for id in fields.token_ids("eos_token_id")? {
            if !self.eos_token_ids.contains(&id) {
                self.eos_token_ids.push(id);
            }
        }
        if self.bos_token_id.is_none() {
            self.bos_token_id = fields.opt_token_id("bos_token_id")?;
        }
        if self.pad_token_id.is_none() {
            self.pad_token_id = fields.opt_token_id("pad_token_id")?;
        }
        Ok(())
    }

    /// The architecture, or an error naming the unsupported `model_type`.
    pub fn model_kind(&self) -> Result<ModelType, ConfigError> {
        self.model_type.parse()
    }

    /// Whether the q/k/v projections carry biases: the family's own rule
    /// ([`ModelType::always_qkv_bias`]), else `attention_bias`.
    pub fn qkv_bias(&self) -> bool {
        self.model_kind().is_ok_and(ModelType::always_qkv_bias) || self.attention_bias
    }

    /// RoPE inverse frequencies, `head_dim / 2` of them, as transformers computes them.
    ///
    /// torch evaluates `1.0 / (base ** (arange(0, dim, 2).float() / dim))` in `f32`; the power is
    /// taken here in `f64` and rounded once, which is the correctly rounded `f32` result (torch's
    /// vectorised `powf` is within one ulp of it). The llama3 adjustment repeats torch's `f32`
    /// operation order, including `scalar / tensor` being `tensor.reciprocal() * scalar`.
    pub fn rope_inv_freq(&self) -> Vec<f32> {
        let default = default_inv_freq(self.rope_theta, self.head_dim);
        match self.rope_scaling {
            RopeScaling::Default => default,
            RopeScaling::Linear { factor } => default.iter().map(|f| f / factor as f32).collect(),
            RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_max_position_embeddings } => {
                llama3_inv_freq(&default, factor, low_freq_factor, high_freq_factor, original_max_position_embeddings)
            }
        }
    }
}

/// HF's default RoPE inverse frequencies `1 / theta^(2i / dim)`, `dim / 2` of them, as
/// transformers computes them (see [`HfConfig::rope_inv_freq`]).
pub fn default_inv_freq(theta: f64, dim: usize) -> Vec<f32> {
    // torch casts the Python scalar base to the tensor dtype (f32) before the power.
    let base = f64::from(theta as f32);
    (0..dim)
        .step_by(2)
        .map(|i| {
            let exponent = i as f32 / dim as f32;
            let power = base.powf(f64::from(exponent)) as f32;
            1.0f32 / power
        })
        .collect()
}

fn llama3_inv_freq(
    inv_freq: &[f32],
    factor: f64,
    low_freq_factor: f64,
    high_freq_factor: f64,
    original_max_position_embeddings: usize,
) -> Vec<f32> {
    let old_context_len = original_max_position_embeddings as f64;
    // Python-side scalars are computed in f64, then cast to f32 when they meet the tensor.
    let low_freq_wavelen = (old_context_len / low_freq_factor) as f32;
    let high_freq_wavelen = (old_context_len / high_freq_factor) as f32;
    let two_pi = (2.0 * std::f64::consts::PI) as f32;
    let factor32 = factor as f32;
    let low32 = low_freq_factor as f32;
    let band32 = (high_freq_factor - low_freq_factor) as f32;
    let old32 = old_context_len as f32;

    inv_freq
        .iter()
        .map(|&freq| {
            let wavelen = (1.0f32 / freq) * two_pi;
            let scaled = if wavelen > low_freq_wavelen { freq / factor32 } else { freq };
            let smooth = ((1.0f32 / wavelen) * old32 - low32) / band32;
            let smoothed = (1.0f32 - smooth) * scaled / factor32 + smooth * scaled;
            // torch: ~(wavelen < high) * ~(wavelen > low); wavelen is never NaN here.
            let is_medium = wavelen >= high_freq_wavelen && wavelen <= low_freq_wavelen;
            if is_medium {
                smoothed
            } else {
                scaled
            }
        })
        .collect()
}

/// Reads `rope_theta` and the scaling scheme from either spelling (see the module docs).
fn parse_rope(fields: &Fields<'_>) -> Result<(f64, RopeScaling), ConfigError> {
    let top_theta = fields.opt_f64("rope_theta")?;
    let (scaling_field, scaling) = match fields.opt_object("rope_parameters")? {
        Some(map) => ("rope_parameters", Some(map)),
        None => ("rope_scaling", fields.opt_object("rope_scaling")?),
    };
    let Some(scaling) = scaling else {
        return Ok((top_theta.unwrap_or(DEFAULT_ROPE_THETA), RopeScaling::Default));
    };
    let nested = fields.nested(scaling_field, scaling);
    if scaling.get("rope_type").is_none()
        && scaling.get("type").is_none()
        && !scaling.is_empty()
        && scaling.values().all(Value::is_object)
    {
        // transformers 5.x hybrid models (Gemma 3) key rope_parameters by layer type: the full
        // attention layers' are the model's ([`HfConfig::sliding_rope_theta`] reads the others).
        let full = nested.opt_object("full_attention")?.ok_or_else(|| nested.missing("full_attention"))?;
        return rope_from(fields, &nested.nested("full_attention", full), top_theta);
    }
    rope_from(fields, &nested, top_theta)
}

/// The RoPE base and scheme of one `rope_parameters` / `rope_scaling` object.
fn rope_from(
    fields: &Fields<'_>,
    nested: &Fields<'_>,
    top_theta: Option<f64>,
) -> Result<(f64, RopeScaling), ConfigError> {
    let rope_type = match nested.opt_str("rope_type")? {
        Some(t) => Some(("rope_type", t)),
        None => nested.opt_str("type")?.map(|t| ("type", t)),
    };
    let partial = nested.opt_f64("partial_rotary_factor")?;
    if partial.is_some_and(|f| f != 1.0) {
        return Err(nested.invalid("partial_rotary_factor", "only full rotary embeddings (1.0) are supported"));
    }
    let theta = nested.opt_f64("rope_theta")?.or(top_theta).unwrap_or(DEFAULT_ROPE_THETA);
    let theta_field =
        if nested.opt_f64("rope_theta")?.is_some() { nested.name("rope_theta") } else { "rope_theta".into() };
    if !is_positive(theta) || !is_positive(f64::from(theta as f32)) {
        return Err(ConfigError::InvalidValue {
            path: fields.path.to_path_buf(),
            field: theta_field,
            reason: format!("{theta:e} must be > 0 and finite as f32 (at most {:e})", f32::MAX),
        });
    }

    let scheme = match rope_type {
        None | Some((_, "default")) => RopeScaling::Default,
        Some((_, "linear")) => {
            let factor = nested.req_f64("factor")?;
            nested.check_positive_f32("factor", factor)?;
            RopeScaling::Linear { factor }
        }
        Some((_, "llama3")) => {
            let factor = nested.req_f64("factor")?;
            let low_freq_factor = nested.req_f64("low_freq_factor")?;
            let high_freq_factor = nested.req_f64("high_freq_factor")?;
            let original_max_position_embeddings =
                nested.req_bounded("original_max_position_embeddings", limits::POSITIONS)?;
            nested.check_positive_f32("factor", factor)?;
            nested.check_positive_f32("low_freq_factor", low_freq_factor)?;
            nested.check_positive_f32("high_freq_factor", high_freq_factor)?;
            if high_freq_factor <= low_freq_factor || !high_freq_factor.is_finite() {
                return Err(nested.invalid(
                    "high_freq_factor",
                    format!("{high_freq_factor} must be greater than low_freq_factor ({low_freq_factor})"),
                ));
            }
            RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_max_position_embeddings }
        }
        Some((key, other)) => {
            return Err(ConfigError::UnsupportedRope {
                path: fields.path.to_path_buf(),
                field: nested.name(key),
                rope_type: other.to_string(),
            })
        }
    };
    Ok((theta, scheme))
}

/// Upper bounds on sizes read from a config: far above any released model, far below what
/// would make a bad file allocate terabytes before its checkpoint is even looked at.
pub mod limits {
    /// `num_hidden_layers` (released models: up to ~130).
    pub const LAYERS: usize = 4096;
    /// `hidden_size`, `intermediate_size`, and `num_attention_heads * head_dim`.
    pub const WIDTH: usize = 1 << 20;
    /// `vocab_size` (released models: up to ~260k).
    pub const VOCAB: usize = 1 << 24;
    /// `num_attention_heads`, `num_key_value_heads`.
    pub const HEADS: usize = 1 << 12;
    /// `head_dim` (released models: 64 to 256).
    pub const HEAD_DIM: usize = 1 << 12;
    /// `max_position_embeddings` and any context length or position count asked for.
    pub const POSITIONS: usize = 1 << 24;
}

/// Config features the model files do not implement: an error, never silently ignored.
fn check_unsupported_features(fields: &Fields<'_>) -> Result<(), ConfigError> {
    if fields.opt_bool("mlp_bias")? == Some(true) {
        return Err(fields.invalid("mlp_bias", "true is not supported: the model files have no bias on the MLP"));
    }
    Ok(())
}

/// A usable positive scale (JSON numbers are never NaN, but may be zero, negative or huge).
fn is_positive(x: f64) -> bool {
    x > 0.0 && x.is_finite()
}

/// transformers' default when a config has no `rope_theta` at all.
const DEFAULT_ROPE_THETA: f64 = 10_000.0;

fn read_text(path: &Path) -> Result<String, ConfigError> {
    mllm_dsl::files::read_text_bounded(path, mllm_dsl::files::CONFIG_SIZE_LIMIT).map_err(|e| match e {
        mllm_dsl::files::FileError::Io { source, .. } => ConfigError::Io { path: path.to_path_buf(), source },
        other => ConfigError::File(other),
    })
}

fn parse_object(text: &str, path: &Path) -> Result<Map<String, Value>, ConfigError> {
    match serde_json::from_str::<Value>(text) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(other) => Err(ConfigError::NotAnObject { path: path.to_path_buf(), found: describe(&other) }),
        Err(source) => Err(ConfigError::Json { path: path.to_path_buf(), source }),
    }
}

/// Short description of a JSON value for "found ..." in error messages.
fn describe(value: &Value) -> String {
    match value {
        Value::Null => "null".into(),
        Value::Bool(b) => format!("boolean {b}"),
        Value::Number(n) => format!("number {n}"),
        Value::String(s) => format!("string \"{s}\""),
        Value::Array(_) => "an array".into(),
        Value::Object(_) => "an object".into(),
    }
}

/// Typed access to one JSON object, producing errors that name the file and the dotted field.
struct Fields<'a> {
    path: &'a Path,
    /// Dotted name of this object inside the file ("" for the top level).
    prefix: String,
    map: &'a Map<String, Value>,
}

impl<'a> Fields<'a> {
    fn top(path: &'a Path, map: &'a Map<String, Value>) -> Self {
        Fields { path, prefix: String::new(), map }
    }

    fn nested(&self, key: &str, map: &'a Map<String, Value>) -> Fields<'a> {
        Fields { path: self.path, prefix: self.name(key), map }
    }

    fn name(&self, key: &str) -> String {
        if self.prefix.is_empty() {
            key.to_string()
        } else {
            format!("{}.{key}", self.prefix)
        }
    }

    /// A present, non-null value. HF writes `null` for "not set", so null counts as absent.
    fn get(&self, key: &str) -> Option<&'a Value> {
        self.map.get(key).filter(|v| !v.is_null())
    }

    fn missing(&self, key: &str) -> ConfigError {
        ConfigError::MissingField { path: self.path.to_path_buf(), field: self.name(key) }
    }

    fn wrong_type(&self, key: &str, expected: &'static str, found: &Value) -> ConfigError {
        ConfigError::WrongType {
            path: self.path.to_path_buf(),
            field: self.name(key),
            expected,
            found: describe(found),
        }
    }

    fn invalid(&self, key: &str, reason: impl Into<String>) -> ConfigError {
        ConfigError::InvalidValue { path: self.path.to_path_buf(), field: self.name(key), reason: reason.into() }
    }

    fn opt_usize(&self, key: &str) -> Result<Option<usize>, ConfigError> {
        const EXPECTED: &str = "a non-negative integer";
        let Some(value) = self.get(key) else {
            return Ok(None);
        };
        let Value::Number(n) = value else {
            return Err(self.wrong_type(key, EXPECTED, value));
        };
        if let Some(u) = n.as_u64() {
            return usize::try_from(u).map(Some).map_err(|_| self.wrong_type(key, EXPECTED, value));
        }
        // Some exporters write integers as floats (8192.0); accept them when exact.
        match n.as_f64() {
            Some(f) if f >= 0.0 && f.fract() == 0.0 && f < usize::MAX as f64 => Ok(Some(f as usize)),
            _ => Err(self.wrong_type(key, EXPECTED, value)),
        }
    }

    /// A required size in `1..=limit`.
    fn req_bounded(&self, key: &str, limit: usize) -> Result<usize, ConfigError> {
        let n = self.req_positive(key)?;
        self.bounded(key, n, limit)
    }

    fn bounded(&self, key: &str, n: usize, limit: usize) -> Result<usize, ConfigError> {
        if n > limit {
            return Err(self.invalid(key, format!("{n} is over the limit of {limit}")));
        }
        Ok(n)
    }

    /// A float parameter the runtime uses as f32: positive, and positive and finite once
    /// rounded to f32 (1e300 would be inf, 1e-50 would be 0).
    fn check_positive_f32(&self, key: &str, value: f64) -> Result<(), ConfigError> {
        let as_f32 = value as f32;
        if !is_positive(value) || !as_f32.is_finite() || as_f32 < f32::MIN_POSITIVE {
            return Err(self.invalid(
                key,
                format!(
                    "{value} must be > 0 and a finite, non-zero f32 (between {:e} and {:e})",
                    f32::MIN_POSITIVE,
                    f32::MAX
                ),
            ));
        }
        Ok(())
    }

    fn req_positive(&self, key: &str) -> Result<usize, ConfigError> {
        match self.opt_usize(key)? {
            None => Err(self.missing(key)),
            Some(0) => Err(self.invalid(key, "must be at least 1, found 0")),
            Some(n) => Ok(n),
        }
    }

    fn opt_f64(&self, key: &str) -> Result<Option<f64>, ConfigError> {
        match self.get(key) {
            None => Ok(None),
            Some(value) => value.as_f64().map(Some).ok_or_else(|| self.wrong_type(key, "a number", value)),
        }
    }

    fn req_f64(&self, key: &str) -> Result<f64, ConfigError> {
        self.opt_f64(key)?.ok_or_else(|| self.missing(key))
    }

    fn opt_bool(&self, key: &str) -> Result<Option<bool>, ConfigError> {
        match self.get(key) {
            None => Ok(None),
            Some(value) => value.as_bool().map(Some).ok_or_else(|| self.wrong_type(key, "true or false", value)),
        }
    }

    fn opt_str(&self, key: &str) -> Result<Option<&'a str>, ConfigError> {
        match self.get(key) {
            None => Ok(None),
            Some(value) => value.as_str().map(Some).ok_or_else(|| self.wrong_type(key, "a string", value)),
        }
    }

    fn req_str(&self, key: &str) -> Result<&'a str, ConfigError> {
        self.opt_str(key)?.ok_or_else(|| self.missing(key))
    }

    fn opt_object(&self, key: &str) -> Result<Option<&'a Map<String, Value>>, ConfigError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Object(map)) => Ok(Some(map)),
            Some(value) => Err(self.wrong_type(key, "an object", value)),
        }
    }

    fn token_id(&self, key: &str, value: &Value) -> Result<u32, ConfigError> {
        value
            .as_u64()
            .and_then(|id| u32::try_from(id).ok())
            .ok_or_else(|| self.wrong_type(key, "a token id (integer in 0..2^32)", value))
    }

    fn opt_token_id(&self, key: &str) -> Result<Option<u32>, ConfigError> {
        self.get(key).map(|v| self.token_id(key, v)).transpose()
    }

    /// A token id or a list of them (HF allows both for `eos_token_id`).
    fn token_ids(&self, key: &str) -> Result<Vec<u32>, ConfigError> {
        match self.get(key) {
            None => Ok(Vec::new()),
            Some(Value::Array(items)) => {
                let mut ids = Vec::with_capacity(items.len());
                for item in items {
                    let id = self.token_id(key, item)?;
                    if !ids.contains(&id) {
                        ids.push(id);
                    }
                }
                Ok(ids)
            }
            Some(value) => Ok(vec![self.token_id(key, value)?]),
        }
    }
}

mod layers;
pub use layers::{AttentionLayout, HiddenAct};

#[cfg(test)]
mod tests;

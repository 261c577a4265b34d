//! mllm's QNN AOT config (`qnn_aot_cfg_*.json`): target SoC, which graphs run on QNN, and the
//! quantization recipe.
//!
//! The format is mllm's, so the same file drives both compilers. Parsing is strict: unknown
//! fields, wrong types and settings this compiler cannot honour are errors naming the JSON field
//! path. What mllm parses but never reads is still parsed and kept:
//! - `quant_recipe.builtin_llm_pass.{model, lm_head, kv_cache}` are never read by mllm; the lm_head
//!   is quantized with the `linear` recipe ([`AotConfig::warnings`] says so when they differ);
//! - the `kv_cache` recipe must describe what the runtime does (per-tensor, sym, w8a8).
//!
//! `linear` maps regular expressions over op names to recipes, plus a required `fallback`. mllm
//! reads the object into an `nlohmann::json`, whose keys iterate in byte-wise sorted order, and
//! takes the first pattern that matches the whole op name; [`RecipeTable::resolve`] does the same,
//! so a config resolves to the same recipes in both compilers.

use std::fmt;
use std::path::{Path, PathBuf};

use regex::Regex;
use serde_json::{json, Map, Value};

/// Why an AOT config was rejected.
#[derive(Debug, thiserror::Error)]
pub enum AotConfigError {
    #[error("cannot read AOT config `{path}`: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Not a regular file (a FIFO, a device), over [`mllm_dsl::files::CONFIG_SIZE_LIMIT`], not UTF-8.
    #[error("cannot read AOT config: {0}")]
    File(#[from] mllm_dsl::files::FileError),
    #[error("AOT config is not valid JSON: {0}")]
    Syntax(#[source] serde_json::Error),
    #[error("AOT config field `{field}`: {problem}")]
    Field { field: String, problem: String },
    #[error("AOT config `{path}`: {source}")]
    InFile {
        path: PathBuf,
        #[source]
        source: Box<AotConfigError>,
    },
    #[error("HF config.json `linear_block_size` must be greater than 0")]
    HfBlockSizeZero,
    #[error(
        "linear `{op}`: AOT config `{field}` is {aot} but HF config.json `linear_block_size` is {hf}; \
         the two must agree"
    )]
    BlockSizeMismatch { op: String, field: String, aot: usize, hf: usize },
    #[error(
        "linear `{op}`: block size {block_size} (from `{field}`) does not divide its input width \
         {in_features}"
    )]
    BlockSizeDoesNotDivide { op: String, field: String, block_size: usize, in_features: usize },
}

fn field_error(field: impl Into<String>, problem: impl Into<String>) -> AotConfigError {
    AotConfigError::Field { field: field.into(), problem: problem.into() }
}

/// Defines a closed set of JSON strings as an enum with parsing that lists the allowed names.
macro_rules! string_enum {
    ($(#[$meta:meta])* $name:ident { $($variant:ident => $text:literal),+ $(,)? }) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub enum $name { $($variant),+ }

        impl $name {
            /// Every accepted spelling, in declaration order.
            pub const NAMES: &'static [&'static str] = &[$($text),+];

            /// Every variant, in declaration order.
            pub const ALL: &'static [Self] = &[$($name::$variant),+];

            /// The spelling used in the JSON.
            pub const fn as_str(self) -> &'static str {
                match self { $($name::$variant => $text),+ }
            }

            fn parse(text: &str) -> Option<Self> {
                match text { $($text => Some($name::$variant),)+ _ => None }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

string_enum!(
    /// Hexagon tensor processor generation (`htp_arch`), ordered oldest first.
    HtpArch { V68 => "V68", V69 => "V69", V73 => "V73", V75 => "V75", V79 => "V79", V81 => "V81", V85 => "V85" }
);

impl HtpArch {
    /// The `QnnHtpDevice_Arch_t` value (68 for V68, ...).
    pub const fn raw(self) -> u32 {
        match self {
            HtpArch::V68 => 68,
            HtpArch::V69 => 69,
            HtpArch::V73 => 73,
            HtpArch::V75 => 75,
            HtpArch::V79 => 79,
            HtpArch::V81 => 81,
            HtpArch::V85 => 85,
        }
    }
}

string_enum!(
    /// Snapdragon SoC (`htp_chipset`): the SoCs whose QNN `socModel` id is public.
    HtpChipset {
        Sm8350 => "SM8350", Sm8450 => "SM8450", Sa8295 => "SA8295", Sm8475 => "SM8475",
        Sm8550 => "SM8550", Sm8650 => "SM8650", Sm8750 => "SM8750", Sm8850 => "SM8850",
        Qcm6490 => "QCM6490", Qcs6490 => "QCS6490", Sm8845 => "SM8845",
    }
);

/// A Snapdragon SoC with its QNN `socModel` id, HTP arch and VTCM size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Chipset {
    pub name: &'static str,
    pub soc_model: u32,
    pub arch: HtpArch,
    /// VTCM in MB when a public table records it.
    pub vtcm_mb: Option<u32>,
}

impl HtpChipset {
    /// The SoC's facts: executorch `serialization/qc_schema.py` and mllm's
    /// chipset enum (SM8845 = 97, v81; its VTCM size is not recorded publicly, so the JSON value
    /// is trusted). The one table of SoCs in the project.
    pub const fn soc(self) -> Chipset {
        let (soc_model, arch, vtcm_mb) = match self {
            HtpChipset::Sm8350 => (30, HtpArch::V68, Some(4)),
            HtpChipset::Sm8450 => (36, HtpArch::V69, Some(8)),
            HtpChipset::Sa8295 => (39, HtpArch::V68, Some(8)),
            HtpChipset::Sm8475 => (42, HtpArch::V69, Some(8)),
            HtpChipset::Sm8550 => (43, HtpArch::V73, Some(8)),
            HtpChipset::Sm8650 => (57, HtpArch::V75, Some(8)),
            HtpChipset::Sm8750 => (69, HtpArch::V79, Some(8)),
            HtpChipset::Sm8850 => (87, HtpArch::V81, Some(8)),
            HtpChipset::Qcm6490 => (93, HtpArch::V68, Some(2)),
            // mllm spells this SoC QCS6490; same socModel.
            HtpChipset::Qcs6490 => (93, HtpArch::V68, Some(2)),
            HtpChipset::Sm8845 => (97, HtpArch::V81, None),
        };
        Chipset { name: self.as_str(), soc_model, arch, vtcm_mb }
    }
}

string_enum!(
    /// HTP performance mode (`htp_try_best_performance`).
    HtpPerformance {
        Default => "HtpDefault", SustainedHighPerformance => "HtpSustainedHighPerformance",
        Burst => "HtpBurst", HighPerformance => "HtpHighPerformance", PowerSaver => "HtpPowerSaver",
        LowPowerSaver => "HtpLowPowerSaver", HighPowerSaver => "HtpHighPowerSaver",
        LowBalanced => "HtpLowBalanced", Balanced => "HtpBalanced",
    }
);

string_enum!(
    /// Protection domain of the HTP session (`htp_security_pd_session`).
    HtpPdSession { Unsigned => "HtpUnsignedPd", Signed => "HtpSignedPd" }
);

string_enum!(
    /// Weight/tensor quantization method of a recipe.
    QuantMethod { Lpbq => "LPBQ", PerChannel => "per-channel", PerTensor => "per-tensor" }
);

string_enum!(
    /// Weight and activation bit widths of a recipe.
    Precision { W4A16 => "w4a16", W8A16 => "w8a16", W8A8 => "w8a8" }
);

/// `target_machine`: the device the context binary is compiled for.
#[derive(Clone, Debug, PartialEq)]
pub struct TargetMachine {
    pub htp_arch: HtpArch,
    pub htp_chipset: HtpChipset,
    pub htp_try_best_performance: HtpPerformance,
    pub htp_security_pd_session: HtpPdSession,
    pub htp_vtcm_capability_in_mb: u32,
}

impl TargetMachine {
    /// The arch must be the chipset's, and the VTCM size at most the chipset's (when recorded).
    fn check(&self) -> Result<(), AotConfigError> {
        let soc = self.htp_chipset.soc();
        if soc.arch != self.htp_arch {
            return Err(field_error(
                "target_machine.htp_arch",
                format!("{} does not match htp_chipset {}, which is {}", self.htp_arch, soc.name, soc.arch),
            ));
        }
        let vtcm = self.htp_vtcm_capability_in_mb;
        if let Some(max) = soc.vtcm_mb.filter(|&max| vtcm > max) {
            return Err(field_error(
                "target_machine.htp_vtcm_capability_in_mb",
                format!("{vtcm} MB exceeds the {max} MB VTCM of {}", soc.name),
            ));
        }
        Ok(())
    }
}

/// One quantization recipe (`{"method", "sym", "precision", "block_size"?}`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Recipe {
    pub method: QuantMethod,
    pub sym: bool,
    pub precision: Precision,
    /// Present exactly when `method` is LPBQ; always greater than 0.
    pub block_size: Option<usize>,
}

impl Recipe {
    /// Symmetric LPBQ w4a16 with the given block size: the only linear recipe mllm lowers.
    pub fn lpbq_w4a16(block_size: usize) -> Self {
        Recipe { method: QuantMethod::Lpbq, sym: true, precision: Precision::W4A16, block_size: Some(block_size) }
    }

    /// Per-tensor symmetric w8a8: the KV cache recipe.
    pub fn per_tensor_w8a8() -> Self {
        Recipe { method: QuantMethod::PerTensor, sym: true, precision: Precision::W8A8, block_size: None }
    }

    fn to_json(&self) -> Value {
        let mut m = Map::new();
        m.insert("method".into(), json!(self.method.as_str()));
        m.insert("sym".into(), json!(self.sym));
        m.insert("precision".into(), json!(self.precision.as_str()));
        if let Some(bs) = self.block_size {
            m.insert("block_size".into(), json!(bs));
        }
        Value::Object(m)
    }
}

/// A recipe under a regular-expression key.
#[derive(Clone, Debug)]
pub struct PatternRecipe {
    /// The key as written in the JSON.
    pub pattern: String,
    /// `pattern` anchored at both ends (mllm uses `std::regex_match`, a whole-string match).
    regex: Regex,
    pub recipe: Recipe,
}

impl PartialEq for PatternRecipe {
    fn eq(&self, other: &Self) -> bool {
        self.pattern == other.pattern && self.recipe == other.recipe
    }
}

impl PatternRecipe {
    /// Whether the pattern matches the whole `op_name`.
    pub fn matches(&self, op_name: &str) -> bool {
        self.regex.is_match(op_name)
    }
}

/// `lm_head` / `linear`: a `fallback` plus pattern-keyed overrides.
#[derive(Clone, Debug, PartialEq)]
pub struct RecipeTable {
    /// Field path of this table in the JSON, for messages.
    path: String,
    pub fallback: Recipe,
    /// Sorted byte-wise by pattern, the order mllm tries them in.
    pub patterns: Vec<PatternRecipe>,
}

/// The recipe an op resolves to and the JSON field it came from.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ResolvedRecipe<'a> {
    pub recipe: &'a Recipe,
    pub field: &'a str,
}

impl RecipeTable {
    fn new(path: &str, fallback: Recipe, mut patterns: Vec<PatternRecipe>) -> Self {
        patterns.sort_by(|a, b| a.pattern.cmp(&b.pattern));
        RecipeTable { path: path.to_string(), fallback, patterns }
    }

    /// The first pattern (in sorted order) matching the whole op name, else `fallback`.
    pub fn resolve(&self, op_name: &str) -> &Recipe {
        self.patterns.iter().find(|p| p.matches(op_name)).map_or(&self.fallback, |p| &p.recipe)
    }

    /// Field path of the recipe [`resolve`](Self::resolve) picks, e.g.
    /// `quant_recipe.builtin_llm_pass.linear.fallback`.
    pub fn resolve_field(&self, op_name: &str) -> String {
        match self.patterns.iter().find(|p| p.matches(op_name)) {
            Some(p) => key_path(&self.path, &p.pattern),
            None => format!("{}.fallback", self.path),
        }
    }

    fn to_json(&self) -> Value {
        let mut m = Map::new();
        m.insert("fallback".into(), self.fallback.to_json());
        for p in &self.patterns {
            m.insert(p.pattern.clone(), p.recipe.to_json());
        }
        Value::Object(m)
    }
}

/// `kv_cache`: recipes of the key and value caches.
#[derive(Clone, Debug, PartialEq)]
pub struct KvCacheRecipe {
    pub key: Recipe,
    pub value: Recipe,
}

/// `quant_recipe.builtin_llm_pass`.
#[derive(Clone, Debug, PartialEq)]
pub struct BuiltinLlmPass {
    pub model: String,
    pub lm_head: RecipeTable,
    pub linear: RecipeTable,
    pub kv_cache: KvCacheRecipe,
}

/// `quant_recipe`.
#[derive(Clone, Debug, PartialEq)]
pub struct QuantRecipe {
    pub llm_recipe: bool,
    /// Number of decoder layers.
    pub layers: u32,
    pub builtin_llm_pass: BuiltinLlmPass,
}

/// A parsed and validated AOT config.
#[derive(Clone, Debug, PartialEq)]
pub struct AotConfig {
    pub target_machine: TargetMachine,
    /// Subgraphs lowered to QNN (e.g. `["model"]`).
    pub graph_on_qnn: Vec<String>,
    /// Top-level ops lowered to QNN (e.g. `["lm_head"]`).
    pub op_on_qnn: Vec<String>,
    /// Always 1 (mllm supports no other split).
    pub split_graph: u32,
    pub quant_recipe: QuantRecipe,
}

const TOP_FIELDS: &[&str] = &["target_machine", "graph_on_qnn", "op_on_qnn", "split_graph", "quant_recipe"];
const TARGET_FIELDS: &[&str] =
    &["htp_arch", "htp_chipset", "htp_try_best_performance", "htp_security_pd_session", "htp_vtcm_capability_in_mb"];
const RECIPE_FIELDS: &[&str] = &["method", "sym", "precision", "block_size"];
const QUANT_RECIPE_FIELDS: &[&str] = &["llm_recipe", "layers", "builtin_llm_pass"];
const BUILTIN_FIELDS: &[&str] = &["model", "lm_head", "linear", "kv_cache"];
const KV_FIELDS: &[&str] = &["key", "value"];

impl AotConfig {
    /// Reads and validates a config file; errors carry the file path.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, AotConfigError> {
        let path = path.as_ref();
        let text = mllm_dsl::files::read_text_bounded(path, mllm_dsl::files::CONFIG_SIZE_LIMIT)?;
        Self::from_json_str(&text).map_err(|e| AotConfigError::InFile { path: path.to_path_buf(), source: Box::new(e) })
    }

    pub fn from_json_str(text: &str) -> Result<Self, AotConfigError> {
        let value: Value = serde_json::from_str(text).map_err(AotConfigError::Syntax)?;
        Self::from_json(&value)
    }

    /// Validates an already parsed JSON document.
    pub fn from_json(value: &Value) -> Result<Self, AotConfigError> {
        let top = Obj::new(value, "", TOP_FIELDS)?;

        let tm = Obj::new(top.get("target_machine")?, "target_machine", TARGET_FIELDS)?;
        let vtcm_field = tm.path("htp_vtcm_capability_in_mb");
        let vtcm = as_u32(tm.get("htp_vtcm_capability_in_mb")?, &vtcm_field)?;
        if vtcm == 0 {
            return Err(field_error(vtcm_field, "expected a VTCM size in MB greater than 0, found 0"));
        }
        let target_machine = TargetMachine {
            htp_arch: tm.enum_field("htp_arch", HtpArch::NAMES, HtpArch::parse)?,
            htp_chipset: tm.enum_field("htp_chipset", HtpChipset::NAMES, HtpChipset::parse)?,
            htp_try_best_performance: tm.enum_field(
                "htp_try_best_performance",
                HtpPerformance::NAMES,
                HtpPerformance::parse,
            )?,
            htp_security_pd_session: tm.enum_field(
                "htp_security_pd_session",
                HtpPdSession::NAMES,
                HtpPdSession::parse,
            )?,
            htp_vtcm_capability_in_mb: vtcm,
        };
        target_machine.check()?;

        let graph_on_qnn = as_string_list(top.get("graph_on_qnn")?, "graph_on_qnn")?;
        if graph_on_qnn.is_empty() {
            return Err(field_error(
                "graph_on_qnn",
                "expected at least one subgraph name (e.g. [\"model\"]), found []",
            ));
        }
        let op_on_qnn = as_string_list(top.get("op_on_qnn")?, "op_on_qnn")?;
        let split_graph = as_u32(top.get("split_graph")?, "split_graph")?;
        if split_graph == 0 {
            return Err(field_error(
                "split_graph",
                "expected at least 1 (the number of context binaries the decoder layers are cut into), found 0"
                    .to_string(),
            ));
        }

        let qr = Obj::new(top.get("quant_recipe")?, "quant_recipe", QUANT_RECIPE_FIELDS)?;
        let llm_recipe = as_bool(qr.get("llm_recipe")?, &qr.path("llm_recipe"))?;
        if !llm_recipe {
            return Err(field_error(
                qr.path("llm_recipe"),
                "expected true (the AOT pipeline only runs the LLM recipe), found false",
            ));
        }
        let layers = as_u32(qr.get("layers")?, &qr.path("layers"))?;
        if layers == 0 {
            return Err(field_error(qr.path("layers"), "expected a layer count greater than 0, found 0"));
        }
        let builtin = Obj::new(qr.get("builtin_llm_pass")?, &qr.path("builtin_llm_pass"), BUILTIN_FIELDS)?;
        let model = as_str(builtin.get("model")?, &builtin.path("model"))?.to_string();
        let lm_head = parse_table(builtin.get("lm_head")?, &builtin.path("lm_head"))?;
        let linear = parse_table(builtin.get("linear")?, &builtin.path("linear"))?;
        check_linear_table(&linear)?;
        let kv = Obj::new(builtin.get("kv_cache")?, &builtin.path("kv_cache"), KV_FIELDS)?;
        let kv_cache = KvCacheRecipe {
            key: parse_kv_recipe(kv.get("key")?, &kv.path("key"))?,
            value: parse_kv_recipe(kv.get("value")?, &kv.path("value"))?,
        };

        Ok(AotConfig {
            target_machine,
            graph_on_qnn,
            op_on_qnn,
            split_graph,
            quant_recipe: QuantRecipe {
                llm_recipe,
                layers,
                builtin_llm_pass: BuiltinLlmPass { model, lm_head, linear, kv_cache },
            },
        })
    }

    /// The built-in W4A16KV8 config: mllm's `qnn_aot_cfg_1.7B.json` (Qwen3-1.7B on SM8650 / V75,
    /// LPBQ w4a16 with block size 16, 28 layers, u8 KV cache).
    pub fn w4a16_kv8() -> Self {
        let target_machine = TargetMachine {
            htp_arch: HtpArch::V75,
            htp_chipset: HtpChipset::Sm8650,
            htp_try_best_performance: HtpPerformance::Burst,
            htp_security_pd_session: HtpPdSession::Signed,
            htp_vtcm_capability_in_mb: 8,
        };
        let linear_path = "quant_recipe.builtin_llm_pass.linear";
        let lm_head_path = "quant_recipe.builtin_llm_pass.lm_head";
        AotConfig {
            target_machine,
            graph_on_qnn: vec!["model".into()],
            op_on_qnn: vec!["lm_head".into()],
            split_graph: 1,
            quant_recipe: QuantRecipe {
                llm_recipe: true,
                layers: 28,
                builtin_llm_pass: BuiltinLlmPass {
                    model: "qwen3".into(),
                    lm_head: RecipeTable::new(lm_head_path, Recipe::lpbq_w4a16(16), vec![]),
                    linear: RecipeTable::new(linear_path, Recipe::lpbq_w4a16(16), vec![]),
                    kv_cache: KvCacheRecipe { key: Recipe::per_tensor_w8a8(), value: Recipe::per_tensor_w8a8() },
                },
            },
        }
    }

    /// The config as mllm's JSON (keys of objects in sorted order).
    pub fn to_json(&self) -> Value {
        let b = &self.quant_recipe.builtin_llm_pass;
        json!({
            "target_machine": target_machine_to_json(&self.target_machine),
            "graph_on_qnn": self.graph_on_qnn,
            "op_on_qnn": self.op_on_qnn,
            "split_graph": self.split_graph,
            "quant_recipe": {
                "llm_recipe": self.quant_recipe.llm_recipe,
                "layers": self.quant_recipe.layers,
                "builtin_llm_pass": {
                    "model": b.model,
                    "lm_head": b.lm_head.to_json(),
                    "linear": b.linear.to_json(),
                    "kv_cache": { "key": b.kv_cache.key.to_json(), "value": b.kv_cache.value.to_json() },
                },
            },
        })
    }

    /// The recipe of a linear (Conv2D) op; always symmetric LPBQ w4a16 after validation.
    pub fn linear_recipe(&self, op_name: &str) -> &Recipe {
        self.quant_recipe.builtin_llm_pass.linear.resolve(op_name)
    }

    /// The LPBQ block size of a linear op and the JSON field it comes from.
    pub fn linear_block_size(&self, op_name: &str) -> Result<(usize, String), AotConfigError> {
        let table = &self.quant_recipe.builtin_llm_pass.linear;
        let field = table.resolve_field(op_name);
        match table.resolve(op_name).block_size {
            Some(bs) => Ok((bs, format!("{field}.block_size"))),
            // Validation requires it for every linear recipe; a hand-built config may lack it.
            None => Err(field_error(
                format!("{field}.block_size"),
                "missing (expected the LPBQ block size, a positive integer)",
            )),
        }
    }

    /// Checks that the HF config's `linear_block_size` agrees with the block size this config
    /// gives every linear op, and that each op's block size divides its input width.
    ///
    /// `widths` lists `(op name, in_features)` for every linear (lm_head included). Without an HF
    /// block size only divisibility is checked.
    pub fn check_block_size<S: AsRef<str>>(
        &self,
        hf_linear_block_size: Option<usize>,
        widths: &[(S, usize)],
    ) -> Result<(), AotConfigError> {
        if hf_linear_block_size == Some(0) {
            return Err(AotConfigError::HfBlockSizeZero);
        }
        for (op, in_features) in widths {
            let op = op.as_ref();
            let (block_size, field) = self.linear_block_size(op)?;
            if let Some(hf) = hf_linear_block_size {
                if hf != block_size {
                    return Err(AotConfigError::BlockSizeMismatch { op: op.to_string(), field, aot: block_size, hf });
                }
            }
            if !in_features.is_multiple_of(block_size) {
                return Err(AotConfigError::BlockSizeDoesNotDivide {
                    op: op.to_string(),
                    field,
                    block_size,
                    in_features: *in_features,
                });
            }
        }
        Ok(())
    }

    /// Settings that are parsed but have no effect, worth telling the user about.
    pub fn warnings(&self) -> Vec<String> {
        let b = &self.quant_recipe.builtin_llm_pass;
        let used = b.linear.resolve("lm_head");
        let declared = b.lm_head.resolve("lm_head");
        if declared == used {
            return vec![];
        }
        vec![format!(
            "`{}` asks for {} but, as in mllm, lm_head is quantized with the `linear` recipe `{}` ({})",
            b.lm_head.resolve_field("lm_head"),
            describe(declared),
            b.linear.resolve_field("lm_head"),
            describe(used),
        )]
    }
}

fn describe(r: &Recipe) -> String {
    let sym = if r.sym { "sym" } else { "asym" };
    match r.block_size {
        Some(bs) => format!("{} {} {sym} block {bs}", r.method, r.precision),
        None => format!("{} {} {sym}", r.method, r.precision),
    }
}

fn target_machine_to_json(tm: &TargetMachine) -> Value {
    json!({
        "htp_arch": tm.htp_arch.as_str(),
        "htp_chipset": tm.htp_chipset.as_str(),
        "htp_try_best_performance": tm.htp_try_best_performance.as_str(),
        "htp_security_pd_session": tm.htp_security_pd_session.as_str(),
        "htp_vtcm_capability_in_mb": tm.htp_vtcm_capability_in_mb,
    })
}

fn parse_table(value: &Value, path: &str) -> Result<RecipeTable, AotConfigError> {
    let map = value.as_object().ok_or_else(|| {
        field_error(
            path,
            format!(
                "expected an object with a `fallback` recipe and optional regex-keyed recipes, found {}",
                show(value)
            ),
        )
    })?;
    let fallback_value = map.get("fallback").ok_or_else(|| {
        field_error(format!("{path}.fallback"), "missing (every recipe table needs a fallback recipe)")
    })?;
    let fallback = parse_recipe(fallback_value, &format!("{path}.fallback"))?;
    let mut patterns = Vec::new();
    for (key, v) in map.iter().filter(|(k, _)| k.as_str() != "fallback") {
        let field = key_path(path, key);
        let regex = Regex::new(&format!("^(?:{key})$")).map_err(|e| {
            field_error(&field, format!("the key is not a valid regular expression over op names: {e}"))
        })?;
        patterns.push(PatternRecipe { pattern: key.clone(), regex, recipe: parse_recipe(v, &field)? });
    }
    Ok(RecipeTable::new(path, fallback, patterns))
}

fn parse_recipe(value: &Value, path: &str) -> Result<Recipe, AotConfigError> {
    let o = Obj::new(value, path, RECIPE_FIELDS)?;
    let method = o.enum_field("method", QuantMethod::NAMES, QuantMethod::parse)?;
    let sym = as_bool(o.get("sym")?, &o.path("sym"))?;
    let precision = o.enum_field("precision", Precision::NAMES, Precision::parse)?;
    let block_size = match (method, o.opt("block_size")) {
        (QuantMethod::Lpbq, None) => {
            return Err(field_error(
                o.path("block_size"),
                "missing (method LPBQ needs a block size, a positive integer)",
            ))
        }
        (QuantMethod::Lpbq, Some(v)) => {
            let bs = as_usize(v, &o.path("block_size"))?;
            if bs == 0 {
                return Err(field_error(o.path("block_size"), "expected a block size greater than 0, found 0"));
            }
            Some(bs)
        }
        (_, Some(v)) => {
            return Err(field_error(
                o.path("block_size"),
                format!("only method LPBQ takes a block size, but method is {method} (found {})", show(v)),
            ))
        }
        (_, None) => None,
    };
    Ok(Recipe { method, sym, precision, block_size })
}

/// Linear weights: mllm only lowers symmetric LPBQ w4a16 and fails on anything else.
fn check_linear_table(table: &RecipeTable) -> Result<(), AotConfigError> {
    let entries = std::iter::once((format!("{}.fallback", table.path), &table.fallback))
        .chain(table.patterns.iter().map(|p| (key_path(&table.path, &p.pattern), &p.recipe)));
    for (field, r) in entries {
        if r.method != QuantMethod::Lpbq {
            return Err(field_error(
                format!("{field}.method"),
                format!("unsupported method {} for linear weights (expected LPBQ)", r.method),
            ));
        }
        if !r.sym {
            return Err(field_error(format!("{field}.sym"), "LPBQ weights are symmetric: expected true, found false"));
        }
        if r.precision != Precision::W4A16 {
            return Err(field_error(
                format!("{field}.precision"),
                format!("unsupported precision {} for LPBQ (expected w4a16)", r.precision),
            ));
        }
    }
    Ok(())
}

/// KV cache: the runtime stores it as u8 "symmetric" per-tensor, which is what this must say.
fn parse_kv_recipe(value: &Value, path: &str) -> Result<Recipe, AotConfigError> {
    let r = parse_recipe(value, path)?;
    if r.method != QuantMethod::PerTensor {
        return Err(field_error(
            format!("{path}.method"),
            format!("unsupported method {} for the KV cache (expected per-tensor)", r.method),
        ));
    }
    if !r.sym {
        return Err(field_error(format!("{path}.sym"), "the KV cache is symmetric u8: expected true, found false"));
    }
    if r.precision != Precision::W8A8 {
        return Err(field_error(
            format!("{path}.precision"),
            format!("unsupported precision {} for the KV cache (expected w8a8)", r.precision),
        ));
    }
    Ok(r)
}

/// A JSON object being read, with its field path and the keys it may have.
struct Obj<'a> {
    path: String,
    map: &'a Map<String, Value>,
}

impl<'a> Obj<'a> {
    /// Requires an object whose keys are all in `allowed`.
    fn new(value: &'a Value, path: &str, allowed: &[&str]) -> Result<Self, AotConfigError> {
        let shown_path = if path.is_empty() { "<root>" } else { path };
        let map = value
            .as_object()
            .ok_or_else(|| field_error(shown_path, format!("expected an object, found {}", show(value))))?;
        if let Some(key) = map.keys().find(|k| !allowed.contains(&k.as_str())) {
            return Err(field_error(
                key_path(path, key),
                format!("unknown field (allowed here: {})", allowed.join(", ")),
            ));
        }
        Ok(Obj { path: path.to_string(), map })
    }

    fn path(&self, key: &str) -> String {
        key_path(&self.path, key)
    }

    fn opt(&self, key: &str) -> Option<&'a Value> {
        self.map.get(key)
    }

    fn get(&self, key: &str) -> Result<&'a Value, AotConfigError> {
        self.map.get(key).ok_or_else(|| field_error(self.path(key), "missing"))
    }

    fn enum_field<T>(&self, key: &str, names: &[&str], parse: fn(&str) -> Option<T>) -> Result<T, AotConfigError> {
        let field = self.path(key);
        let value = self.get(key)?;
        let expected = || format!("expected one of {}", names.join(", "));
        let text =
            value.as_str().ok_or_else(|| field_error(&field, format!("{}, found {}", expected(), show(value))))?;
        parse(text).ok_or_else(|| field_error(&field, format!("unsupported value {} ({})", show(value), expected())))
    }
}

/// `parent.key`, or `parent["key"]` when the key is not a plain identifier (regex patterns).
fn key_path(parent: &str, key: &str) -> String {
    let plain = !key.is_empty() && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    match (parent.is_empty(), plain) {
        (true, true) => key.to_string(),
        (true, false) => format!("[{}]", Value::from(key)),
        (false, true) => format!("{parent}.{key}"),
        (false, false) => format!("{parent}[{}]", Value::from(key)),
    }
}

/// A short rendering of a JSON value for messages.
fn show(value: &Value) -> String {
    let text = value.to_string();
    if text.chars().count() > 60 {
        let head: String = text.chars().take(57).collect();
        format!("{head}...")
    } else {
        text
    }
}

fn as_str<'a>(value: &'a Value, field: &str) -> Result<&'a str, AotConfigError> {
    value.as_str().ok_or_else(|| field_error(field, format!("expected a string, found {}", show(value))))
}

fn as_bool(value: &Value, field: &str) -> Result<bool, AotConfigError> {
    value.as_bool().ok_or_else(|| field_error(field, format!("expected true or false, found {}", show(value))))
}

fn as_u32(value: &Value, field: &str) -> Result<u32, AotConfigError> {
    value
        .as_u64()
        .and_then(|v| u32::try_from(v).ok())
        .ok_or_else(|| field_error(field, format!("expected a non-negative integer, found {}", show(value))))
}

fn as_usize(value: &Value, field: &str) -> Result<usize, AotConfigError> {
    value
        .as_u64()
        .and_then(|v| usize::try_from(v).ok())
        .ok_or_else(|| field_error(field, format!("expected a positive integer, found {}", show(value))))
}

fn as_string_list(value: &Value, field: &str) -> Result<Vec<String>, AotConfigError> {
    let items = value
        .as_array()
        .ok_or_else(|| field_error(field, format!("expected a list of names, found {}", show(value))))?;
    items.iter().enumerate().map(|(i, v)| as_str(v, &format!("{field}[{i}]")).map(str::to_string)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_paths_quote_regex_keys() {
        assert_eq!(key_path("a.b", "fallback"), "a.b.fallback");
        assert_eq!(key_path("", "split_graph"), "split_graph");
        assert_eq!(key_path("linear", r"model\..*"), r#"linear["model\\..*"]"#);
    }

    #[test]
    fn patterns_resolve_in_sorted_order_and_match_whole_names() {
        let cfg = AotConfig::from_json(&{
            let mut v = AotConfig::w4a16_kv8().to_json();
            v["quant_recipe"]["builtin_llm_pass"]["linear"] = json!({
                "fallback": {"method": "LPBQ", "sym": true, "precision": "w4a16", "block_size": 16},
                "model\\.layers\\.1\\..*": {"method": "LPBQ", "sym": true, "precision": "w4a16", "block_size": 64},
                "model\\.layers\\..*": {"method": "LPBQ", "sym": true, "precision": "w4a16", "block_size": 32},
                "mlp": {"method": "LPBQ", "sym": true, "precision": "w4a16", "block_size": 8},
            });
            v
        })
        .unwrap();
        let bs = |op: &str| cfg.linear_block_size(op).unwrap().0;
        // After the common prefix `model\.layers\.` the keys continue with '.' (0x2E) and '1'
        // (0x31), so `model\.layers\..*` is tried first and wins even for layer 1, as in mllm.
        assert_eq!(bs("model.layers.0.mlp.up_proj"), 32);
        assert_eq!(bs("model.layers.1.mlp.up_proj"), 32);
        // "mlp" must match the whole name, so it only matches an op literally called "mlp".
        assert_eq!(bs("mlp"), 8);
        assert_eq!(bs("lm_head"), 16);
        assert_eq!(
            cfg.linear_block_size("lm_head").unwrap().1,
            "quant_recipe.builtin_llm_pass.linear.fallback.block_size"
        );
        assert_eq!(
            cfg.linear_block_size("model.layers.3.mlp.up_proj").unwrap().1,
            r#"quant_recipe.builtin_llm_pass.linear["model\\.layers\\..*"].block_size"#
        );
    }
}

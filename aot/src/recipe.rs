//! Quantization recipes by name: the one table of what each named recipe sets, which one a model
//! family gets by default, and how individual settings refine a named recipe.
//!
//! | name | calibration | weights | activation / KV ranges | rotation | attention-sink prefix |
//! |---|---|---|---|---|---|
//! | `mllm` | pymllm's, quirks included (bit for bit) | round-to-nearest | min/max | none | none |
//! | `rtn` | as deployed | round-to-nearest | min/max | none | none |
//! | `recommended` | as deployed | GPTQ | min/max | Hadamard | `<|endoftext|>` |
//!
//! The rule: a named recipe sets every setting; a setting given on its own replaces the recipe's
//! (the rest stays the recipe's). `mllm` is pymllm's recipe bit for bit, so a setting that differs
//! from it is an error ([`RecipeError::NotMllm`]), never a silent override. Without a name, a
//! float model gets its family's default ([`family_default`]); when the default is `recommended`
//! and the model's tokenizer has no `<|endoftext|>` token, the prefix is left out (and the chosen
//! recipe says so).

use std::path::Path;

use backend_cpu::quant::{CalibrationMode, Rotation, WeightMethod};
use compiler::quant::act_range::ActRanges;

pub use crate::mixed::WeightBudget;
use models::hf::{HfConfig, ModelType};

/// A named recipe ([`RecipeName::recipe`] gives its settings).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecipeName {
    /// pymllm's recipe, bit for bit: its calibration (quirks included), round-to-nearest LPBQ
    /// weights, min/max ranges.
    Mllm,
    /// pymllm's rounding and ranges, calibrated as the model is deployed (the embedded run's).
    Rtn,
    /// The best measured recipe: GPTQ weights, the Hadamard rotation, the `<|endoftext|>`
    /// attention-sink prefix (docs/quantization.md).
    Recommended,
}

/// The attention-sink prefix token of [`RecipeName::Recommended`].
pub const RECOMMENDED_SINK_TOKEN: &str = "<|endoftext|>";

impl RecipeName {
    pub const ALL: [RecipeName; 3] = [RecipeName::Mllm, RecipeName::Rtn, RecipeName::Recommended];

    pub fn name(self) -> &'static str {
        match self {
            RecipeName::Mllm => "mllm",
            RecipeName::Rtn => "rtn",
            RecipeName::Recommended => "recommended",
        }
    }

    /// Every setting of the recipe.
    pub fn recipe(self) -> Recipe {
        let rtn = Recipe {
            mode: CalibrationMode::Deployed,
            weight_method: WeightMethod::Rtn,
            act_ranges: ActRanges::default(),
            rotation: Rotation::None,
            sink_prefix: Vec::new(),
            weight_budget: None,
        };
        match self {
            RecipeName::Mllm => Recipe { mode: CalibrationMode::MllmCompatible, ..rtn },
            RecipeName::Rtn => rtn,
            RecipeName::Recommended => Recipe {
                weight_method: WeightMethod::Gptq,
                rotation: Rotation::Hadamard,
                sink_prefix: vec![RECOMMENDED_SINK_TOKEN.to_string()],
                ..rtn
            },
        }
    }
}

impl std::fmt::Display for RecipeName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for RecipeName {
    type Err = RecipeError;

    fn from_str(s: &str) -> Result<Self, RecipeError> {
        RecipeName::ALL.into_iter().find(|r| r.name() == s).ok_or_else(|| RecipeError::Unknown { name: s.to_string() })
    }
}

/// What a recipe sets.
#[derive(Clone, Debug, PartialEq)]
pub struct Recipe {
    pub mode: CalibrationMode,
    pub weight_method: WeightMethod,
    pub act_ranges: ActRanges,
    pub rotation: Rotation,
    /// The attention-sink prefix, each token as the tokenizer spells it or `id:N` (empty: none).
    pub sink_prefix: Vec<String>,
    /// Mixed 4/8-bit linears chosen by measured sensitivity within this budget (none: all int4;
    /// [`crate::mixed`]).
    pub weight_budget: Option<WeightBudget>,
}

impl Recipe {
    /// The settings in one line, e.g. `gptq weights, minmax ranges, hadamard rotation, sink prefix <|endoftext|>`.
    pub fn describe(&self) -> String {
        let calibration = match self.mode {
            CalibrationMode::MllmCompatible => "pymllm's calibration, ",
            CalibrationMode::Deployed => "",
        };
        let prefix = if self.sink_prefix.is_empty() { "no sink prefix".into() } else { self.sink_prefix.join(" ") };
        let prefix = if self.sink_prefix.is_empty() { prefix } else { format!("sink prefix {prefix}") };
        let mixed = self.weight_budget.map_or_else(String::new, |b| format!(", 8-bit linears within {b}"));
        format!(
            "{calibration}{} weights{mixed}, {} ranges, {} rotation, {prefix}",
            self.weight_method.name(),
            self.act_ranges,
            self.rotation.name()
        )
    }
}

/// Settings given on their own, each replacing the named recipe's ([`choose`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Refinements {
    pub weight_method: Option<WeightMethod>,
    pub act_ranges: Option<ActRanges>,
    pub rotation: Option<Rotation>,
    pub sink_prefix: Option<Vec<String>>,
    pub weight_budget: Option<WeightBudget>,
}

/// The recipe a run uses and why.
#[derive(Clone, Debug, PartialEq)]
pub struct Chosen {
    pub name: RecipeName,
    /// Why this name: asked for, or the model family's default.
    pub why: String,
    pub recipe: Recipe,
    /// The settings replaced by a refinement (`weight method`, `ranges`, `rotation`, `sink prefix`).
    pub refined: Vec<&'static str>,
    /// What the default left out, when it did.
    pub note: Option<String>,
}

impl Chosen {
    /// The recipe narrowed to what `target` can run: mllm's runtime preloads no attention-sink
    /// prefix, so a family default loses its prefix (and says so). A prefix asked for, by
    /// `--recipe recommended` or on its own, stays, and the run refuses it before any work.
    pub fn for_runtime(mut self, target: crate::deploy::TargetRuntime) -> Chosen {
        let defaulted = self.why != ASKED_FOR && !self.refined.contains(&"sink prefix");
        if target == crate::deploy::TargetRuntime::Mllm && defaulted && !self.recipe.sink_prefix.is_empty() {
            self.recipe.sink_prefix.clear();
            self.note = Some("no sink prefix: mllm's runtime does not preload one (target runtime mllm)".into());
        }
        self
    }
}

/// [`Chosen::why`] of a recipe named by the user.
const ASKED_FOR: &str = "asked for";

impl Chosen {
    /// The line a run prints at its start.
    pub fn line(&self) -> String {
        let refined =
            if self.refined.is_empty() { String::new() } else { format!(", refined: {}", self.refined.join(", ")) };
        let note = self.note.as_ref().map_or_else(String::new, |n| format!("; {n}"));
        format!("recipe: {} ({}{refined}; {}{note})", self.name, self.recipe.describe(), self.why)
    }
}

/// A recipe name or combination that cannot be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RecipeError {
    #[error("unknown recipe `{name}` (recipes: mllm, rtn, recommended)")]
    Unknown { name: String },
    #[error("weight budget `{value}`: {reason}")]
    WeightBudget { value: String, reason: String },
    #[error(
        "recipe `mllm` is pymllm's recipe bit for bit: its {setting} is {mllm}, not {asked}; use recipe `rtn` (pymllm's \
         rounding, calibrated as deployed) to change it"
    )]
    NotMllm { setting: &'static str, mllm: String, asked: String },
}

/// Why a family outside [`ModelType`] gets no rotation or prefix by default.
const UNCHECKED_FAMILY: &str = "the Hadamard fold and the prefix are built and checked for qwen3, qwen2 and llama only";

/// What the default of a family outside [`ModelType`] rests on, by `model_type`.
fn outside_family_basis(model_type: &str) -> &'static str {
    match model_type {
        "gemma3_text" => {
            "GPTQ chosen on Gemma 3 270M over rtn and mse ranges, 1.13-1.35x float there; \
             --weight-budget 1.0 (every linear 8-bit) came within 1.05x (docs/quantization.md)"
        }
        _ => "not measured on a trained checkpoint of this family yet",
    }
}

/// The default recipe of a model family: the best one it supports (all three families run GPTQ,
/// the Hadamard rotation and an attention-sink prefix).
pub fn family_default(family: ModelType) -> RecipeName {
    match family {
        ModelType::Qwen3 | ModelType::Qwen2 | ModelType::Llama => RecipeName::Recommended,
    }
}

/// The recipe for calibrating a float model: `name`, else the default of `model`'s family
/// (directory and config), else, without a model (the embedded tiny Qwen3), `rtn`; refined by
/// `refine` (the rule is in the module docs).
pub fn choose(
    name: Option<RecipeName>,
    model: Option<(&Path, &HfConfig)>,
    refine: &Refinements,
) -> Result<Chosen, crate::AotError> {
    let mut note = None;
    let (name, why, mut recipe) = match (name, model) {
        (Some(name), _) => (name, ASKED_FOR.to_string(), name.recipe()),
        (None, None) => (RecipeName::Rtn, "the embedded model's".to_string(), RecipeName::Rtn.recipe()),
        (None, Some((dir, hf))) => match hf.model_kind() {
            Ok(family) => {
                let name = family_default(family);
                let mut recipe = name.recipe();
                // The default's prefix token needs the model's tokenizer to have it; a recipe asked
                // for by name keeps it (and the run fails naming the token when the tokenizer lacks it).
                if recipe.sink_prefix == [RECOMMENDED_SINK_TOKEN] && !has_token(dir, RECOMMENDED_SINK_TOKEN) {
                    recipe.sink_prefix.clear();
                    note = Some(format!("no sink prefix: the model's tokenizer has no {RECOMMENDED_SINK_TOKEN} token"));
                }
                (name, format!("the default for {} models", family.as_str()), recipe)
            }
            // A family with a model file that the rotation fold and the prefix were not checked
            // on (Gemma 3, Phi-3, Mistral): GPTQ weights only.
            Err(_) if models::supported_model_types().contains(&hf.model_type.as_str()) => {
                let mut recipe = RecipeName::Recommended.recipe();
                recipe.rotation = Rotation::None;
                recipe.sink_prefix.clear();
                note = Some(format!(
                    "no rotation or sink prefix: {UNCHECKED_FAMILY}; {}",
                    outside_family_basis(&hf.model_type)
                ));
                (RecipeName::Recommended, format!("the default for {} models", hf.model_type), recipe)
            }
            Err(e) => return Err(e.into()),
        },
    };
    let mut refined = Vec::new();
    if name == RecipeName::Mllm {
        let differs = |setting, mllm: String, asked: Option<String>| match asked {
            Some(asked) if asked != mllm => Err(RecipeError::NotMllm { setting, mllm, asked }),
            _ => Ok(()),
        };
        differs("weight method", recipe.weight_method.name().into(), refine.weight_method.map(|w| w.name().into()))?;
        differs("ranges", recipe.act_ranges.to_string(), refine.act_ranges.map(|a| a.to_string()))?;
        differs("rotation", recipe.rotation.name().into(), refine.rotation.map(|r| r.name().into()))?;
        let none = "no sink prefix".to_string();
        differs("sink prefix", none, refine.sink_prefix.as_ref().filter(|p| !p.is_empty()).map(|p| p.join(" ")))?;
        differs("weight budget", "none (all int4)".into(), refine.weight_budget.map(|b| b.to_string()))?;
        return Ok(Chosen { name, why, recipe, refined, note });
    }
    if let Some(w) = refine.weight_method {
        recipe.weight_method = w;
        refined.push("weight method");
    }
    if let Some(a) = refine.act_ranges {
        recipe.act_ranges = a;
        refined.push("ranges");
    }
    if let Some(r) = refine.rotation {
        recipe.rotation = r;
        refined.push("rotation");
    }
    if let Some(b) = refine.weight_budget {
        recipe.weight_budget = Some(b);
        refined.push("weight budget");
    }
    if let Some(p) = &refine.sink_prefix {
        recipe.sink_prefix = p.clone();
        refined.push("sink prefix");
        note = None;
    }
    Ok(Chosen { name, why, recipe, refined, note })
}

/// Whether `model_dir/tokenizer.json` exists and has `token`.
fn has_token(model_dir: &Path, token: &str) -> bool {
    crate::sequences::load_tokenizer(model_dir).is_ok_and(|t| t.token_to_id(token).is_some())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures").join(name)
    }

    #[test]
    fn names_parse_and_the_table_holds() {
        for r in RecipeName::ALL {
            assert_eq!(r.name().parse::<RecipeName>().unwrap(), r);
        }
        let err = "best".parse::<RecipeName>().unwrap_err().to_string();
        assert!(err.contains("`best`") && err.contains("recommended"), "{err}");
        let m = RecipeName::Mllm.recipe();
        assert_eq!(
            (m.mode, m.weight_method, m.rotation),
            (CalibrationMode::MllmCompatible, WeightMethod::Rtn, Rotation::None)
        );
        let r = RecipeName::Recommended.recipe();
        assert_eq!(
            (r.mode, r.weight_method, r.rotation),
            (CalibrationMode::Deployed, WeightMethod::Gptq, Rotation::Hadamard)
        );
        assert_eq!(r.sink_prefix, ["<|endoftext|>"]);
        assert_eq!(RecipeName::Rtn.recipe(), Recipe { mode: CalibrationMode::Deployed, ..m });
    }

    #[test]
    fn refinements_replace_one_setting_and_mllm_refuses_them() {
        let dir = fixture("qwen3-dev-f32");
        let hf = HfConfig::from_dir(&dir).unwrap();
        let refine = Refinements { weight_method: Some(WeightMethod::Mse), ..Default::default() };
        let c = choose(Some(RecipeName::Recommended), Some((&dir, &hf)), &refine).unwrap();
        assert_eq!((c.recipe.weight_method, c.recipe.rotation), (WeightMethod::Mse, Rotation::Hadamard));
        assert_eq!(c.refined, ["weight method"]);
        assert!(c.line().contains("recommended") && c.line().contains("refined: weight method"), "{}", c.line());
        let err = choose(Some(RecipeName::Mllm), Some((&dir, &hf)), &refine).unwrap_err().to_string();
        assert!(err.contains("`mllm`") && err.contains("weight method is rtn, not mse"), "{err}");
        // The same setting as pymllm's is no conflict.
        let same = Refinements {
            weight_method: Some(WeightMethod::Rtn),
            rotation: Some(Rotation::None),
            ..Default::default()
        };
        assert_eq!(choose(Some(RecipeName::Mllm), Some((&dir, &hf)), &same).unwrap().recipe, RecipeName::Mllm.recipe());
        let prefix = Refinements { sink_prefix: Some(vec!["id:1".into()]), ..Default::default() };
        let err = choose(Some(RecipeName::Mllm), Some((&dir, &hf)), &prefix).unwrap_err().to_string();
        assert!(err.contains("sink prefix"), "{err}");
    }

    #[test]
    fn the_default_is_the_familys_best_and_says_what_it_left_out() {
        // A tiny Qwen3 without a tokenizer: the recommended recipe without its prefix token.
        let dir = fixture("qwen3-dev-f32");
        let hf = HfConfig::from_dir(&dir).unwrap();
        let c = choose(None, Some((&dir, &hf)), &Refinements::default()).unwrap();
        assert_eq!(c.name, RecipeName::Recommended);
        assert!(c.recipe.sink_prefix.is_empty());
        let line = c.line();
        assert!(line.contains("the default for qwen3 models") && line.contains("no <|endoftext|> token"), "{line}");
        // Asked for by name, the prefix stays (and the run names the missing token).
        let asked = choose(Some(RecipeName::Recommended), Some((&dir, &hf)), &Refinements::default()).unwrap();
        assert_eq!(asked.recipe, RecipeName::Recommended.recipe());
        // A family with a model file outside the fold (Gemma 3): GPTQ weights, and it says why.
        let dir3 = fixture("gemma3-dev-f32");
        let g = choose(None, Some((&dir3, &HfConfig::from_dir(&dir3).unwrap())), &Refinements::default()).unwrap();
        assert_eq!((g.recipe.weight_method, g.recipe.rotation), (WeightMethod::Gptq, Rotation::None));
        assert!(g.recipe.sink_prefix.is_empty());
        let line = g.line();
        assert!(
            line.contains("the default for gemma3_text models")
                && line.contains("no rotation or sink prefix")
                && line.contains("chosen on Gemma 3 270M"),
            "{line}"
        );
        let dir4 = fixture("phi3-dev-f32");
        let p = choose(None, Some((&dir4, &HfConfig::from_dir(&dir4).unwrap())), &Refinements::default()).unwrap();
        assert!(p.line().contains("not measured on a trained checkpoint"), "{}", p.line());
        // Without a model (the embedded run): pymllm's rounding as deployed, as ever.
        let embedded = choose(None, None, &Refinements::default()).unwrap();
        assert_eq!((embedded.name, embedded.recipe), (RecipeName::Rtn, RecipeName::Rtn.recipe()));
    }

    #[test]
    fn for_mllms_runtime_the_default_loses_its_prefix_and_an_asked_prefix_stays() {
        use crate::deploy::TargetRuntime;
        let dir = fixture("qwen3-dev-f32");
        let hf = HfConfig::from_dir(&dir).unwrap();
        let prefix = Refinements { sink_prefix: Some(vec!["id:1".into()]), ..Default::default() };
        // A default recipe that has a prefix (here given as a refinement of the default) keeps it
        // when asked for, for any runtime.
        let refined = choose(None, Some((&dir, &hf)), &prefix).unwrap();
        assert_eq!(refined.clone().for_runtime(TargetRuntime::Mllm).recipe.sink_prefix, ["id:1"]);
        // `recommended` by name keeps its prefix (the run then refuses it for mllm's runtime).
        let asked = choose(Some(RecipeName::Recommended), Some((&dir, &hf)), &Refinements::default()).unwrap();
        assert_eq!(asked.for_runtime(TargetRuntime::Mllm).recipe.sink_prefix, [RECOMMENDED_SINK_TOKEN]);
        // A family default with its prefix loses it for mllm's runtime, and says so; not for any.
        let mut default = choose(None, Some((&dir, &hf)), &Refinements::default()).unwrap();
        default.recipe.sink_prefix = vec![RECOMMENDED_SINK_TOKEN.into()];
        default.note = None;
        assert_eq!(default.clone().for_runtime(TargetRuntime::Any).recipe.sink_prefix, [RECOMMENDED_SINK_TOKEN]);
        let mllm = default.for_runtime(TargetRuntime::Mllm);
        assert!(mllm.recipe.sink_prefix.is_empty());
        assert!(mllm.line().contains("mllm's runtime does not preload one"), "{}", mllm.line());
    }
}

//! Command-line flags that several of the example mains share, so their names, defaults and help
//! have one owner. Each main takes them with `#[command(flatten)]`.

use std::path::PathBuf;

/// The flags of a main that scores a model on text and reports figures: JSON output, CPU threads,
/// progress bars.
#[derive(clap::Args, Debug)]
pub struct ScoreFlags {
    /// Also write the scores as JSON here.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// CPU threads (0: all cores).
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub threads: usize,
    /// No progress bars.
    #[arg(long)]
    pub quiet: bool,
}

/// How a float checkpoint is quantized (docs/quantization.md): a named recipe, refined by the
/// individual settings every main that calibrates offers. The recipes and the rule are
/// [`aot::recipe`]'s: a named recipe sets every setting, a flag given on its own replaces that
/// setting, and `mllm` (pymllm's, bit for bit) refuses a flag that differs from it.
#[derive(clap::Args, Debug, Clone)]
pub struct RecipeFlags {
    /// Quantization recipe: mllm (pymllm's, bit for bit), rtn (pymllm's rounding and ranges, calibrated as
    /// deployed) or recommended (gptq, hadamard, sink prefix <|endoftext|>). Default with --model: the best
    /// recipe of the model's family (printed at the start).
    #[arg(long, value_name = "NAME")]
    pub recipe: Option<aot::RecipeName>,
    /// LPBQ weight rounding: rtn (pymllm's), mse, gptq, seqmse or seqmse-gptq (replaces the recipe's).
    #[arg(long, value_name = "METHOD")]
    pub weight_method: Option<backend_cpu::quant::WeightMethod>,
    /// Activation/KV ranges: minmax (pymllm), mse or percentile:P, for both kinds or as
    /// act=METHOD,kv=METHOD (replaces the recipe's).
    #[arg(long, value_name = "METHOD")]
    pub act_range: Option<compiler::quant::act_range::ActRanges>,
    /// Rotation folded into the float weights first: none or hadamard (QuaRot's R1 + R2; replaces the recipe's).
    #[arg(long, value_name = "ROTATION")]
    pub rotation: Option<backend_cpu::quant::Rotation>,
    /// Attention-sink prefix every sequence starts from (its float K/V ship with the checkpoint):
    /// a token as the tokenizer spells it (e.g. '<|endoftext|>') or id:N; repeatable (replaces the recipe's).
    #[arg(long, value_name = "TOKEN")]
    pub sink_prefix: Vec<String>,
    /// Mixed 4/8-bit weights: raise the linears most sensitive per byte (measured on the calibration
    /// text) to per-channel int8 within this fraction over the all-int4 bytes, e.g. 0.10 (+10 %).
    #[arg(long, value_name = "FRACTION")]
    pub weight_budget: Option<aot::mixed::WeightBudget>,
}

impl RecipeFlags {
    /// The individual settings given.
    pub fn refinements(&self) -> aot::Refinements {
        aot::Refinements {
            weight_method: self.weight_method,
            act_ranges: self.act_range,
            rotation: self.rotation,
            sink_prefix: (!self.sink_prefix.is_empty()).then(|| self.sink_prefix.clone()),
            weight_budget: self.weight_budget,
        }
    }

    /// Whether any recipe flag was given.
    pub fn any(&self) -> bool {
        self.recipe.is_some() || self.refinements() != aot::Refinements::default()
    }

    /// The recipe for calibrating `model` (directory and config; `None`: the embedded model):
    /// `--recipe`, else the family's default, refined by the individual flags.
    pub fn choose(&self, model: Option<(&std::path::Path, &models::hf::HfConfig)>) -> anyhow::Result<aot::Chosen> {
        use anyhow::Context as _;
        aot::recipe::choose(self.recipe, model, &self.refinements()).with_context(|| {
            let name = self.recipe.map_or_else(|| "the default recipe".to_string(), |r| format!("--recipe {r}"));
            format!("{name} with --weight-method / --act-range / --rotation / --sink-prefix / --weight-budget")
        })
    }
}

/// The library's names of its options as they appear in its errors, and the flag of each on the
/// command line of `qwen3_aot`, `quantize` and `perplexity`: the library names a field
/// (`AotOptions::sink_prefix`) or a value (`ModelSource::Float`), the mains say `--sink-prefix` or
/// `--model`.
pub const FLAG_NAMES: &[(&str, &str)] = &[
    ("AotOptions::calibration", "--calib-ids FILE or --calib-text FILE"),
    ("AotOptions::chunks", "--chunk"),
    ("AotOptions::context_binary", "--context-binary"),
    ("AotOptions::context_lens", "--context-len"),
    ("AotOptions::shards", "--shards"),
    ("AotOptions::sink_prefix", "--sink-prefix"),
    ("AotOptions::target_runtime", "--target-runtime"),
    ("AutoLimits::max_context_bytes", "--max-context-bytes"),
    ("AutoLimits::max_memory", "--max-memory"),
    ("CalibrationMode::MllmCompatible", "--mllm-compatible"),
    ("GraphFamily::chunks", "--chunk"),
    ("GraphFamily::contexts", "--context-len"),
    ("ModelSource::Float", "--model"),
    ("ModelSource::Quantized", "--quantized"),
    ("QuantizeOptions::rotation", "--rotation"),
    ("QuantizeOptions::sink_prefix", "--sink-prefix"),
    ("QuantizeOptions::weight_budget", "--weight-budget"),
    ("Recipe::sink_prefix", "--sink-prefix"),
    ("RunSizes::chunk", "--chunk"),
    ("RunSizes::context", "--context-len"),
    ("RunSizes::max_positions", "--max-positions"),
];

/// [`FLAG_NAMES`] for `generate`, whose request is [`aot::GenerateRequest`] and whose run sizes
/// come from `--chunk` and `--context` alone (the RoPE tables cover the context).
pub const GENERATE_FLAG_NAMES: &[(&str, &str)] = &[
    ("GenerateRequest::chunks", "--chunk"),
    ("GenerateRequest::contexts", "--context"),
    ("GenerateRequest::logits_out", "--logits-out"),
    ("GenerateRequest::max_new_tokens", "--max-new-tokens"),
    ("GenerateRequest::model", "--model"),
    ("GenerateRequest::qnn_context", "--qnn-context"),
    ("GenerateRequest::qnn_emulate", "--qnn-emulate"),
    ("GenerateRequest::target", "--target"),
    ("GenerateRequest::temperature", "--temperature"),
    ("GraphFamily::chunks", "--chunk"),
    ("GraphFamily::contexts", "--context"),
    ("RunSizes::chunk", "--chunk"),
    ("RunSizes::context", "--context"),
    ("RunSizes::max_positions", "RoPE positions"),
];

/// [`FLAG_NAMES`] for `export_ascend`, whose options are [`aot::ascend::AscendOptions`].
pub const EXPORT_ASCEND_FLAG_NAMES: &[(&str, &str)] = &[
    ("AscendOptions::float_patterns", "--float"),
    ("AscendOptions::group_size", "--group-size"),
    ("AscendOptions::kv_c8", "--kv-c8"),
    ("AscendOptions::quant_type", "--quant-type"),
    ("AscendOptions::weight_method", "--weight-method"),
];

/// `err` as `qwen3_aot`, `quantize` and `perplexity` say it: [`with_names`] of [`FLAG_NAMES`].
pub fn with_flag_names(err: impl Into<anyhow::Error>) -> anyhow::Error {
    with_names(err, FLAG_NAMES)
}

/// `err` as the command line says it: every option name of `names` in its chain replaced by its
/// flag, longer names first (the chain's layers kept; `err` itself when it names no option).
pub fn with_names(err: impl Into<anyhow::Error>, names: &[(&str, &str)]) -> anyhow::Error {
    let err = err.into();
    let mut names = names.to_vec();
    names.sort_by_key(|(name, _)| std::cmp::Reverse(name.len()));
    let layers: Vec<String> = err.chain().map(|e| e.to_string()).collect();
    let mapped: Vec<String> =
        layers.iter().map(|l| names.iter().fold(l.clone(), |l, (name, flag)| l.replace(name, flag))).collect();
    if mapped == layers {
        return err;
    }
    let mut layers = mapped.into_iter().rev();
    let innermost = anyhow::anyhow!(layers.next().unwrap_or_default());
    layers.fold(innermost, |e, outer| e.context(outer))
}

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

/// How a float checkpoint is quantized (docs/quantization.md): the options of the W4A16KV8
/// recipe every main that calibrates offers.
#[derive(clap::Args, Debug, Clone)]
pub struct RecipeFlags {
    /// LPBQ weight rounding: rtn (pymllm's), mse, gptq, seqmse or seqmse-gptq.
    #[arg(long, value_name = "METHOD", default_value = "rtn")]
    pub weight_method: backend_cpu::quant::WeightMethod,
    /// Activation/KV ranges: minmax (pymllm), mse or percentile:P, for both kinds or as
    /// act=METHOD,kv=METHOD.
    #[arg(long, value_name = "METHOD", default_value = "minmax")]
    pub act_range: compiler::quant::act_range::ActRanges,
    /// Rotation folded into the float weights first: none or hadamard (QuaRot's R1 + R2).
    #[arg(long, value_name = "ROTATION", default_value = "none")]
    pub rotation: backend_cpu::quant::Rotation,
    /// Attention-sink prefix every sequence starts from (its float K/V ship with the checkpoint):
    /// a token as the tokenizer spells it (e.g. '<|endoftext|>') or id:N; repeatable.
    #[arg(long, value_name = "TOKEN")]
    pub sink_prefix: Vec<String>,
}

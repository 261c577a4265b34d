//! Quality on a text, the way users measure it, for the `perplexity` example and the quantization
//! methods' comparisons: float vs fake-quant of a quantized checkpoint vs the naive weight-only RTN
//! baseline, each scored by perplexity, mean KL(float‖model) and top-1 agreement with float
//! ([`backend_cpu::quant::TextEval`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use crate::error::{bail, ensure, AotError, Context, Result};
use backend_cpu::quant::{FakeQuantHook, QdqParams, QualityRow, RtnWeights, SinkPrefix, TextEval};
use backend_cpu::{Bf16Products, CheckpointStore, CpuBackend, QdqHook};
use checkpoint::SafetensorsCheckpoint;
use compiler::quant::points::qdq_points;
use mllm_dsl::module::{ParamSource, WeightStore};
use mllm_dsl::{BackendRef, CausalLm, ParamFormat};
use models::hf::HfConfig;

use crate::load::build_model;
use crate::progress::Progress;
use crate::trace::trace_model;
use models::keys::ROPE_SIN_TABLE;

/// The first `max_tokens` tokens of a text file, tokenized with `tokenizer.json` as a plain text
/// (the tokenizer's own special-token rules, no chat template).
pub fn load_text_ids(path: &Path, tokenizer: &Path, max_tokens: usize) -> Result<Vec<i64>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let tok = tokenizers::Tokenizer::from_file(tokenizer)
        .map_err(|e| AotError::tokenizer(format!("cannot load tokenizer {}", tokenizer.display()), e))?;
    let enc = tok.encode(text, true).map_err(|e| AotError::tokenizer(format!("tokenizing {}", path.display()), e))?;
    let ids: Vec<i64> = enc.get_ids().iter().take(max_tokens).map(|&i| i64::from(i)).collect();
    ensure!(ids.len() >= 2, "{}: {} tokens; at least 2 are needed to measure perplexity", path.display(), ids.len());
    Ok(ids)
}

/// Weight-only RTN baseline settings (symmetric, float scales, activations float).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RtnBaseline {
    pub bits: u32,
    pub block: usize,
}

impl Default for RtnBaseline {
    /// int4 in blocks of 16: the LPBQ block size of the W4A16KV8 recipe.
    fn default() -> Self {
        RtnBaseline { bits: 4, block: 16 }
    }
}

/// What [`text_quality`] scores.
#[derive(Clone, Debug)]
pub struct TextQualityOptions {
    /// HF float checkpoint directory.
    pub model: PathBuf,
    /// Quantized checkpoints (pymllm's format) to score in fake-quant mode, with their row names.
    pub quantized: Vec<(String, PathBuf)>,
    /// Also score the weight-only RTN baseline.
    pub rtn: Option<RtnBaseline>,
    /// Also score the float model with bf16 products ([`Bf16Products::Bf16`]: each linear's input
    /// rounded to bf16; changes nothing for f32 weights).
    pub bf16_products: bool,
    /// The evaluation tokens.
    pub ids: Vec<i64>,
    /// Tokens per prefill window (each window starts with no past).
    pub window: usize,
    /// Where the long steps report progress ([`crate::progress::bars`] on a terminal).
    pub progress: std::sync::Arc<dyn Progress>,
}

/// The scores, float first, and the wall time of each model's run.
#[derive(Clone, Debug)]
pub struct TextQuality {
    pub rows: Vec<QualityRow>,
    pub seconds: Vec<f64>,
    pub windows: usize,
}

impl TextQuality {
    /// An aligned text table, with each row's perplexity relative to float.
    pub fn table(&self) -> String {
        let float = self.rows.first().map_or(f64::NAN, |r| r.perplexity);
        let width = self.rows.iter().map(|r| r.name.len()).max().unwrap_or(0).max(5);
        let mut s = format!(
            "{:<width$}  {:>10}  {:>8}  {:>10}  {:>7}  {:>7}\n",
            "model", "perplexity", "x float", "KL nats", "top-1", "time s"
        );
        for (r, t) in self.rows.iter().zip(&self.seconds) {
            s.push_str(&format!(
                "{:<width$}  {:>10.3}  {:>8.3}  {:>10.5}  {:>6.1}%  {:>7.2}\n",
                r.name,
                r.perplexity,
                r.perplexity / float,
                r.mean_kl,
                r.top1_agreement * 100.0,
                t
            ));
        }
        s
    }

    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "windows": self.windows,
            "rows": self.rows.iter().zip(&self.seconds).map(|(r, t)| serde_json::json!({
                "name": r.name, "perplexity": r.perplexity, "mean_kl": r.mean_kl,
                "top1_agreement": r.top1_agreement, "predictions": r.predictions, "seconds": t,
            })).collect::<Vec<_>>(),
        })
    }
}

/// A quantized checkpoint in fake-quant mode: its decoded weights and every QDQ point with its
/// stored parameters. Returns the model, its backend and the RoPE rows it covers.
pub fn load_fake_quant(dir: &Path) -> Result<(Box<dyn CausalLm>, BackendRef, usize)> {
    let hf = HfConfig::from_dir(dir)?;
    let ckpt = SafetensorsCheckpoint::open(dir)?;
    let rows = match ckpt.info(ROPE_SIN_TABLE) {
        Ok((_, &[1, rows, _])) => rows,
        _ => bail!("{}: no RoPE table `{ROPE_SIN_TABLE}` [1, L, head_dim]; not a quantized checkpoint", dir.display()),
    };
    let points = qdq_points(&trace_model(&hf, rows, ParamFormat::Float)?)?;
    let params = QdqParams::from_checkpoint(&ckpt, &points)
        .with_context(|| format!("reading the QDQ parameters of {}", dir.display()))?;
    drop(ckpt);
    let hook: Arc<dyn QdqHook> = Arc::new(FakeQuantHook::new(&params));
    let backend = CpuBackend::with_qdq(hook);
    let store = CheckpointStore::open(dir, backend.clone(), hf.tie_word_embeddings)?;
    let model = build_model(&hf, rows, &ParamSource::Store(&store), dir)?;
    Ok((model, backend, rows))
}

/// Scores float, each quantized checkpoint and the RTN baseline on `opts.ids`. When the quantized
/// checkpoints ship an attention-sink prefix ([`SinkPrefix`]), every model starts each window
/// from the same prefix tokens: the quantized ones from the K/V they ship, float and RTN from
/// their own.
pub fn text_quality(opts: &TextQualityOptions) -> Result<TextQuality> {
    let hf = HfConfig::from_dir(&opts.model)?;
    let prefixes = opts
        .quantized
        .iter()
        .map(|(_, dir)| SinkPrefix::load_beside(dir).with_context(|| format!("the prefix of {}", dir.display())))
        .collect::<Result<Vec<_>>>()?;
    let prefix_ids = prefixes.first().and_then(|p| p.as_ref().map(|p| p.ids.clone()));
    for ((_, dir), p) in opts.quantized.iter().zip(&prefixes) {
        ensure!(
            p.as_ref().map(|p| &p.ids) == prefix_ids.as_ref(),
            "{} starts from the attention-sink prefix {:?}, {} from {:?}: checkpoints scored together must share it",
            dir.display(),
            p.as_ref().map(|p| &p.ids),
            opts.quantized[0].1.display(),
            prefix_ids
        );
    }
    let prefix_len = prefix_ids.as_ref().map_or(0, Vec::len);
    let positions = opts.window.min(opts.ids.len()).max(2) + prefix_len;
    let n_windows = opts.ids.chunks(opts.window.max(1)).filter(|w| w.len() >= 2).count();
    let runs = 1 + opts.quantized.len() + usize::from(opts.rtn.is_some()) + usize::from(opts.bf16_products);
    let pb = opts.progress.start("perplexity", runs * n_windows);
    let tick = |_: usize, _: usize| pb.inc(1);
    let (mut rows, mut seconds) = (Vec::new(), Vec::new());
    // A float-activation model on `weights`, with its own K/V of the prefix tokens.
    let float_activation_model = |weights: &dyn WeightStore,
                                  backend: &BackendRef|
     -> Result<(Box<dyn CausalLm>, Option<SinkPrefix>)> {
        let model = build_model(&hf, positions, &ParamSource::Store(weights), &opts.model)?;
        let prefix = match &prefix_ids {
            Some(ids) => Some(SinkPrefix::compute(model.as_ref(), backend, ids).context("the attention-sink prefix")?),
            None => None,
        };
        Ok((model, prefix))
    };

    // 1. Float: the reference every other model is scored against.
    let t = Instant::now();
    pb.set_message("float");
    let float_backend = CpuBackend::float();
    let store = CheckpointStore::open(&opts.model, float_backend.clone(), hf.tie_word_embeddings)?;
    let (float, float_prefix) = float_activation_model(&store, &float_backend)?;
    let eval = TextEval::new(float.as_ref(), &float_backend, float_prefix.as_ref(), &opts.ids, opts.window, &tick)
        .with_context(|| format!("float run of {}", opts.model.display()))?;
    drop(float);
    rows.push(eval.float().clone());
    seconds.push(t.elapsed().as_secs_f64());

    // 2. Each quantized checkpoint in fake-quant mode.
    for ((name, dir), prefix) in opts.quantized.iter().zip(&prefixes) {
        let t = Instant::now();
        pb.set_message(name);
        let (model, backend, rows_covered) = load_fake_quant(dir)?;
        ensure!(
            positions <= rows_covered,
            "{}: its RoPE tables cover {rows_covered} positions; the evaluation window needs {positions}",
            dir.display()
        );
        let row = eval.score(name.clone(), model.as_ref(), &backend, prefix.as_ref(), &tick);
        rows.push(row.with_context(|| name.clone())?);
        seconds.push(t.elapsed().as_secs_f64());
    }

    // 3. The naive baseline: weight-only RTN, activations float.
    if let Some(rtn) = opts.rtn {
        let t = Instant::now();
        let name = format!("RTN int{} block {} weight-only", rtn.bits, rtn.block);
        pb.set_message(&name);
        let rtn_store = RtnWeights::new(&store, rtn.bits, rtn.block)?;
        let (model, prefix) = float_activation_model(&rtn_store, &float_backend)?;
        let row = eval.score(name.clone(), model.as_ref(), &float_backend, prefix.as_ref(), &tick);
        rows.push(row.with_context(|| name.clone())?);
        seconds.push(t.elapsed().as_secs_f64());
    }
    // 4. The float model with bf16 products.
    if opts.bf16_products {
        let t = Instant::now();
        let name = "float, bf16 products".to_string();
        pb.set_message(&name);
        let backend = CpuBackend::float_with(Bf16Products::Bf16);
        let store = CheckpointStore::open(&opts.model, backend.clone(), hf.tie_word_embeddings)?;
        let (model, prefix) = float_activation_model(&store, &backend)?;
        let row = eval.score(name.clone(), model.as_ref(), &backend, prefix.as_ref(), &tick);
        rows.push(row.with_context(|| name.clone())?);
        seconds.push(t.elapsed().as_secs_f64());
    }
    pb.finish();
    Ok(TextQuality { rows, seconds, windows: eval.windows() })
}

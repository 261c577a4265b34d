//! One run of the `generate` command: a [`GenerateRequest`] (what the command line asked for)
//! checked, its model loaded into a [`Runner`], its prompt (ids, text, or a chat turn) or a
//! conversation read from an input answered, and the lines the command prints.

use std::collections::BTreeMap;
use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::time::Instant;

use crate::error::{bail, ensure, AotError, Context, Result};
use crate::run_sizes::{available_memory, RunSizes};
use crate::sequences::PromptText;
use checkpoint::{write_safetensors_atomic, StDtype, TensorBytes};
use models::hf::HfConfig;
use runtime::{GenerationConfig, GenerationOutput, RandomSampling, Sampling};

use crate::chat::{load_chat_template, stop_ids, Conversation};
use crate::family::{graph_menu, GraphFamily, GraphNaming};
use crate::load::RunMode;
use crate::runner::Runner;
use backend_cpu::Bf16Products;
use backend_qnn::cost::HtpPerf;

/// What to generate from and how; the `generate` example's arguments, documented there (errors
/// name the fields, `GenerateRequest::chunks`).
#[derive(Debug, Clone)]
pub struct GenerateRequest {
    pub model: PathBuf,
    pub prompt_ids: Vec<u32>,
    pub prompt: Option<String>,
    pub chat: bool,
    pub system: Option<String>,
    pub max_new_tokens: usize,
    /// Prefill chunk sizes: one for mllm's fixed pair (with 1 for decode); several make a family.
    pub chunks: Vec<usize>,
    /// Context lengths: one, or several for a family.
    pub contexts: Vec<usize>,
    /// Pick each step's graph by its modelled cost (implied by several chunks or contexts).
    pub select: bool,
    /// The target of the cost model (`sm8650`, `sm8750`).
    pub target: String,
    /// Print every call and context move (`graph: ...` lines).
    pub verbose: bool,
    pub logits_out: Option<PathBuf>,
    pub temperature: f32,
    pub top_k: usize,
    pub top_p: f32,
    pub seed: u64,
    pub threads: usize,
    pub timings: bool,
    pub float: bool,
    /// A float checkpoint's bf16 weights multiplied in bf16 ([`Bf16Products::Bf16`]).
    pub bf16_products: bool,
    pub qnn_context: Option<PathBuf>,
    pub qnn_emulate: bool,
}

/// Runs `req` and returns the lines the command prints (`ids: …`, `text: …`, timings), reading
/// chat turns from `input` (--chat without --prompt) and, with `stream`, writing the generated
/// text to `output` as it is produced (then left out of the lines). `loaded` sees the runner once
/// the model is loaded, before anything is generated (to tell its notes).
pub fn run(
    req: &GenerateRequest,
    input: &mut dyn BufRead,
    output: &mut dyn Write,
    stream: bool,
    loaded: &mut dyn FnMut(&Runner),
) -> Result<Vec<String>> {
    let (chunk, context) = match (req.chunks.first(), req.contexts.first()) {
        (Some(&chunk), Some(&context)) => (chunk, context),
        _ => bail!("GenerateRequest::chunks and GenerateRequest::contexts need at least one value each"),
    };
    let selecting = req.select || req.chunks.len() > 1 || req.contexts.len() > 1;
    let family = if selecting {
        let mut chunks = req.chunks.clone();
        if !chunks.contains(&1) {
            chunks.push(1);
        }
        Some(GraphFamily::new(&chunks, &req.contexts, GraphNaming::Mllm)?)
    } else {
        if chunk == 0 || chunk >= context {
            bail!(
                "GenerateRequest::chunks {chunk} must be at least 1 and smaller than GenerateRequest::contexts {context}"
            );
        }
        None
    };
    // The largest context the run may reach.
    let context = family.as_ref().and_then(|f| f.contexts().last().copied()).unwrap_or(context);
    let target = HtpPerf::by_name(&req.target)
        .with_context(|| format!("GenerateRequest::target {}: expected sm8650 (v75) or sm8750 (v79)", req.target))?;
    if let Some(path) = &req.logits_out {
        // Every file of the model directory (and the context binary) is an input.
        let listing = std::fs::read_dir(&req.model)
            .with_context(|| format!("listing GenerateRequest::model {}", req.model.display()))?;
        let mut inputs: Vec<PathBuf> = listing.filter_map(|e| e.ok().map(|e| e.path())).collect();
        inputs.extend(req.qnn_context.clone());
        mllm_dsl::files::ensure_not_input(path, &inputs).context("GenerateRequest::logits_out")?;
    }
    // 0 is greedy; anything else (NaN, negative, inf included) goes to the sampler's checks.
    if req.temperature != 0.0 && !(req.temperature.is_finite() && req.temperature > 0.0) {
        bail!("GenerateRequest::temperature {} must be 0 (greedy) or a finite value > 0", req.temperature);
    }
    // Sizes checked against each other, the config and the machine's memory before loading.
    let largest_chunk = req.chunks.iter().copied().max().unwrap_or(chunk);
    let sizes = RunSizes { max_positions: context, context, chunk: largest_chunk };
    sizes.check(&HfConfig::from_dir(&req.model)?, available_memory())?;
    backend_cpu::kernels::set_num_threads(req.threads)?;
    let t0 = Instant::now();
    let mut runner = match (&req.qnn_context, &family) {
        (Some(binary), Some(f)) => Runner::context_binary_family(&req.model, binary, f, req.qnn_emulate)?,
        (Some(binary), None) => Runner::context_binary(&req.model, binary, chunk, context, req.qnn_emulate)?,
        (None, _) => {
            let mode = if req.float { RunMode::Float } else { RunMode::Auto };
            let bf16 = if req.bf16_products { Bf16Products::Bf16 } else { Bf16Products::F32 };
            Runner::cpu_with(&req.model, context, mode, bf16)?
        }
    };
    if let Some(f) = &family {
        let graphs = match (&req.qnn_context, req.qnn_emulate) {
            (Some(_), true) => Some(crate::compile::lower_family(&req.model, f)?),
            _ => None,
        };
        let menu = graph_menu(&runner.config, f, graphs.as_deref(), &target)?;
        if req.verbose {
            for c in menu.choices() {
                eprintln!(
                    "graph chunk {} context {}: modelled {:.3} ms per call on {}",
                    c.chunk,
                    c.context_len,
                    c.cost_s * 1e3,
                    target.soc
                );
            }
        }
        runner.select(menu)?;
    }
    let load_s = t0.elapsed().as_secs_f64();
    loaded(&runner);
    let tokenizer =
        (req.prompt.is_some() || req.chat).then(|| crate::sequences::load_tokenizer(&req.model)).transpose()?;
    let template = req.chat.then(|| load_chat_template(&req.model)).transpose()?;
    let mut conversation = template.map(|t| Conversation::new(t, req.system.as_deref()));
    let sampling = if req.temperature > 0.0 {
        let (temperature, top_k, top_p, seed) = (req.temperature, req.top_k, req.top_p, req.seed);
        Sampling::Random(RandomSampling { temperature, top_k, top_p, seed })
    } else {
        Sampling::Greedy
    };
    let eos_ids = match &tokenizer {
        Some(tok) => stop_ids(&runner.config.eos_token_ids, conversation.as_ref().map(Conversation::template), tok),
        None => runner.config.eos_token_ids.clone(),
    };
    let (max_new_tokens, prefill_chunk, collect_prompt_logits) = (req.max_new_tokens, chunk, req.logits_out.is_some());
    let config = GenerationConfig { max_new_tokens, prefill_chunk, sampling, eos_ids, collect_prompt_logits };
    let fits = |prompt: &[u32]| fits_in_context(prompt, req.max_new_tokens, context);
    let lines_of = |prompt: &[u32], out: &GenerationOutput| {
        let ids: Vec<String> = prompt.iter().chain(&out.ids).map(u32::to_string).collect();
        let text = match (&tokenizer, stream) {
            (Some(tok), false) => Some(tok.decode(&out.ids, true).map_err(|e| AotError::tokenizer("decoding", e))?),
            _ => None,
        };
        Ok::<_, AotError>([Some(format!("ids: {}", ids.join(","))), text.map(|t| format!("text: {t}"))])
    };
    let mut lines = Vec::new();
    // Several turns: user lines from `input` until it ends.
    if let (Some(conv), Some(tok), None) = (conversation.as_mut(), tokenizer.as_ref(), &req.prompt) {
        for (prompt, out) in runner.chat(conv, tok, &config, (input, output), stream, &fits)? {
            lines.extend(lines_of(&prompt, &out)?.into_iter().flatten());
            lines.extend(out.steps.iter().filter(|_| req.verbose).map(|step| format!("graph: {step}")));
        }
        return Ok(lines);
    }
    let prompt = match (&req.prompt, &tokenizer, conversation.as_mut()) {
        (Some(text), Some(tok), Some(conv)) => {
            crate::sequences::encode_prompt(tok, &conv.user_says(text)?, PromptText::Chat, &runner.config)?
        }
        (Some(text), Some(tok), None) => crate::sequences::encode_prompt(tok, text, PromptText::Plain, &runner.config)?,
        _ => req.prompt_ids.clone(),
    };
    ensure!(!prompt.is_empty(), "the prompt is empty");
    fits(&prompt)?;
    let out = runner.generate(&prompt, &config, tokenizer.as_ref().filter(|_| stream), output)?;
    lines.extend(lines_of(&prompt, &out)?.into_iter().flatten());
    lines.extend(out.steps.iter().filter(|_| req.verbose).map(|step| format!("graph: {step}")));
    if let (Some(path), Some(logits)) = (&req.logits_out, &out.prompt_logits) {
        let bytes: Vec<u8> = logits.iter().flat_map(|v| v.to_le_bytes()).collect();
        let tensor: TensorBytes<'_> = ("logits", StDtype::F32, &[1, prompt.len(), runner.config.vocab_size], &bytes);
        write_safetensors_atomic(path, &[tensor], &BTreeMap::new())?;
    }
    if req.timings {
        let t = &out.timings;
        let (prefill, decode) = (t.prefill_tokens_per_sec(), t.decode_tokens_per_sec());
        lines.push(format!("prefill_tok_s={prefill:.2} decode_tok_s={decode:.2} load_s={load_s:.3}"));
    }
    Ok(lines)
}

/// The prompt plus `--max-new-tokens` must fit in `--context` (the largest, for a family):
/// checked before generating, so a run never stops short without a word.
fn fits_in_context(prompt: &[u32], new: usize, context: usize) -> Result<()> {
    let len = prompt.len();
    let wanted = len.saturating_add(new);
    ensure!(
        wanted <= context,
        "the prompt ({len} tokens) + GenerateRequest::max_new_tokens {new} = {wanted} tokens do not fit in \
         GenerateRequest::contexts {context}"
    );
    Ok(())
}

//! The `generate` example's command: argument parsing and the run itself, as a library function so
//! tests drive it exactly like the command line does.

use crate::quant_pipeline::{load_model, RunMode};
use crate::{qwen3_chat_prompt, write_f32_safetensors};
use anyhow::{anyhow, bail, Context, Result};
use clap::Parser;
use mllm_dsl::runtime::{GenerationConfig, Generator, RandomSampling, Sampling};
use std::path::PathBuf;
use std::time::Instant;

#[derive(Parser, Debug)]
#[command(about = "Generate tokens on the CPU with a model file from an HF checkpoint directory")]
pub struct GenerateArgs {
    /// HF model directory: config.json + model.safetensors (or shards with an index).
    #[arg(long)]
    pub model: PathBuf,
    /// Prompt as comma-separated token ids, e.g. 5,17,42.
    #[arg(long, value_delimiter = ',', conflicts_with = "prompt", required_unless_present = "prompt")]
    pub prompt_ids: Vec<u32>,
    /// Prompt text, tokenized with the directory's tokenizer.json.
    #[arg(long)]
    pub prompt: Option<String>,
    /// Apply Qwen3's chat template (non-thinking) to --prompt.
    #[arg(long, requires = "prompt")]
    pub chat: bool,
    #[arg(long, default_value_t = 32)]
    pub max_new_tokens: usize,
    /// Prefill chunk size (the last chunk is zero-padded).
    #[arg(long, default_value_t = 32)]
    pub chunk: usize,
    /// Context length (KV cache capacity, RoPE table rows).
    #[arg(long, default_value_t = 1024)]
    pub context: usize,
    /// Write the prompt positions' logits as safetensors tensor `logits`, f32 [1, prompt_len, vocab].
    #[arg(long)]
    pub logits_out: Option<PathBuf>,
    /// Sampling temperature; 0 means greedy.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    /// Keep the k most likely tokens (0: all).
    #[arg(long, default_value_t = 0)]
    pub top_k: usize,
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// CPU threads (0: all cores).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// Print `prefill_tok_s=X decode_tok_s=Y load_s=Z` as the last line.
    #[arg(long)]
    pub timings: bool,
    /// Run a quantized checkpoint without fake-quant (decoded weights, QDQ points off).
    #[arg(long)]
    pub float: bool,
}

/// Runs generation and returns the lines the command prints.
pub fn run_generate(args: &GenerateArgs) -> Result<Vec<String>> {
    if args.chunk == 0 || args.chunk >= args.context {
        bail!("--chunk {} must be at least 1 and smaller than --context {}", args.chunk, args.context);
    }
    backend_cpu::kernels::set_num_threads(args.threads)?;
    let t0 = Instant::now();
    let mode = if args.float { RunMode::Float } else { RunMode::Auto };
    let loaded = load_model(&args.model, args.context, mode)?;
    let load_s = t0.elapsed().as_secs_f64();
    if loaded.fake_quant {
        eprintln!("{}: quantized checkpoint, running in fake-quant mode (--float to disable)", args.model.display());
    }
    if !loaded.unused.is_empty() {
        eprintln!("warning: {} checkpoint tensors were not used: {}", loaded.unused.len(), loaded.unused.join(", "));
    }
    let tokenizer = match &args.prompt {
        Some(_) => {
            let path = args.model.join("tokenizer.json");
            Some(tokenizers::Tokenizer::from_file(&path).map_err(|e| anyhow!("cannot load {}: {e}", path.display()))?)
        }
        None => None,
    };
    let prompt: Vec<u32> = match (&args.prompt, &tokenizer) {
        (Some(text), Some(tok)) => {
            let text = if args.chat { qwen3_chat_prompt(text) } else { text.clone() };
            tok.encode(text, false).map_err(|e| anyhow!("tokenizing the prompt: {e}"))?.get_ids().to_vec()
        }
        _ => args.prompt_ids.clone(),
    };
    if prompt.is_empty() {
        bail!("the prompt is empty");
    }
    let vocab = loaded.config.vocab_size;
    if let Some(&bad) = prompt.iter().find(|&&id| id as usize >= vocab) {
        bail!("prompt id {bad} is outside the vocabulary of {} ({vocab} ids)", args.model.display());
    }
    let sampling = if args.temperature > 0.0 {
        Sampling::Random(RandomSampling {
            temperature: args.temperature,
            top_k: args.top_k,
            top_p: args.top_p,
            seed: args.seed,
        })
    } else {
        Sampling::Greedy
    };
    let config = GenerationConfig {
        max_new_tokens: args.max_new_tokens,
        prefill_chunk: args.chunk,
        sampling,
        eos_ids: loaded.config.eos_token_ids.clone(),
        collect_prompt_logits: args.logits_out.is_some(),
    };
    let mut generator = Generator::new(loaded.model)?;
    let out = generator.generate(&prompt, &config).context("generation failed")?;
    let all: Vec<u32> = prompt.iter().chain(&out.ids).copied().collect();
    let mut lines = vec![format!("ids: {}", all.iter().map(u32::to_string).collect::<Vec<_>>().join(","))];
    if let Some(tok) = &tokenizer {
        let text = tok.decode(&out.ids, true).map_err(|e| anyhow!("decoding: {e}"))?;
        lines.push(format!("text: {text}"));
    }
    if let (Some(path), Some(logits)) = (&args.logits_out, &out.prompt_logits) {
        write_f32_safetensors(path, "logits", &[1, prompt.len(), vocab], logits)?;
    }
    if args.timings {
        let t = &out.timings;
        lines.push(format!(
            "prefill_tok_s={:.2} decode_tok_s={:.2} load_s={:.3}",
            t.prefill_tokens_per_sec(),
            t.decode_tokens_per_sec(),
            load_s
        ));
    }
    Ok(lines)
}

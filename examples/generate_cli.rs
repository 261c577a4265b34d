//! The `generate` example's command: argument parsing and the run itself, as a library function so
//! tests drive it exactly like the command line does.

use anyhow::{anyhow, bail, ensure, Context, Result};
use aot::{load_chat_template, load_model, lower_for_context, stop_ids, Conversation, RunMode, TextStream};
use backend_qnn::sdk::{EmulatedHtp, SdkChunkModel, SdkError};
use backend_qnn::{QnnChunkModel, QnnModelError};
use checkpoint::{write_safetensors_atomic, StDtype, TensorBytes};
use clap::Parser;
use mllm_dsl::config::hf::HfConfig;
use mllm_dsl::config::run_sizes::{available_memory, RunSizes};
use mllm_dsl::runtime::{ChunkModel, GenerationConfig, GenerationOutput, Generator, RandomSampling, Sampling};
use std::collections::BTreeMap;
use std::io::{BufRead, Write};
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::time::Instant;

#[derive(Parser, Debug)]
#[command(about = "Generate tokens on the CPU with a model file from an HF checkpoint directory")]
pub struct GenerateArgs {
    /// HF model directory: config.json + model.safetensors (or shards with an index).
    #[arg(long)]
    pub model: PathBuf,
    /// Prompt as comma-separated token ids, e.g. 5,17,42.
    #[arg(long, value_delimiter = ',', conflicts_with_all = ["prompt", "chat"], required_unless_present_any = ["prompt", "chat"])]
    pub prompt_ids: Vec<u32>,
    /// Prompt text, tokenized with the directory's tokenizer.json.
    #[arg(long)]
    pub prompt: Option<String>,
    /// Chat with the model's own chat template (chat_template.jinja or tokenizer_config.json's
    /// `chat_template`; Qwen3's in non-thinking mode): --prompt is the user's turn; without
    /// --prompt, user turns are read from standard input, one per line, and each is answered with
    /// the whole conversation so far. Generation stops at the model's EOS tokens.
    #[arg(long)]
    pub chat: bool,
    /// With --chat: the system prompt (else the template's default, if it has one).
    #[arg(long, requires = "chat")]
    pub system: Option<String>,
    /// Tokens to generate at most (fewer on an EOS); prompt + this must fit in --context.
    #[arg(long, default_value_t = 32)]
    pub max_new_tokens: usize,
    /// Prefill chunk size (the last chunk is zero-padded).
    #[arg(long, default_value_t = 32)]
    pub chunk: usize,
    /// Context length (KV cache capacity, RoPE table rows).
    #[arg(long, default_value_t = 1024)]
    pub context: usize,
    /// Write the prompt positions' logits as safetensors tensor `logits`, f32 [1, prompt_len, vocab]
    /// (written atomically; a file of --model is refused).
    #[arg(long)]
    pub logits_out: Option<PathBuf>,
    /// Sampling temperature: 0 means greedy, else a finite value > 0.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    /// Keep the k most likely tokens (0: all).
    #[arg(long, default_value_t = 0)]
    pub top_k: usize,
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// CPU threads (0: all cores; more than the machine has are capped with a warning).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// Print `prefill_tok_s=X decode_tok_s=Y load_s=Z` as the last line.
    #[arg(long)]
    pub timings: bool,
    /// Run a quantized checkpoint without fake-quant (decoded weights, QDQ points off).
    #[arg(long)]
    pub float: bool,
    /// Generate from this QNN context binary (built from --model's quantized checkpoint with
    /// graphs for --chunk and 1 at --context) instead of the CPU model. Runs on the QNN SDK's HTP
    /// backend (libQnnHtp.so of QNN_SDK_ROOT; on x86 its HTP emulation), which needs
    /// `--features qnn-sdk`; --model supplies the tokenizer and config. See --qnn-emulate.
    #[arg(long, conflicts_with = "float")]
    pub qnn_context: Option<PathBuf>,
    /// Run --qnn-context on the CPU instead: backend-qnn's reference interpreter executes the
    /// graphs lowered again from --model (the binary must list exactly those graphs).
    #[arg(long, requires = "qnn_context")]
    pub qnn_emulate: bool,
}

/// Runs generation and returns the lines the command prints (`ids: …`, `text: …`, timings); with
/// --chat and no --prompt there are no user turns to read, so nothing is generated.
pub fn run_generate(args: &GenerateArgs) -> Result<Vec<String>> {
    run_generate_io(args, &mut std::io::empty(), &mut std::io::sink(), false)
}

/// Like [`run_generate`], reading chat turns from `input` (--chat without --prompt) and, with
/// `stream`, writing the generated text to `output` as it is produced (the returned lines then
/// leave it out).
pub fn run_generate_io(
    args: &GenerateArgs,
    input: &mut dyn BufRead,
    output: &mut dyn Write,
    stream: bool,
) -> Result<Vec<String>> {
    if args.chunk == 0 || args.chunk >= args.context {
        bail!("--chunk {} must be at least 1 and smaller than --context {}", args.chunk, args.context);
    }
    if let Some(path) = &args.logits_out {
        // Every file of the model directory (and the context binary) is an input.
        let mut inputs: Vec<PathBuf> = std::fs::read_dir(&args.model)
            .with_context(|| format!("listing --model {}", args.model.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .collect();
        inputs.extend(args.qnn_context.clone());
        mllm_dsl::files::ensure_not_input(path, &inputs).context("--logits-out")?;
    }
    // 0 is greedy; anything else (NaN, negative, inf included) goes to the sampler's checks.
    if args.temperature != 0.0 && !(args.temperature.is_finite() && args.temperature > 0.0) {
        bail!("--temperature {} must be 0 (greedy) or a finite value > 0", args.temperature);
    }
    // Sizes checked against each other, the config and the machine's memory before loading.
    let sizes = RunSizes { max_positions: args.context, context: args.context, chunk: args.chunk };
    sizes.check(&HfConfig::from_dir(&args.model)?, available_memory())?;
    backend_cpu::kernels::set_num_threads(args.threads)?;
    let t0 = Instant::now();
    let model = match &args.qnn_context {
        Some(binary) => {
            let hf = HfConfig::from_dir(&args.model)?;
            match load_qnn_context(args, binary)? {
                QnnModel::Emulated(m) => Model::Qnn(m, hf),
                QnnModel::Sdk(m) => Model::QnnSdk(m, hf),
            }
        }
        None => {
            let mode = if args.float { RunMode::Float } else { RunMode::Auto };
            let loaded = load_model(&args.model, args.context, mode)?;
            if loaded.fake_quant {
                let dir = args.model.display();
                eprintln!("{dir}: quantized checkpoint, running in fake-quant mode (--float to disable)");
            }
            if !loaded.unused.is_empty() {
                let (n, keys) = (loaded.unused.len(), loaded.unused.join(", "));
                eprintln!("warning: {n} checkpoint tensors were not used: {keys}");
            }
            Model::Cpu(Box::new(loaded.model), loaded.config)
        }
    };
    let load_s = t0.elapsed().as_secs_f64();
    let hf = match &model {
        Model::Cpu(_, c) | Model::Qnn(_, c) | Model::QnnSdk(_, c) => c.clone(),
    };
    let tokenizer = if args.prompt.is_some() || args.chat {
        let path = args.model.join("tokenizer.json");
        Some(tokenizers::Tokenizer::from_file(&path).map_err(|e| anyhow!("cannot load {}: {e}", path.display()))?)
    } else {
        None
    };
    let mut conversation = match args.chat {
        true => Some(Conversation::new(load_chat_template(&args.model)?, args.system.as_deref())),
        false => None,
    };
    let vocab = hf.vocab_size;
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
    let eos_ids = match &tokenizer {
        Some(tok) => stop_ids(&hf.eos_token_ids, conversation.as_ref().map(Conversation::template), tok),
        None => hf.eos_token_ids.clone(),
    };
    let config = GenerationConfig {
        max_new_tokens: args.max_new_tokens,
        prefill_chunk: args.chunk,
        sampling,
        eos_ids,
        collect_prompt_logits: args.logits_out.is_some(),
    };
    let mut generator = match model {
        Model::Cpu(m, _) => AnyGenerator::Cpu(Box::new(Generator::new(*m)?)),
        Model::Qnn(m, _) => AnyGenerator::Qnn(Box::new(Generator::new(*m)?)),
        Model::QnnSdk(m, _) => AnyGenerator::QnnSdk(Box::new(Generator::new(*m)?)),
    };
    let mut lines = Vec::new();
    // Several turns: user lines from `input` until it ends.
    if let (Some(conv), Some(tok), None) = (conversation.as_mut(), tokenizer.as_ref(), &args.prompt) {
        let mut line = String::new();
        loop {
            write!(output, "> ")?;
            output.flush()?;
            line.clear();
            if input.read_line(&mut line).context("reading the next user turn")? == 0 {
                break;
            }
            let user = line.trim();
            if user.is_empty() {
                continue;
            }
            let prompt = encode(tok, &conv.user_says(user)?, vocab, &args.model)?;
            fits_in_context(&prompt, args)?;
            let out = generator.generate(&prompt, &config, tok, stream, output)?;
            let reply = tok.decode(&out.ids, true).map_err(|e| anyhow!("decoding: {e}"))?;
            conv.assistant_said(reply.trim());
            lines.extend(turn_lines(&prompt, &out, tok, stream)?);
        }
        return Ok(lines);
    }
    let prompt: Vec<u32> = match (&args.prompt, &tokenizer) {
        (Some(text), Some(tok)) => {
            let text = match conversation.as_mut() {
                Some(conv) => conv.user_says(text)?,
                None => text.clone(),
            };
            encode(tok, &text, vocab, &args.model)?
        }
        _ => args.prompt_ids.clone(),
    };
    if prompt.is_empty() {
        bail!("the prompt is empty");
    }
    fits_in_context(&prompt, args)?;
    if let Some(&bad) = prompt.iter().find(|&&id| id as usize >= vocab) {
        bail!("prompt id {bad} is outside the vocabulary of {} ({vocab} ids)", args.model.display());
    }
    let out = match &tokenizer {
        Some(tok) => generator.generate(&prompt, &config, tok, stream, output)?,
        None => generator.generate_ids(&prompt, &config)?,
    };
    match &tokenizer {
        Some(tok) => lines.extend(turn_lines(&prompt, &out, tok, stream)?),
        None => lines.push(ids_line(&prompt, &out)),
    }
    if let (Some(path), Some(logits)) = (&args.logits_out, &out.prompt_logits) {
        let bytes: Vec<u8> = logits.iter().flat_map(|v| v.to_le_bytes()).collect();
        let tensor: TensorBytes<'_> = ("logits", StDtype::F32, &[1, prompt.len(), vocab], &bytes);
        write_safetensors_atomic(path, &[tensor], &BTreeMap::new())?;
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

/// `text`'s ids, checked against the vocabulary.
fn encode(tok: &tokenizers::Tokenizer, text: &str, vocab: usize, model: &Path) -> Result<Vec<u32>> {
    let ids = tok.encode(text, false).map_err(|e| anyhow!("tokenizing the prompt: {e}"))?.get_ids().to_vec();
    ensure!(!ids.is_empty(), "the prompt is empty");
    if let Some(&bad) = ids.iter().find(|&&id| id as usize >= vocab) {
        bail!("{}: tokenizer.json gives id {bad}, outside the model's vocabulary of {vocab} ids", model.display());
    }
    Ok(ids)
}

fn ids_line(prompt: &[u32], out: &GenerationOutput) -> String {
    let all: Vec<String> = prompt.iter().chain(&out.ids).map(u32::to_string).collect();
    format!("ids: {}", all.join(","))
}

/// `ids: …` and, unless the text was already streamed, `text: …`.
fn turn_lines(
    prompt: &[u32],
    out: &GenerationOutput,
    tok: &tokenizers::Tokenizer,
    streamed: bool,
) -> Result<Vec<String>> {
    let mut lines = vec![ids_line(prompt, out)];
    if !streamed {
        lines.push(format!("text: {}", tok.decode(&out.ids, true).map_err(|e| anyhow!("decoding: {e}"))?));
    }
    Ok(lines)
}

/// A generator over any of the models, so one can serve several turns.
enum AnyGenerator {
    Cpu(Box<Generator<backend_cpu::CpuChunkModel>>),
    Qnn(Box<Generator<QnnChunkModel<EmulatedHtp>>>),
    QnnSdk(Box<Generator<SdkChunkModel>>),
}

impl AnyGenerator {
    fn generate_with(
        &mut self,
        prompt: &[u32],
        config: &GenerationConfig,
        on_token: &mut dyn FnMut(u32) -> ControlFlow<()>,
    ) -> Result<GenerationOutput> {
        let out = match self {
            AnyGenerator::Cpu(g) => g.generate_streaming(prompt, config, on_token),
            AnyGenerator::Qnn(g) => g.generate_streaming(prompt, config, on_token),
            AnyGenerator::QnnSdk(g) => g.generate_streaming(prompt, config, on_token),
        };
        out.context("generation failed")
    }

    fn generate_ids(&mut self, prompt: &[u32], config: &GenerationConfig) -> Result<GenerationOutput> {
        self.generate_with(prompt, config, &mut |_| ControlFlow::Continue(()))
    }

    /// Generates; with `stream`, writes the text to `output` as each token arrives.
    fn generate(
        &mut self,
        prompt: &[u32],
        config: &GenerationConfig,
        tok: &tokenizers::Tokenizer,
        stream: bool,
        output: &mut dyn Write,
    ) -> Result<GenerationOutput> {
        if !stream {
            return self.generate_ids(prompt, config);
        }
        let mut text = TextStream::new(tok);
        let mut failed = None;
        let out = self.generate_with(prompt, config, &mut |id| {
            let written =
                text.push(id).and_then(|piece| Ok(output.write_all(piece.as_bytes()).and_then(|()| output.flush())?));
            match written {
                Ok(()) => ControlFlow::Continue(()),
                Err(e) => {
                    failed = Some(e);
                    ControlFlow::Break(())
                }
            }
        })?;
        if let Some(e) = failed {
            return Err(e.context("writing the generated text"));
        }
        writeln!(output)?;
        Ok(out)
    }
}

/// The model generation runs on, with the checkpoint's config (vocabulary, EOS ids).
enum Model {
    Cpu(Box<backend_cpu::CpuChunkModel>, HfConfig),
    Qnn(Box<QnnChunkModel<EmulatedHtp>>, HfConfig),
    QnnSdk(Box<SdkChunkModel>, HfConfig),
}

/// A context binary opened for generation: on the QNN SDK's backend or on the CPU emulator.
enum QnnModel {
    Emulated(Box<QnnChunkModel<EmulatedHtp>>),
    Sdk(Box<SdkChunkModel>),
}

/// The context binary at `binary` as a chunk model (see `--qnn-context` / `--qnn-emulate`).
fn load_qnn_context(args: &GenerateArgs, binary: &Path) -> Result<QnnModel> {
    if !args.qnn_emulate && !backend_qnn::sdk::sdk_available() {
        bail!(
            "--qnn-context runs the binary on the QNN SDK's HTP backend, and this build has no QNN SDK support: {} \
             (for this example: cargo run --example generate --features qnn-sdk); or add --qnn-emulate to run it \
             on the CPU",
            backend_qnn::sdk::ENABLE_SDK_HINT
        );
    }
    let bytes = std::fs::read(binary).with_context(|| format!("reading {}", binary.display()))?;
    let what = || format!("{} as a context binary of {}", binary.display(), args.model.display());
    if args.qnn_emulate {
        let graphs = lower_for_context(&args.model, args.chunk, args.context)?;
        let model = QnnChunkModel::emulated(graphs, &bytes).with_context(what)?;
        return Ok(QnnModel::Emulated(Box::new(model)));
    }
    // The graph I/O (and its encodings) comes from the binary's metadata; only when that lacks
    // scale/offsets are the graphs lowered again from --model to supply them.
    let model = match backend_qnn::sdk::open_context_binary_with_sdk(&bytes, None) {
        Err(SdkError::Model(QnnModelError::MissingEncoding { graph, tensor, .. })) => {
            eprintln!(
                "{}: the metadata of `{graph}` has no encoding for `{tensor}`; lowering {} again for the I/O \
                 encodings",
                binary.display(),
                args.model.display()
            );
            let graphs = lower_for_context(&args.model, args.chunk, args.context)?;
            backend_qnn::sdk::open_context_binary_with_sdk(&bytes, Some(&graphs))
        }
        other => other,
    };
    let model = model.with_context(what)?;
    let chunks = model.chunk_lens();
    ensure!(
        chunks.contains(&args.chunk),
        "{} has graphs for chunks {chunks:?}, not for --chunk {}",
        binary.display(),
        args.chunk
    );
    let ctx = model.layout().context_len;
    ensure!(ctx == args.context, "{} was built for context {ctx}, not --context {}", binary.display(), args.context);
    Ok(QnnModel::Sdk(Box::new(model)))
}

/// The prompt plus `--max-new-tokens` must fit in `--context`: checked before generating, so a
/// run never stops short without a word.
fn fits_in_context(prompt: &[u32], args: &GenerateArgs) -> Result<()> {
    let wanted = prompt.len().saturating_add(args.max_new_tokens);
    ensure!(
        wanted <= args.context,
        "the prompt ({} tokens) + --max-new-tokens {} = {wanted} tokens do not fit in --context {}",
        prompt.len(),
        args.max_new_tokens,
        args.context
    );
    Ok(())
}

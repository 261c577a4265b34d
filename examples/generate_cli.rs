//! The `generate` example's command: argument parsing and the run itself, as a library function so
//! tests drive it exactly like the command line does.

use anyhow::{anyhow, bail, ensure, Context, Result};
use aot::{load_model, lower_for_context, qwen3_chat_prompt, RunMode};
use backend_qnn::sdk::{EmulatedHtp, SdkChunkModel, SdkError};
use backend_qnn::{QnnChunkModel, QnnModelError};
use checkpoint::{write_safetensors_atomic, StDtype, TensorBytes};
use clap::Parser;
use mllm_dsl::config::hf::HfConfig;
use mllm_dsl::config::run_sizes::{available_memory, RunSizes};
use mllm_dsl::runtime::{ChunkModel, GenerationConfig, GenerationOutput, Generator, RandomSampling, Sampling};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
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

/// Runs generation and returns the lines the command prints.
pub fn run_generate(args: &GenerateArgs) -> Result<Vec<String>> {
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
    let wanted = prompt.len().saturating_add(args.max_new_tokens);
    ensure!(
        wanted <= args.context,
        "the prompt ({} tokens) + --max-new-tokens {} = {wanted} tokens do not fit in --context {}",
        prompt.len(),
        args.max_new_tokens,
        args.context
    );
    let vocab = hf.vocab_size;
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
        eos_ids: hf.eos_token_ids.clone(),
        collect_prompt_logits: args.logits_out.is_some(),
    };
    let out = match model {
        Model::Cpu(m, _) => generate(*m, &prompt, &config)?,
        Model::Qnn(m, _) => generate(*m, &prompt, &config)?,
        Model::QnnSdk(m, _) => generate(*m, &prompt, &config)?,
    };
    let all: Vec<u32> = prompt.iter().chain(&out.ids).copied().collect();
    let mut lines = vec![format!("ids: {}", all.iter().map(u32::to_string).collect::<Vec<_>>().join(","))];
    if let Some(tok) = &tokenizer {
        let text = tok.decode(&out.ids, true).map_err(|e| anyhow!("decoding: {e}"))?;
        lines.push(format!("text: {text}"));
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

fn generate<M: ChunkModel>(model: M, prompt: &[u32], config: &GenerationConfig) -> Result<GenerationOutput> {
    Generator::new(model)?.generate(prompt, config).context("generation failed")
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

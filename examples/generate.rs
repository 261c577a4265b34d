//! Text generation on the CPU from an HF checkpoint directory.
//!
//! ```text
//! cargo run --release --example generate -- --model fixtures/qwen3-dev-f32 --prompt-ids 5,17,42
//! ```
//! Prints `ids: a,b,c,…` (prompt then generated ids); with `--prompt` the text first, as it is
//! produced. `--chat` applies the model's own chat template (`--system` sets the system prompt);
//! without `--prompt` it reads user turns from standard input, one per line:
//!
//! ```text
//! cargo run --release --example generate -- --model "$(scripts/fetch-smollm2)" --chat \
//!     --prompt "What is the capital of France?"
//! ```
//!
//! A quantized checkpoint (pymllm's export, or `quantize`'s output) runs in fake-quant mode (its
//! QDQ points quantize with their stored parameters); `--float` runs it without them.
//! `--qnn-context FILE` generates from a QNN context binary built from it instead: on Qualcomm's
//! HTP backend (`scripts/fetch-qnn-sdk` or `QNN_SDK_ROOT`; on x86 its emulation), or with
//! `--qnn-emulate` on backend-qnn's interpreter:
//!
//! ```text
//! cargo run --release --example generate -- --model fixtures/pymllm-qwen3-dev-f32 --prompt-ids 5,17,99 \
//!     --chunk 4 --context 16 --qnn-context qwen3-tiny.bin --qnn-emulate
//! ```

use std::io::{BufRead, Write};
use std::path::PathBuf;

use anyhow::Result;
use aot::GenerateRequest;
use clap::Parser;

fn main() -> Result<()> {
    let args = GenerateArgs::parse();
    // Text prompts stream their answer as it is produced; the summary lines follow.
    let stream = args.prompt.is_some() || args.chat;
    for line in run_generate_io(&args, &mut std::io::stdin().lock(), &mut std::io::stdout(), stream)? {
        println!("{line}");
    }
    Ok(())
}

#[derive(Parser, Debug, Clone)]
#[command(about = "Generate tokens on the CPU with a model file from an HF checkpoint directory")]
pub struct GenerateArgs {
    /// HF model directory: config.json + model.safetensors (or shards with an index) or a GGUF file (converted once into the cache).
    #[arg(long, value_name = "HF_DIR|GGUF")]
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
    /// Prefill chunk size (the last chunk is zero-padded). Repeat for a graph family: each step then
    /// runs on the graph of least modelled cost (--select), decode on chunk 1.
    #[arg(long, default_values_t = [32])]
    pub chunk: Vec<usize>,
    /// Context length (KV cache capacity, RoPE table rows). Repeat for a graph family: a sequence
    /// starts on the smallest and moves to a larger one only when it must.
    #[arg(long, default_values_t = [1024])]
    pub context: Vec<usize>,
    /// Pick each step's graph among --chunk x --context (and 1) by its modelled cost on --target
    /// (implied by several --chunk or --context values).
    #[arg(long)]
    pub select: bool,
    /// The phone the cost model describes: sm8650 (HTP v75) or sm8750 (HTP v79).
    #[arg(long, default_value = "sm8650")]
    pub target: String,
    /// Print every graph choice and context move (`graph: ...` lines after the ids).
    #[arg(long)]
    pub verbose: bool,
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
    /// Multiply a float checkpoint's bf16 weights in bf16: each linear's input rounded to bf16,
    /// about twice the prefill speed on CPUs with AMX or on AMD's with AVX-512 BF16, logits no
    /// longer the float references' (docs/cpu.md has the measured cost).
    #[arg(long)]
    pub bf16_products: bool,
    /// Generate from this QNN context binary (built from --model's quantized checkpoint with
    /// graphs for --chunk and 1 at --context) instead of the CPU model. Runs on Qualcomm's HTP
    /// backend (libQnnHtp.so of QNN_SDK_ROOT, else of `scripts/fetch-qnn-sdk`'s cache; on x86 its
    /// HTP emulation, which loads qwen3_aot's qnn/context.x86.bin, not the weight-shared
    /// context.bin); --model supplies the tokenizer and config. A shard set
    /// (`context_<i>_of_<n>[.x86].bin`) is given as its directory or first file; its token
    /// embedding is gathered on the CPU from `embedding.safetensors` in the same directory.
    /// See --qnn-emulate.
    #[arg(long, conflicts_with_all = ["float", "bf16_products"])]
    pub qnn_context: Option<PathBuf>,
    /// Run --qnn-context on the CPU instead: backend-qnn's reference interpreter executes the
    /// graphs lowered again from --model (the binary must list exactly those graphs).
    #[arg(long, requires = "qnn_context")]
    pub qnn_emulate: bool,
}

impl GenerateArgs {
    /// The run these arguments ask for.
    pub fn request(&self) -> GenerateRequest {
        let a = self.clone();
        GenerateRequest {
            model: a.model,
            prompt_ids: a.prompt_ids,
            prompt: a.prompt,
            chat: a.chat,
            system: a.system,
            max_new_tokens: a.max_new_tokens,
            chunks: a.chunk,
            contexts: a.context,
            select: a.select,
            target: a.target,
            verbose: a.verbose,
            logits_out: a.logits_out,
            temperature: a.temperature,
            top_k: a.top_k,
            top_p: a.top_p,
            seed: a.seed,
            threads: a.threads,
            timings: a.timings,
            float: a.float,
            bf16_products: a.bf16_products,
            qnn_context: a.qnn_context,
            qnn_emulate: a.qnn_emulate,
        }
    }
}

/// Runs generation and returns the lines the command prints (see [`aot::generation::run`]); with
/// --chat and no --prompt there are no user turns to read, so nothing is generated.
pub fn run_generate(args: &GenerateArgs) -> Result<Vec<String>> {
    run_generate_io(args, &mut std::io::empty(), &mut std::io::sink(), false)
}

/// Like [`run_generate`], reading chat turns from `input` and streaming to `output`.
pub fn run_generate_io(
    args: &GenerateArgs,
    input: &mut dyn BufRead,
    output: &mut dyn Write,
    stream: bool,
) -> Result<Vec<String>> {
    let mut request = args.request();
    request.model = aot::resolve_model(&request.model)?;
    let model = request.model.display().to_string();
    let mut loaded = |runner: &aot::Runner| {
        if runner.fake_quant {
            eprintln!("{model}: quantized checkpoint, running in fake-quant mode (--float to disable)");
        }
        runner.notes.iter().for_each(|note| eprintln!("{note}"));
    };
    aot::generation::run(&request, input, output, stream, &mut loaded)
        .map_err(|e| mllm_examples::with_names(e, mllm_examples::GENERATE_FLAG_NAMES))
}

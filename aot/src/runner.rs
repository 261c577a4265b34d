//! A model to generate from: a checkpoint directory on the CPU (float or fake-quant), or a QNN
//! context binary built from it, on the QNN SDK's HTP backend or on the CPU emulator; one prompt
//! at a time or a conversation read turn by turn, optionally streaming the text as it is produced.

use std::io::{BufRead, Write};
use std::ops::ControlFlow;
use std::path::Path;

use crate::error::{bail, ensure, AotError, Context, Result};
use backend_cpu::quant::SinkPrefix;
use backend_cpu::CpuChunkModel;
use backend_qnn::sdk::{EmulatedHtp, SdkChunkModel, SdkError};
use backend_qnn::{QnnChunkModel, QnnModelError};
use models::hf::HfConfig;
use runtime::{ChunkModel, GenerationConfig, GenerationOutput, Generator};

use crate::chat::{Conversation, TextStream};
use crate::compile::lower_for_context;
use crate::load::{load_model, RunMode};

/// Where a [`Runner`] executes: a generator over one of the models.
enum RunnerGenerator {
    /// Eager CPU execution of the checkpoint.
    Cpu(Box<Generator<CpuChunkModel>>),
    /// The context binary's graphs on backend-qnn's reference interpreter.
    Emulated(Box<Generator<QnnChunkModel<EmulatedHtp>>>),
    /// The context binary on the QNN SDK's HTP backend.
    Sdk(Box<Generator<SdkChunkModel>>),
}

/// A model loaded for generation, with its checkpoint's config (vocabulary, EOS ids); it keeps
/// its generator, so it can answer several turns.
pub struct Runner {
    pub config: HfConfig,
    /// What the user should know about how it was loaded (fake-quant mode, unused tensors, graphs
    /// lowered again for their I/O encodings).
    pub notes: Vec<String>,
    generator: RunnerGenerator,
}

impl Runner {
    /// The checkpoint `dir` on the CPU: fake-quant when it is quantized, unless `mode` says float.
    pub fn cpu(dir: &Path, context: usize, mode: RunMode) -> Result<Runner> {
        let loaded = load_model(dir, context, mode)?;
        let mut notes = Vec::new();
        if loaded.fake_quant {
            notes.push(format!(
                "{}: quantized checkpoint, running in fake-quant mode (--float to disable)",
                dir.display()
            ));
        }
        if !loaded.unused.is_empty() {
            let (n, keys) = (loaded.unused.len(), loaded.unused.join(", "));
            notes.push(format!("warning: {n} checkpoint tensors were not used: {keys}"));
        }
        let mut generator = Generator::new(loaded.model)?;
        if let Some(prefix) = shipped_prefix(dir, &mut notes)? {
            generator.set_prefix(prefix.into_kv_prefix())?;
        }
        let generator = RunnerGenerator::Cpu(Box::new(generator));
        Ok(Runner { config: loaded.config, notes, generator })
    }

    /// The context binary at `binary`, built from the quantized checkpoint `dir` with graphs for
    /// `chunk` and 1 at `context`: on the CPU emulator when `emulate` (the graphs lowered again
    /// from `dir`), else on Qualcomm's QNN libraries (`QNN_SDK_ROOT`, else `scripts/fetch-qnn-sdk`'s cache).
    pub fn context_binary(dir: &Path, binary: &Path, chunk: usize, context: usize, emulate: bool) -> Result<Runner> {
        if !emulate {
            // Before reading anything: without Qualcomm's libraries say how to get them.
            backend_qnn::sdk::check_sdk_libraries().context(
                "--qnn-context runs the binary on Qualcomm's HTP backend (x86: its emulation); or add --qnn-emulate to \
                 run it on backend-qnn's interpreter",
            )?;
            refuse_shared_binary_on_x86(binary)?;
        }
        let config = HfConfig::from_dir(dir)?;
        let bytes = std::fs::read(binary).with_context(|| format!("reading {}", binary.display()))?;
        let what = || format!("{} as a context binary of {}", binary.display(), dir.display());
        let mut notes = Vec::new();
        if emulate {
            let graphs = lower_for_context(dir, chunk, context)?;
            let model = QnnChunkModel::emulated(graphs, &bytes).with_context(what)?;
            let generator = RunnerGenerator::Emulated(Box::new(with_prefix(model, dir, &mut notes)?));
            return Ok(Runner { config, notes, generator });
        }
        // The graph I/O (and its encodings) comes from the binary's metadata; only when that lacks
        // scale/offsets are the graphs lowered again from `dir` to supply them.
        let model = match backend_qnn::sdk::open_context_binary_with_sdk(&bytes, None) {
            Err(SdkError::Model(QnnModelError::MissingEncoding { graph, tensor, .. })) => {
                notes.push(format!(
                    "{}: the metadata of `{graph}` has no encoding for `{tensor}`; lowering {} again for the I/O \
                     encodings",
                    binary.display(),
                    dir.display()
                ));
                let graphs = lower_for_context(dir, chunk, context)?;
                backend_qnn::sdk::open_context_binary_with_sdk(&bytes, Some(&graphs))
            }
            other => other,
        };
        let model = model.with_context(what)?;
        let chunks = model.chunk_lens();
        ensure!(
            chunks.contains(&chunk),
            "{} has graphs for chunks {chunks:?}, not for --chunk {chunk}",
            binary.display()
        );
        let ctx = model.layout().context_len;
        ensure!(ctx == context, "{} was built for context {ctx}, not --context {context}", binary.display());
        let generator = RunnerGenerator::Sdk(Box::new(with_prefix(model, dir, &mut notes)?));
        Ok(Runner { config, notes, generator })
    }

    /// Generates after `prompt` (ids checked against the vocabulary of `self.config`); with a
    /// `stream` tokenizer, writes the text to `output` as each token arrives (then a newline).
    pub fn generate(
        &mut self,
        prompt: &[u32],
        config: &GenerationConfig,
        stream: Option<&tokenizers::Tokenizer>,
        output: &mut dyn Write,
    ) -> Result<GenerationOutput> {
        ensure!(!prompt.is_empty(), "the prompt is empty");
        let vocab = self.config.vocab_size;
        if let Some(&bad) = prompt.iter().find(|&&id| id as usize >= vocab) {
            let dir = self.config.source.parent().unwrap_or(&self.config.source);
            bail!("prompt id {bad} is outside the vocabulary of {} ({vocab} ids)", dir.display());
        }
        let Some(tokenizer) = stream else {
            return self.generate_with(prompt, config, &mut |_| ControlFlow::Continue(()));
        };
        let mut text = TextStream::new(tokenizer);
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
            return Err(AotError::Step { context: "writing the generated text".into(), cause: Box::new(e) });
        }
        writeln!(output)?;
        Ok(out)
    }

    /// A conversation: user turns read from `input` (one per line, blank lines skipped, `> `
    /// written to `output` before each) until it ends; each answered with the whole conversation
    /// so far as the prompt, which `check` sees first. Returns each turn's prompt and output.
    pub fn chat(
        &mut self,
        conversation: &mut Conversation,
        tokenizer: &tokenizers::Tokenizer,
        config: &GenerationConfig,
        io: (&mut dyn BufRead, &mut dyn Write),
        stream: bool,
        check: &dyn Fn(&[u32]) -> Result<()>,
    ) -> Result<Vec<(Vec<u32>, GenerationOutput)>> {
        let (input, output) = io;
        let (mut turns, mut line) = (Vec::new(), String::new());
        loop {
            write!(output, "> ")?;
            output.flush()?;
            line.clear();
            if input.read_line(&mut line).context("reading the next user turn")? == 0 {
                return Ok(turns);
            }
            let user = line.trim();
            if user.is_empty() {
                continue;
            }
            let prompt = crate::sequences::encode_prompt(tokenizer, &conversation.user_says(user)?, &self.config)?;
            check(&prompt)?;
            let out = self.generate(&prompt, config, stream.then_some(tokenizer), output)?;
            let reply = tokenizer.decode(&out.ids, true).map_err(|e| AotError::tokenizer("decoding", e))?;
            conversation.assistant_said(reply.trim());
            turns.push((prompt, out));
        }
    }

    fn generate_with(
        &mut self,
        prompt: &[u32],
        config: &GenerationConfig,
        on_token: &mut dyn FnMut(u32) -> ControlFlow<()>,
    ) -> Result<GenerationOutput> {
        let out = match &mut self.generator {
            RunnerGenerator::Cpu(g) => g.generate_streaming(prompt, config, on_token),
            RunnerGenerator::Emulated(g) => g.generate_streaming(prompt, config, on_token),
            RunnerGenerator::Sdk(g) => g.generate_streaming(prompt, config, on_token),
        };
        out.context("generation failed")
    }
}

/// The attention-sink prefix the checkpoint `dir` ships, noted in `notes` when there is one.
fn shipped_prefix(dir: &Path, notes: &mut Vec<String>) -> Result<Option<SinkPrefix>> {
    let prefix =
        SinkPrefix::load_beside(dir).with_context(|| format!("the attention-sink prefix of {}", dir.display()))?;
    if let Some(p) = &prefix {
        notes.push(format!(
            "{}: every sequence starts from its {}-token attention-sink prefix {:?} ({})",
            dir.display(),
            p.len(),
            p.ids,
            backend_cpu::quant::SINK_PREFIX_FILE
        ));
    }
    Ok(prefix)
}

/// A generator over a context binary's graphs, starting every sequence from the prefix the
/// checkpoint `dir` ships (as codes of the graphs' K/V inputs), when it ships one.
fn with_prefix<A: backend_qnn::sdk::QnnExecApi>(
    model: QnnChunkModel<A>,
    dir: &Path,
    notes: &mut Vec<String>,
) -> Result<Generator<QnnChunkModel<A>>> {
    let window = HfConfig::from_dir(dir)?.attention.sliding_window;
    let model = model.with_sliding_window(window).context("the model's sliding window")?;
    let prefix = match shipped_prefix(dir, notes)? {
        Some(p) => Some(model.kv_prefix(p.len(), &p.keys, &p.values).context("the attention-sink prefix")?),
        None => None,
    };
    let mut generator = Generator::new(model)?;
    if let Some(prefix) = prefix {
        generator.set_prefix(prefix)?;
    }
    Ok(generator)
}

/// Qualcomm's x86 emulation cannot run a weight-shared context binary, and its libQnnHtp.so does
/// not refuse one: `contextCreateFromBinary` crashes (SIGSEGV, QAIRT 2.51). `qwen3_aot` writes an
/// unshared `<stem>.x86.bin` beside each shared `<stem>.bin` for this reason, so a binary with that
/// sibling is the device's and is refused here, naming the one to use.
fn refuse_shared_binary_on_x86(binary: &Path) -> Result<()> {
    if !cfg!(target_arch = "x86_64") || binary.extension().is_none_or(|e| e != "bin") {
        return Ok(());
    }
    let Some(stem) = binary.file_stem().and_then(|s| s.to_str()).filter(|s| !s.ends_with(".x86")) else {
        return Ok(());
    };
    let sibling = binary.with_file_name(format!("{stem}.x86.bin"));
    ensure!(
        !sibling.is_file(),
        "{} is the weight-shared context binary for the device, which Qualcomm's x86 HTP emulation cannot load \
         (its libQnnHtp.so crashes on it); on this machine use {}",
        binary.display(),
        sibling.display()
    );
    Ok(())
}

//! A model to generate from: a checkpoint directory on the CPU (float or fake-quant), or a QNN
//! context binary built from it, on the QNN SDK's HTP backend or on the CPU emulator; one prompt
//! at a time or a conversation read turn by turn, optionally streaming the text as it is produced.

use std::io::{BufRead, Write};
use std::ops::ControlFlow;
use std::path::Path;

use crate::error::{bail, ensure, AotError, Context, Result};
use backend_cpu::quant::SinkPrefix;
use backend_cpu::CpuChunkModel;
use backend_qnn::sdk::{EmulatedHtp, SdkApi, SdkChunkModel, SdkError};
use backend_qnn::sharded::{shard_set_files, ShardBinary};
use backend_qnn::{GraphIo, QnnChunkModel, QnnModelError, ShardedChunkModel};
use models::hf::HfConfig;
use runtime::{ChunkModel, GenerationConfig, GenerationOutput, Generator, GraphMenu};

use crate::chat::{Conversation, TextStream};
use crate::compile::{lower_family, lower_for_context};
use crate::family::GraphFamily;
use crate::load::{load_float_with, load_model, RunMode};
use backend_cpu::Bf16Products;

/// Where a [`Runner`] executes: a generator over one of the models.
enum RunnerGenerator {
    /// Eager CPU execution of the checkpoint.
    Cpu(Box<Generator<CpuChunkModel>>),
    /// The same with the KV cache kept as its 8-bit codes (fake-quant mode).
    CpuKv8(Box<Generator<CpuChunkModel<u8>>>),
    /// The context binary's graphs on backend-qnn's reference interpreter.
    Emulated(Box<Generator<QnnChunkModel<EmulatedHtp>>>),
    /// A set of shard binaries chained on the QNN SDK's HTP backend.
    Sharded(Box<Generator<ShardedChunkModel<SdkApi>>>),
    /// The context binary on the QNN SDK's HTP backend.
    Sdk(Box<Generator<SdkChunkModel>>),
}

/// A model loaded for generation, with its checkpoint's config (vocabulary, EOS ids); it keeps
/// its generator, so it can answer several turns.
pub struct Runner {
    pub config: HfConfig,
    /// What the user should know about how it was loaded (unused tensors, graphs lowered again for
    /// their I/O encodings).
    pub notes: Vec<String>,
    /// A quantized checkpoint on the CPU with its QDQ points on (fake-quant mode): a command line
    /// says so with its way to turn them off.
    pub fake_quant: bool,
    generator: RunnerGenerator,
}

impl Runner {
    /// The checkpoint `dir` on the CPU: fake-quant when it is quantized, unless `mode` says float.
    pub fn cpu(dir: &Path, context: usize, mode: RunMode) -> Result<Runner> {
        Runner::cpu_with(dir, context, mode, Bf16Products::F32)
    }

    /// [`Runner::cpu`] with a float checkpoint's bf16 weights multiplied as `bf16` says
    /// ([`Bf16Products::Bf16`] is refused for a quantized checkpoint, which has no bf16 matrices).
    pub fn cpu_with(dir: &Path, context: usize, mode: RunMode, bf16: Bf16Products) -> Result<Runner> {
        let mut notes = Vec::new();
        let loaded = match bf16 {
            Bf16Products::F32 => load_model(dir, context, mode)?,
            Bf16Products::Bf16 => {
                let ckpt = checkpoint::SafetensorsCheckpoint::open(dir)?;
                ensure!(
                    !backend_cpu::quant::is_quantized_checkpoint(&ckpt),
                    "{}: bf16 products apply to a float checkpoint's bf16 weights; this one is quantized",
                    dir.display()
                );
                if !ckpt.keys().iter().any(|k| matches!(ckpt.info(k), Ok((checkpoint::StDtype::BF16, _)))) {
                    notes.push(format!(
                        "warning: {} has no bf16 tensors; bf16 products change nothing (scripts/to-bf16.py \
                         writes a bf16 copy)",
                        dir.display()
                    ));
                }
                load_float_with(dir, context, bf16)?
            }
        };
        if !loaded.unused.is_empty() {
            let (n, keys) = (loaded.unused.len(), loaded.unused.join(", "));
            notes.push(format!("warning: {n} checkpoint tensors were not used: {keys}"));
        }
        // A shipped attention-sink prefix holds float K/V, off the KV grids: it keeps an f32 cache.
        let generator = match (shipped_prefix(dir, &mut notes)?, loaded.kv8_grids) {
            (None, Some(grids)) => {
                let model =
                    loaded.model.into_kv8(grids).map_err(|e| AotError::invalid(format!("the 8-bit KV cache: {e}")))?;
                RunnerGenerator::CpuKv8(Box::new(Generator::new(model)?))
            }
            (prefix, _) => {
                let mut generator = Generator::new(loaded.model)?;
                if let Some(prefix) = prefix {
                    generator.set_prefix(prefix.into_kv_prefix())?;
                }
                RunnerGenerator::Cpu(Box::new(generator))
            }
        };
        Ok(Runner { config: loaded.config, notes, generator, fake_quant: loaded.fake_quant })
    }

    /// The context binary at `binary`, built from the quantized checkpoint `dir` with graphs for
    /// `chunk` and 1 at `context`: on the CPU emulator when `emulate` (the graphs lowered again
    /// from `dir`), else on Qualcomm's QNN libraries (`QNN_SDK_ROOT`, else `scripts/fetch-qnn-sdk`'s cache).
    pub fn context_binary(dir: &Path, binary: &Path, chunk: usize, context: usize, emulate: bool) -> Result<Runner> {
        if is_shard_set(binary) {
            ensure!(
                !emulate,
                "{}: a set of shard binaries runs on Qualcomm's HTP backend; GenerateRequest::qnn_emulate takes one context \
                 binary",
                binary.display()
            );
            return Runner::shard_set(dir, binary, chunk, context);
        }
        let (config, bytes) = read_binary(dir, binary, emulate)?;
        let what = || format!("{} as a context binary of {}", binary.display(), dir.display());
        let mut notes = Vec::new();
        if emulate {
            let graphs = lower_for_context(dir, chunk, context)?;
            let model = QnnChunkModel::emulated(graphs, &bytes).with_context(what)?;
            let generator = RunnerGenerator::Emulated(Box::new(with_prefix(model, dir, &mut notes)?));
            return Ok(Runner { config, notes, generator, fake_quant: false });
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
            "{} has graphs for chunks {chunks:?}, not for chunk {chunk}",
            binary.display()
        );
        let ctx = model.layout().context_len;
        ensure!(ctx == context, "{} was built for context {ctx}, not {context}", binary.display());
        let generator = RunnerGenerator::Sdk(Box::new(with_prefix(model, dir, &mut notes)?));
        Ok(Runner { config, notes, generator, fake_quant: false })
    }

    /// The context binary at `binary`, built from the quantized checkpoint `dir` with every graph
    /// of `family`: on the CPU emulator when `emulate` (the family lowered again from `dir`), else
    /// on Qualcomm's QNN libraries. The binary must hold exactly the family's graphs (named as the
    /// family names them); anything else is refused naming the graphs on both sides.
    pub fn context_binary_family(dir: &Path, binary: &Path, family: &GraphFamily, emulate: bool) -> Result<Runner> {
        let (config, bytes) = read_binary(dir, binary, emulate)?;
        let what = || format!("{} as a context binary of {}", binary.display(), dir.display());
        let mut notes = Vec::new();
        let source = binary.display().to_string();
        if emulate {
            let graphs = lower_family(dir, family)?;
            let model = QnnChunkModel::emulated(graphs, &bytes).with_context(what)?;
            let names: Vec<String> = model.graph_shapes().into_iter().map(|(n, _, _)| n).collect();
            family.check_graph_set(&source, &names)?;
            let generator = RunnerGenerator::Emulated(Box::new(with_prefix(model, dir, &mut notes)?));
            return Ok(Runner { config, notes, generator, fake_quant: false });
        }
        let model = match backend_qnn::sdk::open_context_binary_with_sdk(&bytes, None) {
            Err(SdkError::Model(QnnModelError::MissingEncoding { .. })) => {
                let graphs = lower_family(dir, family)?;
                backend_qnn::sdk::open_context_binary_with_sdk(&bytes, Some(&graphs))
            }
            other => other,
        };
        let model = model.with_context(what)?;
        let names: Vec<String> = model.graph_shapes().into_iter().map(|(n, _, _)| n).collect();
        family.check_graph_set(&source, &names)?;
        let generator = RunnerGenerator::Sdk(Box::new(with_prefix(model, dir, &mut notes)?));
        Ok(Runner { config, notes, generator, fake_quant: false })
    }

    /// From now on every step runs on the graph of `menu` of least modelled cost
    /// ([`runtime::GraphMenu`]).
    pub fn select(&mut self, menu: GraphMenu) -> Result<()> {
        match &mut self.generator {
            RunnerGenerator::Cpu(g) => g.set_menu(menu),
            RunnerGenerator::CpuKv8(g) => g.set_menu(menu),
            RunnerGenerator::Emulated(g) => g.set_menu(menu),
            RunnerGenerator::Sdk(g) => g.set_menu(menu),
            RunnerGenerator::Sharded(g) => g.set_menu(menu),
        }
        .context("choosing graphs by their modelled cost")
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
            let prompt = crate::sequences::encode_prompt(
                tokenizer,
                &conversation.user_says(user)?,
                crate::sequences::PromptText::Chat,
                &self.config,
            )?;
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
            RunnerGenerator::CpuKv8(g) => g.generate_streaming(prompt, config, on_token),
            RunnerGenerator::Emulated(g) => g.generate_streaming(prompt, config, on_token),
            RunnerGenerator::Sdk(g) => g.generate_streaming(prompt, config, on_token),
            RunnerGenerator::Sharded(g) => g.generate_streaming(prompt, config, on_token),
        };
        out.context("generation failed")
    }
}

impl Runner {
    /// The shard binaries `context_<i>_of_<n>.bin` in `path` (a directory, or one of the files)
    /// chained on Qualcomm's HTP backend (on x86 its emulation, with the `.x86.bin` set). Every
    /// binary's metadata is read with libQnnSystem.so before the backend loads any, and the set
    /// is refused, naming the file, when a shard is missing, extra, or from another build.
    pub fn shard_set(dir: &Path, path: &Path, chunk: usize, context: usize) -> Result<Runner> {
        let paths = backend_qnn::sdk::check_sdk_libraries()
            .context("shard binaries run on Qualcomm's HTP backend (x86: its emulation)")?;
        let x86 = cfg!(target_arch = "x86_64");
        let files = shard_set_files(path, x86).map_err(|e| match x86 {
            true => AotError::invalid(format!(
                "{e} (Qualcomm's x86 HTP emulation runs the unshared context_<i>_of_<n>.x86.bin set qwen3_aot writes                  beside the device binaries)"
            )),
            false => e.into(),
        })?;
        let config = HfConfig::from_dir(dir)?;
        let api = SdkApi::load_for_execution(&paths)?;
        let mut notes = Vec::new();
        // Every binary's metadata first (libQnnSystem.so), before the backend loads any.
        let mut read = Vec::with_capacity(files.len());
        for f in &files {
            let binary = std::fs::read(f).with_context(|| format!("reading {}", f.display()))?;
            let info = api.binary_info(&binary).map_err(QnnModelError::from);
            let info = info.with_context(|| format!("reading the metadata of {}", f.display()))?;
            read.push((f, binary, info));
        }
        let encodings: Result<(), QnnModelError> =
            read.iter().flat_map(|(_, _, info)| &info.graphs).try_for_each(GraphIo::check_encodings);
        let ios = match encodings {
            Ok(()) => read.iter().map(|(_, _, info)| info.graphs.clone()).collect(),
            Err(QnnModelError::MissingEncoding { graph, tensor, .. }) => {
                notes.push(format!(
                    "the metadata of `{graph}` has no encoding for `{tensor}`; lowering {} again for the I/O encodings",
                    dir.display()
                ));
                let plan = plan_of_set(&read.iter().map(|(_, _, i)| i).collect::<Vec<_>>())?;
                let compiled = crate::compile::compile_for_context(dir, chunk, context)?;
                let ckpt = checkpoint::SafetensorsCheckpoint::open(dir)?;
                let lowered =
                    crate::sharded_aot::lower_shards(&compiled, &plan, &ckpt, backend_qnn::LowerOptions::default())?;
                let mut ios = Vec::new();
                for ((_, _, info), graphs) in read.iter().zip(&lowered) {
                    let mut io = Vec::new();
                    for g in &info.graphs {
                        let l = graphs.iter().find(|l| l.name == g.name).with_context(|| {
                            format!("graph `{}` of the shard set is not among the lowered shards", g.name)
                        })?;
                        io.push(GraphIo::from_graph(l)?);
                    }
                    ios.push(io);
                }
                ios
            }
            Err(e) => return Err(e.into()),
        };
        // A set whose first shard takes hidden_states gathers the token embedding on the CPU.
        let set_dir = files[0].parent().unwrap_or(dir);
        let table_path = set_dir.join(crate::cpu_embedding::EMBEDDING_FILE);
        let takes_rows = ios[0].iter().any(|g| g.inputs.iter().any(|t| t.name == backend_qnn::HIDDEN_STATES));
        let embedding: Option<Box<dyn backend_qnn::TokenEmbedding>> = match (takes_rows, table_path.exists()) {
            (true, true) => {
                notes.push(format!("token embedding gathered on the CPU from {}", table_path.display()));
                Some(Box::new(crate::cpu_embedding::EmbeddingTable::open(&table_path)?))
            }
            (true, false) => bail!(
                "{} is missing: the first shard {} takes hidden_states, the token embedding's rows gathered on the CPU \
                 from that table (qwen3_aot writes it beside the shards)",
                table_path.display(),
                files[0].display()
            ),
            (false, _) => None,
        };
        let mut shards = Vec::with_capacity(files.len());
        for ((f, binary, _), graphs) in read.into_iter().zip(ios) {
            shards.push(ShardBinary { origin: f.display().to_string(), binary, graphs });
        }
        notes.push(format!(
            "{} shards chained: {}",
            files.len(),
            files.iter().map(|f| f.display().to_string()).collect::<Vec<_>>().join(", ")
        ));
        let model = ShardedChunkModel::open(api, shards, embedding)?;
        let chunks = model.chunk_lens();
        ensure!(chunks.contains(&chunk), "{} has graphs for chunks {chunks:?}, not for chunk {chunk}", path.display());
        let ctx = model.layout().context_len;
        ensure!(ctx == context, "{} was built for context {ctx}, not {context}", path.display());
        ensure!(
            model.layout().num_layers == config.num_hidden_layers,
            "{} holds {} layers, {} has {}",
            path.display(),
            model.layout().num_layers,
            dir.display(),
            config.num_hidden_layers
        );
        let model = model.with_sliding_window(config.attention.sliding_window).context("the model's sliding window")?;
        let prefix = match shipped_prefix(dir, &mut notes)? {
            Some(p) => Some(model.kv_prefix(p.len(), &p.keys, &p.values).context("the attention-sink prefix")?),
            None => None,
        };
        let mut generator = Generator::new(model)?;
        if let Some(prefix) = prefix {
            generator.set_prefix(prefix)?;
        }
        let generator = RunnerGenerator::Sharded(Box::new(generator));
        Ok(Runner { config, notes, generator, fake_quant: false })
    }
}

/// The shard plan a set of binaries was built with: each shard's layers from its graphs'
/// `past_key_<l>` inputs.
fn plan_of_set(infos: &[&backend_qnn::sdk::ffi::BinaryInfo]) -> Result<crate::shard::ShardPlan> {
    let count = infos.len();
    let mut shards = Vec::with_capacity(count);
    for (index, info) in infos.iter().enumerate() {
        let layers: Vec<usize> = info
            .graphs
            .first()
            .map(|g| g.inputs.iter().filter_map(|t| t.name.strip_prefix("past_key_")?.parse().ok()).collect())
            .unwrap_or_default();
        let (Some(&lo), Some(&hi)) = (layers.iter().min(), layers.iter().max()) else {
            bail!("shard {} of the set has no past_key_<l> inputs", index + 1)
        };
        shards.push(crate::shard::ShardSpec {
            index,
            count,
            layers: lo..hi + 1,
            embedding: crate::shard::embedding_in_graph(index, count),
            head: index + 1 == count,
            static_bytes: 0,
        });
    }
    Ok(crate::shard::ShardPlan { shards })
}

/// A directory, or a file named `context_<i>_of_<n>[.x86].bin`.
fn is_shard_set(path: &Path) -> bool {
    if path.is_dir() {
        return true;
    }
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    let stem = name.strip_suffix(".x86.bin").or_else(|| name.strip_suffix(".bin"));
    stem.and_then(|s| s.strip_prefix("context_"))
        .and_then(|s| s.split_once("_of_"))
        .is_some_and(|(i, n)| i.parse::<usize>().is_ok() && n.parse::<usize>().is_ok())
}

/// The model config of `dir` and the bytes of `binary`; for Qualcomm's backend (`!emulate`), first
/// its libraries (or how to get them) and a binary x86 can run.
fn read_binary(dir: &Path, binary: &Path, emulate: bool) -> Result<(HfConfig, Vec<u8>)> {
    if !emulate {
        // Before reading anything: without Qualcomm's libraries say how to get them.
        backend_qnn::sdk::check_sdk_libraries().context(
            "GenerateRequest::qnn_context runs the binary on Qualcomm's HTP backend (x86: its emulation); or add \
             GenerateRequest::qnn_emulate to run it on backend-qnn's interpreter",
        )?;
        refuse_shared_binary_on_x86(binary)?;
    }
    let config = HfConfig::from_dir(dir)?;
    let bytes = std::fs::read(binary).with_context(|| format!("reading {}", binary.display()))?;
    Ok((config, bytes))
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

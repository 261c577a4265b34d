//! Prompt processing, token generation and the [`Generator`] facade that ties them together.
//!
//! [`PromptProcessor`] runs the prompt in chunks of a configurable length (32 by default, the
//! length of mllm's prefill graph); the last chunk is zero-padded. When a chunk would not fit the
//! chunk-`ar` graph near the end of the context (its result needs `n_past + n <= ctx - ar`), the
//! rest of the prompt runs through the decode graph (`ar = 1`), which has one past column more
//! than any other; mllm instead writes past the cache row there. [`TokenGenerator`] then decodes
//! one token per chunk-1 run until an EOS id, `max_new_tokens`, or a full context.
//!
//! A QNN context (graphs for 32 and 1 only) and a CPU model (any length) both fit: the runtime only
//! asks for the configured prefill length and 1.
//!
//! Context accounting: a sequence (prompt + generated tokens) never exceeds `context_len` tokens.
//! A token sampled at position `ctx - 1` ends generation with [`StopReason::ContextFull`] without
//! being run, since its logits would predict a position outside the context.

use std::ops::ControlFlow;
use std::time::{Duration, Instant};

use super::error::RuntimeError;
use super::kv_cache::KvPrefix;
use super::model::ChunkModel;
use super::sampler::{Sampler, Sampling};
use super::select::{self, GraphMenu, Step};
use super::sequence::Sequence;

/// Prefill chunk length of mllm's Qwen3 AOT graphs.
pub const DEFAULT_PREFILL_CHUNK: usize = 32;

/// Why generation stopped. None of these is an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// The given end-of-sequence id was generated (it is the last id of the output).
    Eos(u32),
    /// `max_new_tokens` ids were generated.
    MaxNewTokens,
    /// The sequence reached the context length.
    ContextFull,
    /// The token callback asked to stop.
    Cancelled,
}

/// Settings of one [`Generator::generate`] call.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerationConfig {
    /// Most ids to generate (0: only run the prompt).
    pub max_new_tokens: usize,
    /// Prefill chunk length; the model must support it.
    pub prefill_chunk: usize,
    /// How to pick tokens.
    pub sampling: Sampling,
    /// Any of these ids ends generation (it is kept in the output).
    pub eos_ids: Vec<u32>,
    /// Return the logits of every prompt position (`[prompt_len, vocab]`).
    pub collect_prompt_logits: bool,
}

impl Default for GenerationConfig {
    fn default() -> Self {
        Self {
            max_new_tokens: 256,
            prefill_chunk: DEFAULT_PREFILL_CHUNK,
            sampling: Sampling::Greedy,
            eos_ids: Vec::new(),
            collect_prompt_logits: false,
        }
    }
}

/// Wall-clock figures of one generation.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct GenerationTimings {
    /// Time spent running the prompt.
    pub prefill: Duration,
    /// Prompt tokens run.
    pub prefill_tokens: usize,
    /// Model runs the prompt took.
    pub prefill_chunks: usize,
    /// Time spent sampling and running generated tokens.
    pub decode: Duration,
    /// Generated ids.
    pub generated_tokens: usize,
    /// Decode model runs (one per generated id that was fed back).
    pub decode_steps: usize,
}

impl GenerationTimings {
    /// Prompt tokens per second (0 if no time was measured).
    pub fn prefill_tokens_per_sec(&self) -> f64 {
        per_sec(self.prefill_tokens, self.prefill)
    }

    /// Decode steps per second (0 if no time was measured).
    pub fn decode_tokens_per_sec(&self) -> f64 {
        per_sec(self.decode_steps, self.decode)
    }
}

fn per_sec(n: usize, d: Duration) -> f64 {
    let s = d.as_secs_f64();
    if s > 0.0 {
        n as f64 / s
    } else {
        0.0
    }
}

/// Result of [`Generator::generate`].
#[derive(Debug, Clone, PartialEq)]
pub struct GenerationOutput {
    /// Generated ids (without the prompt; an EOS that stopped generation is included).
    pub ids: Vec<u32>,
    /// `[prompt_len, vocab]` logits, when requested.
    pub prompt_logits: Option<Vec<f32>>,
    /// Why generation stopped.
    pub stop_reason: StopReason,
    /// Durations and counts.
    pub timings: GenerationTimings,
    /// Every call and context move, when the generator selects its graphs
    /// ([`Generator::set_menu`]); empty otherwise.
    pub steps: Vec<Step>,
}

/// Result of [`PromptProcessor::prefill`].
#[derive(Debug, Clone, PartialEq)]
pub struct PrefillOutput {
    /// Logits of the last prompt token (`[vocab]`): row `len - 1` of the last chunk, which is
    /// mllm's `(n + ar - 1) % ar` when the last chunk ran in the prefill graph.
    pub last_logits: Vec<f32>,
    /// Logits of every prompt token, `[prompt_len, vocab]`, when requested.
    pub prompt_logits: Option<Vec<f32>>,
    /// Model runs.
    pub chunks: usize,
}

/// Runs a prompt in chunks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PromptProcessor {
    chunk_len: usize,
}

impl PromptProcessor {
    /// Prefill in chunks of `chunk_len` tokens.
    pub fn new(chunk_len: usize) -> Self {
        Self { chunk_len }
    }

    /// Chunk length.
    pub fn chunk_len(&self) -> usize {
        self.chunk_len
    }

    /// Runs `prompt` at the sequence's current position.
    pub fn prefill<M>(
        &self,
        model: &mut M,
        seq: &mut Sequence<M::Kv>,
        prompt: &[u32],
        collect_logits: bool,
    ) -> Result<PrefillOutput, RuntimeError>
    where
        M: ChunkModel + ?Sized,
    {
        let layout = *seq.layout();
        let ctx = layout.context_len;
        layout.check_chunk_len(self.chunk_len)?;
        if !model.supports_chunk_len(self.chunk_len) {
            return Err(RuntimeError::UnsupportedChunkLen { ar: self.chunk_len, purpose: "prefill_chunk" });
        }
        if prompt.is_empty() {
            return Err(RuntimeError::EmptyPrompt);
        }
        if seq.n_past() + prompt.len() > ctx {
            return Err(RuntimeError::PromptTooLong { prompt_len: seq.n_past() + prompt.len(), context_len: ctx });
        }
        let vocab = layout.vocab_size;
        let mut prompt_logits = collect_logits.then(|| Vec::with_capacity(prompt.len() * vocab));
        let mut last_logits = Vec::new();
        let mut chunks = 0;
        let mut done = 0;
        while done < prompt.len() {
            let rest = prompt.len() - done;
            let mut ar = self.chunk_len;
            let mut n = ar.min(rest);
            if !seq.chunk_fits(ar, n) {
                // Near the end of the context: continue in the decode graph.
                if !model.supports_chunk_len(1) {
                    return Err(RuntimeError::UnsupportedChunkLen {
                        ar: 1,
                        purpose: "the prompt tail that does not fit the prefill graph",
                    });
                }
                ar = 1;
                n = 1;
            }
            // Every row's logits when collecting them; else only the prompt's last row (a CPU
            // model then skips the lm_head for every other row, and for earlier chunks entirely).
            let rows = if collect_logits {
                0..n
            } else if done + n == prompt.len() {
                n - 1..n
            } else {
                n..n
            };
            let out = seq.run_chunk(model, &prompt[done..done + n], ar, rows)?;
            chunks += 1;
            if let Some(all) = prompt_logits.as_mut() {
                all.extend_from_slice(&out.logits()[..n * vocab]);
            }
            done += n;
            if done == prompt.len() {
                last_logits = out.logits_row(n - 1).to_vec();
            }
        }
        Ok(PrefillOutput { last_logits, prompt_logits, chunks })
    }
}

/// Result of [`TokenGenerator::generate`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodeOutput {
    /// Generated ids.
    pub ids: Vec<u32>,
    /// Why decoding stopped.
    pub stop_reason: StopReason,
    /// Model runs (chunk length 1).
    pub steps: usize,
}

/// Generates tokens one chunk-1 run at a time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenGenerator {
    eos_ids: Vec<u32>,
    max_new_tokens: usize,
}

impl TokenGenerator {
    /// Stops on any of `eos_ids` or after `max_new_tokens` ids.
    pub fn new(eos_ids: Vec<u32>, max_new_tokens: usize) -> Self {
        Self { eos_ids, max_new_tokens }
    }

    /// Samples from `first_logits` (the last prompt position's), then feeds each new id back
    /// through the decode graph. `on_token` sees every id as soon as it is chosen.
    pub fn generate<M>(
        &self,
        model: &mut M,
        seq: &mut Sequence<M::Kv>,
        first_logits: &[f32],
        sampler: &mut Sampler,
        on_token: &mut dyn FnMut(u32) -> ControlFlow<()>,
    ) -> Result<DecodeOutput, RuntimeError>
    where
        M: ChunkModel + ?Sized,
    {
        let ctx = seq.layout().context_len;
        let done = |ids: Vec<u32>, stop_reason, steps| DecodeOutput { ids, stop_reason, steps };
        if self.max_new_tokens == 0 {
            return Ok(done(Vec::new(), StopReason::MaxNewTokens, 0));
        }
        if seq.n_past() >= ctx {
            return Ok(done(Vec::new(), StopReason::ContextFull, 0));
        }
        if !model.supports_chunk_len(1) {
            return Err(RuntimeError::UnsupportedChunkLen { ar: 1, purpose: "decode" });
        }
        let mut ids = Vec::new();
        let mut steps = 0;
        let mut token = sampler.sample(first_logits)?;
        loop {
            ids.push(token);
            let stop = if on_token(token).is_break() {
                Some(StopReason::Cancelled)
            } else if self.eos_ids.contains(&token) {
                Some(StopReason::Eos(token))
            } else if ids.len() >= self.max_new_tokens {
                Some(StopReason::MaxNewTokens)
            } else if seq.n_past() + 1 >= ctx {
                // `token` sits at position ctx - 1: the sequence fills the context.
                Some(StopReason::ContextFull)
            } else {
                None
            };
            if let Some(reason) = stop {
                return Ok(done(ids, reason, steps));
            }
            let out = seq.run_chunk(model, &[token], 1, 0..1)?;
            steps += 1;
            token = sampler.sample(out.logits_row(0))?;
        }
    }
}

/// Owns a model and its sequence state; runs prompt + generation.
#[derive(Debug)]
pub struct Generator<M: ChunkModel> {
    model: M,
    seq: Sequence<M::Kv>,
    /// The graphs to choose from per step; `None`: the configured prefill chunk and decode graph.
    menu: Option<GraphMenu>,
}

impl<M: ChunkModel> Generator<M> {
    /// Allocates the KV cache and mask for the model's layout.
    pub fn new(model: M) -> Result<Self, RuntimeError> {
        let layout = model.layout();
        layout.validate()?;
        let seq = Sequence::new(layout, 1)?;
        Ok(Self { model, seq, menu: None })
    }

    /// From now on every step runs on the graph of `menu` that minimises the modelled cost of the
    /// work left ([`super::select`]), starting each sequence at the menu's smallest context;
    /// `GenerationConfig::prefill_chunk` is then unused. Every graph of the menu must be one the
    /// model has.
    pub fn set_menu(&mut self, menu: GraphMenu) -> Result<(), RuntimeError> {
        if let Some(c) = menu.choices().iter().find(|c| !self.model.supports_graph(c.chunk, c.context_len)) {
            return Err(RuntimeError::UnsupportedGraph { ar: c.chunk, context_len: c.context_len });
        }
        self.seq.reset()?;
        self.seq.move_to_context(menu.contexts()[0])?;
        self.menu = Some(menu);
        Ok(())
    }

    /// The graphs this generator chooses from, when it selects.
    pub fn menu(&self) -> Option<&GraphMenu> {
        self.menu.as_ref()
    }

    /// The model.
    pub fn model(&self) -> &M {
        &self.model
    }

    /// The model, mutably.
    pub fn model_mut(&mut self) -> &mut M {
        &mut self.model
    }

    /// Gives the model back.
    pub fn into_model(self) -> M {
        self.model
    }

    /// Every generation from now on starts from `prefix` ([`Sequence::set_prefix`]).
    pub fn set_prefix(&mut self, prefix: KvPrefix<M::Kv>) -> Result<(), RuntimeError> {
        self.seq.set_prefix(prefix)
    }

    /// Runs `prompt` and generates from it (a fresh sequence each call).
    pub fn generate(&mut self, prompt: &[u32], config: &GenerationConfig) -> Result<GenerationOutput, RuntimeError> {
        self.generate_streaming(prompt, config, |_| ControlFlow::Continue(()))
    }

    /// Like [`generate`](Self::generate), calling `on_token` with each id as soon as it is chosen;
    /// returning `ControlFlow::Break` stops with [`StopReason::Cancelled`].
    pub fn generate_streaming(
        &mut self,
        prompt: &[u32],
        config: &GenerationConfig,
        mut on_token: impl FnMut(u32) -> ControlFlow<()>,
    ) -> Result<GenerationOutput, RuntimeError> {
        let layout = *self.seq.layout();
        if prompt.is_empty() {
            return Err(RuntimeError::EmptyPrompt);
        }
        let context_len = self.menu.as_ref().map_or(layout.context_len, GraphMenu::largest_context);
        if prompt.len() > context_len {
            return Err(RuntimeError::PromptTooLong { prompt_len: prompt.len(), context_len });
        }
        if let Some(position) = prompt.iter().position(|&id| id as usize >= layout.vocab_size) {
            return Err(RuntimeError::TokenOutOfVocab {
                id: prompt[position],
                position,
                vocab_size: layout.vocab_size,
            });
        }
        let mut sampler = Sampler::new(&config.sampling)?;
        self.seq.reset()?;
        if let Some(menu) = self.menu.clone() {
            return self.generate_selecting(&menu, prompt, config, sampler, &mut on_token);
        }

        let start = Instant::now();
        let prefill = PromptProcessor::new(config.prefill_chunk).prefill(
            &mut self.model,
            &mut self.seq,
            prompt,
            config.collect_prompt_logits,
        )?;
        let prefill_time = start.elapsed();

        let start = Instant::now();
        let decoded = TokenGenerator::new(config.eos_ids.clone(), config.max_new_tokens).generate(
            &mut self.model,
            &mut self.seq,
            &prefill.last_logits,
            &mut sampler,
            &mut on_token,
        )?;
        let decode_time = start.elapsed();

        Ok(GenerationOutput {
            timings: GenerationTimings {
                prefill: prefill_time,
                prefill_tokens: prompt.len(),
                prefill_chunks: prefill.chunks,
                decode: decode_time,
                generated_tokens: decoded.ids.len(),
                decode_steps: decoded.steps,
            },
            ids: decoded.ids,
            prompt_logits: prefill.prompt_logits,
            stop_reason: decoded.stop_reason,
            steps: Vec::new(),
        })
    }

    /// [`generate_streaming`](Self::generate_streaming) choosing each step's graph from `menu`.
    fn generate_selecting(
        &mut self,
        menu: &GraphMenu,
        prompt: &[u32],
        config: &GenerationConfig,
        mut sampler: Sampler,
        on_token: &mut dyn FnMut(u32) -> ControlFlow<()>,
    ) -> Result<GenerationOutput, RuntimeError> {
        // Every sequence starts on the smallest context (the previous one may have moved up).
        self.seq.move_to_context(menu.contexts()[0])?;
        let mut steps = Vec::new();
        let start = Instant::now();
        let select::Prefilled { last: last_logits, all: prompt_logits, calls: chunks } =
            select::prefill(menu, &mut self.model, &mut self.seq, prompt, config.collect_prompt_logits, &mut steps)?;
        let prefill_time = start.elapsed();
        let start = Instant::now();
        let decoded = select::decode(
            menu,
            &mut self.model,
            &mut self.seq,
            &last_logits,
            &mut sampler,
            &config.eos_ids,
            config.max_new_tokens,
            on_token,
            &mut steps,
        )?;
        let decode_time = start.elapsed();
        Ok(GenerationOutput {
            timings: GenerationTimings {
                prefill: prefill_time,
                prefill_tokens: prompt.len(),
                prefill_chunks: chunks,
                decode: decode_time,
                generated_tokens: decoded.ids.len(),
                decode_steps: decoded.steps,
            },
            ids: decoded.ids,
            prompt_logits,
            stop_reason: decoded.stop_reason,
            steps,
        })
    }
}

//! One sequence's state (KV cache, mask, position) and the protocol for running one chunk of it.
//!
//! Running a chunk of `n <= ar` tokens at position `n_past`: switch the cache and mask to the
//! chunk-`ar` layout if needed, pad the ids with 0 and continue the positions into the padding,
//! run the model, store the first `n` present K/V columns at `n_past`, open those mask columns,
//! advance `n_past`. Both prefill and decode go through [`Sequence::run_chunk`].
//!
//! Placement rule. A chunk-`ar` graph has `ctx - ar` past columns, so the chunk's past must fit
//! them (`n_past <= ctx - ar`) and, for the sequence to continue, so must its stored result
//! (`n_past + n <= ctx - ar`). The only chunk allowed to skip storing is one that ends exactly at
//! the context length: nothing can follow it. This is where mllm writes one column past the row
//! (decode at position ctx-1); here that write simply does not happen, and any other overflow is an
//! error before the model runs.

use super::error::RuntimeError;
use super::kv_cache::{KvCache, KvPrefix};
use super::mask::AttentionMask;
use super::model::{ChunkInputs, ChunkModel, ChunkOutputs, ModelLayout};

/// KV cache, mask and position of one sequence, plus reusable chunk buffers.
#[derive(Debug)]
pub struct Sequence<T> {
    layout: ModelLayout,
    cache: KvCache<T>,
    mask: AttentionMask,
    n_past: usize,
    ids: Vec<i32>,
    positions: Vec<i32>,
    /// One output buffer per chunk length used so far (typically the prefill length and 1).
    outputs: Vec<ChunkOutputs<T>>,
    /// What every start ([`Sequence::reset`]) puts at positions `0..len`.
    prefix: Option<KvPrefix<T>>,
}

impl<T: Copy + Default> Sequence<T> {
    /// An empty sequence for a model of this layout, laid out for chunks of `ar`.
    pub fn new(layout: ModelLayout, ar: usize) -> Result<Self, RuntimeError> {
        let cache = KvCache::new(layout, ar)?;
        let mut mask = AttentionMask::with_sliding_window(layout.context_len, layout.sliding_window)?;
        mask.init(ar, 0)?;
        Ok(Self {
            layout,
            cache,
            mask,
            n_past: 0,
            ids: Vec::new(),
            positions: Vec::new(),
            outputs: Vec::new(),
            prefix: None,
        })
    }

    /// From now on the sequence starts from `prefix` at positions `0..prefix.len` (an
    /// attention-sink prefix), text from position `prefix.len`; starts over now. A prefix that
    /// does not fit the model is refused and the previous start kept.
    pub fn set_prefix(&mut self, prefix: KvPrefix<T>) -> Result<(), RuntimeError> {
        let previous = self.prefix.replace(prefix);
        if let Err(refused) = self.reset() {
            self.prefix = previous;
            self.reset()?;
            return Err(refused);
        }
        Ok(())
    }

    /// Positions already run (the next token goes to position `n_past`).
    pub fn n_past(&self) -> usize {
        self.n_past
    }

    /// Shapes of the model this sequence is for.
    pub fn layout(&self) -> &ModelLayout {
        &self.layout
    }

    /// The KV cache.
    pub fn cache(&self) -> &KvCache<T> {
        &self.cache
    }

    /// The attention mask of the current chunk layout.
    pub fn mask(&self) -> &AttentionMask {
        &self.mask
    }

    /// Starts over at position 0 (after the prefix, when there is one), keeping the buffers.
    pub fn reset(&mut self) -> Result<(), RuntimeError> {
        self.cache.clear();
        self.n_past = 0;
        if let Some(prefix) = &self.prefix {
            self.cache.write_prefix(prefix)?;
            self.n_past = prefix.len;
        }
        self.mask.init(self.cache.ar(), self.n_past)
    }

    /// Moves the sequence to the graphs of context `context_len` (another member of the model's
    /// family): the cache re-strided into the new rows (laid out for the decode graph), the mask
    /// rebuilt at the current position. Fails, changing nothing, when the stored positions do not
    /// fit the new context.
    pub fn move_to_context(&mut self, context_len: usize) -> Result<(), RuntimeError> {
        if context_len == self.layout.context_len {
            return Ok(());
        }
        let layout = ModelLayout { context_len, ..self.layout };
        layout.validate()?;
        let cache = self.cache.moved_to(layout, 1)?;
        let mut mask = AttentionMask::new(context_len)?;
        mask.init(1, self.n_past)?;
        (self.cache, self.mask, self.layout) = (cache, mask, layout);
        Ok(())
    }

    /// Whether `n_tokens` tokens at the current position can run as one chunk of `ar`
    /// (see the placement rule in the module docs).
    pub fn chunk_fits(&self, ar: usize, n_tokens: usize) -> bool {
        let ctx = self.layout.context_len;
        let end = self.n_past + n_tokens;
        if ar == 0 || ar > ctx || n_tokens == 0 || n_tokens > ar || end > ctx {
            return false;
        }
        let past_cols = ctx - ar;
        end <= past_cols || (end == ctx && self.n_past <= past_cols)
    }

    /// Runs `tokens` (1..=ar of them) as one chunk of `ar` and returns the chunk's outputs; rows
    /// `[0, tokens.len())` of its logits belong to the tokens, the rest to padding. Only the logits
    /// of rows `read_rows` (within the tokens; possibly none) are guaranteed to be computed.
    pub fn run_chunk<M>(
        &mut self,
        model: &mut M,
        tokens: &[u32],
        ar: usize,
        read_rows: std::ops::Range<usize>,
    ) -> Result<&ChunkOutputs<T>, RuntimeError>
    where
        M: ChunkModel<Kv = T> + ?Sized,
    {
        let ctx = self.layout.context_len;
        let n = tokens.len();
        self.layout.check_chunk_len(ar)?;
        if !model.supports_graph(ar, ctx) {
            return Err(if model.supports_chunk_len(ar) {
                RuntimeError::UnsupportedGraph { ar, context_len: ctx }
            } else {
                RuntimeError::UnsupportedChunkLen { ar, purpose: "chunk" }
            });
        }
        if n == 0 || n > ar {
            return Err(RuntimeError::ChunkTokenCount { n_tokens: n, ar });
        }
        if read_rows.start > read_rows.end || read_rows.end > n {
            return Err(RuntimeError::InvalidLogitRows { start: read_rows.start, end: read_rows.end, n_tokens: n });
        }
        if self.n_past + n > ctx {
            return Err(RuntimeError::ContextOverflow { n_past: self.n_past, n_tokens: n, context_len: ctx });
        }
        if !self.chunk_fits(ar, n) {
            return Err(RuntimeError::ChunkDoesNotFit {
                n_past: self.n_past,
                n_tokens: n,
                ar,
                past_cols: ctx - ar,
                context_len: ctx,
            });
        }
        if self.cache.ar() != ar {
            self.cache.rearrange(ar)?;
        }
        if self.mask.ar() != ar {
            self.mask.init(ar, self.n_past)?;
        }

        self.ids.clear();
        self.positions.clear();
        for (i, &id) in tokens.iter().enumerate() {
            let id32 = i32::try_from(id).ok().filter(|_| (id as usize) < self.layout.vocab_size);
            let Some(id32) = id32 else {
                return Err(RuntimeError::TokenOutOfVocab {
                    id,
                    position: self.n_past + i,
                    vocab_size: self.layout.vocab_size,
                });
            };
            self.ids.push(id32);
        }
        self.ids.resize(ar, 0);
        // Positions continue into the padding; the placement rule keeps them below ctx.
        self.positions.extend((self.n_past..self.n_past + ar).map(|p| p as i32));

        let slot = match self.outputs.iter().position(|o| o.ar() == ar) {
            Some(slot) => slot,
            None => {
                self.outputs.push(ChunkOutputs::new(&self.layout, ar));
                self.outputs.len() - 1
            }
        };
        let inputs = ChunkInputs {
            ids: &self.ids,
            positions: &self.positions,
            mask: &self.mask,
            cache: &self.cache,
            n_past: self.n_past,
            n_valid: n,
            logit_rows: read_rows,
        };
        let outputs = &mut self.outputs[slot];
        model.run_chunk(&inputs, outputs).map_err(|source| RuntimeError::ModelRun {
            ar,
            n_past: self.n_past,
            source,
        })?;

        if self.n_past + n <= ctx - ar {
            for layer in 0..self.layout.num_layers {
                self.cache.update(
                    layer,
                    outputs.present_key(layer),
                    outputs.present_value(layer),
                    ar,
                    self.n_past,
                    n,
                )?;
            }
            self.mask.update(self.n_past, n)?;
        }
        // else: the chunk ends at the context length; nothing can attend to it later.
        self.n_past += n;
        Ok(&self.outputs[slot])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_prefix_keeps_the_previous_start() {
        let layout = ModelLayout {
            num_layers: 2,
            num_kv_heads: 1,
            head_dim: 2,
            vocab_size: 10,
            context_len: 8,
            sliding_window: None,
        };
        let mut seq = Sequence::<u16>::new(layout, 1).unwrap();
        // Two positions: K [1, 2, 2] and V [1, 2, 2] per layer.
        let prefix = KvPrefix { len: 2, keys: vec![vec![1, 2, 3, 4]; 2], values: vec![vec![5, 6, 7, 8]; 2] };
        seq.set_prefix(prefix).unwrap();
        assert_eq!((seq.n_past(), seq.cache().len()), (2, 2));
        assert_eq!(&seq.cache().past_key(1)[..2], &[1, 2]);

        let bad = KvPrefix { len: 3, keys: vec![vec![9; 6]; 2], values: vec![vec![9; 5]; 2] };
        assert!(matches!(seq.set_prefix(bad), Err(RuntimeError::TensorSize { tensor: "prefix value", .. })));
        assert_eq!((seq.n_past(), seq.cache().len()), (2, 2), "the previous prefix still starts the sequence");
        assert_eq!(&seq.cache().past_key(1)[..2], &[1, 2]);
        seq.reset().unwrap();
        assert_eq!(seq.n_past(), 2);
    }
}

//! The contract between the generation runtime and a backend: run one chunk of `ar` tokens.
//!
//! The I/O follows mllm's static NPU graphs (ExecuTorch "SMART_MASK" style, see
//! mllm/backends/qnn/aot_rt): ids `[ar]`, positions `[ar]`, mask `[ar, ctx]`, past K per layer
//! `[Hkv, D, ctx-ar]`, past V `[Hkv, ctx-ar, D]`; outputs logits `[ar, vocab]` and only the NEW
//! K `[Hkv, D, ar]` / V `[Hkv, ar, D]`. The runtime owns the cache and copies the new K/V in. A QNN
//! model has one graph per chunk length (32 for prefill, 1 for decode); a CPU model can run any length.

use super::error::{ModelError, RuntimeError};
use super::kv_cache::KvCache;
use super::mask::AttentionMask;

/// Shapes the runtime needs to size the cache, mask and logits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelLayout {
    /// Decoder layers, each with its own K/V cache.
    pub num_layers: usize,
    /// Key/value heads (`Hkv`; fewer than query heads under GQA).
    pub num_kv_heads: usize,
    /// Head dimension `D`.
    pub head_dim: usize,
    /// Logits per position.
    pub vocab_size: usize,
    /// Context length `ctx`: the mask width and the most positions a sequence may hold.
    pub context_len: usize,
    /// The window of the model's sliding-window layers, if it has any: the mask then has a
    /// second plane for them (see [`AttentionMask`]).
    pub sliding_window: Option<usize>,
}

impl ModelLayout {
    /// Checks that every dimension is usable (non-zero; at least two context positions so that a
    /// decode graph has a past column).
    pub fn validate(&self) -> Result<(), RuntimeError> {
        let fields = [
            ("num_layers", self.num_layers, 1),
            ("num_kv_heads", self.num_kv_heads, 1),
            ("head_dim", self.head_dim, 1),
            ("vocab_size", self.vocab_size, 1),
            ("context_len", self.context_len, 2),
        ];
        for (field, value, min) in fields {
            if value < min {
                return Err(RuntimeError::InvalidLayout {
                    field,
                    value,
                    expected: if min == 1 { ">= 1" } else { ">= 2" },
                });
            }
        }
        Ok(())
    }

    /// Elements of one layer's K (or V) tensor for `cols` positions: `Hkv * D * cols`.
    pub fn kv_elems(&self, cols: usize) -> usize {
        self.num_kv_heads * self.head_dim * cols
    }

    /// Checks that `ar` is a chunk length this context can hold (`1..=ctx`).
    pub fn check_chunk_len(&self, ar: usize) -> Result<(), RuntimeError> {
        if ar == 0 || ar > self.context_len {
            return Err(RuntimeError::InvalidChunkLen { ar, context_len: self.context_len });
        }
        Ok(())
    }
}

/// A model executed one fixed-size chunk at a time.
pub trait ChunkModel {
    /// Element type of the K/V cache (`u8` for a quantized cache, QNN's or the CPU's in fake-quant
    /// mode; `f32` for the CPU's float models).
    type Kv: Copy + Default;

    /// Shapes of the model.
    fn layout(&self) -> ModelLayout;

    /// Whether the model has a graph for chunks of `ar` tokens. A QNN context typically answers
    /// true for 32 and 1 only; a CPU model for every length. Decoding needs `ar == 1`.
    fn supports_chunk_len(&self, ar: usize) -> bool;

    /// Whether the model has a graph for chunks of `ar` attending over `context_len` positions (the
    /// mask width of the inputs it is given). By default only its layout's context length; a
    /// model holding a graph family ([`GraphMenu`](super::GraphMenu)) answers for each member.
    fn supports_graph(&self, ar: usize, context_len: usize) -> bool {
        context_len == self.layout().context_len && self.supports_chunk_len(ar)
    }

    /// Runs one chunk of `inputs.ar()` positions and fills every buffer of `outputs` (sized for the
    /// same `ar`): logits of all rows, including padding rows, and the present K/V of every layer.
    /// The context length of the graph to run is the mask's width (`inputs.mask().context_len()`).
    fn run_chunk(
        &mut self,
        inputs: &ChunkInputs<'_, Self::Kv>,
        outputs: &mut ChunkOutputs<Self::Kv>,
    ) -> Result<(), ModelError>;
}

/// Boxed models (e.g. a backend chosen at run time) are models too.
impl<M: ChunkModel + ?Sized> ChunkModel for Box<M> {
    type Kv = M::Kv;

    fn layout(&self) -> ModelLayout {
        (**self).layout()
    }

    fn supports_chunk_len(&self, ar: usize) -> bool {
        (**self).supports_chunk_len(ar)
    }

    fn supports_graph(&self, ar: usize, context_len: usize) -> bool {
        (**self).supports_graph(ar, context_len)
    }

    fn run_chunk(
        &mut self,
        inputs: &ChunkInputs<'_, Self::Kv>,
        outputs: &mut ChunkOutputs<Self::Kv>,
    ) -> Result<(), ModelError> {
        (**self).run_chunk(inputs, outputs)
    }
}

/// Inputs of one chunk. The mask is authoritative: padding rows and unused past columns are masked.
pub struct ChunkInputs<'a, T> {
    pub(crate) ids: &'a [i32],
    pub(crate) positions: &'a [i32],
    pub(crate) mask: &'a AttentionMask,
    pub(crate) cache: &'a KvCache<T>,
    pub(crate) n_past: usize,
    pub(crate) n_valid: usize,
    pub(crate) logit_rows: std::ops::Range<usize>,
}

impl<'a, T: Copy + Default> ChunkInputs<'a, T> {
    /// Chunk length of the graph to run.
    pub fn ar(&self) -> usize {
        self.ids.len()
    }

    /// Token ids `[ar]`; rows past [`n_valid`](Self::n_valid) are zero padding.
    pub fn ids(&self) -> &'a [i32] {
        self.ids
    }

    /// Position ids `[ar]`: `n_past + i`, continuing into the padding.
    pub fn positions(&self) -> &'a [i32] {
        self.positions
    }

    /// Attention mask `[ar, ctx]`.
    pub fn mask(&self) -> &'a AttentionMask {
        self.mask
    }

    /// Past keys of `layer`: `[Hkv, D, ctx-ar]`, column `c` is position `c`.
    pub fn past_key(&self, layer: usize) -> &'a [T] {
        self.cache.past_key(layer)
    }

    /// Past values of `layer`: `[Hkv, ctx-ar, D]`, row `c` of each head is position `c`.
    pub fn past_value(&self, layer: usize) -> &'a [T] {
        self.cache.past_value(layer)
    }

    /// The whole buffer [`past_key`](Self::past_key) is the start of (its row stride is
    /// `past_key(layer).len() / (Hkv * D)`), shared so a backend can read the past where it lies.
    /// Hold it only during `run_chunk`: the runtime writes the cache afterwards, and a buffer still
    /// shared then is copied first.
    pub fn key_buffer(&self, layer: usize) -> &'a std::sync::Arc<Vec<T>> {
        self.cache.key_buffer(layer)
    }

    /// The whole buffer [`past_value`](Self::past_value) is the start of (see [`key_buffer`](Self::key_buffer)).
    pub fn value_buffer(&self, layer: usize) -> &'a std::sync::Arc<Vec<T>> {
        self.cache.value_buffer(layer)
    }

    /// Positions already in the cache (`past_key` columns `[0, n_past)` are valid). The static graphs
    /// do not receive this; a CPU backend may use it to skip columns the mask excludes.
    pub fn n_past(&self) -> usize {
        self.n_past
    }

    /// Real (non-padding) tokens in this chunk; also informational only.
    pub fn n_valid(&self) -> usize {
        self.n_valid
    }

    /// The rows whose logits the runtime reads (empty for a prompt chunk before the last one when
    /// no prompt logits are collected). A model must fill these; it may
    /// leave the other rows' logits stale (a static graph computes all of them anyway).
    pub fn logit_rows(&self) -> std::ops::Range<usize> {
        self.logit_rows.clone()
    }
}

/// Output buffers of one chunk, allocated by the runtime for a given `ar` and filled by the model.
/// Their sizes are fixed; the model writes through the `_mut` slices.
#[derive(Debug, Clone)]
pub struct ChunkOutputs<T> {
    ar: usize,
    vocab_size: usize,
    logits: Vec<f32>,
    present_keys: Vec<Vec<T>>,
    present_values: Vec<Vec<T>>,
}

impl<T: Copy + Default> ChunkOutputs<T> {
    /// Zeroed buffers for chunks of `ar` tokens.
    pub fn new(layout: &ModelLayout, ar: usize) -> Self {
        let kv = layout.kv_elems(ar);
        Self {
            ar,
            vocab_size: layout.vocab_size,
            logits: vec![0.0; ar * layout.vocab_size],
            present_keys: (0..layout.num_layers).map(|_| vec![T::default(); kv]).collect(),
            present_values: (0..layout.num_layers).map(|_| vec![T::default(); kv]).collect(),
        }
    }

    /// Chunk length these buffers are sized for.
    pub fn ar(&self) -> usize {
        self.ar
    }

    /// Logits `[ar, vocab]`, row-major.
    pub fn logits(&self) -> &[f32] {
        &self.logits
    }

    /// Logits of chunk row `row` (`[vocab]`).
    pub fn logits_row(&self, row: usize) -> &[f32] {
        &self.logits[row * self.vocab_size..(row + 1) * self.vocab_size]
    }

    /// Writable logits `[ar, vocab]`.
    pub fn logits_mut(&mut self) -> &mut [f32] {
        &mut self.logits
    }

    /// Present keys of `layer`: `[Hkv, D, ar]`.
    pub fn present_key(&self, layer: usize) -> &[T] {
        &self.present_keys[layer]
    }

    /// Present values of `layer`: `[Hkv, ar, D]`.
    pub fn present_value(&self, layer: usize) -> &[T] {
        &self.present_values[layer]
    }

    /// Writable present keys of `layer`.
    pub fn present_key_mut(&mut self, layer: usize) -> &mut [T] {
        &mut self.present_keys[layer]
    }

    /// Writable present values of `layer`.
    pub fn present_value_mut(&mut self, layer: usize) -> &mut [T] {
        &mut self.present_values[layer]
    }

    /// Present keys and values of `layer`, both writable at once.
    pub fn present_kv_mut(&mut self, layer: usize) -> (&mut [T], &mut [T]) {
        (&mut self.present_keys[layer], &mut self.present_values[layer])
    }
}

//! Errors of the generation runtime.
//!
//! Every variant names the quantity that was wrong and what was expected, so that a failure deep in a
//! generation loop (a cache write past a row, a chunk size the graph does not have) can be diagnosed
//! from the message alone.

/// Error a [`ChunkModel`](super::ChunkModel) reports from `run_chunk`; the runtime wraps it with the
/// chunk size and position it was running.
pub type ModelError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Errors of the KV cache, attention mask, sampler and generation loop.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// A [`ModelLayout`](super::ModelLayout) field is unusable.
    #[error("model layout field `{field}` is {value}; expected {expected}")]
    InvalidLayout { field: &'static str, value: usize, expected: &'static str },

    /// A chunk length (`ar`) outside `1..=context_len`.
    #[error("chunk length (ar) {ar} is invalid for context length {context_len}; expected 1..={context_len}")]
    InvalidChunkLen { ar: usize, context_len: usize },

    /// The model has no graph for this chunk length.
    #[error("the model cannot run chunks of {ar} tokens ({purpose}); choose a chunk length its graphs were built for")]
    UnsupportedChunkLen { ar: usize, purpose: &'static str },

    /// The logit rows to read are not a range within the chunk's tokens.
    #[error("logit rows {start}..{end} are not a range within the chunk's {n_tokens} token(s)")]
    InvalidLogitRows { start: usize, end: usize, n_tokens: usize },

    /// Generation needs at least one prompt token to produce the first logits.
    #[error("the prompt is empty; at least one token id is needed")]
    EmptyPrompt,

    /// The prompt does not fit the model's context.
    #[error("the prompt has {prompt_len} tokens but the model's context holds {context_len}")]
    PromptTooLong { prompt_len: usize, context_len: usize },

    /// A token id that is not in the vocabulary (or does not fit the graph's i32 id input).
    #[error("token id {id} at sequence position {position} is outside the vocabulary of {vocab_size} ids")]
    TokenOutOfVocab { id: u32, position: usize, vocab_size: usize },

    /// A sequence step would run past the end of the context.
    #[error("running {n_tokens} more token(s) after {n_past} would exceed the context length {context_len}")]
    ContextOverflow { n_past: usize, n_tokens: usize, context_len: usize },

    /// A chunk cannot be placed: its past does not fit the columns of the chunk-`ar` graph, or its
    /// present K/V could not be stored although the sequence continues.
    #[error(
        "a chunk of {n_tokens} token(s) at position {n_past} does not fit a chunk-{ar} graph with context {context_len} \
         (past columns 0..{past_cols}); run the remainder with a smaller chunk length"
    )]
    ChunkDoesNotFit { n_past: usize, n_tokens: usize, ar: usize, past_cols: usize, context_len: usize },

    /// `KvCache::update` would write past the end of a cache row.
    #[error(
        "KV cache update of layer {layer} writes positions {n_past}..{end} but a chunk-{ar} graph has only {past_cols} \
         past columns (context {context_len})",
        end = n_past + n_update
    )]
    CacheOverflow { layer: usize, n_past: usize, n_update: usize, ar: usize, past_cols: usize, context_len: usize },

    /// `KvCache::update` was given a chunk of a different length than the layout the cache is in.
    #[error("KV cache is laid out for chunk length {cache_ar} but the present K/V are for chunk length {ar}; call rearrange({ar}) first")]
    CacheChunkMismatch { cache_ar: usize, ar: usize },

    /// `n_update` larger than the chunk it is taken from.
    #[error("cannot copy {n_update} positions out of a present K/V chunk of {ar}")]
    UpdateLongerThanChunk { n_update: usize, ar: usize },

    /// A chunk run with no tokens or more tokens than its length.
    #[error("a chunk of length {ar} takes 1..={ar} tokens, got {n_tokens}")]
    ChunkTokenCount { n_tokens: usize, ar: usize },

    /// A layer index past the model's layers.
    #[error("layer {layer} is out of range; the model has {num_layers} layers")]
    LayerOutOfRange { layer: usize, num_layers: usize },

    /// A K/V prefix for another number of layers.
    #[error("the K/V prefix holds {keys} key and {values} value layers; the model has {num_layers} layers")]
    PrefixLayers { keys: usize, values: usize, num_layers: usize },

    /// A present K/V or logits buffer of the wrong size.
    #[error("{tensor} of layer {layer} has {got} elements; expected {expected}")]
    TensorSize { tensor: &'static str, layer: usize, expected: usize, got: usize },

    /// Shrinking the cache rows would drop stored positions.
    #[error("cannot rearrange the KV cache to chunk length {ar}: it holds {len} positions but rows would have only {past_cols} columns")]
    RearrangeLosesData { ar: usize, len: usize, past_cols: usize },

    /// Mask init/update outside the past columns.
    #[error("attention mask {op}: positions {start}..{end} exceed the {past_cols} past columns of a chunk-{ar} mask (context {context_len})")]
    MaskOutOfRange { op: &'static str, start: usize, end: usize, ar: usize, past_cols: usize, context_len: usize },

    /// A sampling parameter outside its domain.
    #[error("sampling parameter `{field}` is {value}; expected {expected}")]
    InvalidSampling { field: &'static str, value: String, expected: &'static str },

    /// Logits that cannot be sampled from (NaN, +inf, or every entry -inf).
    #[error("logits cannot be sampled: {reason}")]
    BadLogits { reason: String },

    /// A list of graphs to choose from that cannot drive generation.
    #[error("graph menu: {detail}")]
    GraphMenu { detail: String },

    /// The model has no graph for this chunk length at this context length.
    #[error("the model has no graph for chunks of {ar} tokens at context {context_len}")]
    UnsupportedGraph { ar: usize, context_len: usize },

    /// Moving the sequence to another context length would drop stored positions.
    #[error("cannot move the sequence to context {context_len}: it holds {len} positions")]
    ContextTooSmall { context_len: usize, len: usize },

    /// The model's own failure while running one chunk.
    #[error("model failed running a chunk of {ar} token(s) at position {n_past}: {source}")]
    ModelRun {
        ar: usize,
        n_past: usize,
        #[source]
        source: ModelError,
    },
}

//! [`CausalLm`]: what every decoder model file offers, so backends and tools can drive any of them.

use std::ops::Range;

use crate::module::ParamSource;
use crate::{Error, Result, Tensor};

/// Scale of the attention mask input's u16 encoding (`mask` in [`CausalLm`]'s graph I/O).
pub const MASK_SCALE: f32 = 0.001 / 65535.0;
/// Zero point of the attention mask input's u16 encoding (QNN offset = -65535).
pub const MASK_ZERO_POINT: i32 = 65535;

/// The numbers a backend needs about a decoder model file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DecoderShape {
    pub num_layers: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub vocab_size: usize,
    /// The window of the sliding-window layers, if any: the graphs' mask input then has two
    /// planes, `[1, 2, S, T]` (full causal, sliding window), see `runtime::AttentionMask`.
    pub sliding_window: Option<usize>,
}

impl DecoderShape {
    /// Planes of the mask input: 1, or 2 with sliding-window layers.
    pub fn mask_planes(&self) -> usize {
        1 + usize::from(self.sliding_window.is_some())
    }
}

/// A decoder model file with mllm's positional graph I/O contract:
/// `(ids [1, S], positions [S], mask [1, P, S, T] (P = `DecoderShape::mask_planes`), past K per layer [1, Hkv, D, P],
/// past V per layer [1, Hkv, P, D])` → `(logits [1, 1, S, V], new K [1, Hkv, D, S], new V [1, Hkv, S, D])`
/// with `T = P + S`. Compiled graphs fix `P = ctx - S`; eager execution may pass any `P`.
pub trait CausalLm: Send + Sync {
    /// The decoder over one chunk when the caller reads the logits of chunk rows `logit_rows` only
    /// (the rows are an explicit input, never ambient state). A model file may slice its hidden
    /// state to those rows before the lm_head and return `logits [1, 1, logit_rows.len(), V]`: on
    /// the CPU the lm_head is about a quarter of a small model's prefill work, and a prompt needs
    /// the logits of its last row only. K/V outputs always cover every row.
    ///
    /// `#[module]` on the implementing block makes this call the model's scope.
    fn forward_rows(
        &self,
        ids: &Tensor,
        positions: &Tensor,
        mask: &Tensor,
        past_keys: &[Tensor],
        past_values: &[Tensor],
        logit_rows: Range<usize>,
    ) -> Result<(Tensor, Vec<Tensor>, Vec<Tensor>)>;

    /// [`forward_rows`](Self::forward_rows) with every row's logits (what tracing and the
    /// compiled graphs need).
    fn forward(
        &self,
        ids: &Tensor,
        positions: &Tensor,
        mask: &Tensor,
        past_keys: &[Tensor],
        past_values: &[Tensor],
    ) -> Result<(Tensor, Vec<Tensor>, Vec<Tensor>)> {
        let rows = ids.dim(-1)?;
        self.forward_rows(ids, positions, mask, past_keys, past_values, 0..rows)
    }

    /// Binds the whole model as the top module.
    fn bind_params(&mut self, src: &ParamSource<'_>) -> Result<()>;

    fn shape(&self) -> DecoderShape;

    /// [`forward`](Self::forward) on the graph inputs in their positional order, `[ids, positions,
    /// mask, past K × L, past V × L]`: what [`trace`](crate::trace) hands its closure and what a
    /// compiled graph takes.
    fn forward_graph(&self, inputs: &[Tensor]) -> Result<(Tensor, Vec<Tensor>, Vec<Tensor>)> {
        let layers = self.shape().num_layers;
        if inputs.len() != 3 + 2 * layers {
            return Err(Error::msg(format!(
                "a {layers}-layer decoder takes {} graph inputs (ids, positions, mask, {layers} past K, {layers} past V), \
                 got {}",
                3 + 2 * layers,
                inputs.len()
            )));
        }
        let (past_keys, past_values) = inputs[3..].split_at(layers);
        self.forward(&inputs[0], &inputs[1], &inputs[2], past_keys, past_values)
    }
}

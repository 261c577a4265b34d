//! [`CausalLm`]: what every decoder model file offers, so backends and tools can drive any of them.

use std::cell::Cell;
use std::ops::Range;

use crate::module::ParamSource;
use crate::{Result, Tensor};

thread_local! {
    static LOGIT_ROWS: Cell<Option<(usize, usize)>> = const { Cell::new(None) };
}

/// The chunk rows whose logits the caller will read, while a [`CausalLm::forward_rows`] call runs
/// on this thread; `None` (every row) otherwise, in particular while tracing. A model file may
/// slice its hidden state to these rows before the lm_head: on the CPU the lm_head is about a
/// quarter of a small model's prefill work, and a prompt needs the logits of its last row only.
pub fn logit_rows() -> Option<Range<usize>> {
    LOGIT_ROWS.with(|c| c.get()).map(|(a, b)| a..b)
}

/// Restores the previous row selection on drop (also when the forward pass fails or panics).
struct RowsGuard(Option<(usize, usize)>);

impl RowsGuard {
    fn set(rows: Range<usize>) -> RowsGuard {
        RowsGuard(LOGIT_ROWS.with(|c| c.replace(Some((rows.start, rows.end)))))
    }
}

impl Drop for RowsGuard {
    fn drop(&mut self) {
        LOGIT_ROWS.with(|c| c.set(self.0));
    }
}

/// The numbers a backend needs about a decoder model file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DecoderShape {
    pub num_layers: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub vocab_size: usize,
}

/// A decoder model file with mllm's positional graph I/O contract:
/// `(ids [1, S], positions [S], mask [1, 1, S, T], past K per layer [1, Hkv, D, P],
/// past V per layer [1, Hkv, P, D])` → `(logits [1, 1, S, V], new K [1, Hkv, D, S], new V [1, Hkv, S, D])`
/// with `T = P + S`. Compiled graphs fix `P = ctx - S`; eager execution may pass any `P`.
pub trait CausalLm: Send + Sync {
    fn forward(
        &self,
        ids: &Tensor,
        positions: &Tensor,
        mask: &Tensor,
        past_keys: &[Tensor],
        past_values: &[Tensor],
    ) -> Result<(Tensor, Vec<Tensor>, Vec<Tensor>)>;

    /// [`forward`](Self::forward) when only the logits of chunk rows `rows` will be read. Model
    /// files that honour [`logit_rows`] return `logits [1, 1, rows.len(), V]`; others return all
    /// `S` rows. K/V outputs are unaffected.
    fn forward_rows(
        &self,
        ids: &Tensor,
        positions: &Tensor,
        mask: &Tensor,
        past_keys: &[Tensor],
        past_values: &[Tensor],
        rows: Range<usize>,
    ) -> Result<(Tensor, Vec<Tensor>, Vec<Tensor>)> {
        let _rows = RowsGuard::set(rows);
        self.forward(ids, positions, mask, past_keys, past_values)
    }

    /// Binds the whole model as the top module.
    fn bind_params(&mut self, src: &ParamSource<'_>) -> Result<()>;

    fn shape(&self) -> DecoderShape;
}

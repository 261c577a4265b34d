//! [`CausalLm`]: what every decoder model file offers, so backends and tools can drive any of them.

use crate::module::ParamSource;
use crate::{Result, Tensor};

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

    /// Binds the whole model as the top module.
    fn bind_params(&mut self, src: &ParamSource<'_>) -> Result<()>;

    fn shape(&self) -> DecoderShape;
}

//! Layers with parameters. A layer call is one named op (`linalg.CPU.Conv2DOp
//! <name="model.layers.0.mlp.up_proj">`), not a subgraph, as in mllm.

use crate::error::{CallSite, Error, Result};
use crate::module::{Module, ParamRole, ParamSource};
use crate::op::OpKind;
use crate::tensor::{apply, Tensor};
use std::fmt;
use std::sync::Arc;

fn unbound(kind: &str) -> Error {
    Error::Trace {
        module_path: crate::scope::current_path(),
        message: format!("{kind} layer used before bind_weights()/declare()"),
    }
}

/// Shared state of every layer: its path and parameters once bound.
#[derive(Clone, Debug, Default)]
struct Bound {
    path: Option<String>,
    params: Vec<Tensor>,
}

impl Bound {
    fn get(&self, kind: &str) -> Result<(&str, &[Tensor])> {
        match &self.path {
            Some(p) if !self.params.is_empty() => Ok((p, &self.params)),
            _ => Err(unbound(kind)),
        }
    }

    /// The module at `path` bound to its weight (`role`, `shape`) and, when `bias` gives its
    /// length, its bias.
    fn bind(path: &str, src: &ParamSource<'_>, role: ParamRole, shape: &[usize], bias: Option<usize>) -> Result<Bound> {
        let mut params = vec![src.param(path, "weight", role, shape)?];
        if let Some(len) = bias {
            params.push(src.param(path, "bias", ParamRole::Bias, &[len])?);
        }
        Ok(Bound { path: Some(path.to_string()), params })
    }

    /// `kind` of `first` and then the bound parameters, named by the module's path (`type_name`
    /// names the module in the error when it is not bound). A module has one or two parameters:
    /// their list stays on the stack.
    fn apply(&self, type_name: &str, kind: OpKind, first: &Tensor, site: CallSite) -> Result<Tensor> {
        let (path, params) = self.get(type_name)?;
        match params {
            [a] => apply(kind, &[first, a], Some(path), site),
            [a, b] => apply(kind, &[first, a, b], Some(path), site),
            _ => apply(kind, &std::iter::once(first).chain(params).collect::<Vec<_>>(), Some(path), site),
        }
    }
}

/// A linear computed as a 1×1 convolution (mllm's `nn::Conv2D` with the QNN LPBQ impl): input NHWC
/// `[1, 1, S, in]`, weight HWIO `[1, 1, in, out]`, output `[1, 1, S, out]`.
#[derive(Clone, Debug)]
pub struct Conv2d {
    pub in_features: usize,
    pub out_features: usize,
    pub has_bias: bool,
    bound: Bound,
}

impl Conv2d {
    pub fn new(in_features: usize, out_features: usize) -> Self {
        Conv2d { in_features, out_features, has_bias: false, bound: Bound::default() }
    }

    pub fn with_bias(mut self, bias: bool) -> Self {
        self.has_bias = bias;
        self
    }

    #[track_caller]
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.bound.apply("Conv2d", OpKind::Conv2d, x, CallSite::here())
    }

    pub fn weight(&self) -> Option<&Tensor> {
        self.bound.params.first()
    }
}

impl Module for Conv2d {
    fn bind(&mut self, path: &str, src: &ParamSource<'_>) -> Result<()> {
        let bias = self.has_bias.then_some(self.out_features);
        self.bound =
            Bound::bind(path, src, ParamRole::Conv2dWeight, &[1, 1, self.in_features, self.out_features], bias)?;
        Ok(())
    }

    fn module_path(&self) -> Option<String> {
        self.bound.path.clone()
    }
}

/// A PyTorch linear: weight `[out, in]`, optional bias.
#[derive(Clone, Debug)]
pub struct Linear {
    pub in_features: usize,
    pub out_features: usize,
    pub has_bias: bool,
    bound: Bound,
}

impl Linear {
    pub fn new(in_features: usize, out_features: usize) -> Self {
        Linear { in_features, out_features, has_bias: false, bound: Bound::default() }
    }

    pub fn with_bias(mut self, bias: bool) -> Self {
        self.has_bias = bias;
        self
    }

    #[track_caller]
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.bound.apply("Linear", OpKind::Linear, x, CallSite::here())
    }
}

impl Module for Linear {
    fn bind(&mut self, path: &str, src: &ParamSource<'_>) -> Result<()> {
        let bias = self.has_bias.then_some(self.out_features);
        self.bound = Bound::bind(path, src, ParamRole::LinearWeight, &[self.out_features, self.in_features], bias)?;
        Ok(())
    }

    fn module_path(&self) -> Option<String> {
        self.bound.path.clone()
    }
}

/// RMSNorm over the last dim: `x / sqrt(mean(x²) + eps) * weight`.
#[derive(Clone, Debug)]
pub struct RmsNorm {
    pub dim: usize,
    pub eps: f32,
    /// Scale by `1 + w` instead of `w` (Gemma).
    pub unit_offset: bool,
    bound: Bound,
}

impl RmsNorm {
    pub fn new(dim: usize, eps: f32) -> Self {
        RmsNorm { dim, eps, unit_offset: false, bound: Bound::default() }
    }

    /// The norm scaling by `1 + w` (Gemma's RMSNorm): the checkpoint's weight is used as stored.
    pub fn with_unit_offset(mut self, unit_offset: bool) -> Self {
        self.unit_offset = unit_offset;
        self
    }

    #[track_caller]
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.bound.apply(
            "RmsNorm",
            OpKind::RmsNorm { eps: self.eps, unit_offset: self.unit_offset },
            x,
            CallSite::here(),
        )
    }
}

impl Module for RmsNorm {
    fn bind(&mut self, path: &str, src: &ParamSource<'_>) -> Result<()> {
        self.bound = Bound::bind(path, src, ParamRole::NormWeight, &[self.dim], None)?;
        Ok(())
    }

    fn module_path(&self) -> Option<String> {
        self.bound.path.clone()
    }
}

/// Token embedding: ids `[..]` → `[.., hidden]`.
#[derive(Clone, Debug)]
pub struct Embedding {
    pub vocab_size: usize,
    pub hidden_size: usize,
    bound: Bound,
}

impl Embedding {
    pub fn new(vocab_size: usize, hidden_size: usize) -> Self {
        Embedding { vocab_size, hidden_size, bound: Bound::default() }
    }

    #[track_caller]
    pub fn forward(&self, ids: &Tensor) -> Result<Tensor> {
        self.bound.apply("Embedding", OpKind::Embedding, ids, CallSite::here())
    }

    pub fn weight(&self) -> Option<&Tensor> {
        self.bound.params.first()
    }
}

impl Module for Embedding {
    fn bind(&mut self, path: &str, src: &ParamSource<'_>) -> Result<()> {
        self.bound = Bound::bind(path, src, ParamRole::EmbeddingWeight, &[self.vocab_size, self.hidden_size], None)?;
        Ok(())
    }

    fn module_path(&self) -> Option<String> {
        self.bound.path.clone()
    }
}

/// Why a parameter's computed values could not be made (e.g. a table too large to allocate).
pub type ParamInitError = Box<dyn std::error::Error + Send + Sync>;

/// Computes a parameter's f32 values when the checkpoint does not have it.
pub type ParamInit = Arc<dyn Fn() -> Result<Vec<f32>, ParamInitError> + Send + Sync>;

/// A bare parameter tensor (mllm's `nn::Param`), e.g. the RoPE tables `model.mllm_max_sin_embedding`.
/// Its key is its own path. With [`or_compute`](Self::or_compute) it is computed when the checkpoint
/// lacks it (plain HF checkpoints have no RoPE tables; pymllm's have them pre-quantized).
#[derive(Clone)]
pub struct Param {
    pub shape: Vec<usize>,
    pub role: ParamRole,
    init: Option<ParamInit>,
    path: Option<String>,
    tensor: Option<Tensor>,
}

impl fmt::Debug for Param {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Param").field("shape", &self.shape).field("path", &self.path).finish()
    }
}

impl Param {
    pub fn new(shape: impl Into<Vec<usize>>, role: ParamRole) -> Self {
        Param { shape: shape.into(), role, init: None, path: None, tensor: None }
    }

    pub fn or_compute(mut self, init: impl Fn() -> Result<Vec<f32>, ParamInitError> + Send + Sync + 'static) -> Self {
        self.init = Some(Arc::new(init));
        self
    }

    pub fn tensor(&self) -> Result<&Tensor> {
        self.tensor.as_ref().ok_or_else(|| unbound("Param"))
    }
}

impl Module for Param {
    fn bind(&mut self, path: &str, src: &ParamSource<'_>) -> Result<()> {
        let (parent, name) = path.rsplit_once('.').unwrap_or(("", path));
        let t = match (src, &self.init) {
            (ParamSource::Store(store), Some(init)) if !store.contains(path) => {
                let data = init().map_err(|e| Error::Weight {
                    key: path.to_string(),
                    module_path: parent.to_string(),
                    message: format!("cannot compute it: {e}"),
                })?;
                Tensor::from_f32(data, self.shape.clone(), store.backend())?
            }
            _ => src.param(parent, name, self.role, &self.shape)?,
        };
        self.path = Some(path.to_string());
        self.tensor = Some(t);
        Ok(())
    }

    fn module_path(&self) -> Option<String> {
        self.path.clone()
    }
}

//! A float model with some of its linears replaced by their deployed int4 weights: the tool that
//! attributes a quantized checkpoint's loss to layers and linear families (weight-only, every
//! activation float).
//!
//! ```no_run
//! # use backend_cpu::quant::QuantizedSubset;
//! # use backend_cpu::{CheckpointStore, CpuBackend};
//! # use mllm_dsl::module::ParamSource;
//! # use mllm_dsl::CausalLm;
//! # use std::path::Path;
//! # fn demo(float_dir: &Path, quant_dir: &Path, tie: bool, model: &mut dyn CausalLm) -> Result<(), Box<dyn std::error::Error>> {
//! let float = CheckpointStore::open(float_dir, CpuBackend::float(), tie)?;
//! let quant = CheckpointStore::open(quant_dir, CpuBackend::float(), false)?;
//! let only_down = QuantizedSubset::new(&float, &quant, &|op: &str| op.ends_with("down_proj"));
//! model.bind_params(&ParamSource::Store(&only_down))?;
//! # Ok(())
//! # }
//! ```

use mllm_dsl::module::{ParamRequest, ParamRole, WeightStore};
use mllm_dsl::{BackendRef, Result as DslResult, Tensor};

use crate::store::CheckpointStore;

/// Serves the float checkpoint's parameters, except the linear weights whose op path (the key
/// without `.weight`) `select` accepts: those come decoded from the quantized checkpoint.
pub struct QuantizedSubset<'a> {
    float: &'a CheckpointStore,
    quantized: &'a CheckpointStore,
    select: &'a (dyn Fn(&str) -> bool + Sync),
}

impl<'a> QuantizedSubset<'a> {
    /// `quantized` must be quantized from `float` (the same model, rotated the same way).
    pub fn new(
        float: &'a CheckpointStore,
        quantized: &'a CheckpointStore,
        select: &'a (dyn Fn(&str) -> bool + Sync),
    ) -> Self {
        QuantizedSubset { float, quantized, select }
    }
}

impl WeightStore for QuantizedSubset<'_> {
    fn load(&self, req: &ParamRequest<'_>) -> DslResult<Tensor> {
        let linear = matches!(req.role, ParamRole::Conv2dWeight | ParamRole::LinearWeight);
        let op = req.key.strip_suffix(".weight").unwrap_or(req.key);
        if linear && (self.select)(op) {
            let t = self.quantized.load(req)?;
            // Run on the float store's backend, whatever the quantized store was opened with.
            let data = crate::executor::real_values(&t)
                .ok_or_else(|| mllm_dsl::Error::msg(format!("`{}` has no real-valued data", req.key)))?;
            return Tensor::from_f32(data.into_owned(), req.shape.to_vec(), self.float.backend());
        }
        self.float.load(req)
    }

    fn contains(&self, key: &str) -> bool {
        self.float.contains(key)
    }

    fn backend(&self) -> BackendRef {
        self.float.backend()
    }
}

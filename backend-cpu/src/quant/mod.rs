//! Quantized execution on the CPU: fake-quant runs of quantized checkpoints, calibration of float
//! checkpoints with mllm's observer semantics, export in pymllm's checkpoint format, and accuracy
//! reports comparing the two.
//!
//! Everything here works on a model file's QDQ points as the trace of the model lists them
//! ([`compiler::quant::points`]), so nothing is specific to one architecture:
//! - [`params`]: scale / zero point of every QDQ point, read from a checkpoint and validated;
//! - [`fake_quant`]: the [`QdqHook`](crate::QdqHook) that quantizes and dequantizes at each point;
//! - [`calibrate`]: the observing hook, the weights the model sees while it observes, and the
//!   prefill driver calibration and evaluation share;
//! - [`export`]: LPBQ / uint16 weight quantization and the checkpoint writer;
//! - [`linear`]: how linear weights become LPBQ (pymllm's rounding, MSE scale search, GPTQ), with
//!   [`input_stats`] (the linears' input second moments) and [`gptq`];
//! - [`accuracy`]: SQNR, max error and top-1 agreement per decoder layer and at the logits;
//! - [`eval`]: perplexity, mean KL(float‖quant) and top-1 agreement on a text, as users measure quality;
//! - [`rotation`]: Hadamard rotations folded into a float checkpoint before calibration, with
//!   [`hadamard`] (the orthogonal matrices);
//! - [`rtn`]: the naive weight-only round-to-nearest baseline a recipe must beat;
//! - [`subset`]: a float model with chosen linears quantized, to attribute the loss;
//! - [`sink`]: the attention-sink prefix every run may start from, shipped beside a quantized
//!   checkpoint.

pub mod accuracy;
pub mod calibrate;
pub mod error;
pub mod eval;
pub mod export;
pub mod fake_quant;
pub mod gptq;
pub mod hadamard;
pub mod input_stats;
pub mod linear;
pub mod params;
pub mod prefill;
pub mod rotation;
pub mod rtn;
pub mod sink;
pub mod subset;

pub use accuracy::{AccuracyReport, Comparison, ComparisonError, RecordingHook, Sqnr};
pub use calibrate::{Calibration, CalibrationMode, CalibrationWeights, ObserverHook};
pub use error::QuantizationError;
pub use eval::{score_logits, QualityRow, TextEval};
pub use export::{
    plan_export, quantize_weights, quantize_weights_with, write_quantized_checkpoint, ExportPlan, ParamPlan,
    QuantizedWeights,
};
pub use fake_quant::FakeQuantHook;
pub use hadamard::{orthogonal, Orthogonal, OrthogonalKind};
pub use input_stats::{InputStats, InputStatsHook, LinearStats, LinearStatsError, StatsDepth};
pub use linear::{LinearExport, LinearQuantizer, UnknownWeightMethod, WeightMethod};
pub use params::QdqParams;
pub use prefill::{prefill, prefill_logits, PresentKv};
pub use rotation::{rotate_checkpoint, Rotation, RotationSummary, UnknownRotation};
pub use rtn::RtnWeights;
pub use sink::{SinkPrefix, SINK_PREFIX_FILE};
pub use subset::QuantizedSubset;

/// Whether a checkpoint holds quantized weights (pymllm's export or this project's): it has
/// activation QDQ parameters or LPBQ scales.
pub fn is_quantized_checkpoint(ckpt: &checkpoint::SafetensorsCheckpoint) -> bool {
    ckpt.keys()
        .iter()
        .any(|k| mllm_dsl::QdqAttr::is_calibrated_scale_key(k) || mllm_dsl::ir::SpecParams::lpbq_prefix_of(k).is_some())
}

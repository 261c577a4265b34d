//! [`AscendError`]: why an AscendV1 export or its decoding refused its input.

/// Why an AscendV1 export (or reading one back) refused its input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AscendError {
    #[error("unknown AscendV1 quant type `{name}` for {argument}; expected one of {expected}")]
    UnknownQuantType { name: String, argument: String, expected: String },
    #[error("{argument} pattern `{pattern}` matches none of the model's {linears} linears (e.g. `{example}`)")]
    PatternMatchesNothing { argument: String, pattern: String, linears: usize, example: String },
    #[error("linear `{linear}` ({out_features} x {in_features}) cannot be stored as {quant_type}: {problem}")]
    CannotPack { linear: String, quant_type: String, out_features: usize, in_features: usize, problem: String },
    #[error(
        "{linear}: W4A8_DYNAMIC's scale_bias depends on whether the linear is column-parallel (q/k/v/gate/up \
         projections) or row-parallel (o/down projections), which msModelSlim tells by its name; `{linear}` is \
         neither — keep it FLOAT with AscendOptions::float_patterns"
    )]
    UnknownParallelism { linear: String },
    #[error(
        "QDQ point `{point}` feeds linears of different activation quantization ({detail}); the fake-quant run \
         quantizes a shared input once"
    )]
    SharedInput { point: String, detail: String },
    #[error("{path}: {key}: {problem}")]
    Format { path: String, key: String, problem: String },
    #[error("{0}")]
    Argument(String),
}

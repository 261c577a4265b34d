//! The checkpoint a run starts from when given none: the tiny random HF Qwen3 of
//! `fixtures/qwen3-dev-f32` (hidden 32, 2 layers, vocab 128), its reference logits and pymllm's
//! calibration ids for it, embedded so the whole flow runs without a download.

/// The model directory's files.
pub const EMBEDDED_MODEL: &[(&str, &[u8])] = &[
    ("config.json", include_bytes!("../../fixtures/qwen3-dev-f32/config.json")),
    ("model.safetensors", include_bytes!("../../fixtures/qwen3-dev-f32/model.safetensors")),
    ("reference.safetensors", include_bytes!("../../fixtures/qwen3-dev-f32/reference.safetensors")),
];
/// Name of the embedded model in reports.
pub const EMBEDDED_MODEL_NAME: &str = "embedded:qwen3-dev-f32";
/// pymllm's calibration ids for that model: `calib_ids`, int64 `[8, 32]` (seed 1234).
pub const EMBEDDED_CALIB_IDS: &[u8] = include_bytes!("../../fixtures/pymllm-qwen3-dev-f32/calib_ids.safetensors");

//! One trace of a model file serves every use of its QDQ points: the calibration traces with
//! W4A16 parameters, and the fake-quant runs (the ledger, `evaluate`) reuse that trace, which is
//! only right if a float trace names exactly the same points.

use std::path::PathBuf;

use compiler::quant::points::qdq_points;
use mllm_dsl::ParamFormat;
use models::hf::HfConfig;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fixtures").join(name)
}

#[test]
fn float_and_w4a16_traces_name_the_same_qdq_points() {
    for name in ["qwen3-dev-f32", "llama-dev-f32", "qwen2-dev-f32"] {
        let hf = HfConfig::from_dir(fixture(name)).unwrap();
        let float = qdq_points(&aot::trace_model(&hf, 1024, ParamFormat::Float).unwrap()).unwrap();
        let w4a16 = qdq_points(&aot::trace_model(&hf, 1024, ParamFormat::QnnW4A16).unwrap()).unwrap();
        assert!(float.len() > 10, "{name}: {} points", float.len());
        assert_eq!(float, w4a16, "{name}");
    }
}

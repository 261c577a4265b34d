//! Qualcomm's own QNN libraries as the judge: the clean-room declarations must match their ABI.
//!
//! These tests load the real x86_64 `libQnnHtp.so` / `libQnnSystem.so` (QAIRT 2.51 from PyPI's
//! onnxruntime-qnn 2.7.0 wheel, fetched by `scripts/fetch-qnn-sdk` into the cache, or a QAIRT
//! SDK through `QNN_SDK_ROOT`). They FAIL, naming the script, when the libraries are absent:
//! a missing judge is not a pass.
//!
//! What each test pins, established by probing the real libraries (see the ABI comments in
//! `qnn-abi/include/QNN`):
//! - `deviceCreate` reads the HTP custom config's value at offset 8 (a socModel written at
//!   offset 4 is read as 0 and rejected with 14001), and rejects an unknown SoC;
//! - context (weight sharing) and graph custom configs are accepted, both graphs finalize, and
//!   one binary holds both;
//! - `libQnnSystem.so`'s metadata (V3 binary info, 88-byte V3 graph infos, V2 tensors) reads
//!   back every graph's name and I/O names, ids, dtypes, dims and scale/offset.

#[path = "sdk_common/mod.rs"]
mod common;

use std::sync::Mutex;

use backend_qnn::sdk::ffi::{LibraryPaths, SdkApi, SystemApi};
use backend_qnn::sdk::{build_context_binary, BuildError, HtpOptions};
use backend_qnn::{Encoding, QnnGraph};

/// Qualcomm's libraries, or a failure saying how to get them.
fn real_libraries() -> LibraryPaths {
    LibraryPaths::find().unwrap_or_else(|e| panic!("{e}"))
}

/// One QNN backend at a time: Qualcomm's HTP backend is a process-wide singleton, and two
/// tests building at once make it fail validations spuriously (error 0xc26).
static BACKEND: Mutex<()> = Mutex::new(());

fn build(graphs: &[QnnGraph], options: &HtpOptions) -> Result<Vec<u8>, BuildError> {
    let _one_at_a_time = BACKEND.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let mut api = SdkApi::load(&real_libraries()).expect("the real libQnnHtp.so loads");
    build_context_binary(graphs, options, &mut api)
}

#[test]
fn real_backend_builds_both_graphs_and_the_system_library_reads_them_back() {
    let graphs = common::toy_model();
    let binary = build(&graphs, &HtpOptions::sm8650()).unwrap();
    let info = SystemApi::load(&real_libraries().system).unwrap().binary_info(&binary).unwrap();
    assert_eq!(info.graphs.len(), 2);
    for (read, graph) in info.graphs.iter().zip(&graphs) {
        assert_eq!(read.name, graph.name);
        let listed = read.inputs.iter().chain(&read.outputs);
        let declared = graph.inputs.iter().chain(&graph.outputs);
        for (t, name) in listed.zip(declared) {
            let d = graph.tensors.iter().find(|d| &d.name == name).unwrap();
            assert_eq!(t.name, d.name, "{}", graph.name);
            assert_eq!(t.dtype, d.dtype, "{}", t.name);
            assert_eq!(t.dims, d.dims, "{}", t.name);
            let Encoding::ScaleOffset(q) = d.encoding else { panic!("toy I/O is scale/offset") };
            assert_eq!(t.quant, Some(q), "{}", t.name);
        }
        assert_eq!(read.inputs.len(), graph.inputs.len());
        assert_eq!(read.outputs.len(), graph.outputs.len());
    }
}

#[test]
fn device_create_reads_the_soc_model_qualcomm_defines() {
    // SM8650 (57) was accepted above; a SoC number Qualcomm does not define must be refused,
    // which shows the value is read where we write it.
    let mut options = HtpOptions::sm8650();
    options.device.soc_model = 9_999;
    let err = build(&common::toy_model(), &options).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("creating the HTP device") && msg.contains("deviceCreate"), "{msg}");
}

//! The lowered tiny Qwen3 (`model.0.s4` + `model.0.s1`) built into one context for mllm's SM8650
//! `target_machine`: the exact QNN call sequence, recorded by `RecordingApi` and snapshotted
//! (`snapshots/qnn__qwen3__context_call_sequence.snap`), with one creation per shared weight.
//! The same sequence through the FFI and the clean-room mock provider is tested in
//! `tests/sdk_ffi.rs`.

mod qwen3_common;

use backend_qnn::context::{build_context, context_options, write_context_binary, ContextError};
use backend_qnn::sdk::render::{self, FakeGraph};
use backend_qnn::sdk::RecordingApi;
use backend_qnn::target::{HtpTarget, TargetError};
use backend_qnn::{GraphIo, TensorType};
use compiler::aot_config::AotConfig;
use qwen3_common::*;

/// The `target_machine` block of mllm's Qwen3-1.7B AOT config (SM8650, V75, signed PD, 8 MB).
fn sm8650() -> HtpTarget {
    HtpTarget::new(&aot_config().target_machine)
}

#[test]
fn both_graphs_go_into_one_weight_sharing_context_in_order() {
    let (s4, s1) = lowered_pair();
    let graphs = [s4, s1];
    let mut api = RecordingApi::new();
    let binary = build_context(&graphs, &sm8650(), &mut api).unwrap();
    let log = api.log();

    let calls = |f: &str| log.lines().filter(|l| l.starts_with(&format!("{f}("))).count();
    assert_eq!(calls("contextCreate"), 1);
    assert!(log.contains("htp.weightSharingEnabled(1)"), "{log}");
    let graph_order: Vec<&str> =
        log.lines().filter(|l| l.starts_with("graphCreate(")).map(|l| l.split('"').nth(1).unwrap()).collect();
    assert_eq!(graph_order, ["model.0.s4", "model.0.s1"]);
    assert_eq!(calls("graphFinalize"), 2);
    assert_eq!(calls("graphAddNode"), graphs[0].nodes.len() + graphs[1].nodes.len());
    // Every static tensor is created in each graph that uses it (QNN tensor ids belong to one
    // graph; the weight-sharing context stores same-named statics once).
    for t in graphs[0].tensors.iter().filter(|t| t.tensor_type == TensorType::Static) {
        let created = log
            .lines()
            .filter(|l| l.starts_with("tensorCreateGraphTensor(") && l.contains(&format!("{{name=\"{}\",", t.name)))
            .count();
        let users = graphs.iter().filter(|g| g.tensors.iter().any(|u| u.name == t.name)).count();
        assert_eq!(created, users, "{}", t.name);
    }
    // The fake binary lists both graphs with their I/O in binding order.
    let options = context_options(&graphs, &sm8650()).unwrap();
    assert!(options.weight_sharing);
    let listed = render::parse_fake_context_binary(&binary).expect("a fake context binary");
    assert_eq!(render::fake_context_binary(&listed), binary, "listing round trip");
    let without_ids: Vec<FakeGraph> =
        listed.iter().cloned().map(|g| FakeGraph { io: g.io.without_ids(), ..g }).collect();
    let fake: Vec<FakeGraph> =
        graphs.iter().map(|g| FakeGraph { io: GraphIo::from_graph(g).unwrap(), nodes: g.nodes.len() as u32 }).collect();
    assert_eq!(without_ids, fake);
    // I/O ids are the ones the backend assigned, distinct within the context.
    let mut ids: Vec<u32> =
        listed.iter().flat_map(|g| g.io.inputs.iter().chain(&g.io.outputs).map(|t| t.id.unwrap())).collect();
    let n = ids.len();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), n);
    assert!(ids[0] > 0);

    insta::with_settings!({
        snapshot_path => concat!(env!("CARGO_MANIFEST_DIR"), "/../snapshots"),
        prepend_module_to_snapshot => false,
        omit_expression => true,
    }, {
        insta::assert_snapshot!("qnn__qwen3__context_call_sequence", log);
    });
}

#[test]
fn target_errors_stop_before_any_call() {
    let (s4, s1) = lowered_pair();
    // The AOT config owns the target checks: a bad target never reaches the backend.
    let mut json = aot_config().to_json();
    json["target_machine"]["htp_chipset"] = serde_json::json!("SM9999");
    let err = AotConfig::from_json(&json).unwrap_err().to_string();
    assert!(err.contains("`target_machine.htp_chipset`") && err.contains("\"SM9999\""), "{err}");
    json["target_machine"]["htp_chipset"] = serde_json::json!("SM8750");
    let err = AotConfig::from_json(&json).unwrap_err().to_string();
    assert_eq!(err, "AOT config field `target_machine.htp_arch`: V75 does not match htp_chipset SM8750, which is V79");
    // Two graphs need weight sharing, which V69 lacks.
    json["target_machine"]["htp_chipset"] = serde_json::json!("SM8450");
    json["target_machine"]["htp_arch"] = serde_json::json!("V69");
    let old = HtpTarget::new(&AotConfig::from_json(&json).unwrap().target_machine);
    let mut api = RecordingApi::new();
    let err = build_context(&[s4, s1.clone()], &old, &mut api).unwrap_err();
    assert!(matches!(err, ContextError::Target(TargetError::WeightSharingUnsupported { .. })), "{err}");
    assert!(api.log().is_empty());
    // One graph alone needs no sharing.
    build_context(&[s1], &old, &mut api).unwrap();
}

/// A `QNN_SDK_ROOT` without Qualcomm's libraries is an error naming the library it lacks, and
/// nothing is written. (No other test of this file reads the variable.)
#[test]
fn a_qnn_sdk_root_without_the_libraries_is_named_and_nothing_is_written() {
    use backend_qnn::context::{build_context_binary, build_context_with_sdk};
    let (s4, s1) = lowered_pair();
    let graphs = [s4, s1];
    let dir = TempDir::new("context-no-sdk");
    std::env::set_var("QNN_SDK_ROOT", dir.0.join("no-sdk"));
    let in_memory = build_context_with_sdk(&graphs, &sm8650()).unwrap_err();
    let out = dir.0.join("qwen3.bin");
    let written = build_context_binary(&graphs, &sm8650(), &out).unwrap_err();
    std::env::remove_var("QNN_SDK_ROOT");
    let msg = in_memory.to_string();
    assert!(matches!(in_memory, ContextError::Sdk(backend_qnn::sdk::SdkError::Load(_))), "{msg}");
    let lib = dir.0.join("no-sdk/lib/x86_64-linux-clang/libQnnHtp.so");
    assert!(msg.contains(&lib.display().to_string()) && msg.contains("scripts/fetch-qnn-sdk"), "{msg}");
    assert_eq!(written.to_string(), msg);
    assert!(std::fs::read_dir(&dir.0).unwrap().next().is_none(), "nothing may be written");
}

#[test]
fn the_binary_is_written_atomically_with_what_it_holds() {
    let (s4, s1) = lowered_pair();
    let graphs = [s4, s1];
    let dir = TempDir::new("context-write");
    let out = dir.0.join("qwen3.bin");
    std::fs::write(&out, b"old").unwrap();
    let mut api = RecordingApi::new();
    let written = write_context_binary(&graphs, &sm8650(), &mut api, &out).unwrap();
    let expected = build_context(&graphs, &sm8650(), &mut RecordingApi::new()).unwrap();
    assert_eq!(std::fs::read(&out).unwrap(), expected);
    assert_eq!((written.path.as_path(), written.bytes), (out.as_path(), expected.len() as u64));
    assert_eq!(written.graphs, ["model.0.s4", "model.0.s1"]);
    // Only the binary is left in the directory (no temporary file).
    let names: Vec<_> = std::fs::read_dir(&dir.0).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names, [std::ffi::OsString::from("qwen3.bin")]);
    // A directory that does not exist is an error naming the path; no partial file appears.
    let missing = dir.0.join("missing").join("qwen3.bin");
    let err = write_context_binary(&graphs, &sm8650(), &mut RecordingApi::new(), &missing).unwrap_err();
    assert!(matches!(err, ContextError::Write(_)) && err.to_string().contains("missing/qwen3.bin"), "{err}");
}

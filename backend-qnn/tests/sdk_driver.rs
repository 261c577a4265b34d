//! The compile-side call sequence, checked through `RecordingApi` (no SDK needed).

#[path = "sdk_common/mod.rs"]
mod common;

use backend_qnn::sdk::{build_context_binary, render, ApiError, BuildError, HtpOptions, RecordingApi};
use backend_qnn::{OpType, QnnGraph, ScaleOffset, StaticData, TensorType};

fn record(graphs: &[QnnGraph]) -> (Result<Vec<u8>, BuildError>, RecordingApi) {
    let mut api = RecordingApi::new();
    let result = build_context_binary(graphs, &HtpOptions::sm8650(), &mut api);
    (result, api)
}

/// Lines of `function` calls whose rendered arguments mention `needle`.
fn lines_with<'a>(api: &'a RecordingApi, function: &str, needle: &str) -> Vec<&'a str> {
    api.calls().iter().filter(|c| c.function == function && c.line.contains(needle)).map(|c| c.line.as_str()).collect()
}

#[test]
fn call_sequence_snapshot() {
    let (binary, api) = record(&common::toy_model());
    binary.unwrap();
    insta::with_settings!({
        snapshot_path => concat!(env!("CARGO_MANIFEST_DIR"), "/../snapshots"),
        prepend_module_to_snapshot => false,
        omit_expression => true,
        description => "QNN calls for a two-graph toy (RmsNorm + LPBQ Conv2d, prefill s32 + decode s1) on SM8650",
    }, {
        insta::assert_snapshot!("qnn__sdk__call_sequence", api.log());
    });
}

#[test]
fn one_context_graphs_in_order_and_teardown_last() {
    let (binary, api) = record(&common::toy_model());
    binary.unwrap();
    let f = api.functions();
    assert_eq!(f.iter().filter(|&&n| n == "contextCreate").count(), 1);
    assert_eq!(&f[..4], &["logCreate", "backendCreate", "deviceCreate", "contextCreate"]);
    assert_eq!(
        &f[f.len() - 6..],
        &["contextGetBinarySize", "contextGetBinary", "contextFree", "deviceFree", "backendFree", "logFree"]
    );
    let graph_creates = lines_with(&api, "graphCreate", "");
    assert_eq!(graph_creates.len(), 2);
    assert!(graph_creates[0].contains("name=\"model.0.s32\"") && graph_creates[0].ends_with("-> graph1"));
    assert!(graph_creates[1].contains("name=\"model.0.s1\"") && graph_creates[1].ends_with("-> graph2"));
    assert!(api.calls()[3].line.contains("htp.weightSharingEnabled(1)"));

    // Each graph is finalized before the next one is created; every node validated then added.
    let finalize1 = f.iter().position(|&n| n == "graphFinalize").unwrap();
    let create2 = f.iter().rposition(|&n| n == "graphCreate").unwrap();
    assert!(finalize1 < create2);
    for (i, &name) in f.iter().enumerate() {
        if name == "backendValidateOpConfig" {
            assert_eq!(f[i + 1], "graphAddNode");
        }
    }
}

#[test]
fn graph_io_created_first_and_params_per_node() {
    let (binary, api) = record(&common::toy_model());
    binary.unwrap();
    let f = api.functions();
    for graph in ["graph1", "graph2"] {
        let creates = lines_with(&api, "tensorCreateGraphTensor", &format!("graph={graph},"));
        assert!(creates[0].contains("name=\"x\", type=APP_WRITE"), "{graph}: {}", creates[0]);
        assert!(creates[1].contains("name=\"y\", type=APP_READ"), "{graph}: {}", creates[1]);
        // Param tensors exist per graph, once per node that uses them.
        for p in ["model.norm.axes", "model.proj.stride", "model.proj.pad_amount", "model.proj.dilation"] {
            assert_eq!(creates.iter().filter(|l| l.contains(&format!("name=\"{p}\""))).count(), 1, "{graph} {p}");
        }
    }
    // The first node's tensors are created right after graph I/O, before its validation.
    let first_validate = f.iter().position(|&n| n == "backendValidateOpConfig").unwrap();
    assert_eq!(&f[5..first_validate], &["tensorCreateGraphTensor"; 6]);
}

#[test]
fn each_graph_creates_its_own_static_weights() {
    // QNN tensor ids belong to one graph: Qualcomm's HTP backend rejects a node that names a
    // tensor of another graph ("Did not find registered tensor"). Weights are shared by the
    // weight-sharing context, which stores same-named STATIC tensors once.
    let (binary, api) = record(&common::toy_model());
    binary.unwrap();
    for w in ["model.norm.weight", "model.norm_runtime_bias", "model.proj.weight"] {
        let creates = lines_with(&api, "tensorCreateGraphTensor", &format!("name=\"{w}\""));
        assert_eq!(creates.len(), 2, "{w} created {} times", creates.len());
        assert!(creates[0].contains("graph=graph1") && creates[1].contains("graph=graph2"), "{creates:?}");
        // Same description in both graphs: only the graph and the id differ.
        let body = |l: &str| l.split_once("tensor={").map(|(_, b)| b.rsplit_once("-> ").unwrap().0.to_string());
        assert_eq!(body(creates[0]), body(creates[1]), "{w}");
    }
    // Each Conv2d node references the weight by the id it got in its own graph.
    let ids: Vec<String> = lines_with(&api, "tensorCreateGraphTensor", "name=\"model.proj.weight\"")
        .iter()
        .map(|l| l.rsplit("-> ").next().unwrap().to_string())
        .collect();
    let adds = lines_with(&api, "graphAddNode", "name=\"model.proj\"");
    assert_eq!(adds.len(), 2);
    for (add, id) in adds.iter().zip(&ids) {
        assert!(add.contains(&format!("{id} \"model.proj.weight\"")), "{add}");
    }
    assert_ne!(ids[0], ids[1]);
}

#[test]
fn fake_binary_lists_both_graphs() {
    let (binary, _) = record(&common::toy_model());
    let text = String::from_utf8(binary.unwrap()).unwrap();
    assert_eq!(
        text,
        format!(
            "{}\ngraph model.0.s32 nodes=2\nin 1 x UFIXED_POINT_16 1x1x32x64 1.00000005e-03 -32768\n\
             out 2 y UFIXED_POINT_16 1x1x32x32 4.00000019e-03 -32768\n\
             graph model.0.s1 nodes=2\nin 11 x UFIXED_POINT_16 1x1x1x64 1.00000005e-03 -32768\n\
             out 12 y UFIXED_POINT_16 1x1x1x32 4.00000019e-03 -32768\n",
            render::FAKE_BINARY_MAGIC
        )
    );
    // The listing parses back, scales exactly (`%.8e` round-trips an f32).
    let listed = render::parse_fake_context_binary(text.as_bytes()).unwrap();
    assert_eq!(listed[1].io.outputs[0].quant, Some(ScaleOffset { scale: 0.004, offset: -32768 }));
    assert_eq!(render::fake_context_binary(&listed), text.as_bytes());
    assert!(render::parse_fake_context_binary(b"QNN-FAKE-CONTEXT-BINARY 2\nin 1 x UFIXED_POINT_16 1x2\n").is_none());
}

#[test]
fn rejected_node_is_named_and_handles_are_freed() {
    let mut api = RecordingApi::new();
    api.fail("backendValidateOpConfig", "model.proj", 6001);
    let err = build_context_binary(&common::toy_model(), &HtpOptions::sm8650(), &mut api).unwrap_err();
    assert_eq!(
        err,
        BuildError::NodeRejected {
            graph: "model.0.s32".into(),
            node: "model.proj".into(),
            op_type: OpType::Conv2d,
            source: ApiError::Qnn { function: "backendValidateOpConfig", code: 6001 },
        }
    );
    let msg = err.to_string();
    assert!(msg.contains("node `model.proj` (Conv2d) of graph `model.0.s32`"), "{msg}");
    assert!(msg.contains("6001 (graph error)"), "{msg}");

    let f = api.functions();
    assert!(lines_with(&api, "graphAddNode", "model.proj").is_empty(), "rejected node must not be added");
    assert!(!f.contains(&"graphFinalize") && !f.contains(&"contextGetBinary"));
    assert_eq!(&f[f.len() - 4..], &["contextFree", "deviceFree", "backendFree", "logFree"]);
    assert!(api.calls().iter().rev().take(4).all(|c| c.line.ends_with("-> ok")));
}

#[test]
fn failing_tensor_creation_names_tensor_and_graph() {
    let mut api = RecordingApi::new();
    api.fail("tensorCreateGraphTensor", "model.proj.weight", 7006);
    let err = build_context_binary(&common::toy_model(), &HtpOptions::sm8650(), &mut api).unwrap_err();
    assert_eq!(
        err.to_string(),
        "creating tensor `model.proj.weight` in graph `model.0.s32`: tensorCreateGraphTensor returned error 7006 (QNN_TENSOR_ERROR_NAME_HASH_COLLISION)"
    );
    assert_eq!(api.functions().last(), Some(&"logFree"));
}

#[test]
fn failure_before_context_frees_what_exists() {
    let mut api = RecordingApi::new();
    api.fail("deviceCreate", "", 14001);
    let err = build_context_binary(&common::toy_model(), &HtpOptions::sm8650(), &mut api).unwrap_err();
    assert!(err.to_string().starts_with("creating the HTP device: deviceCreate returned error 14001"), "{err}");
    assert_eq!(api.functions(), ["logCreate", "backendCreate", "deviceCreate", "backendFree", "logFree"]);
}

#[test]
fn invalid_graphs_fail_before_any_call() {
    let mut graphs = common::toy_model();
    graphs[1].nodes.swap(0, 1); // Conv2d now consumes `h` before RmsNorm produces it.
    let (result, api) = record(&graphs);
    assert_eq!(
        result.unwrap_err().to_string(),
        "graph `model.0.s1`: node `model.proj` (Conv2d): input `h` is used before a node produces it (nodes must be in dependency order)"
    );
    assert!(api.calls().is_empty());

    let mut graphs = common::toy_model();
    let w = graphs[1].tensors.iter_mut().find(|t| t.name == "model.proj.weight").unwrap();
    w.data = Some(StaticData::new(vec![1u8; w.numel() as usize]));
    let (result, api) = record(&graphs);
    let msg = result.unwrap_err().to_string();
    assert!(
        msg.contains("STATIC tensor `model.proj.weight` differs from the one of the same name in graph `model.0.s32`"),
        "{msg}"
    );
    assert!(api.calls().is_empty());

    let mut graphs = common::toy_model();
    graphs[0].tensors.iter_mut().find(|t| t.name == "y").unwrap().tensor_type = TensorType::Native;
    let (result, _) = record(&graphs);
    assert_eq!(result.unwrap_err().to_string(), "graph `model.0.s32`: graph output `y` is NATIVE, expected APP_READ");

    let mut graphs = common::toy_model();
    graphs[1].name = "model.0.s32".into();
    assert!(record(&graphs).0.unwrap_err().to_string().contains("graph name is used twice"));
}

mod owned_graphs {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use backend_qnn::sdk::{
        build_context_binary, build_context_binary_owned, BuildPhase, HtpOptions, PhaseObserver, RecordingApi,
    };

    /// Static buffers of the owned graphs still alive.
    static LIVE: AtomicUsize = AtomicUsize::new(0);

    /// By value, the driver frees each graph's static data once its nodes are added: the
    /// prefill graph finalizes with only the decode graph's (shared) weights alive, the decode
    /// graph and the serialization with none; the calls and the binary are those of the
    /// borrowing build.
    #[test]
    fn static_data_is_freed_before_each_graph_is_finalized() {
        let graphs = super::common::toy_model();
        let mut borrowed = RecordingApi::new();
        let expected = build_context_binary(&graphs, &HtpOptions::sm8650(), &mut borrowed).unwrap();

        let owned = super::common::poisoned_copies(&graphs, &LIVE);
        let distinct = LIVE.load(Ordering::SeqCst);
        assert!(distinct > 0);
        let mut alive_at = Vec::new();
        let mut on_phase = |phase: BuildPhase| alive_at.push((phase, LIVE.load(Ordering::SeqCst)));
        let mut recording = RecordingApi::new();
        let binary = build_context_binary_owned(
            owned,
            &HtpOptions::sm8650(),
            &mut PhaseObserver::new(&mut recording, &mut on_phase),
        )
        .unwrap();
        use BuildPhase::*;
        let decode_weights = alive_at[2].1;
        assert!(decode_weights > 0 && decode_weights <= distinct, "{alive_at:?}");
        assert_eq!(
            alive_at,
            [
                (Setup, distinct),
                (AddNodes, distinct),
                (Finalize, decode_weights),
                (AddNodes, decode_weights),
                (Finalize, 0),
                (Serialize, 0),
                (Release, 0)
            ]
        );
        assert_eq!(binary, expected);
        let lines = |api: &RecordingApi| api.calls().iter().map(|c| c.line.clone()).collect::<Vec<_>>();
        assert_eq!(lines(&recording), lines(&borrowed));
    }
}

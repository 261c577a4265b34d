//! The tiny Qwen3, Llama, Llama 3 and Qwen2 fixtures compiled by Qualcomm's own HTP backend.
//!
//! Each model is quantized (pymllm's export for Qwen3, W4A16/KV8 calibrated here for the
//! others), traced as `model.0.s32` and `model.0.s1`, run through mllm's passes, lowered, and
//! built for SM8650 / V75 with the real `libQnnHtp.so`: every node passes the backend's
//! `backendValidateOpConfig`, both graphs finalize into one weight-sharing context, and the
//! real `libQnnSystem.so` reads the binary back with the graph names, I/O names, dtypes, dims
//! and scale/offset encodings we declared. Fails, naming `scripts/fetch-qnn-sdk`, when the
//! libraries are absent (see `tests/sdk_real.rs`).

mod model_common;
#[path = "sdk_common/mod.rs"]
mod sdk_common;

use std::sync::Mutex;

use backend_qnn::context::{build_context, context_options};
use backend_qnn::encoding::Int4Storage;
use backend_qnn::sdk::ffi::{LibraryPaths, SdkApi, SystemApi};
use backend_qnn::sdk::BuildError;
use backend_qnn::target::HtpTarget;
use backend_qnn::LowerOptions;
use backend_qnn::{DataType, Encoding, OpType};
use model_common::{fixture, AotModel};

/// Context length of the traced graphs (the KV cache inputs' length), as `qwen3_aot` uses.
const CONTEXT: usize = 1024;

/// Qualcomm's HTP backend is a process-wide singleton: one build at a time.
static BACKEND: Mutex<()> = Mutex::new(());

fn compiles_for_real(model: AotModel) {
    let paths = LibraryPaths::find().unwrap_or_else(|e| panic!("{e}"));
    let options = LowerOptions::qualcomm_htp();
    let graphs = model.lowered_at(&[32, 1], CONTEXT, options);
    let names: Vec<&str> = graphs.iter().map(|g| g.name.as_str()).collect();
    assert_eq!(names, ["model.0.s32", "model.0.s1"]);
    let target = HtpTarget::new(&model.aot_config().target_machine);
    let binary = {
        let _one_at_a_time = BACKEND.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let mut api = SdkApi::load(&paths).unwrap();
        build_context(&graphs, &target, &mut api).unwrap_or_else(|e| panic!("{}: {e}", model.dir.display()))
    };
    let info = SystemApi::load(&paths.system).unwrap().binary_info(&binary).unwrap();
    assert_eq!(info.graphs.len(), graphs.len());
    for (read, graph) in info.graphs.iter().zip(&graphs) {
        assert_eq!(read.name, graph.name);
        let listed: Vec<_> = read.inputs.iter().chain(&read.outputs).collect();
        let declared: Vec<_> = graph.inputs.iter().chain(&graph.outputs).collect();
        assert_eq!(listed.len(), declared.len(), "{}", graph.name);
        for (t, name) in listed.into_iter().zip(declared) {
            let d = graph.tensors.iter().find(|d| &d.name == name).unwrap();
            assert_eq!(&t.name, name, "{}", graph.name);
            assert_eq!(t.dtype, d.dtype, "{}: {name}", graph.name);
            assert_eq!(t.dims, d.dims, "{}: {name}", graph.name);
            match d.encoding {
                Encoding::ScaleOffset(q) => assert_eq!(t.quant, Some(q), "{}: {name}", graph.name),
                _ => {
                    assert!(matches!(d.dtype, DataType::Int32 | DataType::UInt32 | DataType::Float32));
                    assert_eq!(t.quant, None, "{}: {name}", graph.name);
                }
            }
        }
    }
}

#[test]
fn qwen3_compiles_with_qualcomms_backend() {
    compiles_for_real(AotModel::open(fixture("pymllm-qwen3-dev-f32")));
}

#[test]
fn llama_compiles_with_qualcomms_backend() {
    compiles_for_real(AotModel::calibrated("llama-dev-f32"));
}

#[test]
fn llama3_compiles_with_qualcomms_backend() {
    compiles_for_real(AotModel::calibrated("llama3-dev-f32"));
}

#[test]
fn qwen2_compiles_with_qualcomms_backend() {
    compiles_for_real(AotModel::calibrated("qwen2-dev-f32"));
}

// ------------------------------------------------------------------ execution ---------------

use backend_qnn::interp::TensorValue;
use backend_qnn::sdk::{build_context_binary, run_binary_on_values};
use backend_qnn::QnnGraph;
use model_common::{sqnr_db, CHUNK};

/// Runs `g` of `binary` once on Qualcomm's x86 HTP emulation with `inputs`; the outputs as values.
fn execute_on_htp(binary: &[u8], g: &QnnGraph, inputs: &[TensorValue]) -> Vec<TensorValue> {
    let paths = LibraryPaths::find().unwrap_or_else(|e| panic!("{e}"));
    let _one_at_a_time = BACKEND.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let mut api = SdkApi::load_for_execution(&paths).unwrap();
    let mut outputs = run_binary_on_values(&mut api, binary, &[(g, inputs)]).unwrap_or_else(|e| panic!("{e}"));
    outputs.remove(0)
}

/// Logits SQNR of the HTP emulation against this project's reference interpreter and against
/// backend-cpu's fake-quant run, per graph.
fn htp_matches_the_references(model: AotModel) {
    let paths = LibraryPaths::find().unwrap_or_else(|e| panic!("{e}"));
    let options = LowerOptions::qualcomm_htp();
    let graphs = model.lowered_at(&[CHUNK, 1], model_common::CONTEXT, options);
    let target = HtpTarget::new(&model.aot_config().target_machine);
    // x86 HTP emulation refuses weight-shared binaries at load ("Shared weights buffer isn't
    // supported on this platform"), so the binary run here is built without weight sharing.
    let mut htp_options = context_options(&graphs, &target).unwrap();
    htp_options.weight_sharing = false;
    let binary = {
        let _one_at_a_time = BACKEND.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        build_context_binary(&graphs, &htp_options, &mut SdkApi::load(&paths).unwrap()).unwrap()
    };
    for (g, chunk) in graphs.iter().zip([CHUNK, 1]) {
        let htp = execute_on_htp(&binary, g, &model.qnn_inputs(g, chunk));
        let interp = model.run_qnn(g, chunk);
        let cpu = model.run_cpu_fake_quant(&model.compiled(chunk), chunk);
        let htp_logits = htp[0].to_real().unwrap();
        let vs_interp = sqnr_db(&htp_logits, &interp[0].to_real().unwrap());
        let vs_fakequant = sqnr_db(&htp_logits, cpu[0].as_f32().unwrap());
        eprintln!(
            "{} {}: htp_vs_interp {vs_interp:.2} dB, htp_vs_fakequant {vs_fakequant:.2} dB",
            model.dir.display(),
            g.name
        );
        assert!(vs_interp >= 35.0 && vs_fakequant >= 35.0, "{}: {vs_interp} / {vs_fakequant} dB", g.name);
    }
}

#[test]
fn qwen3_runs_on_the_htp_emulation() {
    htp_matches_the_references(AotModel::open(fixture("pymllm-qwen3-dev-f32")));
}

#[test]
fn llama_runs_on_the_htp_emulation() {
    htp_matches_the_references(AotModel::calibrated("llama-dev-f32"));
}

#[test]
fn llama3_runs_on_the_htp_emulation() {
    htp_matches_the_references(AotModel::calibrated("llama3-dev-f32"));
}

#[test]
fn qwen2_runs_on_the_htp_emulation() {
    htp_matches_the_references(AotModel::calibrated("qwen2-dev-f32"));
}

/// Backend rule: QAIRT 2.51's HTP backend refuses SFIXED_POINT_4 tensors ("tensor datatype 772
/// not supported", 7004 at tensorCreateGraphTensor), so mllm's low-nibble int4 weights must go
/// as SFIXED_POINT_8 containers (`Int4Storage::Int8Container`), as above.
#[test]
fn sfixed_point_4_weights_are_refused_by_qualcomms_backend() {
    let paths = LibraryPaths::find().unwrap_or_else(|e| panic!("{e}"));
    let model = AotModel::open(fixture("pymllm-qwen3-dev-f32"));
    let options = LowerOptions { int4_storage: Int4Storage::LowNibble, ..LowerOptions::qualcomm_htp() };
    let graphs = model.lowered_at(&[1], model_common::CONTEXT, options);
    let target = HtpTarget::new(&model.aot_config().target_machine);
    let _one_at_a_time = BACKEND.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let err = build_context(&graphs, &target, &mut SdkApi::load(&paths).unwrap()).unwrap_err().to_string();
    assert!(err.contains("creating tensor `model_layers_0_self_attn_q_proj_weight`"), "{err}");
    assert!(err.contains("tensorCreateGraphTensor returned error 7004"), "{err}");
    // The backend's own words, caught by our log callback.
    assert!(err.contains("the backend logged: ERROR:  <E> tensor datatype 772 not supported"), "{err}");
}

/// A node Qualcomm's backend refuses is reported with the node, its op type, the QNN error code
/// and the lines the backend logged while refusing it (caught by our log callback).
#[test]
fn a_rejected_node_names_qualcomms_log_line() {
    let paths = LibraryPaths::find().unwrap_or_else(|e| panic!("{e}"));
    let model = AotModel::open(fixture("pymllm-qwen3-dev-f32"));
    let options = LowerOptions::qualcomm_htp();
    let mut graphs = model.lowered_at(&[1], CONTEXT, options);
    let target = HtpTarget::new(&model.aot_config().target_machine);
    let htp = context_options(&graphs, &target).unwrap();
    // Past our own validator (already run above): the first Transpose loses its `perm`.
    let node = graphs[0].nodes.iter_mut().find(|n| n.op_type == OpType::Transpose).expect("a Transpose node");
    node.params.retain(|(name, _)| name != "perm");
    let name = node.name.clone();
    let _one_at_a_time = BACKEND.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let err = build_context_binary(&graphs, &htp, &mut SdkApi::load(&paths).unwrap()).unwrap_err();
    let BuildError::NodeRejected { node, op_type, source, .. } = &err else { panic!("not a node rejection: {err}") };
    assert_eq!((node.as_str(), *op_type), (name.as_str(), OpType::Transpose));
    assert_eq!(source.function(), "backendValidateOpConfig");
    assert!(source.qnn_code().is_some(), "{err}");
    let log = source.backend_log();
    assert!(!log.is_empty(), "the backend logged nothing for the refusal: {err}");
    let msg = err.to_string();
    eprintln!("{msg}");
    // Qualcomm's words for a Transpose without its mandatory `perm` (QAIRT 2.51).
    assert!(log.iter().any(|l| l.contains("Wrong number of Parameters 0")), "{err}");
    for part in [format!("`{name}`"), "(Transpose)".into(), "returned error 3110".into(), log[0].clone()] {
        assert!(msg.contains(&part), "`{part}` missing from: {msg}");
    }
}

/// The per-op tool on Qualcomm's emulation: the Qwen3 chunk-4 graph cut after its first Softmax
/// (every node before it included), and that Softmax alone on the interpreter's inputs, agree
/// with the reference interpreter.
#[test]
fn a_window_of_the_graph_runs_on_the_htp_emulation() {
    use backend_qnn::interp::Interpreter;
    use backend_qnn::sdk::{run_window_on_values, HtpOptions};
    let paths = LibraryPaths::find().unwrap_or_else(|e| panic!("{e}"));
    let model = AotModel::open(fixture("pymllm-qwen3-dev-f32"));
    let g = model.lowered_at(&[CHUNK], model_common::CONTEXT, LowerOptions::qualcomm_htp()).remove(0);
    let values = Interpreter::new(&g).unwrap().run_all(&model.qnn_inputs(&g, CHUNK)).unwrap();
    let softmax = g.nodes.iter().position(|n| n.op_type == OpType::Softmax).unwrap();
    let options = HtpOptions { log_level: None, ..HtpOptions::sm8650() };
    for nodes in [0..softmax + 1, softmax..softmax + 1] {
        let out = {
            let _one_at_a_time = BACKEND.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            let mut build = SdkApi::load(&paths).unwrap();
            let mut exec = SdkApi::load_for_execution(&paths).unwrap();
            run_window_on_values(&mut build, &mut exec, &options, &g, nodes.clone(), &values).unwrap()
        };
        let reference = values[&g.nodes[softmax].outputs[0]].to_real().unwrap();
        let db = sqnr_db(&out[0].to_real().unwrap(), &reference);
        eprintln!("nodes {nodes:?} on the HTP emulation: {db:.2} dB");
        assert!(db >= 40.0, "nodes {nodes:?}: {db:.2} dB");
    }
    let _one_at_a_time = BACKEND.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let (mut build, mut exec) = (SdkApi::load(&paths).unwrap(), SdkApi::load_for_execution(&paths).unwrap());
    let err = run_window_on_values(&mut build, &mut exec, &options, &g, softmax..softmax + 1, &Default::default())
        .unwrap_err();
    assert!(err.to_string().contains("no value was given"), "{err}");
}

// ------------------------------------------------------------- static data lifetime ---------

use std::sync::atomic::{AtomicUsize, Ordering};

use backend_qnn::sdk::{build_context_binary_owned, BuildPhase, HtpOptions, PhaseObserver};
use sdk_common::poisoned_copies;

/// Static buffers of [`poisoned_copies`] still alive.
static LIVE_POISONED: AtomicUsize = AtomicUsize::new(0);

/// [`build_context_binary_owned`] releases each graph's static data before its `graphFinalize`
/// (nothing of it is alive when the last graph finalizes or the context is serialized), and
/// Qualcomm's backend does not need it then: with the released buffers poisoned, the binary
/// reads back with the same graphs and I/O (weight-shared and unshared), and the unshared one
/// computes on the HTP emulation exactly what the binary built from live buffers computes.
/// (QAIRT 2.51's binaries are not byte-reproducible: two builds of the same graphs differ in a
/// few thousand bytes unshared and in size when weight-shared, so bytes are not compared.)
#[test]
fn static_data_released_before_finalize_leaves_the_binary_unchanged() {
    let paths = LibraryPaths::find().unwrap_or_else(|e| panic!("{e}"));
    let system = SystemApi::load(&paths.system).unwrap();
    let model = AotModel::open(fixture("pymllm-qwen3-dev-f32"));
    let graphs = model.lowered_at(&[CHUNK, 1], model_common::CONTEXT, LowerOptions::qualcomm_htp());
    let target = HtpTarget::new(&model.aot_config().target_machine);
    let shared = context_options(&graphs, &target).unwrap();
    let unshared = HtpOptions { weight_sharing: false, ..shared };
    for options in [shared, unshared] {
        let _one_at_a_time = BACKEND.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let live = build_context_binary(&graphs, &options, &mut SdkApi::load(&paths).unwrap()).unwrap();
        let mut alive_at = Vec::new();
        let mut on_phase = |phase: BuildPhase| {
            if matches!(phase, BuildPhase::Finalize | BuildPhase::Serialize) {
                alive_at.push((phase, LIVE_POISONED.load(Ordering::SeqCst)));
            }
        };
        let mut sdk = SdkApi::load(&paths).unwrap();
        let mut observed = PhaseObserver::new(&mut sdk, &mut on_phase);
        let released =
            build_context_binary_owned(poisoned_copies(&graphs, &LIVE_POISONED), &options, &mut observed).unwrap();
        drop(sdk);
        drop(_one_at_a_time);
        // The prefill graph finalizes with only the decode graph's buffers alive, the decode
        // graph and the serialization with none.
        assert!(alive_at[0].0 == BuildPhase::Finalize && alive_at[0].1 > 0, "{alive_at:?}");
        assert_eq!(alive_at[1..], [(BuildPhase::Finalize, 0), (BuildPhase::Serialize, 0)], "{alive_at:?}");
        let sharing = options.weight_sharing;
        // Tensor ids are left out: they count on across contexts of the process-wide backend.
        let io = |binary: &[u8]| -> Vec<_> {
            system.binary_info(binary).unwrap().graphs.into_iter().map(|g| g.without_ids()).collect()
        };
        assert_eq!(io(&released), io(&live), "weight sharing {sharing}");
        if !sharing {
            for (g, chunk) in graphs.iter().zip([CHUNK, 1]) {
                let inputs = model.qnn_inputs(g, chunk);
                let (a, b) = (execute_on_htp(&released, g, &inputs), execute_on_htp(&live, g, &inputs));
                assert_eq!(a[0].to_real().unwrap(), b[0].to_real().unwrap(), "{}", g.name);
            }
        }
    }
}

//! The bindgen + libloading path, end to end, against a mock QNN provider.
//!
//! The mock (`tests/cleanroom/mock_provider.c`) is compiled with the `cc` crate's compiler
//! discovery against the clean-room declarations the committed bindings come from
//! (`qnn-abi/include/QNN`), loaded through `SdkApi` exactly like
//! `libQnnHtp.so`, and logs what it decodes from the C structs it receives in the format of
//! `RecordingApi`. Equal logs mean the FFI layer passed exactly what the driver asked for.

#[path = "sdk_common/mod.rs"]
mod common;
mod qwen3_common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use backend_qnn::sdk::ffi::{self, BinaryInfo, LibraryPaths, LoadError, SdkApi, SystemApi};
use backend_qnn::sdk::{
    build_context_binary, ApiError, BuildError, HtpDeviceOptions, HtpOptions, QnnApi, RecordingApi,
};
use backend_qnn::{DataType, GraphIo, IoTensor, ScaleOffset};

/// The mock keeps global state per loaded library: tests using one run one at a time.
static MOCK_LOCK: Mutex<()> = Mutex::new(());
static BUILT: Mutex<Option<HashMap<&'static str, PathBuf>>> = Mutex::new(None);

fn lock() -> MutexGuard<'static, ()> {
    MOCK_LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Compiles the mock into `<tmp>/<variant>/lib/x86_64-linux-clang/{libQnnHtp,libQnnSystem}.so`
/// (once per variant) and returns that SDK-like root.
fn mock_sdk(variant: &'static str, defines: &[&str]) -> PathBuf {
    let mut built = BUILT.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(root) = built.get_or_insert_with(HashMap::new).get(variant) {
        return root.clone();
    }
    let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join("mock-qnn-sdk").join(variant);
    let lib_dir = root.join(ffi::HOST_LIB_DIR);
    std::fs::create_dir_all(&lib_dir).unwrap();
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/cleanroom/mock_provider.c");
    let include = Path::new(env!("CARGO_MANIFEST_DIR")).join("qnn-abi/include/QNN");
    let compiler = cc::Build::new()
        .cargo_metadata(false)
        .target(ffi::BUILD_TARGET)
        .host(ffi::BUILD_TARGET)
        .opt_level(0)
        .debug(false)
        .get_compiler();
    // Two separate files, so the two libraries are separate instances once loaded.
    for name in ["libQnnHtp.so", "libQnnSystem.so"] {
        let out = lib_dir.join(name);
        let status = compiler
            .to_command()
            .args(["-std=gnu11", "-shared", "-fPIC", "-Wall", "-Wextra", "-Werror"])
            .arg("-I")
            .arg(&include)
            .args(defines.iter().map(|d| format!("-D{d}")))
            .arg(&source)
            .arg("-o")
            .arg(&out)
            .status()
            .expect("the C compiler runs");
        assert!(status.success(), "compiling {} failed", source.display());
    }
    built.as_mut().unwrap().insert(variant, root.clone());
    root
}

/// The mock's control entry points, through a second handle on the same loaded library.
struct MockControl(libloading::Library);

impl MockControl {
    fn open(path: &Path) -> MockControl {
        // SAFETY: the mock has no initializers.
        let control = MockControl(unsafe { libloading::Library::new(path) }.unwrap());
        control.reset();
        control
    }

    fn reset(&self) {
        // SAFETY: signature as defined in mock_provider.c.
        unsafe { self.0.get::<unsafe extern "C" fn()>(b"mock_qnn_reset\0").unwrap()() }
    }

    fn fail(&self, function: &str, subject: &str, code: u64) {
        let f = std::ffi::CString::new(function).unwrap();
        let s = std::ffi::CString::new(subject).unwrap();
        type Fail = unsafe extern "C" fn(*const std::os::raw::c_char, *const std::os::raw::c_char, u64);
        // SAFETY: signature as defined in mock_provider.c; strings outlive the call.
        unsafe { self.0.get::<Fail>(b"mock_qnn_fail\0").unwrap()(f.as_ptr(), s.as_ptr(), code) }
    }

    fn log(&self) -> String {
        type Log = unsafe extern "C" fn(*mut u8, usize) -> usize;
        // SAFETY: signature as defined in mock_provider.c; the buffer is as large as stated.
        unsafe {
            let log = self.0.get::<Log>(b"mock_qnn_log\0").unwrap();
            let len = log(std::ptr::null_mut(), 0);
            let mut buf = vec![0u8; len];
            log(buf.as_mut_ptr(), len);
            String::from_utf8(buf).unwrap()
        }
    }
}

fn assert_same_log(recorded: &str, mock: &str) {
    for (i, (r, m)) in recorded.lines().zip(mock.lines()).enumerate() {
        assert_eq!(r, m, "call {} differs between RecordingApi and the mock provider", i + 1);
    }
    assert_eq!(recorded.lines().count(), mock.lines().count(), "number of calls differs");
}

#[test]
fn mock_provider_receives_exactly_the_recorded_calls() {
    let _guard = lock();
    let paths = LibraryPaths::from_sdk_root(mock_sdk("plain", &[]));
    let control = MockControl::open(&paths.backend);
    let graphs = common::toy_model();
    let target = HtpOptions::sm8650();

    let mut recorder = RecordingApi::new();
    let expected = build_context_binary(&graphs, &target, &mut recorder).unwrap();

    let mut api = SdkApi::load(&paths).unwrap();
    assert_eq!(api.provider().name, "mock-htp");
    assert_eq!(api.provider().api_version.0, ffi::BINDINGS_CORE_API_VERSION.0);
    let binary = build_context_binary(&graphs, &target, &mut api).unwrap();
    drop(api);

    assert_same_log(&recorder.log(), &control.log());
    assert_eq!(binary, expected, "the mock serializes the context like RecordingApi");

    // The system library reads the binary back: both graphs with I/O in binding order.
    let system = SystemApi::load(&paths.system).unwrap();
    assert_eq!(system.provider().name, "mock-system");
    // Ids are the ones the backend assigned when the tensors were created (listed in the binary).
    let listed = backend_qnn::sdk::render::parse_fake_context_binary(&binary).unwrap();
    let io = |id, name: &str, dims: &[u32], scale: f32| IoTensor {
        id,
        name: name.into(),
        dtype: DataType::UFixedPoint16,
        dims: dims.to_vec(),
        quant: Some(ScaleOffset { scale, offset: -32768 }),
    };
    let graph = |i: usize, name: &str, seq| GraphIo {
        name: name.into(),
        inputs: vec![io(listed[i].io.inputs[0].id, "x", &[1, 1, seq, common::HIDDEN], 0.001)],
        outputs: vec![io(listed[i].io.outputs[0].id, "y", &[1, 1, seq, common::OUT], 0.004)],
    };
    let info = system.binary_info(&binary).unwrap();
    assert_eq!(info, BinaryInfo { graphs: vec![graph(0, "model.0.s32", 32), graph(1, "model.0.s1", 1)] });
    assert_ne!(info.graphs[0].inputs[0].id, info.graphs[1].inputs[0].id, "ids are per context, not per graph");
    let garbage = system.binary_info(b"not a context").unwrap_err();
    assert_eq!(garbage, ApiError::Qnn { function: "systemContextGetMetaData", code: 1004 });
}

/// The lowered tiny Qwen3 (`model.0.s4` + `model.0.s1`, LPBQ weights, shared statics) for
/// mllm's SM8650 target: through the FFI exactly the recorded calls, and a binary whose graph
/// I/O the system library reads back in binding order.
#[test]
fn lowered_qwen3_context_crosses_the_abi_as_recorded() {
    let _guard = lock();
    let paths = LibraryPaths::from_sdk_root(mock_sdk("plain", &[]));
    let control = MockControl::open(&paths.backend);
    let (s4, s1) = qwen3_common::lowered_pair();
    let graphs = [s4, s1];
    let target = backend_qnn::target::HtpTarget::new(&qwen3_common::aot_config().target_machine);

    let mut recorder = RecordingApi::new();
    let expected = backend_qnn::context::build_context(&graphs, &target, &mut recorder).unwrap();
    let mut api = SdkApi::load(&paths).unwrap();
    let binary = backend_qnn::context::build_context(&graphs, &target, &mut api).unwrap();
    drop(api);
    assert_same_log(&recorder.log(), &control.log());
    assert_eq!(binary, expected);

    let info = SystemApi::load(&paths.system).unwrap().binary_info(&binary).unwrap();
    let names: Vec<&str> = info.graphs.iter().map(|g| g.name.as_str()).collect();
    assert_eq!(names, ["model.0.s4", "model.0.s1"]);
    for (g, lowered) in info.graphs.iter().zip(&graphs) {
        let inputs: Vec<&str> = g.inputs.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(inputs, lowered.inputs);
        let logits = &g.outputs[0];
        assert_eq!((logits.name.as_str(), logits.dtype), ("logits", DataType::UFixedPoint16));
        assert_eq!(logits.dims, lowered.tensor("logits").unwrap().dims);
    }
}

#[test]
fn signed_pd_and_other_options_cross_the_abi() {
    let _guard = lock();
    let paths = LibraryPaths::from_sdk_root(mock_sdk("plain", &[]));
    let control = MockControl::open(&paths.backend);
    let mut target = HtpOptions::sm8650();
    target.device = HtpDeviceOptions { signed_pd: true, ..HtpDeviceOptions::for_chipset("SM8750").unwrap() };
    target.graph.precision = None;
    target.graph.dlbc = Some(true);
    target.log_level = None;
    let graphs = common::toy_model();

    let mut recorder = RecordingApi::new();
    build_context_binary(&graphs, &target, &mut recorder).unwrap();
    let mut api = SdkApi::load(&paths).unwrap();
    build_context_binary(&graphs, &target, &mut api).unwrap();
    drop(api);
    let mock = control.log();
    assert_same_log(&recorder.log(), &mock);
    assert!(mock.contains("htp.signedPd(1)") && mock.contains("arch=V79") && mock.contains("ENABLE_DLBC"), "{mock}");
    assert!(mock.starts_with("backendCreate(log=null"), "{mock}");
}

#[test]
fn rejected_node_is_reported_through_the_ffi() {
    let _guard = lock();
    let paths = LibraryPaths::from_sdk_root(mock_sdk("plain", &[]));
    let control = MockControl::open(&paths.backend);
    let graphs = common::toy_model();
    let target = HtpOptions::sm8650();

    let mut recorder = RecordingApi::new();
    recorder.fail("backendValidateOpConfig", "model.norm", 3110);
    let expected = build_context_binary(&graphs, &target, &mut recorder).unwrap_err();

    control.fail("backendValidateOpConfig", "model.norm", 3110);
    let mut api = SdkApi::load(&paths).unwrap();
    let err = build_context_binary(&graphs, &target, &mut api).unwrap_err();
    drop(api);

    assert_eq!(err, expected);
    assert!(matches!(&err, BuildError::NodeRejected { node, .. } if node == "model.norm"), "{err}");
    assert!(err.to_string().contains("returned error 3110 (op package error)"), "{err}");
    let mock = control.log();
    assert_same_log(&recorder.log(), &mock);
    assert!(mock.ends_with("contextFree(context=context1) -> ok\ndeviceFree(device=device1) -> ok\nbackendFree(backend=backend1) -> ok\nlogFree(log=log1) -> ok\n"));
}

#[test]
fn dropping_sdk_api_frees_open_handles() {
    let _guard = lock();
    let paths = LibraryPaths::from_sdk_root(mock_sdk("plain", &[]));
    let control = MockControl::open(&paths.backend);
    let mut api = SdkApi::load(&paths).unwrap();
    let backend = api.backend_create(None).unwrap();
    let device = api.device_create(None, &HtpDeviceOptions::sm8650().device_configs()).unwrap();
    api.context_create(backend, device, &[]).unwrap();
    drop(api);
    let log = control.log();
    let tail: Vec<&str> = log.lines().rev().take(3).collect();
    assert_eq!(
        tail,
        [
            "backendFree(backend=backend1) -> ok",
            "deviceFree(device=device1) -> ok",
            "contextFree(context=context1) -> ok"
        ]
    );
}

#[test]
fn handles_are_checked_before_reaching_c() {
    let _guard = lock();
    let paths = LibraryPaths::from_sdk_root(mock_sdk("plain", &[]));
    let control = MockControl::open(&paths.backend);
    let mut api = SdkApi::load(&paths).unwrap();
    let backend = api.backend_create(None).unwrap();
    api.backend_free(backend).unwrap();
    let err = api.backend_free(backend).unwrap_err();
    assert_eq!(err.to_string(), "backendFree: backend1 is not a live handle of this SdkApi");
    drop(api);
    assert_eq!(control.log().lines().count(), 2, "the stale free never reached the library");
}

#[test]
fn provider_selection_skips_incompatible_providers() {
    let _guard = lock();
    let paths = LibraryPaths::from_sdk_root(mock_sdk("decoys", &["MOCK_DECOY_PROVIDERS"]));
    let api = SdkApi::load(&paths).unwrap();
    assert_eq!(api.provider().name, "mock-htp");
    assert_eq!(api.provider().backend_id, ffi::HTP_BACKEND_ID);

    let paths = LibraryPaths::from_sdk_root(mock_sdk("only-decoys", &["MOCK_ONLY_DECOYS"]));
    let Err(err) = SdkApi::load(&paths) else { panic!("a library without a usable provider must be refused") };
    let (major, minor) = ffi::BINDINGS_CORE_API_VERSION;
    assert!(matches!(&err, LoadError::NoCompatibleProvider { found, .. } if found.len() == 2), "{err}");
    let msg = err.to_string();
    assert!(msg.contains(&format!("QNN core API {major}.{minor}+ for the HTP backend (id 6)")), "{msg}");
    assert!(msg.contains(&format!("`mock-newer-major` (backend 6, API {}.0.0)", major + 1)), "{msg}");
    assert!(msg.contains(&format!("`mock-cpu` (backend 3, API {major}.{minor}.0)")), "{msg}");
}

#[test]
fn missing_library_names_the_path() {
    let paths = LibraryPaths::from_sdk_root("/nonexistent/qairt");
    let Err(err) = SdkApi::load(&paths) else { panic!("loading a missing library must fail") };
    let msg = err.to_string();
    assert!(msg.starts_with("cannot open QNN library /nonexistent/qairt/lib/x86_64-linux-clang/libQnnHtp.so"), "{msg}");
}

// ------------------------------------------------------------------ execute side ------------

use backend_qnn::sdk::render::{fnv1a64, parse_fake_context_binary};
use backend_qnn::sdk::{ContextHandle, GraphHandle, QnnExecApi};
use backend_qnn::{QnnChunkModel, QnnModelError};
use runtime::{ChunkModel, GenerationConfig, Generator};

/// What one `graphExecute` received and returned, as seen above the FFI.
struct Executed {
    graph: GraphHandle,
    inputs: Vec<Vec<u8>>,
    outputs: Vec<Vec<u8>>,
}

/// An execute API that records every `graphExecute`'s buffers on the way in and out.
struct Tap<A> {
    inner: A,
    calls: Vec<Executed>,
}

impl<A: QnnExecApi> QnnExecApi for Tap<A> {
    fn context_create_from_binary(&mut self, binary: &[u8]) -> Result<ContextHandle, ApiError> {
        self.inner.context_create_from_binary(binary)
    }
    fn graph_retrieve(&mut self, context: ContextHandle, name: &str) -> Result<GraphHandle, ApiError> {
        self.inner.graph_retrieve(context, name)
    }
    fn graph_execute(
        &mut self,
        graph: GraphHandle,
        inputs: &[&[u8]],
        outputs: &mut [&mut [u8]],
    ) -> Result<(), ApiError> {
        self.inner.graph_execute(graph, inputs, outputs)?;
        self.calls.push(Executed {
            graph,
            inputs: inputs.iter().map(|b| b.to_vec()).collect(),
            outputs: outputs.iter().map(|b| b.to_vec()).collect(),
        });
        Ok(())
    }
    fn context_free(&mut self, context: ContextHandle) -> Result<(), ApiError> {
        self.inner.context_free(context)
    }
}

/// The mock provider's `graphExecute`, recomputed: output `k`'s byte `i` is
/// `(sum of every input byte + 7k + i) mod 256`.
fn mock_outputs(inputs: &[Vec<u8>], sizes: &[usize]) -> Vec<Vec<u8>> {
    let sum: u64 = inputs.iter().flatten().map(|&b| u64::from(b)).sum();
    sizes
        .iter()
        .enumerate()
        .map(|(k, &n)| (0..n).map(|i| ((sum + 7 * k as u64 + i as u64) & 0xFF) as u8).collect())
        .collect()
}

/// The tiny Qwen3 pair's context binary (as the mock provider serializes it) and the lowered pair.
fn qwen3_binary() -> (Vec<u8>, [backend_qnn::QnnGraph; 2]) {
    let (s4, s1) = qwen3_common::lowered_pair();
    let graphs = [s4, s1];
    let target = backend_qnn::target::HtpTarget::new(&qwen3_common::aot_config().target_machine);
    let binary = backend_qnn::context::build_context(&graphs, &target, &mut RecordingApi::new()).unwrap();
    (binary, graphs)
}

/// One prefill (chunk 4, 3 prompt tokens) and one decode step of the tiny Qwen3 pair through
/// `SdkApi`'s execute path and the mock provider: the runtime's logits are the mock's
/// deterministic output codes dequantized with the encodings read from the binary's metadata,
/// the bytes the mock saw are the bytes the runtime wrote (FNV digests in its log), the decode
/// step reads the prefill's new K/V from the cache, and the call log is exactly the expected one.
#[test]
fn qwen3_pair_runs_prefill_and_decode_through_the_ffi_exec_path() {
    let _guard = lock();
    let paths = LibraryPaths::from_sdk_root(mock_sdk("plain", &[]));
    let control = MockControl::open(&paths.backend);
    let (binary, lowered) = qwen3_binary();
    let api = SdkApi::load_for_execution(&paths).unwrap();

    // The I/O encodings come from the binary's metadata and equal the lowered graphs' ones.
    let io = api.binary_info(&binary).unwrap().graphs;
    io.iter().for_each(|g| g.check_encodings().unwrap());
    let without_ids: Vec<GraphIo> = io.iter().cloned().map(GraphIo::without_ids).collect();
    let from_lowered: Vec<GraphIo> = lowered.iter().map(|g| GraphIo::from_graph(g).unwrap()).collect();
    assert_eq!(without_ids, from_lowered);

    let model = QnnChunkModel::open(Tap { inner: api, calls: vec![] }, &binary, io.clone()).unwrap();
    assert_eq!(model.chunk_lens(), [qwen3_common::CHUNK, 1]);
    let layout = model.layout();
    let prompt = [5u32, 17, 99];
    let config = GenerationConfig {
        max_new_tokens: 2,
        prefill_chunk: qwen3_common::CHUNK,
        eos_ids: vec![],
        ..GenerationConfig::default()
    };
    let mut generator = Generator::new(qwen3_common::Capture::new(model, qwen3_common::CaptureRows::Valid)).unwrap();
    let out = generator.generate(&prompt, &config).unwrap();
    assert_eq!(out.ids.len(), 2);
    let rows = generator.model().logits.clone();
    let calls = std::mem::take(&mut generator.model_mut().inner.api_mut().calls);
    drop(generator);

    assert_eq!(calls.len(), 2, "one prefill and one decode execution");
    let (prefill, decode) = (&calls[0], &calls[1]);
    assert_eq!((prefill.graph, decode.graph), (GraphHandle(1), GraphHandle(2)));
    for (call, g) in [(prefill, &io[0]), (decode, &io[1])] {
        // Bytes crossed the ABI in both directions: outputs are the mock's function of the inputs.
        let sizes: Vec<usize> = call.outputs.iter().map(Vec::len).collect();
        assert_eq!(call.outputs, mock_outputs(&call.inputs, &sizes), "graph `{}`", g.name);
        assert_eq!(call.inputs.len(), g.inputs.len());
    }
    // The runtime wrote the prompt ids and positions (chunk padded with id 0).
    let i32s = |b: &[u8]| b.chunks_exact(4).map(|c| i32::from_le_bytes(c.try_into().unwrap())).collect::<Vec<_>>();
    assert_eq!(i32s(&prefill.inputs[0]), [5, 17, 99, 0]);
    assert_eq!(i32s(&prefill.inputs[1]), [0, 1, 2, 3]);
    assert_eq!(i32s(&decode.inputs[0]), [out.ids[0] as i32]);
    assert_eq!(i32s(&decode.inputs[1]), [3]);

    // Logits: the mock's u16 codes dequantized with the metadata's scale/offset, for the 3
    // prompt rows and the decode row.
    let vocab = layout.vocab_size;
    let logits = |call: &Executed, g: &GraphIo, row: usize| -> Vec<f32> {
        let so = g.outputs[0].quant.unwrap();
        call.outputs[0][2 * row * vocab..2 * (row + 1) * vocab]
            .chunks_exact(2)
            .map(|c| so.dequantize(i64::from(u16::from_le_bytes([c[0], c[1]]))))
            .collect()
    };
    assert_eq!(rows.len(), prompt.len() + 1);
    for (row, got) in rows[..prompt.len()].iter().enumerate() {
        assert_eq!(got, &logits(prefill, &io[0], row), "prefill row {row}");
    }
    assert_eq!(rows[prompt.len()], logits(decode, &io[1], 0), "decode row");

    // The KV manager moved the prefill's new K/V (3 valid columns) into the decode's past.
    let (layers, h, d, ctx) = (layout.num_layers, layout.num_kv_heads, layout.head_dim, layout.context_len);
    let (ar, past_prefill) = (qwen3_common::CHUNK, ctx - qwen3_common::CHUNK);
    let past_decode = ctx - 1;
    for l in 0..layers {
        let (present_k, past_k) = (&prefill.outputs[1 + l], &decode.inputs[3 + l]);
        let (present_v, past_v) = (&prefill.outputs[1 + layers + l], &decode.inputs[3 + layers + l]);
        for row in 0..h * d {
            for j in 0..prompt.len() {
                assert_eq!(past_k[row * past_decode + j], present_k[row * ar + j], "K layer {l} row {row} col {j}");
            }
        }
        for head in 0..h {
            for j in 0..prompt.len() {
                let (p, n) = ((head * past_decode + j) * d, (head * ar + j) * d);
                assert_eq!(past_v[p..p + d], present_v[n..n + d], "V layer {l} head {head} pos {j}");
            }
        }
        // The prefill itself started from an empty cache.
        assert_eq!(prefill.inputs[3 + l].len(), h * d * past_prefill);
    }

    // The mock's log: the exact calls, with digests of the input bytes it received.
    let listed = parse_fake_context_binary(&binary).unwrap();
    let execute_line = |handle: u32, call: &Executed, g: &GraphIo| {
        let inputs: Vec<String> = g
            .inputs
            .iter()
            .zip(&call.inputs)
            .map(|(t, b)| format!("id={} \"{}\" {}B fnv={:016x}", t.id.unwrap(), t.name, b.len(), fnv1a64(b)))
            .collect();
        let outputs: Vec<String> = g
            .outputs
            .iter()
            .zip(&call.outputs)
            .map(|(t, b)| format!("id={} \"{}\" {}B", t.id.unwrap(), t.name, b.len()))
            .collect();
        format!(
            "graphExecute(graph=graph{handle}, inputs=[{}], outputs=[{}]) -> ok",
            inputs.join(", "),
            outputs.join(", ")
        )
    };
    let expected = [
        "backendCreate(log=null, config=[]) -> backend1".to_string(),
        "deviceCreate(log=null, config=[]) -> device1".to_string(),
        format!(
            "contextCreateFromBinary(backend=backend1, device=device1, config=[], binary={}B fnv={:016x}) -> context1",
            binary.len(),
            fnv1a64(&binary)
        ),
        "graphRetrieve(context=context1, name=\"model.0.s4\") -> graph1".to_string(),
        "graphRetrieve(context=context1, name=\"model.0.s1\") -> graph2".to_string(),
        execute_line(1, prefill, &listed[0].io),
        execute_line(2, decode, &listed[1].io),
        "contextFree(context=context1) -> ok".to_string(),
        "deviceFree(device=device1) -> ok".to_string(),
        "backendFree(backend=backend1) -> ok".to_string(),
    ];
    assert_same_log(&expected.join("\n"), &control.log());
}

/// `QnnChunkModel::from_binary` opens every graph of the binary with the metadata's I/O, or
/// with the lowered graphs' I/O checked against the metadata.
#[test]
fn chunk_model_from_binary_reads_io_from_the_metadata() {
    let _guard = lock();
    let paths = LibraryPaths::from_sdk_root(mock_sdk("plain", &[]));
    let _control = MockControl::open(&paths.backend);
    let (binary, lowered) = qwen3_binary();
    let model = QnnChunkModel::from_binary(SdkApi::load_for_execution(&paths).unwrap(), &binary, None).unwrap();
    assert_eq!(model.chunk_lens(), [qwen3_common::CHUNK, 1]);
    assert_eq!(model.layout().context_len, qwen3_common::CONTEXT);
    drop(model);
    let api = SdkApi::load_for_execution(&paths).unwrap();
    let model = QnnChunkModel::from_binary(api, &binary, Some(&lowered)).unwrap();
    assert_eq!(model.chunk_lens(), [qwen3_common::CHUNK, 1]);
    drop(model);
    // Lowered graphs that are not the binary's are refused by name.
    let api = SdkApi::load_for_execution(&paths).unwrap();
    let err = QnnChunkModel::from_binary(api, &binary, Some(&lowered[1..])).unwrap_err();
    assert_eq!(err.to_string(), "graph `model.0.s4`: is in the binary but not among the lowered graphs");
    let mut other = lowered.clone();
    other[1].tensors.iter_mut().find(|t| t.name == "past_key_0").unwrap().encoding =
        backend_qnn::Encoding::ScaleOffset(ScaleOffset { scale: 1.0, offset: -128 });
    let api = SdkApi::load_for_execution(&paths).unwrap();
    let err = QnnChunkModel::from_binary(api, &binary, Some(&other)).unwrap_err();
    assert!(matches!(&err, QnnModelError::Mismatch { detail, .. } if detail.contains("`past_key_0`")), "{err}");
}

/// Errors of the execute path are named: a binary that is none, a graph the context lacks, a
/// buffer of the wrong size (refused before reaching C), an API opened without the system
/// library, and a failure of the backend's `contextCreateFromBinary`.
#[test]
fn exec_errors_are_named() {
    let _guard = lock();
    let paths = LibraryPaths::from_sdk_root(mock_sdk("plain", &[]));
    let control = MockControl::open(&paths.backend);
    let (binary, _) = qwen3_binary();

    let mut api = SdkApi::load_for_execution(&paths).unwrap();
    let err = api.context_create_from_binary(b"\x7fELF not a context").unwrap_err();
    assert_eq!(err, ApiError::Qnn { function: "systemContextGetMetaData", code: 1004 });
    let err = QnnChunkModel::from_binary(SdkApi::load_for_execution(&paths).unwrap(), b"garbage", None).unwrap_err();
    assert!(err.to_string().contains("systemContextGetMetaData"), "{err}");

    let context = api.context_create_from_binary(&binary).unwrap();
    let err = api.graph_retrieve(context, "model.0.s2").unwrap_err();
    assert_eq!(err, ApiError::Qnn { function: "graphRetrieve", code: 1004 });
    assert!(control.log().contains(
        "graphRetrieve(context=context1, name=\"model.0.s2\") -> error 1004 (no graph named \"model.0.s2\" in this context)"
    ));

    let graph = api.graph_retrieve(context, "model.0.s1").unwrap();
    let calls_before = control.log().lines().count();
    let err = api.graph_execute(graph, &[&[0u8; 4]], &mut []).unwrap_err();
    assert!(err.to_string().contains("graph `model.0.s1` binds"), "{err}");
    let info = api.binary_info(&binary).unwrap();
    let s1 = &info.graphs[1];
    let sizes = |list: &[IoTensor]| -> Vec<usize> {
        list.iter()
            .map(|t| {
                t.dims.iter().map(|&d| d as usize).product::<usize>()
                    * match t.dtype {
                        DataType::Int32 => 4,
                        DataType::UFixedPoint16 => 2,
                        _ => 1,
                    }
            })
            .collect()
    };
    let mut ins: Vec<Vec<u8>> = sizes(&s1.inputs).into_iter().map(|n| vec![1u8; n]).collect();
    let mut outs: Vec<Vec<u8>> = sizes(&s1.outputs).into_iter().map(|n| vec![0u8; n]).collect();
    ins[2].pop();
    {
        let in_refs: Vec<&[u8]> = ins.iter().map(Vec::as_slice).collect();
        let mut out_refs: Vec<&mut [u8]> = outs.iter_mut().map(Vec::as_mut_slice).collect();
        let err = api.graph_execute(graph, &in_refs, &mut out_refs).unwrap_err().to_string();
        assert!(err.contains("buffer of `attention_mask` has"), "{err}");
    }
    assert_eq!(control.log().lines().count(), calls_before, "refused before reaching the library");
    ins[2].push(1);
    {
        let in_refs: Vec<&[u8]> = ins.iter().map(Vec::as_slice).collect();
        let mut out_refs: Vec<&mut [u8]> = outs.iter_mut().map(Vec::as_mut_slice).collect();
        api.graph_execute(graph, &in_refs, &mut out_refs).unwrap();
    }
    assert_eq!(outs, mock_outputs(&ins, &sizes(&s1.outputs)));
    QnnExecApi::context_free(&mut api, context).unwrap();
    let err = api.graph_execute(graph, &[], &mut []).unwrap_err().to_string();
    assert!(err.contains("not a live handle"), "{err}");
    drop(api);

    // Without the system library the binary's I/O cannot be bound.
    let mut api = SdkApi::load(&paths).unwrap();
    let err = api.context_create_from_binary(&binary).unwrap_err().to_string();
    assert!(err.contains("SdkApi::load_for_execution"), "{err}");
    drop(api);

    // The backend refusing the binary.
    control.fail("contextCreateFromBinary", "", 5000);
    let mut api = SdkApi::load_for_execution(&paths).unwrap();
    let err = api.context_create_from_binary(&binary).unwrap_err();
    assert_eq!(err, ApiError::Qnn { function: "contextCreateFromBinary", code: 5000 });
}

/// `open_context_binary_with_sdk` (what `generate --qnn-context` calls) finds the libraries
/// through `QNN_SDK_ROOT` and returns a chunk model the generator runs; a root without them is
/// named in the error.
#[test]
fn open_with_sdk_finds_the_libraries_through_qnn_sdk_root() {
    let _guard = lock();
    let root = mock_sdk("plain", &[]);
    let control = MockControl::open(&LibraryPaths::from_sdk_root(&root).backend);
    let (binary, _) = qwen3_binary();
    let saved = std::env::var_os("QNN_SDK_ROOT");
    // The mock lock serializes every test that loads QNN libraries, the only readers of it.
    std::env::set_var("QNN_SDK_ROOT", &root);
    let opened = backend_qnn::sdk::open_context_binary_with_sdk(&binary, None);
    std::env::set_var("QNN_SDK_ROOT", "/nonexistent/qairt");
    let missing = backend_qnn::sdk::open_context_binary_with_sdk(&binary, None).err();
    match saved {
        Some(v) => std::env::set_var("QNN_SDK_ROOT", v),
        None => std::env::remove_var("QNN_SDK_ROOT"),
    }
    let model = opened.unwrap();
    assert_eq!(model.chunk_lens(), [qwen3_common::CHUNK, 1]);
    let config = GenerationConfig { max_new_tokens: 3, prefill_chunk: 4, eos_ids: vec![], ..Default::default() };
    let out = Generator::new(model).unwrap().generate(&[5, 17, 99, 3, 64], &config).unwrap();
    assert_eq!(out.ids.len(), 3);
    // Two prefill chunks (5 prompt tokens, chunk 4) and two decode steps.
    let log = control.log();
    assert_eq!(log.lines().filter(|l| l.starts_with("graphExecute(graph=graph1,")).count(), 2, "{log}");
    assert_eq!(log.lines().filter(|l| l.starts_with("graphExecute(graph=graph2,")).count(), 2, "{log}");
    let msg = missing.expect("no library under the root").to_string();
    assert!(msg.contains("/nonexistent/qairt/lib/x86_64-linux-clang/libQnnHtp.so"), "{msg}");
}

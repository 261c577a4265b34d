//! The bindgen + libloading path, end to end, against a mock QNN provider.
//!
//! Run with `QNN_SDK_ROOT=$PWD/backend-qnn/tests/cleanroom cargo test -p backend-qnn
//! --features qnn-sdk` (clean-room, test-only headers; libclang needed), or with a real SDK.
//! The mock (`tests/cleanroom/mock_provider.c`) is compiled with the `cc` crate's compiler
//! discovery against the same headers bindgen read, loaded through `SdkApi` exactly like
//! `libQnnHtp.so`, and logs what it decodes from the C structs it receives in the format of
//! `RecordingApi`. Equal logs mean the FFI layer passed exactly what the driver asked for.

#![cfg(feature = "qnn-sdk")]

#[path = "sdk_common/mod.rs"]
mod common;
mod qwen3_common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use backend_qnn::sdk::ffi::{self, BinaryInfo, GraphInfo, LibraryPaths, LoadError, SdkApi, SystemApi, TensorInfo};
use backend_qnn::sdk::{
    build_context_binary, ApiError, BuildError, DataType, HtpDeviceOptions, HtpOptions, QnnApi, RecordingApi,
};

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
    let include = Path::new(ffi::BINDINGS_SDK_ROOT).join("include/QNN");
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
    let io =
        |name: &str, dtype, dims: &[u32]| TensorInfo { name: name.into(), dtype: Some(dtype), dims: dims.to_vec() };
    let graph = |name: &str, seq| GraphInfo {
        name: name.into(),
        inputs: vec![io("x", DataType::UFixedPoint16, &[1, 1, seq, common::HIDDEN])],
        outputs: vec![io("y", DataType::UFixedPoint16, &[1, 1, seq, common::OUT])],
    };
    assert_eq!(
        system.binary_info(&binary).unwrap(),
        BinaryInfo { graphs: vec![graph("model.0.s32", 32), graph("model.0.s1", 1)] }
    );
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
    let target = backend_qnn::target::HtpTarget::from_json(&qwen3_common::aot_config().target_machine_json).unwrap();

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
        assert_eq!((logits.name.as_str(), logits.dtype), ("logits", Some(DataType::UFixedPoint16)));
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

/// With a real QAIRT SDK (`QNN_SDK_ROOT` set for build and run): prepare the toy for SM8650
/// with Qualcomm's HTP backend and read the binary back with its system library.
#[test]
#[ignore = "needs a real QAIRT SDK; run with --ignored"]
fn real_sdk_builds_the_toy_for_sm8650() {
    let paths = LibraryPaths::from_env().unwrap();
    let mut api = SdkApi::load(&paths).unwrap();
    let binary = build_context_binary(&common::toy_model(), &HtpOptions::sm8650(), &mut api).unwrap();
    let info = SystemApi::load(&paths.system).unwrap().binary_info(&binary).unwrap();
    let names: Vec<&str> = info.graphs.iter().map(|g| g.name.as_str()).collect();
    assert_eq!(names, ["model.0.s32", "model.0.s1"]);
    for g in &info.graphs {
        assert_eq!(g.inputs[0].name, "x");
        assert_eq!(g.outputs[0].name, "y");
    }
}

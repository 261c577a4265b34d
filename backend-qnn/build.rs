//! Build script of backend-qnn: tells the tests which target triple to compile their C
//! fixtures (the mock QNN provider) for. The FFI bindings are committed
//! (`qnn-abi/bindings.rs`), so building needs neither bindgen nor libclang.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rustc-env=BACKEND_QNN_TARGET={}", std::env::var("TARGET").expect("cargo sets TARGET"));
}

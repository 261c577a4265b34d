//! The committed FFI bindings (`qnn-abi/bindings.rs`) are exactly what bindgen makes of the
//! clean-room declarations (`qnn-abi/include/QNN`), so nobody needs bindgen or libclang to
//! build backend-qnn and nobody can edit one without the other.
//!
//! `QNN_ABI_REGENERATE=1 cargo test -p backend-qnn --test abi_bindings` rewrites the file.

#[path = "../qnn-abi/generate.rs"]
mod generate;

use std::path::Path;

#[test]
fn committed_bindings_match_the_clean_room_headers() {
    let abi = Path::new(env!("CARGO_MANIFEST_DIR")).join("qnn-abi");
    let fresh = generate::bindings_file(&abi.join("include")).unwrap_or_else(|e| panic!("{e}"));
    let path = abi.join("bindings.rs");
    if std::env::var_os("QNN_ABI_REGENERATE").is_some() {
        mllm_dsl::files::write_atomic_bytes(&path, fresh.as_bytes()).unwrap_or_else(|e| panic!("{e}"));
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    if committed != fresh {
        let line = committed
            .lines()
            .zip(fresh.lines())
            .position(|(a, b)| a != b)
            .map_or_else(|| committed.lines().count().min(fresh.lines().count()) + 1, |i| i + 1);
        panic!(
            "{} differs from the bindings of {} (first difference at line {line}); regenerate with\n    {}",
            path.display(),
            abi.join("include/QNN").display(),
            generate::REGENERATE
        );
    }
}

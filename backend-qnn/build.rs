//! Build script of backend-qnn.
//!
//! Without the `qnn-sdk` feature it does nothing (and needs neither libclang nor the SDK).
//! With it, bindgen reads the QNN headers of `$QNN_SDK_ROOT/include/QNN` and writes Rust
//! bindings into `OUT_DIR`. The headers are Qualcomm's, under the QAIRT SDK licence, so
//! neither they nor the generated bindings are ever written to the source tree.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    #[cfg(feature = "qnn-sdk")]
    qnn_bindings::generate();
}

#[cfg(feature = "qnn-sdk")]
mod qnn_bindings {
    use std::env;
    use std::fs;
    use std::path::{Path, PathBuf};

    /// Headers the FFI layer needs; each pulls in the core headers it depends on.
    const ENTRY_HEADERS: [&str; 5] = [
        "QnnInterface.h",
        "HTP/QnnHtpDevice.h",
        "HTP/QnnHtpGraph.h",
        "HTP/QnnHtpContext.h",
        "System/QnnSystemInterface.h",
    ];

    const EXAMPLE_ROOT: &str = "QNN_SDK_ROOT=/opt/qcom/aistack/qairt/<version>";

    fn fail(message: &str) -> ! {
        eprintln!("error: {message}");
        std::process::exit(1);
    }

    fn sdk_root() -> PathBuf {
        // The test-only clean-room headers stand in for the SDK (see the feature's docs).
        if env::var_os("CARGO_FEATURE_QNN_SDK_CLEANROOM").is_some() {
            return PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("cargo sets it")).join("tests/cleanroom");
        }
        let Some(root) = env::var_os("QNN_SDK_ROOT").filter(|r| !r.is_empty()) else {
            fail(&format!(
                "feature `qnn-sdk` is enabled but QNN_SDK_ROOT is not set.\n\
                 Set it to an unpacked QAIRT SDK (the directory holding include/QNN and lib/), e.g.\n    \
                 {EXAMPLE_ROOT} cargo build -p backend-qnn --features qnn-sdk\n\
                 Without the SDK, CI uses the test-only clean-room headers:\n    \
                 QNN_SDK_ROOT=$PWD/backend-qnn/tests/cleanroom cargo test -p backend-qnn --features qnn-sdk"
            ))
        };
        let root = PathBuf::from(root);
        if !root.is_absolute() {
            fail(&format!("QNN_SDK_ROOT must be an absolute path, got `{}`", root.display()));
        }
        root
    }

    pub fn generate() {
        println!("cargo:rerun-if-env-changed=QNN_SDK_ROOT");
        let root = sdk_root();
        let include = root.join("include").join("QNN");
        let missing: Vec<&str> = ENTRY_HEADERS.into_iter().filter(|h| !include.join(h).is_file()).collect();
        if !missing.is_empty() {
            fail(&format!(
                "QNN_SDK_ROOT=`{}` does not look like a QAIRT SDK: missing {} under include/QNN. \
                 Point it at the SDK root, e.g. {EXAMPLE_ROOT}",
                root.display(),
                missing.join(", ")
            ));
        }
        println!("cargo:rerun-if-changed={}", include.display());

        let wrapper: String = ENTRY_HEADERS.iter().map(|h| format!("#include \"{h}\"\n")).collect();
        let builder = bindgen::Builder::default()
            .header_contents("backend_qnn_wrapper.h", &wrapper)
            .clang_arg(format!("-I{}", include.display()))
            .allowlist_type("Qnn.*")
            .allowlist_type("_QnnDevice_.*")
            .allowlist_var("QNN_.*")
            .prepend_enum_name(false)
            .default_enum_style(bindgen::EnumVariation::Consts)
            .generate_comments(false)
            .layout_tests(true)
            .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()));
        // bindgen panics when it cannot load libclang; turn that into an actionable message.
        let generated = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || builder.generate()));
        let bindings = match generated {
            Ok(Ok(bindings)) => bindings.to_string(),
            Ok(Err(e)) => fail(&format!("bindgen failed on {}: {e}", include.display())),
            Err(_) => fail(
                "bindgen could not run: it needs libclang (Debian/Ubuntu: apt-get install libclang-dev, \
                 or set LIBCLANG_PATH)",
            ),
        };

        let core = interface_table(&bindings, "QnnInterface_t").unwrap_or_else(|e| fail(&e));
        let system = interface_table(&bindings, "QnnSystemInterface_t").unwrap_or_else(|e| fail(&e));
        let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
        write(&out.join("qnn_bindings.rs"), &bindings);
        write(
            &out.join("qnn_tables.rs"),
            &(core.accessor("core", "QnnInterface_t") + &system.accessor("system", "QnnSystemInterface_t")),
        );
        // Lets the FFI layer default to this SDK at run time and the tests build their mock
        // provider against the very headers the bindings came from.
        println!("cargo:rustc-env=BACKEND_QNN_SDK_ROOT={}", root.display());
        println!("cargo:rustc-env=BACKEND_QNN_TARGET={}", env::var("TARGET").expect("cargo sets TARGET"));
    }

    fn write(path: &Path, text: &str) {
        fs::write(path, text).unwrap_or_else(|e| fail(&format!("cannot write {}: {e}", path.display())));
    }

    /// The versioned union member holding an interface's function table.
    struct Table {
        field: String,
        ty: String,
        major: u32,
        minor: u32,
    }

    impl Table {
        fn accessor(&self, prefix: &str, interface: &str) -> String {
            let Table { field, ty, major, minor } = self;
            let upper = prefix.to_uppercase();
            format!(
                "/// Function table type of `{interface}` in the headers used (`{ty}`).\n\
                 pub type {Prefix}Table = {ty};\n\
                 /// (major, minor) API version of those headers, from the union member `{field}`.\n\
                 pub const {upper}_API_VERSION: (u32, u32) = ({major}, {minor});\n\
                 /// The function table of a provider.\n\
                 ///\n\
                 /// # Safety\n\
                 /// The provider must implement this API version (same major, minor at least as high).\n\
                 pub unsafe fn {prefix}_table(interface: &{interface}) -> &{Prefix}Table {{\n    \
                     // SAFETY: the caller checked the provider's version, so this member is the active one.\n    \
                     unsafe {{ &interface.__bindgen_anon_1.{field} }}\n\
                 }}\n",
                Prefix = if prefix == "core" { "Core" } else { "System" },
            )
        }
    }

    /// Finds `pub union <T>__bindgen_ty_1 { pub vMAJ_MIN: Type, }` behind `struct_name`.
    /// The member is named after the API version (`QNN_INTERFACE_VER_NAME`), so it changes
    /// with every SDK and cannot be hard-coded.
    fn interface_table(bindings: &str, struct_name: &str) -> Result<Table, String> {
        let body = |header: &str| -> Option<&str> {
            let start = bindings.find(header)? + header.len();
            let end = start + bindings[start..].find("\n}")?;
            Some(&bindings[start..end])
        };
        let not_found = || format!("cannot find the versioned function table of `{struct_name}` in the bindings");
        let strukt = body(&format!("pub struct {struct_name} {{")).ok_or_else(not_found)?;
        let union_ty = strukt
            .lines()
            .find_map(|l| l.trim().strip_prefix("pub __bindgen_anon_1: "))
            .map(|t| t.trim_end_matches(',').trim())
            .ok_or_else(not_found)?;
        let union = body(&format!("pub union {union_ty} {{")).ok_or_else(not_found)?;
        let (field, ty) = union
            .lines()
            .find_map(|l| l.trim().strip_prefix("pub ")?.trim_end_matches(',').split_once(": "))
            .ok_or_else(not_found)?;
        let version = field
            .strip_prefix('v')
            .and_then(|v| v.split_once('_'))
            .and_then(|(a, b)| Some((a.parse().ok()?, b.parse().ok()?)));
        let (major, minor) =
            version.ok_or_else(|| format!("`{struct_name}` table member `{field}` is not named vMAJOR_MINOR"))?;
        Ok(Table { field: field.to_string(), ty: ty.to_string(), major, minor })
    }
}

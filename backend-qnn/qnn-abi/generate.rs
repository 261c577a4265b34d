//! Generates `qnn-abi/bindings.rs` from the clean-room declarations in `qnn-abi/include/QNN`.
//!
//! Used by `tests/abi_bindings.rs` only (bindgen is a dev-dependency): the test fails when
//! the committed bindings differ from what these headers give, and rewrites them with
//! `QNN_ABI_REGENERATE=1`. Building backend-qnn needs neither bindgen nor libclang.
//!
//! The output must not depend on the machine: libclang is the pinned LLVM 18.1.1 that
//! `scripts/fetch-libclang` fetches into the project cache (`LIBCLANG_PATH` overrides it), and
//! the few standard C names the declarations use come from `qnn-abi/freestanding`, not from a C
//! library or compiler install (`-nostdinc`).

use std::path::{Path, PathBuf};

/// Headers the FFI layer needs; each pulls in the core headers it depends on.
pub const ENTRY_HEADERS: [&str; 5] =
    ["QnnInterface.h", "HTP/QnnHtpDevice.h", "HTP/QnnHtpGraph.h", "HTP/QnnHtpContext.h", "System/QnnSystemInterface.h"];

/// The command that rewrites the committed bindings.
pub const REGENERATE: &str = "QNN_ABI_REGENERATE=1 cargo test -p backend-qnn --test abi_bindings";

/// Why the bindings could not be generated.
#[derive(Debug, thiserror::Error)]
pub enum GenerateError {
    #[error("{} lacks {}", dir.display(), missing.join(", "))]
    MissingHeaders { dir: PathBuf, missing: Vec<&'static str> },
    #[error("bindgen failed on {}: {source}", dir.display())]
    Bindgen {
        dir: PathBuf,
        #[source]
        source: bindgen::BindgenError,
    },
    #[error(
        "bindgen could not load libclang from {}: run scripts/fetch-libclang (or set LIBCLANG_PATH to a \
         directory holding libclang.so)", dir.display()
    )]
    NoLibclang { dir: PathBuf },
    #[error(
        "no libclang directory: LIBCLANG_PATH, MLLM_DSL_CACHE and HOME are all unset (run scripts/fetch-libclang)"
    )]
    NoLibclangDir,
    #[error("cannot find the versioned function table of `{0}` in the bindings")]
    NoTable(String),
    #[error("`{interface}` table member `{field}` is not named vMAJOR_MINOR")]
    TableName { interface: String, field: String },
}

/// Where `scripts/fetch-libclang` puts libclang.so, under the project cache.
const FETCHED_LIBCLANG_SUBDIR: &str = "libclang/18.1.1";

/// The directory bindgen loads libclang from: `$LIBCLANG_PATH`, else the fetched one.
pub fn libclang_dir() -> Result<PathBuf, GenerateError> {
    match std::env::var_os("LIBCLANG_PATH").filter(|p| !p.is_empty()) {
        Some(dir) => Ok(PathBuf::from(dir)),
        None => Ok(mllm_dsl::files::project_cache().ok_or(GenerateError::NoLibclangDir)?.join(FETCHED_LIBCLANG_SUBDIR)),
    }
}

/// The whole text of `bindings.rs` for the headers under `include` (the directory holding `QNN/`).
pub fn bindings_file(include: &Path) -> Result<String, GenerateError> {
    let qnn = include.join("QNN");
    let missing: Vec<&str> = ENTRY_HEADERS.into_iter().filter(|h| !qnn.join(h).is_file()).collect();
    if !missing.is_empty() {
        return Err(GenerateError::MissingHeaders { dir: qnn, missing });
    }
    let wrapper: String = ENTRY_HEADERS.iter().map(|h| format!("#include \"{h}\"\n")).collect();
    let freestanding = include.parent().unwrap_or(include).join("freestanding");
    let libclang = libclang_dir()?;
    // clang-sys reads LIBCLANG_PATH when bindgen first loads libclang, just below.
    std::env::set_var("LIBCLANG_PATH", &libclang);
    let builder = bindgen::Builder::default()
        .header_contents("backend_qnn_wrapper.h", &wrapper)
        .clang_arg("-nostdinc")
        .clang_arg(format!("-isystem{}", freestanding.display()))
        .clang_arg(format!("-I{}", qnn.display()))
        .allowlist_type("Qnn.*")
        .allowlist_type("_QnnDevice_.*")
        .allowlist_var("QNN_.*")
        .prepend_enum_name(false)
        .default_enum_style(bindgen::EnumVariation::Consts)
        .generate_comments(false)
        .layout_tests(true)
        // prettyplease is pinned by Cargo.lock: the text does not depend on a rustfmt install.
        .formatter(bindgen::Formatter::Prettyplease);
    // bindgen panics when it cannot load libclang; turn that into an actionable message.
    let generated = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || builder.generate()));
    let bindings = match generated {
        Ok(Ok(bindings)) => bindings.to_string(),
        Ok(Err(source)) => return Err(GenerateError::Bindgen { dir: qnn, source }),
        Err(_) => return Err(GenerateError::NoLibclang { dir: libclang }),
    };
    let core = interface_table(&bindings, "QnnInterface_t")?;
    let system = interface_table(&bindings, "QnnSystemInterface_t")?;
    Ok(format!(
        "// @generated from backend-qnn/qnn-abi/include/QNN (the project's clean-room declarations)\n\
         // by bindgen; do not edit. Regenerate: {REGENERATE}\n\n{bindings}\n{}{}",
        core.accessor("core", "QnnInterface_t"),
        system.accessor("system", "QnnSystemInterface_t")
    ))
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
/// with every API version and is read from the bindings rather than hard-coded.
fn interface_table(bindings: &str, struct_name: &str) -> Result<Table, GenerateError> {
    let body = |header: &str| -> Option<&str> {
        let start = bindings.find(header)? + header.len();
        let end = start + bindings[start..].find("\n}")?;
        Some(&bindings[start..end])
    };
    let not_found = || GenerateError::NoTable(struct_name.to_string());
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
    let (major, minor) = version
        .ok_or_else(|| GenerateError::TableName { interface: struct_name.to_string(), field: field.to_string() })?;
    Ok(Table { field: field.to_string(), ty: ty.to_string(), major, minor })
}

//! Finding, opening and versioning the QNN shared libraries.
//!
//! A QNN backend library exports one symbol, `QnnInterface_getProviders`, returning versioned
//! function tables ("providers"); the system library does the same with
//! `QnnSystemInterface_getProviders`. A provider is usable when its API major version equals
//! the one our bindings were generated from and its minor version is at least as high
//! (tables only grow at the end within a major version). Provider tables point into the
//! library, so the `Library` is kept alive by whoever copies a table out of it.

use std::ffi::CStr;
use std::fmt;
use std::os::raw::c_char;
use std::path::{Path, PathBuf};

use libloading::os::unix::{Library, Symbol, RTLD_GLOBAL, RTLD_NOW};
use thiserror::Error;

use super::bindings as b;

/// Where the libraries for the machine this program runs on live inside a QAIRT SDK: the x86_64
/// Linux ones (Qualcomm's HTP emulation), or, built for Android, the phone's aarch64 ones.
#[cfg(not(target_os = "android"))]
pub const HOST_LIB_DIR: &str = "lib/x86_64-linux-clang";
/// Where the libraries for the machine this program runs on live inside a QAIRT SDK: the x86_64
/// Linux ones (Qualcomm's HTP emulation), or, built for Android, the phone's aarch64 ones.
#[cfg(target_os = "android")]
pub const HOST_LIB_DIR: &str = "lib/aarch64-android";
/// `QNN_BACKEND_ID_HTP`.
pub const HTP_BACKEND_ID: u32 = 6;
/// Where `scripts/fetch-qnn-sdk` lays out Qualcomm's x86_64 libraries (from PyPI's
/// onnxruntime-qnn 2.7.0 wheel), under the project cache `$MLLM_DSL_CACHE` (default
/// `~/.cache/mllm-dsl`).
pub const FETCHED_SDK_SUBDIR: &str = "qnn-sdk/onnxruntime-qnn-2.7.0";
/// How to get Qualcomm's libraries, for messages.
pub const FETCH_HINT: &str =
    "run `scripts/fetch-qnn-sdk` (fetches Qualcomm's x86_64 QNN libraries into the cache) or set QNN_SDK_ROOT to a QAIRT SDK";

/// Paths of the two libraries the SDK layer opens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LibraryPaths {
    /// `libQnnHtp.so`: builds and serializes contexts.
    pub backend: PathBuf,
    /// `libQnnSystem.so`: reads context-binary metadata.
    pub system: PathBuf,
}

impl LibraryPaths {
    /// `<root>/`[`HOST_LIB_DIR`]`/{libQnnHtp.so, libQnnSystem.so}`.
    pub fn from_sdk_root(root: impl AsRef<Path>) -> LibraryPaths {
        let dir = root.as_ref().join(HOST_LIB_DIR);
        LibraryPaths { backend: dir.join("libQnnHtp.so"), system: dir.join("libQnnSystem.so") }
    }

    /// The SDK root `scripts/fetch-qnn-sdk` writes, whether or not it exists yet.
    pub fn fetched_sdk_root() -> Option<PathBuf> {
        Some(mllm_dsl::files::project_cache()?.join(FETCHED_SDK_SUBDIR))
    }

    /// The one place that decides where Qualcomm's libraries come from: `$QNN_SDK_ROOT` when it
    /// is set (a root without both libraries is an error naming the missing one), else the root
    /// `scripts/fetch-qnn-sdk` fills. [`LoadError::NotFound`] says how to get them.
    pub fn find() -> Result<LibraryPaths, LoadError> {
        let (root, from_env) = match std::env::var_os("QNN_SDK_ROOT").filter(|r| !r.is_empty()) {
            Some(root) => (PathBuf::from(root), true),
            None => (LibraryPaths::fetched_sdk_root().ok_or(LoadError::NotFound { missing: None })?, false),
        };
        let paths = LibraryPaths::from_sdk_root(&root);
        let missing = [&paths.backend, &paths.system].into_iter().find(|p| !p.is_file()).cloned();
        match missing {
            Some(path) if from_env => Err(LoadError::NotInSdkRoot { path }),
            Some(path) => Err(LoadError::NotFound { missing: Some(path) }),
            None => Ok(paths),
        }
    }
}

/// What a library says about one of its providers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderInfo {
    pub name: String,
    pub backend_id: u32,
    /// (major, minor, patch) of the core (or system) API it implements.
    pub api_version: (u32, u32, u32),
}

impl fmt::Display for ProviderInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (major, minor, patch) = self.api_version;
        write!(f, "`{}` (backend {}, API {major}.{minor}.{patch})", self.name, self.backend_id)
    }
}

/// Why a QNN library could not be used.
#[derive(Debug, Error)]
pub enum LoadError {
    #[error("Qualcomm's QNN libraries were not found{}: {FETCH_HINT}", missing_note(.missing))]
    NotFound { missing: Option<PathBuf> },
    #[error("QNN library {} not found: QNN_SDK_ROOT must be a QAIRT SDK root (the directory holding {HOST_LIB_DIR}), or unset it to use the libraries `scripts/fetch-qnn-sdk` fetches", path.display())]
    NotInSdkRoot { path: PathBuf },
    #[error("cannot open QNN library {}: {source} (set QNN_SDK_ROOT to the QAIRT SDK root or pass explicit LibraryPaths)", path.display())]
    Open { path: PathBuf, source: libloading::Error },
    #[error("{} does not export {symbol}: {source}", path.display())]
    Symbol { path: PathBuf, symbol: &'static str, source: libloading::Error },
    #[error("{symbol} of {} returned error {code}", path.display())]
    GetProviders { path: PathBuf, symbol: &'static str, code: u64 },
    #[error("no provider in {} implements {wanted}; it offers: {}", path.display(), list(found))]
    NoCompatibleProvider { path: PathBuf, wanted: String, found: Vec<ProviderInfo> },
}

fn missing_note(missing: &Option<PathBuf>) -> String {
    missing.as_ref().map(|p| format!(" ({} is missing)", p.display())).unwrap_or_default()
}

fn list(found: &[ProviderInfo]) -> String {
    if found.is_empty() {
        return "nothing".into();
    }
    found.iter().map(ProviderInfo::to_string).collect::<Vec<_>>().join(", ")
}

/// Opens a library the way QNN expects (`RTLD_NOW | RTLD_GLOBAL`, as the SDK samples do:
/// backend libraries load further libraries that resolve symbols globally).
pub(crate) fn open(path: &Path) -> Result<Library, LoadError> {
    // SAFETY: running a shared library's initializers is inherently trusted; these are the
    // QNN libraries the user pointed us at.
    unsafe { Library::open(Some(path), RTLD_NOW | RTLD_GLOBAL) }
        .map_err(|source| LoadError::Open { path: path.to_path_buf(), source })
}

/// The first provider with the wanted major version, a minor version at least as high as
/// ours, and (if given) the wanted backend id.
pub(crate) fn select_provider(found: &[ProviderInfo], want: (u32, u32), backend_id: Option<u32>) -> Option<usize> {
    found.iter().position(|p| {
        let (major, minor, _) = p.api_version;
        major == want.0 && minor >= want.1 && backend_id.is_none_or(|id| id == p.backend_id)
    })
}

/// Calls `<symbol>(&list, &count)` and returns the non-null provider pointers.
fn providers<T>(library: &Library, path: &Path, symbol: &'static str) -> Result<Vec<*const T>, LoadError> {
    type GetProviders<T> = unsafe extern "C" fn(*mut *mut *const T, *mut u32) -> b::Qnn_ErrorHandle_t;
    let name = format!("{symbol}\0");
    // SAFETY: the symbol has this signature in every QNN version (`QnnInterface.h`,
    // `QnnSystemInterface.h`).
    let get: Symbol<GetProviders<T>> = unsafe { library.get(name.as_bytes()) }.map_err(|source| LoadError::Symbol {
        path: path.to_path_buf(),
        symbol,
        source,
    })?;
    let mut list: *mut *const T = std::ptr::null_mut();
    let mut count = 0u32;
    // SAFETY: both out-pointers are valid for writes.
    let code = unsafe { get(&mut list, &mut count) };
    if code & 0xFFFF != 0 {
        return Err(LoadError::GetProviders { path: path.to_path_buf(), symbol, code });
    }
    if list.is_null() {
        return Ok(Vec::new());
    }
    // SAFETY: the library returned `count` entries at `list`, valid while it stays loaded.
    let entries = unsafe { std::slice::from_raw_parts(list, count as usize) };
    Ok(entries.iter().copied().filter(|p| !p.is_null()).collect())
}

fn c_name(name: *const c_char) -> String {
    if name.is_null() {
        return String::new();
    }
    // SAFETY: provider names are NUL-terminated strings owned by the library.
    unsafe { CStr::from_ptr(name) }.to_string_lossy().into_owned()
}

/// The core interface table of the usable HTP provider of `library`.
pub(crate) fn core_provider(library: &Library, path: &Path) -> Result<(b::CoreTable, ProviderInfo), LoadError> {
    let list = providers::<b::QnnInterface_t>(library, path, "QnnInterface_getProviders")?;
    let infos: Vec<ProviderInfo> = list
        .iter()
        .map(|&p| {
            // SAFETY: non-null provider pointers from the library.
            let p = unsafe { &*p };
            let v = p.apiVersion.coreApiVersion;
            ProviderInfo {
                name: c_name(p.providerName),
                backend_id: p.backendId,
                api_version: (v.major, v.minor, v.patch),
            }
        })
        .collect();
    let (major, minor) = b::CORE_API_VERSION;
    let index = select_provider(&infos, b::CORE_API_VERSION, Some(HTP_BACKEND_ID)).ok_or_else(|| {
        LoadError::NoCompatibleProvider {
            path: path.to_path_buf(),
            wanted: format!("QNN core API {major}.{minor}+ for the HTP backend (id {HTP_BACKEND_ID})"),
            found: infos.clone(),
        }
    })?;
    // SAFETY: the provider's version was checked by `select_provider`.
    let table = unsafe { *b::core_table(&*list[index]) };
    Ok((table, infos[index].clone()))
}

/// The system interface table of the usable provider of `library`.
pub(crate) fn system_provider(library: &Library, path: &Path) -> Result<(b::SystemTable, ProviderInfo), LoadError> {
    let list = providers::<b::QnnSystemInterface_t>(library, path, "QnnSystemInterface_getProviders")?;
    let infos: Vec<ProviderInfo> = list
        .iter()
        .map(|&p| {
            // SAFETY: non-null provider pointers from the library.
            let p = unsafe { &*p };
            let v = p.systemApiVersion;
            ProviderInfo {
                name: c_name(p.providerName),
                backend_id: p.backendId,
                api_version: (v.major, v.minor, v.patch),
            }
        })
        .collect();
    let (major, minor) = b::SYSTEM_API_VERSION;
    let index =
        select_provider(&infos, b::SYSTEM_API_VERSION, None).ok_or_else(|| LoadError::NoCompatibleProvider {
            path: path.to_path_buf(),
            wanted: format!("QNN system API {major}.{minor}+"),
            found: infos.clone(),
        })?;
    // SAFETY: the provider's version was checked by `select_provider`.
    let table = unsafe { *b::system_table(&*list[index]) };
    Ok((table, infos[index].clone()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(name: &str, backend_id: u32, major: u32, minor: u32) -> ProviderInfo {
        ProviderInfo { name: name.into(), backend_id, api_version: (major, minor, 0) }
    }

    #[test]
    fn provider_selection_needs_same_major_and_newer_minor() {
        let found = [p("old", 6, 2, 10), p("next-major", 6, 3, 0), p("cpu", 3, 2, 25), p("ok", 6, 2, 26)];
        assert_eq!(select_provider(&found, (2, 25), Some(6)), Some(3));
        assert_eq!(select_provider(&found, (2, 25), None), Some(2));
        assert_eq!(select_provider(&found, (2, 27), Some(6)), None);
        assert_eq!(select_provider(&found, (2, 10), Some(6)), Some(0));
    }

    #[test]
    fn sdk_root_layout() {
        let paths = LibraryPaths::from_sdk_root("/opt/qairt/2.37");
        assert_eq!(paths.backend, PathBuf::from("/opt/qairt/2.37/lib/x86_64-linux-clang/libQnnHtp.so"));
        assert_eq!(paths.system, PathBuf::from("/opt/qairt/2.37/lib/x86_64-linux-clang/libQnnSystem.so"));
    }
}

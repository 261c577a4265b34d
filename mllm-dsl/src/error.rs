//! Typed errors. Every error raised while a model runs or traces carries the module path
//! (`model.layers.3.mlp`) and the call site in the user's model file.

use std::fmt;
use std::panic::Location;

/// A call site in user code, captured with `#[track_caller]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CallSite(pub &'static Location<'static>);

impl CallSite {
    #[track_caller]
    pub fn here() -> Self {
        CallSite(Location::caller())
    }
}

impl fmt::Display for CallSite {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}", self.0.file(), self.0.line(), self.0.column())
    }
}

/// Shown for the top-level module, whose path is empty.
pub(crate) fn display_path(path: &str) -> &str {
    if path.is_empty() {
        "<top>"
    } else {
        path
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A shape or dtype error at an op, raised where the user called it.
    #[error("{op} in module `{}` at {site}: {message}", display_path(module_path))]
    Op { op: String, module_path: String, site: CallSite, message: String },

    /// A misused QDQ point (repeated name, wrong input dtype, value already quantized).
    #[error("qdq!(\"{name}\") in module `{}` at {site}: {message}", display_path(module_path))]
    Qdq { name: String, module_path: String, site: CallSite, message: String },

    /// A parameter could not be provided by the weight store.
    #[error("parameter `{key}` (requested by `{}`): {message}", display_path(module_path))]
    Weight { key: String, module_path: String, message: String },

    /// Tracing was used wrongly (a traced tensor outside its trace, eager and traced tensors mixed, ...).
    #[error("trace error in module `{}`: {message}", display_path(module_path))]
    Trace { module_path: String, message: String },

    /// The eager backend failed to compute an op.
    #[error("backend error in {op} (module `{}`): {message}", display_path(module_path))]
    Backend { op: String, module_path: String, message: String },

    /// Printed IR that does not parse.
    #[error("IR parse error at line {line}, column {column}: {message}")]
    Parse { line: usize, column: usize, message: String },

    /// Anything else with a plain message (configuration, I/O of artifacts, ...).
    #[error("{0}")]
    Msg(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub fn msg(m: impl Into<String>) -> Self {
        Error::Msg(m.into())
    }
}

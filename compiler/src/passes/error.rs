//! [`PassError`]: why a pass refused a program. Messages name the pass, the op, the value and the
//! module path (the subgraph the op sits in), so a failure can be found in the dumped IR.

use super::params::ParamError;
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum PassError {
    /// An op or one of its values breaks a rule of the pass.
    #[error("{pass}: op `{op}` in `{module}`, {value}: {message}")]
    Op { pass: &'static str, op: String, module: String, value: String, message: String },

    /// LLMQuantRecipe met an op it has no rule for.
    #[error("{pass}: op `{op}` ({op_type}) in `{module}` has no quantization recipe rule{hint}")]
    NoRecipeRule { pass: &'static str, op: String, op_type: &'static str, module: String, hint: String },

    /// PTQ could not find parameters for a value's spec.
    #[error(transparent)]
    UnsolvedSpec(Box<UnsolvedSpec>),

    /// The inputs of a concat are quantized differently (mllm's PTQ only logs this).
    #[error(transparent)]
    ConcatMismatch(Box<ConcatMismatch>),

    /// A parameter the provider could not give, with the op and value that needed it.
    #[error("{pass}: op `{op}` in `{module}`, {value}: {source}")]
    Param {
        pass: &'static str,
        op: String,
        module: String,
        value: String,
        #[source]
        source: Box<ParamError>,
    },

    /// The AOT config asks for something the program or this compiler cannot do.
    #[error("AOT config `{field}`: {message}")]
    Config { field: String, message: String },

    /// The program does not have the structure the pass expects (no `@model` call, ...).
    #[error("{pass}: {message}")]
    Structure { pass: &'static str, message: String },

    /// An IR dump could not be written.
    #[error("cannot write IR dump `{}`: {source}", path.display())]
    Dump {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// A value whose quantization spec PTQ could not solve.
#[derive(Debug, thiserror::Error)]
#[error("{pass}: {value}, {role} op `{op}` in `{module}`, has an unsolved quantization spec {spec}: {reason}")]
pub struct UnsolvedSpec {
    pub pass: &'static str,
    pub op: String,
    pub module: String,
    /// `input 1 of` / `output 0 of`.
    pub role: String,
    pub value: String,
    pub spec: String,
    pub reason: String,
}

/// Concat inputs with different quantization parameters.
#[derive(Debug, thiserror::Error)]
#[error(
    "{pass}: concat `{op}` in `{module}`: input {index} {value} has scale {scale:e} and zero point {zero_point}, \
     but input 0 {first} has scale {first_scale:e} and zero point {first_zero_point}"
)]
pub struct ConcatMismatch {
    pub pass: &'static str,
    pub op: String,
    pub module: String,
    pub index: usize,
    pub value: String,
    pub scale: f32,
    pub zero_point: i32,
    pub first: String,
    pub first_scale: f32,
    pub first_zero_point: i32,
}

impl PassError {
    pub(crate) fn structure(pass: &'static str, message: impl Into<String>) -> Self {
        PassError::Structure { pass, message: message.into() }
    }

    pub(crate) fn config(field: impl Into<String>, message: impl Into<String>) -> Self {
        PassError::Config { field: field.into(), message: message.into() }
    }
}

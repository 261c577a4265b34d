//! [`AotError`]: why a step of the pipeline failed, typed by the crate that refused.
//!
//! Each lower crate's error converts with `?` into its own variant (so a caller can match on
//! "the AOT config was rejected" or "the checkpoint is unreadable"); the pipeline's own checks of
//! arguments and data against each other are [`AotError::Invalid`]; [`Context::context`] adds
//! what was being done. The message of a [`AotError::Context`] holds the whole chain
//! (`reading the model config of x: config.json: ...`), so `to_string()` names every step.

use std::fmt::Display;

/// Why a step of the AOT pipeline failed.
#[derive(Debug, thiserror::Error)]
pub enum AotError {
    #[error(transparent)]
    HfConfig(Box<models::hf::ConfigError>),
    #[error(transparent)]
    AotConfig(Box<compiler::aot_config::AotConfigError>),
    #[error(transparent)]
    RunSizes(Box<crate::run_sizes::RunSizeError>),
    #[error(transparent)]
    File(Box<mllm_dsl::files::FileError>),
    /// Building, binding, tracing or running a model file.
    #[error(transparent)]
    Model(Box<mllm_dsl::Error>),
    #[error(transparent)]
    Pass(Box<compiler::passes::PassError>),
    #[error(transparent)]
    QdqPoints(Box<compiler::quant::points::PointsError>),
    #[error(transparent)]
    QuantParams(Box<compiler::passes::ParamError>),
    /// Running a chunked model (prefill/decode) on a backend.
    #[error(transparent)]
    Runtime(Box<runtime::RuntimeError>),
    #[error(transparent)]
    Checkpoint(Box<checkpoint::CheckpointError>),
    #[error(transparent)]
    ChatTemplate(Box<checkpoint::ChatTemplateError>),
    #[error(transparent)]
    CpuInterpreter(Box<backend_cpu::interp::InterpError>),
    #[error(transparent)]
    Kernel(Box<backend_cpu::kernels::KernelError>),
    #[error(transparent)]
    Quantization(Box<backend_cpu::quant::QuantizationError>),
    #[error(transparent)]
    Comparison(Box<backend_cpu::quant::ComparisonError>),
    #[error(transparent)]
    Lowering(Box<backend_qnn::LowerError>),
    #[error(transparent)]
    Artifact(Box<backend_qnn::artifacts::ArtifactError>),
    #[error(transparent)]
    ContextBinary(Box<backend_qnn::context::ContextError>),
    #[error(transparent)]
    QnnSdk(Box<backend_qnn::sdk::SdkError>),
    #[error(transparent)]
    QnnInterpreter(Box<backend_qnn::interp::InterpError>),
    #[error(transparent)]
    QnnModel(Box<backend_qnn::QnnModelError>),
    #[error(transparent)]
    QnnValidation(Box<backend_qnn::ValidationError>),
    #[error(transparent)]
    QnnTarget(Box<backend_qnn::target::TargetError>),
    #[error(transparent)]
    QnnLoad(Box<backend_qnn::sdk::LoadError>),
    #[error(transparent)]
    QnnBuild(Box<backend_qnn::sdk::BuildError>),
    #[error(transparent)]
    QnnRun(Box<backend_qnn::sdk::RunValuesError>),
    /// `--target-runtime` refusing an option before any work.
    #[error(transparent)]
    TargetRuntime(Box<crate::deploy::TargetRuntimeRefusal>),
    #[error(transparent)]
    ParseInt(Box<std::num::ParseIntError>),
    /// A quantization recipe name or combination that cannot be used.
    #[error(transparent)]
    Recipe(Box<crate::recipe::RecipeError>),
    /// Planning or cutting sharded context binaries.
    #[error(transparent)]
    Shard(Box<crate::shard::ShardError>),
    /// A shard's build in its child process failed or was killed.
    #[error(transparent)]
    ShardBuild(Box<crate::shard_build::ShardBuildError>),
    /// A graph family that cannot be built or does not match a binary.
    #[error(transparent)]
    Family(Box<crate::family::FamilyError>),
    /// A tokenizer that would not load, encode or decode.
    #[error("{what}: {source}")]
    Tokenizer {
        what: String,
        #[source]
        source: tokenizers::Error,
    },
    /// File system errors outside `mllm_dsl::files` (their step says which path).
    /// An AscendV1 export or decoding refused its input.
    #[error(transparent)]
    Ascend(Box<crate::ascend::AscendError>),
    #[error(transparent)]
    Io(Box<std::io::Error>),
    #[error(transparent)]
    Json(Box<serde_json::Error>),
    /// A model argument that names no model (see [`crate::model_path`]).
    #[error(transparent)]
    ModelPath(Box<crate::model_path::ModelPathError>),
    /// The pipeline's own checks: arguments against each other, data against the model.
    #[error("{0}")]
    Invalid(String),
    /// A failed step and what was being done; the message holds the whole chain.
    #[error("{context}: {cause}")]
    Step { context: String, cause: Box<AotError> },
}

/// `?` converts each lower crate's error into its (boxed, to keep results small) variant.
macro_rules! boxed_from {
    ($($variant:ident <- $source:ty,)+) => {
        $(impl From<$source> for AotError {
            fn from(e: $source) -> Self {
                AotError::$variant(Box::new(e))
            }
        })+
    };
}

boxed_from! {
    TargetRuntime <- crate::deploy::TargetRuntimeRefusal,
    HfConfig <- models::hf::ConfigError,
    AotConfig <- compiler::aot_config::AotConfigError,
    RunSizes <- crate::run_sizes::RunSizeError,
    File <- mllm_dsl::files::FileError,
    Model <- mllm_dsl::Error,
    Pass <- compiler::passes::PassError,
    QdqPoints <- compiler::quant::points::PointsError,
    QuantParams <- compiler::passes::ParamError,
    Runtime <- runtime::RuntimeError,
    Checkpoint <- checkpoint::CheckpointError,
    ChatTemplate <- checkpoint::ChatTemplateError,
    CpuInterpreter <- backend_cpu::interp::InterpError,
    Kernel <- backend_cpu::kernels::KernelError,
    Quantization <- backend_cpu::quant::QuantizationError,
    Comparison <- backend_cpu::quant::ComparisonError,
    Recipe <- crate::recipe::RecipeError,
    Lowering <- backend_qnn::LowerError,
    Artifact <- backend_qnn::artifacts::ArtifactError,
    ContextBinary <- backend_qnn::context::ContextError,
    QnnSdk <- backend_qnn::sdk::SdkError,
    QnnInterpreter <- backend_qnn::interp::InterpError,
    QnnModel <- backend_qnn::QnnModelError,
    QnnValidation <- backend_qnn::ValidationError,
    QnnTarget <- backend_qnn::target::TargetError,
    QnnLoad <- backend_qnn::sdk::LoadError,
    QnnBuild <- backend_qnn::sdk::BuildError,
    QnnRun <- backend_qnn::sdk::RunValuesError,
    ParseInt <- std::num::ParseIntError,
    Shard <- crate::shard::ShardError,
    ShardBuild <- crate::shard_build::ShardBuildError,
    Family <- crate::family::FamilyError,
    Io <- std::io::Error,
    Json <- serde_json::Error,
    ModelPath <- crate::model_path::ModelPathError,
}

/// The `aot` crate's results.
pub type Result<T, E = AotError> = std::result::Result<T, E>;

impl AotError {
    /// The pipeline's own check failed, with a message naming the argument, file or tensor.
    pub fn invalid(message: impl Display) -> AotError {
        AotError::Invalid(message.to_string())
    }

    /// A tokenizer error with what was being done.
    pub fn tokenizer(what: impl Display, source: tokenizers::Error) -> AotError {
        AotError::Tokenizer { what: what.to_string(), source }
    }
}

/// Adds what was being done to an error (or to a missing value), as `anyhow::Context` does.
pub trait Context<T> {
    fn context(self, context: impl Display) -> Result<T>;
    fn with_context<C: Display>(self, context: impl FnOnce() -> C) -> Result<T>;
}

impl<T, E: Into<AotError>> Context<T> for std::result::Result<T, E> {
    fn context(self, context: impl Display) -> Result<T> {
        self.map_err(|e| AotError::Step { context: context.to_string(), cause: Box::new(e.into()) })
    }

    fn with_context<C: Display>(self, context: impl FnOnce() -> C) -> Result<T> {
        self.map_err(|e| AotError::Step { context: context().to_string(), cause: Box::new(e.into()) })
    }
}

impl<T> Context<T> for Option<T> {
    fn context(self, context: impl Display) -> Result<T> {
        self.ok_or_else(|| AotError::invalid(context))
    }

    fn with_context<C: Display>(self, context: impl FnOnce() -> C) -> Result<T> {
        self.ok_or_else(|| AotError::invalid(context()))
    }
}

/// Returns an [`AotError::Invalid`] with a formatted message.
macro_rules! bail {
    ($($arg:tt)*) => {
        return Err($crate::error::AotError::Invalid(format!($($arg)*)))
    };
}

/// Returns an [`AotError::Invalid`] with a formatted message unless the condition holds.
macro_rules! ensure {
    ($cond:expr, $($arg:tt)*) => {
        if !$cond {
            $crate::error::bail!($($arg)*);
        }
    };
}

pub(crate) use {bail, ensure};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn context_messages_hold_the_whole_chain_and_keep_the_typed_cause() {
        let inner: Result<()> = Err(AotError::invalid("AotOptions::chunks 0 must be at least 1"));
        let err = inner.context("checking the arguments").context("qwen3_aot").unwrap_err();
        assert_eq!(err.to_string(), "qwen3_aot: checking the arguments: AotOptions::chunks 0 must be at least 1");
        let AotError::Step { cause, .. } = &err else { panic!("{err:?}") };
        assert!(matches!(&**cause, AotError::Step { cause, .. } if matches!(**cause, AotError::Invalid(_))));
        let missing: Result<u8> = None.context("no graph `model.0.s1`");
        assert_eq!(missing.unwrap_err().to_string(), "no graph `model.0.s1`");
    }
}

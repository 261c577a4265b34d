//! The AOT pass pipeline: a traced [`Program`] becomes QNN-ready IR.
//!
//! Each pass is a [`Pass`]; [`Pipeline::qnn_aot`] chains them in mllm's order
//! (`mllm/backends/qnn/aot/passes/AOTPipeline.cpp`):
//!
//! | # | pass | what it does |
//! |---|---|---|
//! | 1 | [`MarkQnnGraph`] | `using_qnn` on the `graph_on_qnn` subgraphs (and what they call) and the `op_on_qnn` ops |
//! | 2 | [`OpNaming`] | names anonymous ops `<subgraph>.<OpType>.<k>`; makes op names unique |
//! | 3 | [`MergeLlmHead`] | moves the top-level `lm_head` into the model graph |
//! | 4 | [`LlmQuantRecipe`] | gives every value a quantization spec; shared specs through shape ops |
//! | 5 | [`Ptq`] | solves every spec from QDQ parameters and checkpoint metadata; quantizes constants |
//! | 6 | [`LpbqCanonicalize`] | puts LPBQ weights into their canonical HWIO int4 form, checks their block layout |
//! | 7 | [`SplitLlmGraph`] | flattens the model into one graph `model.0.s<S>` |
//! | 8 | [`MarkTensorIo`] | tags graph inputs and outputs, in mllm's positional I/O contract |
//! | 9 | [`TensorRenaming`] | gives every tensor of the flat graph a stable, QNN-safe name |
//!
//! Every pass is semantics-preserving: backend-cpu's IR interpreter runs the program after each one
//! and gets the eager model's outputs. A pass that cannot do its job fails with a [`PassError`]
//! naming the op, the value and the module path; [`Pipeline::dump_to`] writes the IR after every
//! pass for inspecting such failures.

mod error;
mod graph;
mod lpbq_canonicalize;
mod mark_qnn;
mod merge_head;
mod op_naming;
pub mod params;
mod pipeline;
mod ptq;
mod quant_recipe;
mod split_graph;
mod synthetic;
mod tensor_io;
mod tensor_renaming;
#[cfg(test)]
mod tests;

pub use error::{ConcatMismatch, PassError, UnsolvedSpec};
pub use lpbq_canonicalize::LpbqCanonicalize;
pub use mark_qnn::MarkQnnGraph;
pub use merge_head::MergeLlmHead;
pub use op_naming::OpNaming;
pub use params::{qdq_params, ParamError, QuantParamProvider, StoredTensor};
pub use pipeline::{check_config, PassTiming, Pipeline, PipelineReport};
pub use ptq::Ptq;
pub use quant_recipe::LlmQuantRecipe;
pub use split_graph::{graph_name, parse_graph_name, shard_graph_name, SplitLlmGraph};
pub use synthetic::SyntheticParams;
pub use tensor_io::{IoContract, IoContractError, MarkTensorIo};
pub use tensor_renaming::TensorRenaming;

use mllm_dsl::ir::Program;

/// One rewrite of a program.
pub trait Pass {
    /// mllm's pass name (`MarkQnnGraph`), for messages and timings.
    fn name(&self) -> &'static str;

    /// The stage name of the program after this pass (`mark_qnn_graph`): dump file and snapshot
    /// names.
    fn stage(&self) -> &'static str;

    /// Rewrites `program` in place. On error the program may be partly rewritten.
    fn run(&self, program: &mut Program) -> Result<(), PassError>;
}

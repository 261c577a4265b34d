//! [`Pipeline`]: passes in order, config checks up front, timings, and IR dumps after every pass.

use super::{
    LlmQuantRecipe, LpbqCanonicalize, MarkQnnGraph, MarkTensorIo, MergeLlmHead, OpNaming, Pass, PassError, Ptq,
    QuantParamProvider, SplitLlmGraph, TensorRenaming,
};
use crate::aot_config::AotConfig;
use mllm_dsl::ir::{Node, Program};
use mllm_dsl::op::OpKind;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How long one pass took.
#[derive(Clone, Debug)]
pub struct PassTiming {
    pub pass: &'static str,
    pub elapsed: Duration,
}

/// What a pipeline run did.
#[derive(Clone, Debug, Default)]
pub struct PipelineReport {
    pub timings: Vec<PassTiming>,
    /// Dump files written, in order (empty without [`Pipeline::dump_to`]).
    pub dumps: Vec<PathBuf>,
}

impl PipelineReport {
    pub fn total(&self) -> Duration {
        self.timings.iter().map(|t| t.elapsed).sum()
    }
}

/// An ordered list of passes.
pub struct Pipeline<'a> {
    config: Option<&'a AotConfig>,
    passes: Vec<Box<dyn Pass + 'a>>,
    dump_dir: Option<PathBuf>,
}

impl<'a> Pipeline<'a> {
    /// An empty pipeline; [`check_config`] runs first when `config` is given.
    pub fn new(config: Option<&'a AotConfig>) -> Self {
        Pipeline { config, passes: Vec::new(), dump_dir: None }
    }

    /// mllm's QNN AOT pipeline, in its order, with LPBQ canonicalization and tensor renaming.
    pub fn qnn_aot(config: &'a AotConfig, params: &'a dyn QuantParamProvider) -> Self {
        Pipeline::new(Some(config))
            .with(MarkQnnGraph::new(config))
            .with(OpNaming)
            .with(MergeLlmHead)
            .with(LlmQuantRecipe::new(config))
            .with(Ptq::new(params))
            .with(LpbqCanonicalize::new(config, params))
            .with(SplitLlmGraph::new(config))
            .with(MarkTensorIo::new(config))
            .with(TensorRenaming)
    }

    /// Appends a pass.
    pub fn with(mut self, pass: impl Pass + 'a) -> Self {
        self.passes.push(Box::new(pass));
        self
    }

    /// Writes the IR before the first pass (`00-trace.mir`) and after each pass
    /// (`01-mark_qnn_graph.mir`, ...) into `dir`, which is created if needed.
    pub fn dump_to(mut self, dir: impl Into<PathBuf>) -> Self {
        self.dump_dir = Some(dir.into());
        self
    }

    pub fn passes(&self) -> impl Iterator<Item = &dyn Pass> {
        self.passes.iter().map(|p| p.as_ref())
    }

    /// Runs every pass in order.
    pub fn run(&self, program: &mut Program) -> Result<PipelineReport, PassError> {
        self.run_observed(program, |_, _| Ok(()))
    }

    /// Runs every pass and calls `observe` with the program after each (tests check each stage).
    pub fn run_observed(
        &self,
        program: &mut Program,
        mut observe: impl FnMut(&dyn Pass, &Program) -> Result<(), PassError>,
    ) -> Result<PipelineReport, PassError> {
        if let Some(config) = self.config {
            check_config(config, program)?;
        }
        let mut report = PipelineReport::default();
        if let Some(dir) = &self.dump_dir {
            report.dumps.push(dump(dir, 0, "trace", program)?);
        }
        for (i, pass) in self.passes.iter().enumerate() {
            let start = Instant::now();
            pass.run(program)?;
            report.timings.push(PassTiming { pass: pass.name(), elapsed: start.elapsed() });
            if let Some(dir) = &self.dump_dir {
                report.dumps.push(dump(dir, i + 1, pass.stage(), program)?);
            }
            observe(pass.as_ref(), program)?;
        }
        Ok(report)
    }
}

/// Writes `program` to `dir/<index>-<stage>.mir` through a temporary file and a rename, so a
/// reader never sees half a dump.
fn dump(dir: &Path, index: usize, stage: &str, program: &Program) -> Result<PathBuf, PassError> {
    let path = dir.join(format!("{index:02}-{stage}.mir"));
    let io = |source| PassError::Dump { path: path.clone(), source };
    std::fs::create_dir_all(dir).map_err(io)?;
    mllm_dsl::files::write_atomic_bytes(&path, program.to_string().as_bytes())
        .map_err(|e| io(std::io::Error::other(e)))?;
    Ok(path)
}

/// Config errors a program cannot be compiled with, found before any pass runs:
/// `split_graph` other than 1, `graph_on_qnn` names without a subgraph, and linear block sizes
/// that do not divide the op's input width.
pub fn check_config(config: &AotConfig, program: &Program) -> Result<(), PassError> {
    check_split_graph(config)?;
    for (i, name) in config.graph_on_qnn.iter().enumerate() {
        check_graph_name(program, name, i)?;
    }
    for n in &program.main.body {
        let ops: Box<dyn Iterator<Item = &Node>> = match n {
            Node::SubGraph(sg) => Box::new(sg.region.body.iter()),
            other => Box::new(std::iter::once(other)),
        };
        for n in ops {
            if let Node::Linalg(op) = n {
                if op.kind == OpKind::Conv2d && op.inputs.len() >= 2 {
                    let w = &program.value(op.inputs[1]).ty;
                    if w.rank() == 4 {
                        block_size_for(config, op.name.as_deref().unwrap_or(""), w.shape[2])?;
                    }
                }
            }
        }
    }
    Ok(())
}

/// `split_graph` counts the context binaries the decoder layers are cut into (the AOT flow cuts
/// the compiled graph after this pipeline); the pipeline itself always makes one graph per chunk.
pub(crate) fn check_split_graph(config: &AotConfig) -> Result<(), PassError> {
    if config.split_graph == 0 {
        return Err(PassError::config(
            "split_graph",
            "expected at least 1 (the number of context binaries), found 0".to_string(),
        ));
    }
    Ok(())
}

pub(crate) fn check_graph_name(program: &Program, name: &str, index: usize) -> Result<(), PassError> {
    if program.subgraph(name).is_some() {
        return Ok(());
    }
    // Module subgraphs are named by path; list the roots (`init`, `model`), not every layer.
    let roots: Vec<String> = program.subgraphs().map(|g| g.symbol.clone()).filter(|s| !s.contains('.')).collect();
    Err(PassError::config(
        format!("graph_on_qnn[{index}]"),
        format!("names `{name}`, but the program has no such subgraph (root subgraphs: {})", roots.join(", ")),
    ))
}

/// The LPBQ block size of a linear op, checked against its input width.
pub(crate) fn block_size_for(config: &AotConfig, op: &str, in_features: usize) -> Result<usize, PassError> {
    let (block_size, field) = config
        .linear_block_size(op)
        .map_err(|e| PassError::config("quant_recipe.builtin_llm_pass.linear", e.to_string()))?;
    if !in_features.is_multiple_of(block_size) {
        return Err(PassError::config(
            field,
            format!("block size {block_size} does not divide the input width {in_features} of linear `{op}`"),
        ));
    }
    Ok(block_size)
}

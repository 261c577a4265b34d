//! `qwen3_aot --shards N` (N > 1): the compiled graphs of the whole model cut into shards
//! ([`crate::shard`]), their SDK-free artifacts (`qnn/model.<i>.s<chunk>.*`), their context
//! binaries built in child processes ([`crate::shard_build`]: `qnn/context_<i>_of_<n>.bin` and
//! the unshared `.x86.bin` for the emulation), and the ledger rows of the chained shards.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use backend_qnn::interp::{Interpreter, TensorValue};
use backend_qnn::sdk::{run_binary_on_values, LibraryPaths, SdkApi};
use backend_qnn::{LowerOptions, QnnGraph, QnnLowering};
use checkpoint::SafetensorsCheckpoint;
use compiler::passes::QuantParamProvider;

use crate::compile::CompiledGraph;
use crate::cpu_embedding::EmbeddingTable;
use crate::error::{Context, Result};
use crate::shard::{shard_program, AutoPlan, ShardPlan, HIDDEN_STATES, HIDDEN_STATES_OUT};
use crate::shard_build::{run_jobs, JobsOutcome, ShardJob};

/// The shard graphs of every chunk size, lowered with `options`: `[shard][chunk]`.
pub fn lower_shards(
    compiled: &[CompiledGraph],
    plan: &ShardPlan,
    params: &dyn QuantParamProvider,
    options: LowerOptions,
) -> Result<Vec<Vec<QnnGraph>>> {
    let mut out = Vec::with_capacity(plan.count());
    for spec in &plan.shards {
        // One lowering per shard: its graphs share their statics, as in one context.
        let mut lowering = QnnLowering::new(params, options);
        let mut graphs = Vec::with_capacity(compiled.len());
        for c in compiled {
            let program = shard_program(&c.program, plan, spec.index)?;
            let name = spec.graph_name(c.spec.chunk);
            let g = lowering.lower_graph(&program, &name).with_context(|| format!("lowering `{name}`"))?;
            graphs.push(g);
        }
        out.push(graphs);
    }
    Ok(out)
}

/// The inputs of a chain from the whole model's graph `whole` and its input `values`: with the
/// CPU embedding `table`, also shard 1's `hidden_states` gathered for the `input_ids`.
pub fn chain_inputs(
    whole: &QnnGraph,
    values: Vec<TensorValue>,
    first_shard: &QnnGraph,
    table: Option<&EmbeddingTable>,
) -> Result<HashMap<String, TensorValue>> {
    let mut inputs: HashMap<String, TensorValue> = whole.inputs.iter().cloned().zip(values).collect();
    if let Some(table) = table.filter(|_| first_shard.inputs.iter().any(|n| n == HIDDEN_STATES)) {
        let ids = inputs.get("input_ids").with_context(|| format!("graph `{}` takes no input_ids", whole.name))?;
        let hidden = table.hidden_value(first_shard, ids)?;
        inputs.insert(HIDDEN_STATES.to_string(), hidden);
    }
    Ok(inputs)
}

/// Runs shard `k`'s graph on its input values, giving its output values.
pub type RunShard<'a> = dyn FnMut(usize, &QnnGraph, &[TensorValue]) -> Result<Vec<TensorValue>> + 'a;

/// Runs `shards` (one graph per shard, in order) as a chain: each gets the whole model's
/// `inputs` it names, plus the previous shard's `hidden_states` (the first shard's from
/// `inputs`: the CPU embedding's rows, [`chain_inputs`]); returns the last one's outputs by
/// name, and every shard's.
pub fn run_chain(
    shards: &[&QnnGraph],
    inputs: &HashMap<String, TensorValue>,
    run_one: &mut RunShard<'_>,
) -> Result<HashMap<String, TensorValue>> {
    let mut all: HashMap<String, TensorValue> = HashMap::new();
    let mut hidden: Option<TensorValue> = None;
    for (k, g) in shards.iter().enumerate() {
        let values: Vec<TensorValue> = g
            .inputs
            .iter()
            .map(|n| {
                if n == HIDDEN_STATES {
                    hidden.clone().or_else(|| inputs.get(n).filter(|_| k == 0).cloned()).with_context(|| {
                        format!(
                            "graph `{}` takes hidden_states, neither a shard nor the embedding table gave them",
                            g.name
                        )
                    })
                } else {
                    inputs
                        .get(n)
                        .cloned()
                        .with_context(|| format!("graph `{}` takes `{n}`, which the model lacks", g.name))
                }
            })
            .collect::<Result<_>>()?;
        let outputs = run_one(k, g, &values)?;
        crate::error::ensure!(outputs.len() == g.outputs.len(), "graph `{}` gave {} outputs", g.name, outputs.len());
        for (n, v) in g.outputs.iter().zip(outputs) {
            if n == HIDDEN_STATES_OUT {
                hidden = Some(v);
            } else {
                all.insert(n.clone(), v);
            }
        }
    }
    Ok(all)
}

/// backend-qnn's reference interpreter on the chain: the logits.
pub fn chain_logits_on_interpreter(shards: &[&QnnGraph], inputs: &HashMap<String, TensorValue>) -> Result<Vec<f32>> {
    let out = run_chain(shards, inputs, &mut |_, g, values| {
        let interp = Interpreter::new(g).with_context(|| format!("preparing graph `{}`", g.name))?;
        interp.run(values).with_context(|| format!("running graph `{}`", g.name))
    })?;
    Ok(out.get("logits").context("the last shard has no logits")?.to_real()?)
}

/// Qualcomm's x86 HTP emulation on the chain of unshared binaries: the logits.
pub fn chain_logits_on_htp(
    paths: &LibraryPaths,
    binaries: &[Vec<u8>],
    shards: &[&QnnGraph],
    inputs: &HashMap<String, TensorValue>,
) -> Result<Vec<f32>> {
    let mut api = SdkApi::load_for_execution(paths)?;
    let out = run_chain(shards, inputs, &mut |k, g, values| {
        let mut outs = run_binary_on_values(&mut api, &binaries[k], &[(g, values)])
            .with_context(|| format!("running graph `{}` on Qualcomm's x86 HTP emulation", g.name))?;
        outs.pop().context("no outputs")
    })?;
    Ok(out.get("logits").context("the last shard has no logits")?.to_real()?)
}

/// The context binaries of every shard (device and x86), each in a child process of `exe`.
pub struct ShardBinaries {
    pub outcome: JobsOutcome,
    /// The unshared binaries, by shard.
    pub x86: Vec<Vec<u8>>,
    pub written: Vec<PathBuf>,
}

/// Builds `qnn/context_<i>_of_<n>.bin` and `.x86.bin` for every shard of `auto.plan` from the
/// quantized checkpoint `checkpoint`, `auto.jobs` children at once.
#[allow(clippy::too_many_arguments)]
pub fn build_binaries(
    exe: &Path,
    checkpoint: &Path,
    aot_config: Option<&Path>,
    auto: &AutoPlan,
    chunks: &[usize],
    context: usize,
    qnn_dir: &Path,
    work_dir: &Path,
) -> Result<ShardBinaries> {
    let mut jobs = Vec::new();
    for weight_sharing in [true, false] {
        for s in &auto.plan.shards {
            jobs.push(ShardJob {
                checkpoint: checkpoint.to_path_buf(),
                aot_config: aot_config.map(Path::to_path_buf),
                plan: auto.plan.clone(),
                shard: s.index,
                chunks: chunks.to_vec(),
                context,
                weight_sharing,
                optimization_level: None,
                out: qnn_dir.join(if weight_sharing { s.binary_name() } else { s.x86_binary_name() }),
            });
        }
    }
    let outcome = run_jobs(exe, jobs, auto.jobs, work_dir, &mut |_| {})?;
    let _ = std::fs::remove_dir(work_dir);
    let mut x86 = Vec::new();
    for s in &auto.plan.shards {
        let p = qnn_dir.join(s.x86_binary_name());
        x86.push(std::fs::read(&p).with_context(|| format!("reading {}", p.display()))?);
    }
    let written = outcome.shards.iter().map(|o| o.out.clone()).collect();
    Ok(ShardBinaries { outcome, x86, written })
}

/// The ledger label of a chain: `model.0..2.s32` for three shards.
pub fn chain_label(plan: &ShardPlan, chunk: usize) -> String {
    format!("model.0..{}.s{chunk}", plan.count() - 1)
}

/// Opens the quantized checkpoint for lowering.
pub fn open_checkpoint(dir: &Path) -> Result<SafetensorsCheckpoint> {
    SafetensorsCheckpoint::open(dir).with_context(|| format!("opening the quantized checkpoint {}", dir.display()))
}

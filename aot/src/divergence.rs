//! Where backend-qnn's reference interpreter and the CPU fake-quant run of the same IR part ways:
//! every node output of a lowered graph compared with the IR value of the same name
//! ([`op_by_op`]), in execution order, in units of the output's quantization step, twice: as the
//! whole graph ran (errors carried in from earlier nodes included) and with the node alone fed the
//! fake-quant run's own inputs (the node's own error: more than a step or so is a bug).

use std::collections::HashMap;
use std::fmt::Write as _;

use crate::error::{Context, Result};
use backend_cpu::executor::real_values;
use backend_cpu::{CheckpointStore, CpuBackend, GridProducts, InterpMode, Interpreter};
use backend_qnn::encoding::Encoding;
use backend_qnn::interp::TensorValue;
use backend_qnn::QnnGraph;
use checkpoint::SafetensorsCheckpoint;
use mllm_dsl::Program;

use crate::probe::Probe;

/// One node output of the lowered graph against the CPU fake-quant value of the same name.
#[derive(Clone, Debug, PartialEq)]
pub struct OpDivergence {
    /// The QNN node and its op type.
    pub node: String,
    pub op: String,
    /// The output tensor (= the IR value name).
    pub tensor: String,
    /// SQNR of the QNN value against the CPU value (infinite when identical).
    pub sqnr_db: f64,
    pub max_abs_err: f32,
    /// The largest difference in steps of the output's per-tensor encoding (0 for float outputs).
    pub max_steps: f32,
    /// The same for the node alone on the fake-quant run's inputs (quantized to the node's input
    /// encodings, which is exact for values on their grid).
    pub own_steps: f32,
    /// Elements that differ at all, as run and with the node alone.
    pub differing: usize,
    pub own_differing: usize,
    pub elements: usize,
}

/// Both interpreters on `probe`, every node output compared (nodes whose output has no IR value
/// of that name, or holds no real data, are skipped).
pub(crate) fn op_by_op(
    program: &Program,
    graph: &QnnGraph,
    ckpt: &SafetensorsCheckpoint,
    store: &CheckpointStore,
    probe: &Probe,
) -> Result<Vec<OpDivergence>> {
    // f32 sums, as the ledger's other CPU runs (see `stages::validate`).
    let cpu = Interpreter::new(program, store, InterpMode::FakeQuant(ckpt))
        .with_grid_products(GridProducts::F32)
        .run_all_values(&probe.cpu_inputs(&CpuBackend::float())?)
        .with_context(|| format!("running graph `{}` on backend-cpu's IR interpreter", graph.name))?;
    let by_name: HashMap<&str, usize> =
        program.values.iter().enumerate().filter_map(|(i, v)| Some((v.name.as_deref()?, i))).collect();
    let interp = backend_qnn::interp::Interpreter::new(graph)
        .with_context(|| format!("preparing graph `{}` for the reference interpreter", graph.name))?;
    let qnn = interp.run_all(&probe.qnn_inputs(graph)?).with_context(|| format!("running graph `{}`", graph.name))?;
    // A tensor as the fake-quant run computed it, in the graph's representation (integer and bool
    // tensors, which hold no real data there, as the graph computed them).
    let fake_quant_value = |name: &str| -> Result<Option<TensorValue>> {
        let meta = graph.tensor(name).with_context(|| format!("tensor `{name}`"))?;
        if meta.tensor_type == backend_qnn::TensorType::Static {
            return Ok(None); // the node reads it from the graph
        }
        let real = by_name.get(name).and_then(|&i| cpu[i].as_ref()).and_then(real_values);
        Ok(match real {
            Some(real) if meta.dtype.is_fixed_point() || meta.dtype.is_float() => {
                Some(TensorValue::from_real(meta, &real).with_context(|| format!("tensor `{name}`"))?)
            }
            _ => qnn.get(name).cloned(),
        })
    };
    let mut rows = Vec::new();
    for (node_index, node) in graph.nodes.iter().enumerate() {
        let name = &node.outputs[0];
        let (Some(&index), Some(value)) = (by_name.get(name.as_str()), qnn.get(name)) else { continue };
        let Some(reference) = cpu[index].as_ref().and_then(real_values) else { continue };
        let Ok(test) = value.to_real() else { continue };
        if test.len() != reference.len() {
            continue;
        }
        let step = match &value.encoding {
            Encoding::ScaleOffset(so) => so.scale,
            _ => 0.0,
        };
        let mut own_inputs = HashMap::new();
        for input in &node.inputs {
            if let Some(v) = fake_quant_value(input)? {
                own_inputs.insert(input.clone(), v);
            }
        }
        let own = interp.run_node(node_index, &own_inputs)?.to_real()?;
        let own_err = reference.iter().zip(&own).map(|(&r, &t)| (t - r).abs()).fold(0f32, f32::max);
        let own_differing = reference.iter().zip(&own).filter(|(r, t)| r != t).count();
        let (mut signal, mut noise, mut max_abs_err, mut differing) = (0f64, 0f64, 0f32, 0);
        for (&r, &t) in reference.iter().zip(&test) {
            let e = (t - r).abs();
            signal += f64::from(r) * f64::from(r);
            noise += f64::from(e) * f64::from(e);
            max_abs_err = max_abs_err.max(e);
            differing += usize::from(e > 0.0);
        }
        rows.push(OpDivergence {
            node: node.name.clone(),
            op: format!("{:?}", node.op_type),
            tensor: name.clone(),
            sqnr_db: 10.0 * (signal / noise).log10(),
            max_abs_err,
            max_steps: if step > 0.0 { max_abs_err / step } else { 0.0 },
            own_steps: if step > 0.0 { own_err / step } else { 0.0 },
            differing,
            own_differing,
            elements: test.len(),
        });
    }
    Ok(rows)
}

/// The rows as a table, one line per node.
pub fn table(rows: &[OpDivergence]) -> String {
    let mut s = format!(
        "{:<60} {:<20} {:>9} {:>11} {:>9} {:>9} {:>10} {:>9}\n",
        "node", "op", "SQNR dB", "max |err|", "steps", "differ", "own differ", "own steps"
    );
    for r in rows {
        let _ = writeln!(
            s,
            "{:<60} {:<20} {:>9.2} {:>11.4e} {:>9.1} {:>8.1}% {:>9.3}% {:>9.1}",
            r.node,
            r.op,
            r.sqnr_db,
            r.max_abs_err,
            r.max_steps,
            100.0 * r.differing as f64 / r.elements.max(1) as f64,
            100.0 * r.own_differing as f64 / r.elements.max(1) as f64,
            r.own_steps
        );
    }
    s
}

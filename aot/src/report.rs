//! What a compile did ([`AotReport`]): the accuracy ledger, the graphs, the files written and
//! the wall times, as `report.json` and as the short summary the example prints.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Instant;

use crate::ledger::LedgerEntry;
use backend_qnn::cost::{cost_json, Calibration, GraphCost, HtpPerf, MLLM_QWEN3_1_7B_SM8650};

/// Size and content of one lowered graph.
#[derive(Clone, Debug, PartialEq)]
pub struct GraphReport {
    pub name: String,
    pub ops: BTreeMap<String, usize>,
    pub tensors: usize,
    pub static_bytes: u64,
    /// What one call costs on the phone ([`backend_qnn::cost`]).
    pub cost: GraphCost,
}

/// Wall time of each step, in seconds.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Timings {
    pub load: f64,
    /// Folding the rotation into a float copy of the checkpoint (0 without `--rotation`).
    pub rotate: f64,
    /// The weight method's pass over the calibration sequences collecting linear-input statistics
    /// (GPTQ's Hessians and their factorization; 0 for round-to-nearest). The same float run
    /// records the logits and layer outputs `evaluate` compares the fake-quant run with.
    pub input_stats: f64,
    /// Measuring each linear's sensitivity for `--weight-budget` (0 without one).
    pub sensitivity: f64,
    /// The observers' pass over the calibration sequences.
    pub calibrate: f64,
    /// The weights rounded by the weight method (in parallel over the linears) and the quantized
    /// checkpoint written.
    pub quantize: f64,
    /// Accuracy of the quantized checkpoint against float (`fakequant_vs_float`, `float_vs_reference`).
    /// After a calibration it runs on its own thread beside trace, passes, lower, the context
    /// binaries and validate, so the steps' wall times add up to more than `total`.
    pub evaluate: f64,
    pub trace: f64,
    pub passes: f64,
    pub lower: f64,
    pub validate: f64,
    /// Qualcomm's prepare + finalize + serialize of `qnn/context.bin` (0 when not built).
    pub context_binary: f64,
    /// The same for `qnn/context.x86.bin` (no weight sharing, for the x86 emulation).
    pub context_binary_x86: f64,
    pub total: f64,
    /// CPU seconds of the whole run, every thread of this process (user + system): on a shared
    /// machine the wall times grow with the load, this does not.
    pub total_cpu: f64,
}

/// One timed step of a run: a field of [`Timings`] and its key in `report.json`'s `timings_s`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    Load,
    Rotate,
    InputStats,
    Sensitivity,
    Calibrate,
    Quantize,
    Evaluate,
    Trace,
    Passes,
    Lower,
    Validate,
    ContextBinary,
    ContextBinaryX86,
}

impl Step {
    /// Every step, in `report.json`'s order.
    pub const ALL: [Step; 13] = [
        Step::Load,
        Step::Rotate,
        Step::InputStats,
        Step::Sensitivity,
        Step::Calibrate,
        Step::Quantize,
        Step::Evaluate,
        Step::Trace,
        Step::Passes,
        Step::Lower,
        Step::Validate,
        Step::ContextBinary,
        Step::ContextBinaryX86,
    ];

    /// The step's key in `report.json`'s `timings_s`.
    pub fn key(self) -> &'static str {
        match self {
            Step::Load => "load",
            Step::Rotate => "rotate",
            Step::InputStats => "input_stats",
            Step::Sensitivity => "sensitivity",
            Step::Calibrate => "calibrate",
            Step::Quantize => "quantize",
            Step::Evaluate => "evaluate",
            Step::Trace => "trace",
            Step::Passes => "passes",
            Step::Lower => "lower",
            Step::Validate => "validate",
            Step::ContextBinary => "context_binary",
            Step::ContextBinaryX86 => "context_binary_x86",
        }
    }
}

impl Timings {
    /// The seconds recorded for `step`.
    pub fn get(&self, step: Step) -> f64 {
        *self.field(step)
    }

    fn field(&self, step: Step) -> &f64 {
        match step {
            Step::Load => &self.load,
            Step::Rotate => &self.rotate,
            Step::InputStats => &self.input_stats,
            Step::Sensitivity => &self.sensitivity,
            Step::Calibrate => &self.calibrate,
            Step::Quantize => &self.quantize,
            Step::Evaluate => &self.evaluate,
            Step::Trace => &self.trace,
            Step::Passes => &self.passes,
            Step::Lower => &self.lower,
            Step::Validate => &self.validate,
            Step::ContextBinary => &self.context_binary,
            Step::ContextBinaryX86 => &self.context_binary_x86,
        }
    }

    fn field_mut(&mut self, step: Step) -> &mut f64 {
        match step {
            Step::Load => &mut self.load,
            Step::Rotate => &mut self.rotate,
            Step::InputStats => &mut self.input_stats,
            Step::Sensitivity => &mut self.sensitivity,
            Step::Calibrate => &mut self.calibrate,
            Step::Quantize => &mut self.quantize,
            Step::Evaluate => &mut self.evaluate,
            Step::Trace => &mut self.trace,
            Step::Passes => &mut self.passes,
            Step::Lower => &mut self.lower,
            Step::Validate => &mut self.validate,
            Step::ContextBinary => &mut self.context_binary,
            Step::ContextBinaryX86 => &mut self.context_binary_x86,
        }
    }
}

/// The wall clock of a run: each step's time added into [`Timings`] ([`Stopwatch::stage`]), and
/// the whole run's wall and CPU time ([`Stopwatch::finish`]).
pub struct Stopwatch {
    timings: Timings,
    start: Instant,
    /// Process CPU seconds at the start, where /proc is readable (0 elsewhere: informative only).
    cpu_at_start: f64,
}

impl Default for Stopwatch {
    fn default() -> Self {
        Stopwatch::start()
    }
}

impl Stopwatch {
    pub fn start() -> Stopwatch {
        let cpu_at_start = mllm_dsl::memory::cpu_seconds().unwrap_or(0.0);
        Stopwatch { timings: Timings::default(), start: Instant::now(), cpu_at_start }
    }

    /// Runs `f`, adding its wall time to `step`.
    pub fn stage<T>(&mut self, step: Step, f: impl FnOnce() -> T) -> T {
        let t = Instant::now();
        let out = f();
        self.add(step, t.elapsed().as_secs_f64());
        out
    }

    /// Adds `seconds` measured elsewhere (inside a step, or on another thread) to `step`.
    pub fn add(&mut self, step: Step, seconds: f64) {
        *self.timings.field_mut(step) += seconds;
    }

    /// The steps so far.
    pub fn timings(&self) -> &Timings {
        &self.timings
    }

    /// The steps' times with the run's `total` and `total_cpu`.
    pub fn finish(self) -> Timings {
        let mut timings = self.timings;
        timings.total = self.start.elapsed().as_secs_f64();
        timings.total_cpu = mllm_dsl::memory::cpu_seconds().map_or(0.0, |now| now - self.cpu_at_start);
        timings
    }
}

/// What [`run`] did; `report.json` is [`AotReport::to_json`].
#[derive(Clone, Debug, PartialEq)]
pub struct AotReport {
    pub model: String,
    pub ledger: Vec<LedgerEntry>,
    pub timings: Timings,
    pub graphs: Vec<GraphReport>,
    /// Which runtime runs each artifact, and why not ([`crate::deploy`]).
    pub deploy: Vec<crate::deploy::ArtifactRuntimes>,
    /// Static bytes of all graphs with each shared weight counted once (what one weight-sharing
    /// context holds), and counted in every graph that reads it.
    pub shared_static_bytes: u64,
    pub unshared_static_bytes: u64,
    /// Files written, relative to the output directory, sorted.
    pub artifacts: Vec<String>,
    pub warnings: Vec<String>,
    /// How the decoder layers were cut into context binaries, and why (`--shards`).
    pub shards: Vec<String>,
}

impl AotReport {
    /// `report.json`'s content. Each ledger row's `sqnr_db` is a number, `"identical"` (no
    /// difference at all) or `"non-finite"` (a NaN or infinity in the compared logits) ([`backend_cpu::quant::Sqnr`]).
    pub fn to_json(&self) -> serde_json::Value {
        let ledger: Vec<_> = self
            .ledger
            .iter()
            .map(|e| {
                let mut row = serde_json::json!({
                    "stage": e.stage,
                    "sqnr_db": e.comparison.sqnr().to_json(),
                    "top1_agreement": e.comparison.top1_agreement,
                    "max_abs_err": e.comparison.max_abs_error,
                    "rows": e.comparison.rows,
                    "detail": e.detail,
                });
                if let Some(g) = &e.graph {
                    row["graph"] = serde_json::json!(g);
                }
                row
            })
            .collect();
        let t = &self.timings;
        let round = |x: f64| (x * 1e3).round() / 1e3;
        let mut timings = serde_json::Map::new();
        for step in Step::ALL {
            timings.insert(step.key().into(), round(t.get(step)).into());
        }
        timings.insert("total".into(), round(t.total).into());
        timings.insert("total_cpu".into(), round(t.total_cpu).into());
        let targets = HtpPerf::table();
        serde_json::json!({
            "model": self.model,
            "ledger": ledger,
            "timings_s": timings,
            "graphs": self.graphs.iter().map(|g| serde_json::json!({
                "name": g.name, "ops": g.ops, "tensors": g.tensors, "static_bytes": g.static_bytes,
                "cost": cost_json(&g.cost, &targets),
            })).collect::<Vec<_>>(),
            "deploy": crate::deploy::to_json(&self.deploy),
            "static_bytes": { "shared": self.shared_static_bytes, "unshared": self.unshared_static_bytes },
            "cost_model": cost_model_json(&targets),
            "artifacts": self.artifacts,
            "warnings": self.warnings,
            "shards": self.shards,
        })
    }

    /// The short human summary the example prints (the same content as `report.json`).
    pub fn summary(&self) -> String {
        let mut s = format!("model: {}\n\naccuracy ledger (test vs reference, logits):\n", self.model);
        let _ = writeln!(s, "  {:<20} {:<12} {:>9} {:>7} {:>11}", "stage", "graph", "SQNR dB", "top-1", "max |err|");
        for e in &self.ledger {
            let _ = writeln!(
                s,
                "  {:<20} {:<12} {:>9} {:>6.1}% {:>11.3e}",
                e.stage,
                e.graph.as_deref().unwrap_or("-"),
                e.comparison.sqnr(),
                e.comparison.top1_agreement * 100.0,
                e.comparison.max_abs_error
            );
        }
        s.push_str("\ngraphs:\n");
        for g in &self.graphs {
            let ops: Vec<String> = g.ops.iter().map(|(k, v)| format!("{k} {v}")).collect();
            let _ = writeln!(
                s,
                "  {}: {} tensors, {} static bytes; ops: {}",
                g.name,
                g.tensors,
                g.static_bytes,
                ops.join(", ")
            );
        }
        s.push_str("\nwhere the artifacts run (this project's runtime `mllm-dsl`, mllm's QnnAOTRuntime `mllm`):\n");
        s.push_str(&crate::deploy::summary_lines(&self.deploy));
        let _ = writeln!(
            s,
            "  static data: {} bytes with shared weights counted once ({} if every graph kept its own)",
            self.shared_static_bytes, self.unshared_static_bytes
        );
        s.push_str(&cost_table(&self.graphs));
        let t = &self.timings;
        let _ = writeln!(
            s,
            "\ntimings (s): load {:.2}, rotate {:.2}, input stats {:.2}, sensitivity {:.2}, calibrate {:.2}, quantize {:.2}, \
             evaluate {:.2}, \
             trace {:.2}, passes {:.2}, lower {:.2}, validate {:.2}, context binary {:.2} (x86 {:.2}), total {:.2} \
             (CPU {:.2})",
            t.load,
            t.rotate,
            t.input_stats,
            t.sensitivity,
            t.calibrate,
            t.quantize,
            t.evaluate,
            t.trace,
            t.passes,
            t.lower,
            t.validate,
            t.context_binary,
            t.context_binary_x86,
            t.total,
            t.total_cpu
        );
        for line in &self.shards {
            let _ = writeln!(s, "shards: {line}");
        }
        let _ = writeln!(s, "{} files written", self.artifacts.len());
        for w in &self.warnings {
            let _ = writeln!(s, "warning: {w}");
        }
        s
    }
}

/// The modelled cost of every graph on every target, one line each, and how the model compares
/// with mllm's measurement.
pub fn cost_table(graphs: &[GraphReport]) -> String {
    let mut s = String::from("\nmodelled cost per call (roofline over the lowered graphs; docs/graph-families.md):\n");
    let targets = HtpPerf::table();
    let _ = writeln!(
        s,
        "  {:<22} {:>6} {:>7} {:>10} {:>10} {:>9} {:>9}  per target: ms/call, tok/s (bound)",
        "graph", "chunk", "context", "MACs", "weights B", "KV read B", "KV wr B"
    );
    for g in graphs {
        let c = &g.cost;
        let _ = write!(
            s,
            "  {:<22} {:>6} {:>7} {:>10.3e} {:>10} {:>9} {:>9} ",
            g.name,
            c.chunk,
            c.context_len,
            c.macs() as f64,
            c.weight_bytes,
            c.kv_read_bytes,
            c.kv_written_bytes
        );
        for t in &targets {
            let call = t.call(c);
            let what = if c.chunk == 1 { "decode" } else { "prefill" };
            let _ = write!(
                s,
                " {} {:.3} ms, {what} {:.1} tok/s ({});",
                t.soc,
                call.total_s() * 1e3,
                t.tokens_per_s(c),
                call.bound()
            );
        }
        s.push('\n');
    }
    let c = Calibration::mllm_qwen3_1_7b_sm8650();
    let _ = writeln!(
        s,
        "  model vs mllm's Qwen3-1.7B on SM8650 (chunk 32, context 1024): prefill {:.0} vs {:.0} tok/s ({:.2}x), \
         decode {:.1} vs {:.1} tok/s ({:.2}x)",
        c.prefill_tok_s.0,
        MLLM_QWEN3_1_7B_SM8650.0,
        c.prefill_tok_s.2,
        c.decode_tok_s.0,
        MLLM_QWEN3_1_7B_SM8650.1,
        c.decode_tok_s.2
    );
    s
}

/// The target table and the calibration, for `report.json`.
fn cost_model_json(targets: &[HtpPerf]) -> serde_json::Value {
    let c = Calibration::mllm_qwen3_1_7b_sm8650();
    serde_json::json!({
        "model": "overhead + max(2 MACs / (peak ops x compute efficiency), DRAM bytes / (peak bandwidth x bandwidth efficiency))",
        "targets": targets.iter().map(|t| serde_json::json!({
            "soc": t.soc,
            "htp_arch": format!("v{}", t.htp_arch),
            "dram_gb_s": t.dram_bytes_per_s / 1e9,
            "int8_tops": t.int8_ops_per_s / 1e12,
            "int16_tops": t.int16_ops_per_s / 1e12,
            "call_overhead_ms": t.call_overhead_s * 1e3,
            "bandwidth_efficiency": t.efficiency.bandwidth,
            "compute_efficiency": t.efficiency.compute,
            "sources": t.sources,
        })).collect::<Vec<_>>(),
        "vs_mllm_qwen3_1_7b_sm8650": {
            "prefill_tok_s": { "modelled": c.prefill_tok_s.0, "measured": c.prefill_tok_s.1, "ratio": c.prefill_tok_s.2 },
            "decode_tok_s": { "modelled": c.decode_tok_s.0, "measured": c.decode_tok_s.1, "ratio": c.decode_tok_s.2 },
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use backend_cpu::quant::accuracy::Comparison;

    fn entry(stage: &'static str, reference: &[f32], test: &[f32]) -> LedgerEntry {
        let comparison = Comparison::new("logits", reference, test, 2).unwrap();
        LedgerEntry { stage, graph: Some("model.0.s1".into()), detail: String::new(), comparison }
    }

    /// "identical" and "non-finite" are distinct values in report.json and in the printed ledger,
    /// and a non-finite row is never a number (nor the `null` of a missing one).
    #[test]
    fn identical_and_non_finite_rows_say_so() {
        let r = [1.0, 2.0, 3.0, 4.0];
        let report = AotReport {
            model: "m".into(),
            ledger: vec![
                entry("passes_vs_eager", &r, &r),
                entry("qnn_vs_fakequant", &r, &[1.0, f32::NAN, 3.0, 4.0]),
                entry("htp_vs_fakequant", &r, &[1.0, 2.0, 3.0, 4.5]),
            ],
            timings: Timings::default(),
            graphs: vec![],
            artifacts: vec![],
            warnings: vec![],
            deploy: vec![],
            shared_static_bytes: 0,
            unshared_static_bytes: 0,
            shards: vec![],
        };
        let json = report.to_json();
        let sqnr: Vec<_> = json["ledger"].as_array().unwrap().iter().map(|row| row["sqnr_db"].clone()).collect();
        assert_eq!(sqnr[0], "identical");
        assert_eq!(sqnr[1], "non-finite");
        assert!(sqnr[2].as_f64().unwrap() > 20.0, "{}", sqnr[2]);
        let summary = report.summary();
        let line = |stage: &str| summary.lines().find(|l| l.contains(stage)).unwrap().to_string();
        assert!(line("passes_vs_eager").contains("identical"), "{summary}");
        assert!(line("qnn_vs_fakequant").contains("non-finite"), "{summary}");
    }
}

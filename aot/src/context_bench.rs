//! The QNN compile bench: a Qwen3-1.7B-shaped checkpoint (random weights, [`crate::synthetic`])
//! compiled into a real HTP context binary, with the wall time and peak resident memory of every
//! step: trace, passes, lower, validate, the HTP options, then the backend's own
//! phases (adding nodes, finalize, serialize) and writing the binary.
//!
//! ```no_run
//! let opts = aot::context_bench::BenchOptions::new("target/bench-context", 28);
//! let bench = aot::context_bench::run(&opts)?;
//! print!("{}", bench.summary());
//! # Ok::<(), aot::AotError>(())
//! ```
//!
//! Peak RSS per step is `VmHWM`, reset before each step ([`mllm_dsl::memory`]); the RSS at each
//! step's end shows what it leaves held. The lowering's weight cache and the checkpoint mapping
//! are dropped before the backend starts, and the lowered graphs are handed to
//! [`backend_qnn::sdk::build_context_binary_owned`], which frees the static bytes as soon as the
//! backend has copied them: from the backend's finalize on, the process holds no weights of
//! ours. `--no-weight-sharing` and `--optimization-level` measure two backend-side levers. The setup
//! ([`prepare_checkpoint`]: writing the float checkpoint, calibrating and quantizing it once,
//! cached in the work directory) is not measured: the bench starts from the quantized checkpoint
//! as `qwen3_aot --quantized` does.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::error::{ensure, Context, Result};
use backend_qnn::sdk;
use backend_qnn::target::HtpTarget;
use backend_qnn::{validate, LowerOptions, QnnGraph, QnnLowering};
use checkpoint::{write_safetensors_atomic, SafetensorsCheckpoint, StDtype};
use compiler::passes::Pipeline;
use mllm_dsl::files::write_atomic_bytes;
use mllm_dsl::memory::{cpu_seconds, peak_rss_bytes, reset_peak_rss, rss_bytes};
use mllm_dsl::ParamFormat;
use models::hf::HfConfig;

use crate::calibrate::{quantize, QuantizeOptions};
use crate::config::load_aot_config;
use crate::load::rope_positions;
use crate::synthetic::{write_qwen3, Qwen3Shape, QWEN3_1_7B};
use crate::trace::trace_graph;

/// What to compile.
#[derive(Clone, Debug)]
pub struct BenchOptions {
    /// The model's shapes (Qwen3-1.7B by default).
    pub shape: Qwen3Shape,
    /// Work directory: the synthetic float and quantized checkpoints (kept for the next run) and
    /// the context binary.
    pub dir: PathBuf,
    /// Decoder layers (Qwen3-1.7B has 28).
    pub layers: usize,
    /// One graph per chunk size.
    pub chunks: Vec<usize>,
    /// Context length of the graphs.
    pub context: usize,
    /// One weight-sharing context (what `qwen3_aot` ships); `false` builds the unshared binary
    /// the x86 emulation loads.
    pub weight_sharing: bool,
    /// The graphs' `FINALIZE_OPTIMIZATION_FLAG` when not the default (mllm's O=3): a
    /// backend-side lever whose cost in time and memory the bench measures.
    pub optimization_level: Option<u32>,
}

impl BenchOptions {
    /// Chunks 32 and 1, context 1024, as `qwen3_aot` compiles.
    pub fn new(dir: impl Into<PathBuf>, layers: usize) -> BenchOptions {
        BenchOptions {
            shape: QWEN3_1_7B,
            dir: dir.into(),
            layers,
            chunks: vec![32, 1],
            context: 1024,
            weight_sharing: true,
            optimization_level: None,
        }
    }
}

/// One measured step.
#[derive(Clone, Debug, PartialEq)]
pub struct Step {
    pub name: &'static str,
    /// This project's code (as opposed to Qualcomm's backend).
    pub ours: bool,
    pub seconds: f64,
    /// CPU seconds of all threads (user + system; `None` where `/proc` cannot tell): on a loaded
    /// machine a steadier figure than `seconds`.
    pub cpu_seconds: Option<f64>,
    /// Peak resident set during the step, in bytes (`None` where `/proc` cannot tell).
    pub peak_rss: Option<u64>,
    /// Resident set when the step ended (its last occurrence): what the step leaves held.
    pub rss_after: Option<u64>,
}

/// The bench's figures.
#[derive(Clone, Debug)]
pub struct ContextBench {
    pub layers: usize,
    pub steps: Vec<Step>,
    /// Bytes of the distinct STATIC tensors (weights and param tensors) of all graphs.
    pub static_weight_bytes: u64,
    pub binary_bytes: u64,
    pub binary_path: PathBuf,
    /// Whether each step's peak was measured on its own (`/proc/self/clear_refs` writable).
    pub peaks_reset: bool,
}

impl ContextBench {
    pub fn total_seconds(&self) -> f64 {
        self.steps.iter().map(|s| s.seconds).sum()
    }

    pub fn our_seconds(&self) -> f64 {
        self.steps.iter().filter(|s| s.ours).map(|s| s.seconds).sum()
    }

    /// Total and our CPU seconds, when every step has one.
    pub fn cpu_split(&self) -> Option<(f64, f64)> {
        let all: Option<Vec<(bool, f64)>> = self.steps.iter().map(|s| Some((s.ours, s.cpu_seconds?))).collect();
        let all = all?;
        Some((all.iter().map(|s| s.1).sum(), all.iter().filter(|s| s.0).map(|s| s.1).sum()))
    }

    /// The highest peak of any step.
    pub fn peak_rss(&self) -> Option<u64> {
        self.steps.iter().filter_map(|s| s.peak_rss).max()
    }

    /// The table and the two targets (our steps ≤ 10 % of the total, peak RSS ≤ 2× weights).
    pub fn summary(&self) -> String {
        let mb = |b: u64| b as f64 / 1e6;
        let mut out = format!(
            "{:<22} {:>5} {:>10} {:>10} {:>14} {:>14}\n",
            "step", "whose", "wall s", "CPU s", "peak RSS MB", "RSS after MB"
        );
        for s in &self.steps {
            let [peak, after] =
                [s.peak_rss, s.rss_after].map(|b| b.map_or("?".to_string(), |b| format!("{:.0}", mb(b))));
            let cpu = s.cpu_seconds.map_or("?".to_string(), |c| format!("{c:.2}"));
            let whose = if s.ours { "ours" } else { "QNN" };
            out += &format!("{:<22} {whose:>5} {:>10.2} {cpu:>10} {peak:>14} {after:>14}\n", s.name, s.seconds);
        }
        let share = |ours: f64, total: f64| 100.0 * ours / total.max(f64::MIN_POSITIVE);
        let (total, ours) = (self.total_seconds(), self.our_seconds());
        out += &format!(
            "total {total:.2} s wall; our steps {ours:.2} s = {:.1} % of the total (target <= 10 %)\n",
            share(ours, total)
        );
        if let Some((total, ours)) = self.cpu_split() {
            out += &format!("total {total:.2} CPU s; our steps {ours:.2} CPU s = {:.1} %\n", share(ours, total));
        }
        let weights = self.static_weight_bytes;
        match self.peak_rss() {
            Some(peak) => {
                out += &format!(
                    "peak RSS {:.0} MB = {:.2}x the static weight bytes ({:.0} MB) (target <= 2x){}\n",
                    mb(peak),
                    peak as f64 / weights as f64,
                    mb(weights),
                    if self.peaks_reset { "" } else { "; peaks NOT reset per step: they include the setup" }
                )
            }
            None => out += "peak RSS unavailable (no /proc/self/status)\n",
        }
        out += &format!("context binary: {} ({:.0} MB)\n", self.binary_path.display(), mb(self.binary_bytes));
        out
    }
}

/// Wall time, CPU time and peak RSS of consecutive steps.
struct Meter {
    steps: Vec<Step>,
    /// The open step, when it started and the process's CPU seconds then.
    open: Option<(usize, Instant, Option<f64>)>,
    peaks_reset: bool,
}

impl Meter {
    /// Ends the open step and starts `name` (steps of the same name add up).
    fn start(&mut self, name: &'static str, ours: bool) {
        self.stop();
        self.peaks_reset &= reset_peak_rss().is_ok();
        let index = match self.steps.iter().position(|s| s.name == name) {
            Some(i) => i,
            None => {
                self.steps.push(Step {
                    name,
                    ours,
                    seconds: 0.0,
                    cpu_seconds: Some(0.0),
                    peak_rss: None,
                    rss_after: None,
                });
                self.steps.len() - 1
            }
        };
        self.open = Some((index, Instant::now(), cpu_seconds().ok()));
    }

    fn stop(&mut self) {
        if let Some((i, started, cpu_start)) = self.open.take() {
            let step = &mut self.steps[i];
            step.seconds += started.elapsed().as_secs_f64();
            let cpu = cpu_start.zip(cpu_seconds().ok()).map(|(start, end)| end - start);
            step.cpu_seconds = step.cpu_seconds.zip(cpu).map(|(sum, c)| sum + c);
            step.peak_rss = step.peak_rss.max(peak_rss_bytes().ok());
            step.rss_after = rss_bytes().ok();
        }
    }
}

/// Writes (once) the synthetic float checkpoint and its quantized form into `opts.dir`, then
/// compiles the quantized one into a context binary with Qualcomm's backend, measuring each step.
pub fn run(opts: &BenchOptions) -> Result<ContextBench> {
    let quantized = prepare_checkpoint(opts)?;
    let hf = HfConfig::from_dir(&quantized)?;
    let ckpt = SafetensorsCheckpoint::open(&quantized)?;
    let max_positions = rope_positions(&ckpt)?.context("the quantized checkpoint has no RoPE tables")?;
    let (aot, _) = load_aot_config(None, &hf)?;
    let target = HtpTarget::new(&aot.target_machine);
    // Qualcomm's HTP backend refuses 4-bit tensors: int4 codes travel in 8-bit containers.
    let mut lowering = QnnLowering::new(&ckpt, LowerOptions::qualcomm_htp());

    let mut meter = Meter { steps: Vec::new(), open: None, peaks_reset: true };
    let mut graphs: Vec<QnnGraph> = Vec::new();
    for &chunk in &opts.chunks {
        let name = compiler::passes::graph_name(chunk);
        meter.start("trace", true);
        let mut program = trace_graph(&hf, max_positions, chunk, opts.context, ParamFormat::QnnW4A16)?;
        meter.start("passes", true);
        Pipeline::qnn_aot(&aot, &ckpt).run(&mut program).with_context(|| format!("passes of `{name}`"))?;
        meter.start("lower", true);
        let mut lowered = lowering.lower_program(&program).with_context(|| format!("lowering `{name}`"))?;
        ensure!(lowered.len() == 1, "graph `{name}` lowered to {} QNN graphs", lowered.len());
        graphs.push(lowered.remove(0));
    }
    meter.start("validate", true);
    for g in &graphs {
        validate(g).with_context(|| format!("validating `{}`", g.name))?;
    }
    meter.start("HTP options", true);
    let mut options = target.htp_options(opts.weight_sharing && graphs.len() > 1)?;
    if let Some(level) = opts.optimization_level {
        options.graph.optimization_level = Some(level);
    }
    // The graphs become the only owners of the static bytes (the lowering's cache of shared
    // weights lets go), so the driver can free them before the backend finalizes; the
    // checkpoint's mapping goes too.
    drop(lowering);
    drop(ckpt);
    let static_weight_bytes = crate::shard_build::static_bytes(&graphs);
    let binary =
        sdk::build_context_binary_with_sdk_observed(graphs, &options, &mut |phase| meter.start(phase.name(), false))
            .context("building the context binary with Qualcomm's backend")?;
    meter.start("write binary", true);
    let binary_path = opts.dir.join("context.bin");
    write_atomic_bytes(&binary_path, &binary)?;
    meter.stop();
    Ok(ContextBench {
        layers: opts.layers,
        steps: meter.steps,
        static_weight_bytes,
        binary_bytes: binary.len() as u64,
        binary_path,
        peaks_reset: meter.peaks_reset,
    })
}

/// Decoder layers the synthetic float checkpoint is calibrated and quantized with; the quantized
/// checkpoint of more layers repeats their quantized tensors ([`expand_layers`]).
pub const CALIBRATED_LAYERS: usize = 2;

fn slug(shape: &Qwen3Shape) -> String {
    shape.name.to_ascii_lowercase()
}

/// Where the quantized synthetic checkpoint of `opts` lives.
fn quantized_dir(opts: &BenchOptions) -> PathBuf {
    opts.dir.join(format!("{}-{}l-w4a16", slug(&opts.shape), opts.layers))
}

/// Whether [`prepare_checkpoint`] has already made the checkpoint [`run`] compiles.
pub fn is_prepared(opts: &BenchOptions) -> bool {
    quantized_dir(opts).join("config.json").is_file()
}

/// The quantized checkpoint of the synthetic model with `opts.layers` layers, made on first use:
/// a float checkpoint of [`CALIBRATED_LAYERS`] layers calibrated on one short sequence and
/// quantized to W4A16, then its layers repeated up to `opts.layers` ([`expand_layers`]; a
/// Qwen3-8B-shaped float checkpoint would be 16 GB and its calibration more). Callers that want
/// [`run`]'s memory figures free of this setup run it in another process first.
pub fn prepare_checkpoint(opts: &BenchOptions) -> Result<PathBuf> {
    let quantized = quantized_dir(opts);
    if is_prepared(opts) {
        return Ok(quantized);
    }
    let base_layers = opts.layers.min(CALIBRATED_LAYERS);
    let name = slug(&opts.shape);
    let float = opts.dir.join(format!("{name}-{base_layers}l-bf16"));
    let base = opts.dir.join(format!("{name}-{base_layers}l-w4a16"));
    if !base.join("config.json").is_file() {
        if !float.join("config.json").is_file() {
            write_qwen3(&float, &opts.shape, base_layers)?;
        }
        let hf = HfConfig::from_dir(&float)?;
        // Any ids will do for random weights; 16 tokens keep the calibration short.
        let ids: Vec<i64> = (0..16).map(|i| (i * 7919 + 13) % hf.vocab_size as i64).collect();
        quantize(&QuantizeOptions { max_positions: opts.context, ..QuantizeOptions::new(&float, vec![ids], &base) })
            .with_context(|| format!("quantizing the synthetic checkpoint {}", float.display()))?;
    }
    if base_layers < opts.layers {
        expand_layers(&base, &quantized, opts.layers)?;
    }
    Ok(quantized)
}

/// Tensors of at least this many bytes are turned in each repeated layer ([`expand_layers`]).
const DISTINCT_COPY_BYTES: usize = 1 << 16;

/// A quantized checkpoint of `layers` layers from one of `n` fewer: layer `l < n` keeps its own
/// tensors and every later one gets those of layer `1 + (l - 1) mod (n - 1)` of `src` (weights,
/// scales and activation ranges alike), written as one safetensors file per layer plus one for
/// the rest, with an index; the other files are copied and `config.json`'s `num_hidden_layers`
/// set. Layer 0 is never repeated: its input is the embedding's output, so it has no
/// `input_layernorm_input_qdq` of its own, which every later layer needs. In each repeated layer
/// the elements of every tensor of [`DISTINCT_COPY_BYTES`] or more are rotated by an amount of
/// its own (same values, other places), so that no two layers hold identical weights.
pub fn expand_layers(src: &Path, dst: &Path, layers: usize) -> Result<()> {
    let ckpt = SafetensorsCheckpoint::open(src)?;
    let mut config: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(src.join("config.json"))?)?;
    let base = config["num_hidden_layers"].as_u64().context("config.json has no num_hidden_layers")? as usize;
    ensure!(
        base <= layers && (base >= 2 || layers == base),
        "{}: cannot expand {base} layers to {layers} (the repeated layers come from layers 1..{base})",
        src.display()
    );
    std::fs::create_dir_all(dst).with_context(|| format!("creating {}", dst.display()))?;
    let mut rest: Vec<(String, String)> = Vec::new();
    let mut by_layer: Vec<Vec<(String, String)>> = vec![Vec::new(); base];
    for key in ckpt.keys() {
        match models::keys::split_layer_key(key) {
            Some((l, tail)) => {
                ensure!(l < base, "{}: tensor `{key}` of layer {l} beyond num_hidden_layers {base}", src.display());
                by_layer[l].push((key.to_string(), tail.to_string()));
            }
            None => rest.push((key.to_string(), key.to_string())),
        }
    }
    let mut weight_map = serde_json::Map::new();
    // `copy` > 0 turns the elements of every large tensor (the weights) by a different amount:
    // a backend that stores identical constant data once must not see the repeated layers as one.
    let mut write = |file: String, list: Vec<(String, String)>, copy: usize| -> Result<()> {
        let mut data = Vec::with_capacity(list.len());
        for (src_key, dst_key) in &list {
            let (dtype, shape) = ckpt.info(src_key)?;
            let mut bytes = ckpt.read_bytes(src_key)?;
            let elements: usize = shape.iter().product();
            if copy > 0 && bytes.len() >= DISTINCT_COPY_BYTES && elements > 1 {
                let width = bytes.len() / elements;
                bytes.rotate_left((copy * 7919 % elements) * width);
            }
            data.push((dst_key.clone(), dtype, shape.to_vec(), bytes));
        }
        let views: Vec<(&str, StDtype, &[usize], &[u8])> =
            data.iter().map(|(k, d, s, b)| (k.as_str(), *d, s.as_slice(), b.as_slice())).collect();
        write_safetensors_atomic(dst.join(&file), &views, &BTreeMap::new())?;
        for (_, dst_key) in list {
            weight_map.insert(dst_key, serde_json::json!(file));
        }
        Ok(())
    };
    write("model-rest.safetensors".into(), rest, 0)?;
    for l in 0..layers {
        let from = if l < base { l } else { 1 + (l - 1) % (base - 1) };
        let list = by_layer[from].iter().map(|(k, tail)| (k.clone(), models::keys::layer_key(l, tail))).collect();
        write(format!("model-layer-{l:02}.safetensors"), list, if l < base { 0 } else { l })?;
    }
    let index = serde_json::json!({ "metadata": {}, "weight_map": weight_map });
    write_atomic_bytes(&dst.join("model.safetensors.index.json"), serde_json::to_string_pretty(&index)?.as_bytes())?;
    for entry in std::fs::read_dir(src)? {
        let path = entry?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if path.is_file()
            && !name.ends_with(".safetensors")
            && name != "model.safetensors.index.json"
            && name != "config.json"
        {
            write_atomic_bytes(&dst.join(name), &std::fs::read(&path)?)?;
        }
    }
    config["num_hidden_layers"] = serde_json::json!(layers);
    write_atomic_bytes(&dst.join("config.json"), serde_json::to_string_pretty(&config)?.as_bytes())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const BIG: usize = DISTINCT_COPY_BYTES / 4;

    /// The keys of a 2-layer checkpoint as the calibration writes them: layer 0's input QDQ point
    /// belongs to the embedding, layer 1 has its own.
    fn two_layer_checkpoint(dir: &Path) {
        let keys = [
            ("model.embed_tokens.weight", 1.0f32),
            ("model.layers.0.mlp.down_proj.weight", 2.0),
            ("model.layers.1.mlp.down_proj.weight", 3.0),
            ("model.layers.1.input_layernorm_input_qdq.fake_quant.scale", 4.0),
        ];
        let bytes: Vec<[u8; 4]> = keys.iter().map(|(_, v)| v.to_le_bytes()).collect();
        let mut views: Vec<(&str, StDtype, &[usize], &[u8])> =
            keys.iter().zip(&bytes).map(|((k, _), b)| (*k, StDtype::F32, &[1usize][..], &b[..])).collect();
        // A weight large enough to be turned in the repeated layers.
        let big: Vec<u8> = (0..BIG as u32).flat_map(|v| (v as f32).to_le_bytes()).collect();
        views.push(("model.layers.1.mlp.up_proj.weight", StDtype::F32, &[BIG], &big));
        std::fs::create_dir_all(dir).unwrap();
        write_safetensors_atomic(dir.join("model.safetensors"), &views, &BTreeMap::new()).unwrap();
        std::fs::write(dir.join("config.json"), r#"{"num_hidden_layers": 2}"#).unwrap();
    }

    #[test]
    fn expanded_layers_repeat_a_layer_that_has_its_own_input_point() {
        let tmp = tempfile::tempdir().unwrap();
        let (src, dst) = (tmp.path().join("2l"), tmp.path().join("5l"));
        two_layer_checkpoint(&src);
        expand_layers(&src, &dst, 5).unwrap();
        let ckpt = SafetensorsCheckpoint::open(&dst).unwrap();
        for l in 1..5 {
            let qdq = format!("model.layers.{l}.input_layernorm_input_qdq.fake_quant.scale");
            assert_eq!(ckpt.read_float_param(&qdq).unwrap(), [4.0], "{qdq}");
            let down = format!("model.layers.{l}.mlp.down_proj.weight");
            assert_eq!(ckpt.read_float_param(&down).unwrap(), [3.0], "{down}");
        }
        assert_eq!(ckpt.read_float_param("model.layers.0.mlp.down_proj.weight").unwrap(), [2.0]);
        // The large weight: the same values in every layer, in other places in each repeated one.
        let ups: Vec<Vec<f32>> =
            (1..5).map(|l| ckpt.read_float_param(&format!("model.layers.{l}.mlp.up_proj.weight")).unwrap()).collect();
        assert_eq!(ups[0], (0..BIG).map(|v| v as f32).collect::<Vec<_>>());
        for (i, a) in ups.iter().enumerate() {
            let mut sorted = a.clone();
            sorted.sort_by(f32::total_cmp);
            assert_eq!(sorted, ups[0], "layer {}", i + 1);
            assert!(ups[i + 1..].iter().all(|b| a != b), "layer {} repeats another", i + 1);
        }
        assert!(!ckpt.contains("model.layers.0.input_layernorm_input_qdq.fake_quant.scale"));
        let config: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dst.join("config.json")).unwrap()).unwrap();
        assert_eq!(config["num_hidden_layers"], 5);
    }

    #[test]
    fn one_layer_cannot_be_expanded() {
        let tmp = tempfile::tempdir().unwrap();
        let src = tmp.path().join("1l");
        std::fs::create_dir_all(&src).unwrap();
        let b = 1f32.to_le_bytes();
        let views: Vec<(&str, StDtype, &[usize], &[u8])> = vec![("model.layers.0.w", StDtype::F32, &[1], &b)];
        write_safetensors_atomic(src.join("model.safetensors"), &views, &BTreeMap::new()).unwrap();
        std::fs::write(src.join("config.json"), r#"{"num_hidden_layers": 1}"#).unwrap();
        let err = format!("{:#}", expand_layers(&src, &tmp.path().join("3l"), 3).unwrap_err());
        assert!(err.contains("cannot expand 1 layers to 3"), "{err}");
    }
}

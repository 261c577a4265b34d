//! Where a quantized checkpoint's loss is: the float model with one group of linears at a time
//! replaced by their deployed int4 weights (activations float), each scored on a text against
//! float by perplexity, mean KL and top-1 agreement ([`text_quality`](crate::text_quality)'s rows).
//!
//! ```no_run
//! use aot::loss_breakdown::{weight_loss_breakdown, BreakdownOptions};
//! # fn demo(ids: Vec<i64>) -> aot::Result<()> {
//! let rows = weight_loss_breakdown(&BreakdownOptions {
//!     model: "SmolLM2-135M-Instruct".into(),
//!     quantized: "smollm2-w4a16".into(),
//!     rotation: backend_cpu::quant::Rotation::None,
//!     ids,
//!     window: 256,
//!     progress: aot::progress::silent(),
//! })?;
//! print!("{}", rows.table());
//! # Ok(())
//! # }
//! ```
//!
//! Groups: every linear at once, each linear family (`q_proj` .. `down_proj`, `lm_head`) across all
//! layers, and each decoder layer's seven linears. A checkpoint quantized with a rotation is
//! compared against the float model rotated the same way (rebuilt into a temporary directory),
//! so only the rounding differs; the scores stay against the unrotated float model's predictions.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Instant;

use backend_cpu::quant::{rotate_checkpoint, QuantizedSubset, Rotation, TextEval};
use backend_cpu::{CheckpointStore, CpuBackend};
use checkpoint::SafetensorsCheckpoint;
use mllm_dsl::ir::SpecParams;
use mllm_dsl::module::ParamSource;
use models::hf::HfConfig;

use crate::error::{ensure, Context, Result};
use crate::load::build_model;
use crate::progress::Progress;
use crate::text_quality::TextQuality;

/// What [`weight_loss_breakdown`] compares.
#[derive(Clone)]
pub struct BreakdownOptions {
    /// HF float checkpoint directory (unrotated).
    pub model: PathBuf,
    /// A quantized checkpoint made from `model` (pymllm's format).
    pub quantized: PathBuf,
    /// The rotation `quantized` was made with.
    pub rotation: Rotation,
    /// The evaluation tokens.
    pub ids: Vec<i64>,
    /// Tokens per prefill window.
    pub window: usize,
    pub progress: std::sync::Arc<dyn Progress>,
}

/// A named set of linears (by op path).
struct Group {
    name: String,
    members: BTreeSet<String>,
}

/// The linear op paths of a quantized checkpoint (those with LPBQ `scale1`, and the int8 ones of
/// a mixed checkpoint: an int8 `weight` with a `scale` and no `zero_point`), grouped.
fn groups(quantized: &SafetensorsCheckpoint) -> Vec<Group> {
    let keys = quantized.keys();
    let int8 = |op: &str| {
        quantized.info(&SpecParams::weight_key(op)).is_ok_and(|(d, _)| d == checkpoint::StDtype::I8)
            && !quantized.contains(&SpecParams::zero_point_key(op))
    };
    let ops: Vec<String> = keys
        .iter()
        .filter_map(|k| SpecParams::lpbq_prefix_of(k).or_else(|| SpecParams::scale_prefix_of(k).filter(|op| int8(op))))
        .map(str::to_string)
        .collect();
    let family = |op: &str| op.rsplit('.').next().unwrap_or(op).to_string();
    let layer = |op: &str| models::keys::split_layer_key(op).map(|(l, _)| l);
    let mut out = vec![Group { name: "all linears".into(), members: ops.iter().cloned().collect() }];
    let families: BTreeSet<String> = ops.iter().map(|o| family(o)).collect();
    // The LM head's group comes last.
    let head = models::keys::LM_HEAD_MODULE;
    for f in families.iter().filter(|f| f.as_str() != head).chain(families.get(head)) {
        out.push(Group { name: f.clone(), members: ops.iter().filter(|o| family(o) == *f).cloned().collect() });
    }
    let layers: BTreeSet<usize> = ops.iter().filter_map(|o| layer(o)).collect();
    for l in layers {
        let members = ops.iter().filter(|o| layer(o) == Some(l)).cloned().collect();
        out.push(Group { name: format!("layer {l}"), members });
    }
    out
}

/// Scores every group (module docs): row 0 is float, then one row per group.
pub fn weight_loss_breakdown(opts: &BreakdownOptions) -> Result<TextQuality> {
    let hf = HfConfig::from_dir(&opts.model)?;
    let positions = opts.window.min(opts.ids.len()).max(2);
    let groups = {
        let ckpt = SafetensorsCheckpoint::open(&opts.quantized)?;
        ensure!(
            backend_cpu::quant::is_quantized_checkpoint(&ckpt),
            "{}: not a quantized checkpoint (no LPBQ scales or QDQ parameters)",
            opts.quantized.display()
        );
        groups(&ckpt)
    };
    let backend = CpuBackend::float();
    let n_windows = opts.ids.chunks(opts.window.max(1)).filter(|w| w.len() >= 2).count();
    let pb = opts.progress.start("loss breakdown", (1 + groups.len()) * n_windows);
    let tick = |_: usize, _: usize| pb.inc(1);

    // 1. The float reference.
    let t = Instant::now();
    let float_store = CheckpointStore::open(&opts.model, backend.clone(), hf.tie_word_embeddings)?;
    let eval = {
        let float = build_model(&hf, positions, &ParamSource::Store(&float_store), &opts.model)?;
        TextEval::new(float.as_ref(), &backend, None, &opts.ids, opts.window, &tick)
            .with_context(|| format!("float run of {}", opts.model.display()))?
    };
    let (mut rows, mut seconds) = (vec![eval.float().clone()], vec![t.elapsed().as_secs_f64()]);

    // 2. The float model the checkpoint was quantized from (rotated like it).
    let rotated = match opts.rotation {
        Rotation::None => None,
        _ => {
            let dir = tempfile::tempdir().context("creating a directory for the rotated float model")?;
            rotate_checkpoint(&opts.model, &hf, dir.path())
                .with_context(|| format!("rotating {} ({})", opts.model.display(), opts.rotation.name()))?;
            Some(dir)
        }
    };
    let source = rotated.as_ref().map_or(opts.model.clone(), |d| d.path().to_path_buf());
    let source_hf = HfConfig::from_dir(&source)?;
    let source_store = CheckpointStore::open(&source, backend.clone(), source_hf.tie_word_embeddings)?;
    let quant_store = CheckpointStore::open(&opts.quantized, backend.clone(), false)?;

    // 3. One group quantized at a time.
    for g in &groups {
        let t = Instant::now();
        pb.set_message(&g.name);
        let select = |op: &str| g.members.contains(op);
        let store = QuantizedSubset::new(&source_store, &quant_store, &select);
        let model = build_model(&source_hf, positions, &ParamSource::Store(&store), &opts.quantized)
            .with_context(|| format!("group `{}`", g.name))?;
        rows.push(eval.score(g.name.clone(), model.as_ref(), &backend, None, &tick).with_context(|| g.name.clone())?);
        seconds.push(t.elapsed().as_secs_f64());
    }
    pb.finish();
    Ok(TextQuality { rows, seconds, windows: eval.windows() })
}

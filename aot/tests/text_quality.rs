//! `perplexity`'s scoring against references made elsewhere.
//!
//! On the tiny fixture (fixtures/qwen3-dev-f32, logits from HF transformers): the float perplexity
//! `TextEval` measures on the CPU model equals the one HF's stored logits give, and a quantized
//! checkpoint (pymllm's export of the same model) scores against float with the KL and agreement
//! computed from pymllm's own fake-quant logits.

use std::path::{Path, PathBuf};

use aot::text_quality::{load_fake_quant, text_quality, RtnBaseline, TextQualityOptions};
use backend_cpu::quant::{score_logits, TextEval};
use backend_cpu::{CheckpointStore, CpuBackend};
use checkpoint::SafetensorsCheckpoint;
use mllm_dsl::module::ParamSource;
use models::hf::HfConfig;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures").join(name)
}

const VOCAB: usize = 128;

#[test]
fn float_perplexity_equals_hf_logits_perplexity() {
    let dir = fixture("qwen3-dev-f32");
    let r = SafetensorsCheckpoint::open_file(dir.join("reference_long.safetensors")).unwrap();
    let ids = r.read_i64("input_ids").unwrap();
    let hf_logits = r.read_f32("logits").unwrap();
    let (hf, _) = score_logits(&hf_logits, &hf_logits, &ids, VOCAB).unwrap();

    let cfg = HfConfig::from_dir(&dir).unwrap();
    let backend = CpuBackend::float();
    let store = CheckpointStore::open(&dir, backend.clone(), cfg.tie_word_embeddings).unwrap();
    let mut model = models::build(&cfg, 64).unwrap();
    model.bind_params(&ParamSource::Store(&store)).unwrap();
    let eval = TextEval::new(model.as_ref(), &backend, None, &ids, 64, &|_, _| {}).unwrap();
    eprintln!("float perplexity: ours {:.6}, HF {:.6}", eval.float_perplexity(), hf.perplexity);
    assert_eq!(eval.float().predictions, ids.len() - 1);
    assert!((eval.float_perplexity() / hf.perplexity - 1.0).abs() < 1e-5);
    // Random weights over 128 tokens: perplexity well above 1, not the vocabulary's uniform 128 exactly.
    assert!(eval.float_perplexity() > 2.0 && (eval.float_perplexity() - 128.0).abs() > 1.0);

    // Scoring the float model against itself: KL 0, full agreement.
    let own = eval.score("again", model.as_ref(), &backend, None, &|_, _| {}).unwrap();
    assert!(own.mean_kl.abs() < 1e-12 && own.top1_agreement == 1.0, "{own:?}");

    // Windows of 16: three prefills (16, 16, 8 tokens), 15 + 15 + 7 predictions.
    let windowed = TextEval::new(model.as_ref(), &backend, None, &ids, 16, &|_, _| {}).unwrap();
    assert_eq!((windowed.windows(), windowed.float().predictions), (3, 37));
    assert!(TextEval::new(model.as_ref(), &backend, None, &ids, 1, &|_, _| {}).is_err());
    assert!(TextEval::new(model.as_ref(), &backend, None, &[5, 128], 8, &|_, _| {}).is_err());
}

#[test]
fn fake_quant_scores_match_pymllms_fake_quant_logits() {
    // pymllm's export of qwen3-dev-f32, with its float and deployed-simulation logits.
    let qdir = fixture("pymllm-qwen3-dev-f32");
    let r = SafetensorsCheckpoint::open_file(qdir.join("reference.safetensors")).unwrap();
    let ids = r.read_i64("input_ids").unwrap();
    let (float_ref, deployed_ref) =
        score_logits(&r.read_f32("float_logits").unwrap(), &r.read_f32("deployedsim_logits").unwrap(), &ids, VOCAB)
            .unwrap();
    let q = text_quality(&TextQualityOptions {
        model: fixture("qwen3-dev-f32"),
        quantized: vec![("pymllm".into(), qdir.clone())],
        rtn: Some(RtnBaseline::default()),
        bf16_products: false,
        ids: ids.clone(),
        window: 64,
        progress: aot::progress::silent(),
    })
    .unwrap();
    eprintln!("{}", q.table());
    let (float, quant, rtn) = (&q.rows[0], &q.rows[1], &q.rows[2]);
    assert!((float.perplexity / float_ref.perplexity - 1.0).abs() < 1e-4, "{float:?} vs {float_ref:?}");
    assert!((quant.perplexity / deployed_ref.perplexity - 1.0).abs() < 1e-3, "{quant:?} vs {deployed_ref:?}");
    assert!((quant.mean_kl - deployed_ref.mean_kl).abs() < 1e-3 * deployed_ref.mean_kl.max(1e-3), "{quant:?}");
    assert_eq!(quant.top1_agreement, deployed_ref.top1_agreement);
    // RTN int4 on random weights loses something, and is a different model from float.
    assert!(rtn.mean_kl > 1e-4 && rtn.name.contains("RTN int4 block 16"), "{rtn:?}");
    assert_eq!(q.rows.len(), 3);
    let (_, _, rows) = load_fake_quant(&qdir).unwrap();
    assert_eq!(rows, 1024);
}

/// The loss breakdown on pymllm's export of the tiny model: one row per linear family and per
/// layer after float and all linears; each group scores its own members only (a group's row equals
/// float when it is empty of changes, so every row differs from float: pymllm's int4 moved every
/// weight), and the all-linears row is the worst by KL.
#[test]
fn loss_breakdown_scores_every_family_and_layer() {
    use aot::loss_breakdown::{weight_loss_breakdown, BreakdownOptions};
    let r = SafetensorsCheckpoint::open_file(fixture("qwen3-dev-f32").join("reference_long.safetensors")).unwrap();
    let ids = r.read_i64("input_ids").unwrap();
    let q = weight_loss_breakdown(&BreakdownOptions {
        model: fixture("qwen3-dev-f32"),
        quantized: fixture("pymllm-qwen3-dev-f32"),
        rotation: backend_cpu::quant::Rotation::None,
        ids: ids.clone(),
        window: ids.len(),
        progress: aot::progress::silent(),
    })
    .unwrap();
    eprintln!("{}", q.table());
    let names: Vec<&str> = q.rows.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "float",
            "all linears",
            "down_proj",
            "gate_proj",
            "k_proj",
            "o_proj",
            "q_proj",
            "up_proj",
            "v_proj",
            "lm_head",
            "layer 0",
            "layer 1"
        ]
    );
    assert_eq!((q.rows[0].mean_kl, q.rows[0].top1_agreement), (0.0, 1.0));
    for row in &q.rows[2..] {
        assert!(row.mean_kl > 0.0 && row.mean_kl < q.rows[1].mean_kl, "{row:?} vs all {:?}", q.rows[1]);
    }
    // A checkpoint that is not quantized is refused by name.
    let err = weight_loss_breakdown(&BreakdownOptions {
        model: fixture("qwen3-dev-f32"),
        quantized: fixture("qwen3-dev-f32"),
        rotation: backend_cpu::quant::Rotation::None,
        ids,
        window: 16,
        progress: aot::progress::silent(),
    })
    .unwrap_err();
    assert!(format!("{err:#}").contains("not a quantized checkpoint"), "{err:#}");
}

/// `perplexity --bf16-products` scores the float model with each linear's input rounded to bf16:
/// on the bf16 fixture its row equals the score of the NumPy forward that rounds the same way
/// (make_fixtures.py `bf16-products`) against the float forward's logits.
#[test]
fn bf16_products_row_scores_the_rounded_reference() {
    let dir = fixture("qwen3-dev-bf16");
    let float_ref = SafetensorsCheckpoint::open_file(dir.join("reference.safetensors")).unwrap();
    let rounded_ref = SafetensorsCheckpoint::open_file(dir.join("reference_bf16_products.safetensors")).unwrap();
    let ids = float_ref.read_i64("input_ids").unwrap();
    assert_eq!(ids, rounded_ref.read_i64("input_ids").unwrap());
    let (float_want, rounded_want) =
        score_logits(&float_ref.read_f32("logits").unwrap(), &rounded_ref.read_f32("logits").unwrap(), &ids, 160)
            .unwrap();
    let q = text_quality(&TextQualityOptions {
        model: dir,
        quantized: Vec::new(),
        rtn: None,
        bf16_products: true,
        ids: ids.clone(),
        window: ids.len(),
        progress: aot::progress::silent(),
    })
    .unwrap();
    eprintln!("{}", q.table());
    eprintln!("want: float {float_want:?}\n      rounded {rounded_want:?}");
    assert_eq!(q.rows.len(), 2);
    let (float, rounded) = (&q.rows[0], &q.rows[1]);
    assert_eq!(rounded.name, "float, bf16 products");
    // The rounding must show (a no-op mode would score KL 0), and score as the reference does.
    assert!(rounded_want.mean_kl > 1e-9, "{rounded_want:?}");
    assert!((float.perplexity / float_want.perplexity - 1.0).abs() < 1e-4, "{float:?} vs {float_want:?}");
    assert!((rounded.perplexity / rounded_want.perplexity - 1.0).abs() < 1e-4, "{rounded:?} vs {rounded_want:?}");
    assert!((rounded.mean_kl - rounded_want.mean_kl).abs() < 0.05 * rounded_want.mean_kl, "{rounded:?}");
    assert_eq!(rounded.top1_agreement, rounded_want.top1_agreement);
}

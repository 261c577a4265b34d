//! The main job's stages as a library user calls them ([`aot::stages`]): one at a time, stopping
//! before the context binaries, and one stage alone on an input the caller built.

use std::path::PathBuf;

use aot::stages::{self, GraphIr, OutputDir, Passed, Quantized, Traced};
use aot::{AotOptions, ContextBinary, GraphFamily, GraphNaming, Step, Stopwatch};
use mllm_dsl::ParamFormat;
use models::hf::HfConfig;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fixtures").join(name)
}

/// The embedded model through load, quantize, trace, passes and lower, each stage's output
/// inspected, and nothing after: no QNN artifacts, no context binary, no report.
#[test]
fn the_embedded_model_stage_by_stage_up_to_the_lowered_graphs() {
    let dir = tempfile::tempdir().unwrap();
    let mut opts = AotOptions::embedded(dir.path());
    (opts.chunks, opts.context_lens, opts.context_binary) = (vec![8, 1], vec![64], ContextBinary::Off);
    let mut out = OutputDir::new(dir.path());
    let mut clock = Stopwatch::start();
    let progress = aot::progress::Silent;

    let plan = stages::preflight(&opts).unwrap();
    assert!(plan.qualcomm.is_none());
    let loaded = clock.stage(Step::Load, || stages::load(&opts, plan, &mut out)).unwrap();
    assert_eq!(loaded.model_name, "embedded:qwen3-dev-f32");
    assert!(loaded.model_dir.join("config.json").is_file());
    assert!(loaded.calibration.is_some());

    let mut model = stages::quantize(&opts, &loaded, &mut out, &mut clock).unwrap();
    assert_eq!(model.dir, dir.path().join("quantized"));
    assert!(model.evaluation.is_some(), "a calibration leaves its accuracy report pending");
    assert_eq!(model.max_positions, opts.max_positions);

    let traced = stages::trace(&model.hf, model.max_positions, &loaded.family, &progress).unwrap();
    let names: Vec<&str> = traced.graphs.iter().map(|g| g.name.as_str()).collect();
    assert_eq!(names, ["model.0.s8", "model.0.s1"]);
    let ir = dir.path().join("ir");
    let passed = stages::passes(traced.clone(), &loaded.aot, &model.checkpoint, Some(&ir), &progress).unwrap();
    assert!(!passed.ir_dumps.is_empty() && passed.ir_dumps.iter().all(|p| p.starts_with(&ir) && p.is_file()));
    assert_ne!(passed.graphs[0].program, traced.graphs[0].program, "the passes rewrite the IR");
    let lowered = stages::lower(passed, &model.checkpoint, &progress).unwrap();
    assert_eq!(lowered.graphs.len(), 2);
    for (g, spec) in lowered.graphs.iter().zip(loaded.family.members()) {
        assert_eq!(g.graph.name, g.name);
        assert_eq!(g.spec, spec);
        assert!(!g.graph.nodes.is_empty());
        assert_eq!(g.graph.outputs[0], "logits", "{}", g.name);
    }

    // Stopped here: the quantized checkpoint is complete once its accuracy report is in.
    let evaluated = stages::evaluated(&mut model, &mut out, &mut clock).unwrap();
    assert_eq!(evaluated.ledger.as_ref().unwrap().stage, "fakequant_vs_float");
    assert!(dir.path().join("quantized/report.json").is_file());
    assert!(!dir.path().join("qnn").exists() && !dir.path().join("report.json").exists());
    let timings = clock.finish();
    assert!(timings.calibrate > 0.0 && timings.evaluate > 0.0, "{timings:?}");
    let written = out.relative().unwrap();
    assert!(written.contains(&"quantized/model.safetensors".to_string()), "{written:?}");
}

/// `lower` alone on the final IR of graphs the caller traced and passed itself, from a quantized
/// checkpoint given as it is: the same QNN graphs as the library's own [`aot::lower_family`].
#[test]
fn lower_runs_alone_on_an_input_the_caller_built() {
    let dir = fixture("pymllm-qwen3-dev-f32");
    let hf = HfConfig::from_dir(&dir).unwrap();
    let model = Quantized::open(&dir, &hf).unwrap();
    assert!(model.evaluation.is_none() && model.ledger.is_empty());
    let family = GraphFamily::new(&[4, 1], &[16], GraphNaming::Mllm).unwrap();
    let graphs = (family.members().into_iter())
        .map(|spec| GraphIr {
            name: family.name(spec, 0, 1),
            spec,
            program: aot::trace_graph(&hf, model.max_positions, spec.chunk, spec.context_len, ParamFormat::QnnW4A16)
                .unwrap(),
        })
        .collect();
    let (aot_config, _) = aot::load_aot_config(None, &hf).unwrap();
    let progress = aot::progress::Silent;
    let passed = stages::passes(Traced { graphs }, &aot_config, &model.checkpoint, None, &progress).unwrap();
    // Built by hand from the passes' programs alone.
    let input = Passed { graphs: passed.graphs, ir_dumps: Vec::new() };
    let lowered = stages::lower(input, &model.checkpoint, &progress).unwrap();
    let expected = aot::lower_family(&dir, &family).unwrap();
    let got: Vec<_> = lowered.graphs.into_iter().map(|g| g.graph).collect();
    assert_eq!(got, expected);
}

/// `trace` refuses a context its RoPE tables do not cover, before tracing anything.
#[test]
fn trace_refuses_a_context_beyond_the_rope_tables() {
    let hf = HfConfig::from_dir(fixture("qwen3-dev-f32")).unwrap();
    let family = GraphFamily::new(&[1], &[64], GraphNaming::Mllm).unwrap();
    let err = stages::trace(&hf, 32, &family, &aot::progress::Silent).err().unwrap().to_string();
    assert!(err.contains("64") && err.contains("32 positions"), "{err}");
}

//! Text generation from a context binary: the lowered tiny Qwen3 pair (`model.0.s4` for
//! prefill, `model.0.s1` for decode, context 16) built into one context binary (recording API),
//! written to disk, loaded through the execute API of [`EmulatedHtp`] (the reference interpreter
//! standing in for the SDK's HTP emulation) and driven by the generation runtime through
//! [`QnnChunkModel`] with a u8 KV cache. The reference is the same runtime over the CPU
//! fake-quant model of the same checkpoint (`CpuChunkModel`, f32 KV cache).

mod qwen3_common;

use backend_cpu::CpuChunkModel;
use backend_qnn::context::write_context_binary;
use backend_qnn::sdk::{ApiError, EmulatedHtp, RecordingApi};
use backend_qnn::target::HtpTarget;
use backend_qnn::{GraphIo, QnnChunkModel, QnnModelError};
use qwen3_common::*;
use runtime::{argmax, ChunkModel, GenerationConfig, Generator, ModelLayout, StopReason};

/// The checkpoint run eagerly by backend-cpu with its QDQ points fake-quantized.
fn cpu_fake_quant_model() -> CpuChunkModel {
    let loaded = aot::load_model(&fixture(), CONTEXT, aot::RunMode::Auto).unwrap_or_else(|e| panic!("{e:#}"));
    assert!(loaded.fake_quant);
    loaded.model
}

fn sm8650() -> HtpTarget {
    HtpTarget::new(&aot_config().target_machine)
}

/// The context binary of the lowered pair, written to and read back from disk.
fn context_binary(graphs: &[backend_qnn::QnnGraph], dir: &TempDir) -> Vec<u8> {
    let path = dir.0.join("qwen3-tiny.bin");
    let written = write_context_binary(graphs, &sm8650(), &mut RecordingApi::new(), &path).unwrap();
    assert_eq!(written.graphs, ["model.0.s4", "model.0.s1"]);
    let binary = std::fs::read(&path).unwrap();
    assert_eq!(binary.len() as u64, written.bytes);
    binary
}

#[test]
fn greedy_generation_from_the_context_binary_matches_the_cpu_fake_quant_run() {
    let (s4, s1) = lowered_pair();
    let graphs = vec![s4, s1];
    let dir = TempDir::new("runtime");
    let binary = context_binary(&graphs, &dir);
    let qnn = QnnChunkModel::emulated(graphs, &binary).unwrap();
    assert_eq!(qnn.chunk_lens(), [CHUNK, 1]);
    let cfg = model_config();
    let expected_layout = ModelLayout {
        num_layers: cfg.num_hidden_layers,
        num_kv_heads: cfg.num_key_value_heads,
        head_dim: cfg.head_dim,
        vocab_size: cfg.vocab_size,
        context_len: CONTEXT,
        sliding_window: None,
    };
    assert_eq!(qnn.layout(), expected_layout);

    // 6 prompt tokens: one full chunk-4 prefill run and one padded one, then decode to the end
    // of the context.
    let prompt = [5u32, 17, 99, 3, 64, 8];
    let config = GenerationConfig {
        max_new_tokens: CONTEXT,
        prefill_chunk: CHUNK,
        eos_ids: vec![],
        // Every prompt row's logits are read (and so captured), not only the last one.
        collect_prompt_logits: true,
        ..GenerationConfig::default()
    };
    let mut qnn = Generator::new(Capture::new(qnn, CaptureRows::Read)).unwrap();
    let mut cpu = Generator::new(Capture::new(cpu_fake_quant_model(), CaptureRows::Read)).unwrap();
    let q = qnn.generate(&prompt, &config).unwrap();
    let c = cpu.generate(&prompt, &config).unwrap();
    assert_eq!(q.stop_reason, StopReason::ContextFull);
    assert_eq!(q.ids.len(), CONTEXT - prompt.len());

    // Every position's logits, while both runs saw the same tokens.
    let (qs, cs) = (&qnn.model().logits, &cpu.model().logits);
    assert_eq!(qs.len(), CONTEXT - 1, "prompt rows + decode steps");
    let mut agree = 0;
    let mut worst = f64::INFINITY;
    for (step, (a, b)) in qs.iter().zip(cs).enumerate() {
        let db = sqnr_db(a, b);
        worst = worst.min(db);
        agree += usize::from(argmax(a).unwrap() == argmax(b).unwrap());
        assert!(db >= 35.0, "position {step}: logits SQNR {db:.2} dB < 35 dB");
    }
    eprintln!(
        "context binary via EmulatedHtp vs CPU fake-quant: {} positions, worst logits SQNR {worst:.2} dB, top-1 agreement {agree}/{}",
        qs.len(),
        qs.len()
    );
    eprintln!("greedy ids: qnn {:?} cpu {:?}", q.ids, c.ids);
    assert_eq!(q.ids, c.ids, "greedy ids");
}

/// An attention-sink prefix (K/V on the checkpoint's K/V grid, as `quantize --sink-prefix` ships
/// it) starts both runtimes alike: the context binary's u8 cache gets exactly the prefix's codes,
/// and the greedy run after it matches the CPU fake-quant run that starts from the real values.
#[test]
fn a_sink_prefix_starts_the_context_binary_like_the_cpu_run() {
    use backend_cpu::quant::SinkPrefix;
    use compiler::quant::QuantParams;
    let (s4, s1) = lowered_pair();
    let graphs = vec![s4, s1];
    let dir = TempDir::new("runtime-prefix");
    let binary = context_binary(&graphs, &dir);
    let qnn = QnnChunkModel::emulated(graphs, &binary).unwrap();

    // Two prefix tokens through the fake-quant model, rounded onto the checkpoint's K/V grid.
    let (model, backend, _) = aot::text_quality::load_fake_quant(&fixture()).unwrap();
    let real = SinkPrefix::compute(model.as_ref(), &backend, &[1, 7]).unwrap();
    let ckpt = checkpoint::SafetensorsCheckpoint::open(fixture()).unwrap();
    let scale = |l: usize, w: &str| {
        ckpt.read_f32(&format!("model.layers.{l}.self_attn.{w}_cast_to_int8_qdq.fake_quant.scale")).unwrap()[0]
    };
    let layers = real.num_layers();
    let (ks, vs): (Vec<f32>, Vec<f32>) = (0..layers).map(|l| (scale(l, "k"), scale(l, "v"))).unzip();
    let kv_u8 = |scales: &[f32]| scales.iter().map(|&s| QuantParams::kv_u8(s).unwrap()).collect::<Vec<_>>();
    let (prefix, _) = real.on_kv_grid(&kv_u8(&ks), &kv_u8(&vs)).unwrap();
    let codes = qnn.kv_prefix(2, &prefix.keys, &prefix.values).unwrap();
    for l in 0..layers {
        for (c, v) in codes.keys[l].iter().zip(&prefix.keys[l]) {
            assert_eq!((i32::from(*c) - 128) as f32 * ks[l], *v, "layer {l} key code");
        }
        for (c, v) in codes.values[l].iter().zip(&prefix.values[l]) {
            assert_eq!((i32::from(*c) - 128) as f32 * vs[l], *v, "layer {l} value code");
        }
    }
    assert!(qnn.kv_prefix(3, &prefix.keys, &prefix.values).is_err(), "sizes that do not fit 3 positions");

    let prompt = [5u32, 17, 99, 3, 64, 8];
    let config = GenerationConfig {
        max_new_tokens: 6,
        prefill_chunk: CHUNK,
        eos_ids: vec![],
        collect_prompt_logits: true,
        ..GenerationConfig::default()
    };
    let mut qnn = Generator::new(Capture::new(qnn, CaptureRows::Read)).unwrap();
    qnn.set_prefix(codes).unwrap();
    let mut cpu = Generator::new(Capture::new(cpu_fake_quant_model(), CaptureRows::Read)).unwrap();
    cpu.set_prefix(prefix.into_kv_prefix()).unwrap();
    let q = qnn.generate(&prompt, &config).unwrap();
    let c = cpu.generate(&prompt, &config).unwrap();
    let (qs, cs) = (&qnn.model().logits, &cpu.model().logits);
    assert_eq!(qs.len(), prompt.len() + 5);
    for (step, (a, b)) in qs.iter().zip(cs).enumerate() {
        let db = sqnr_db(a, b);
        assert!(db >= 35.0, "position {step} after the prefix: logits SQNR {db:.2} dB < 35 dB");
    }
    assert_eq!(q.ids, c.ids, "greedy ids after the prefix");
    // The prefix is attended: without it the CPU run's first prompt row differs.
    let mut plain = Generator::new(Capture::new(cpu_fake_quant_model(), CaptureRows::Read)).unwrap();
    plain.generate(&prompt, &config).unwrap();
    assert!(sqnr_db(&plain.model().logits[0], &cs[0]) < 60.0, "the prefix changes the first row");
}

#[test]
fn binaries_of_other_graphs_and_broken_io_are_refused() {
    let (s4, s1) = lowered_pair();
    let dir = TempDir::new("runtime-errors");
    let binary = context_binary(&[s4.clone(), s1.clone()], &dir);
    let io = |g: &backend_qnn::QnnGraph| GraphIo::from_graph(g).unwrap();

    // An emulator that only has the decode graph cannot load a binary that holds both.
    let err = QnnChunkModel::open(EmulatedHtp::new(vec![s1.clone()]).unwrap(), &binary, vec![io(&s1)]).unwrap_err();
    let QnnModelError::Api(ApiError::InvalidArgument { function, reason }) = &err else { panic!("{err}") };
    assert_eq!(*function, "contextCreateFromBinary");
    assert!(reason.contains("`model.0.s4`"), "{reason}");
    // Nor one whose graphs differ from the emulator's (here in the node count it lists).
    let text = String::from_utf8(binary.clone()).unwrap();
    let line = format!("graph model.0.s1 nodes={}", s1.nodes.len());
    assert!(text.contains(&line), "{text}");
    let other = text.replace(&line, &format!("graph model.0.s1 nodes={}", s1.nodes.len() + 1));
    let emulator = EmulatedHtp::new(vec![s4.clone(), s1.clone()]).unwrap();
    let err = QnnChunkModel::open(emulator, other.as_bytes(), vec![io(&s1)]).unwrap_err().to_string();
    assert!(err.contains("differs from the given graph"), "{err}");
    // Not a context binary at all.
    let emulator = EmulatedHtp::new(vec![s4.clone(), s1.clone()]).unwrap();
    let err = QnnChunkModel::open(emulator, b"\x7fELF", vec![io(&s1)]).unwrap_err().to_string();
    assert!(err.contains("contextCreateFromBinary"), "{err}");

    // I/O that breaks the runtime contract is named.
    let mut bad = io(&s1);
    bad.inputs.swap(3, 4);
    let emulator = EmulatedHtp::new(vec![s4.clone(), s1.clone()]).unwrap();
    let err = QnnChunkModel::open(emulator, &binary, vec![bad]).unwrap_err().to_string();
    assert_eq!(err, "graph `model.0.s1`: `past_key_1` is UFIXED_POINT_8 [1, 2, 8, 15]; expected `past_key_0` UFIXED_POINT_8 [1, 2, 8, 15]");
    let mut bad = io(&s1);
    bad.outputs[1].quant.as_mut().unwrap().scale *= 2.0;
    let emulator = EmulatedHtp::new(vec![s4.clone(), s1.clone()]).unwrap();
    let err = QnnChunkModel::open(emulator, &binary, vec![bad]).unwrap_err().to_string();
    assert!(err.contains("`present_key_0` has encoding") && err.contains("`past_key_0`"), "{err}");
    // Two graphs for the same chunk length.
    let emulator = EmulatedHtp::new(vec![s4.clone(), s1.clone()]).unwrap();
    let err = QnnChunkModel::open(emulator, &binary, vec![io(&s1), io(&s1)]).unwrap_err().to_string();
    assert_eq!(err, "graph `model.0.s1`: a second graph for chunk 1 at context 16");
    // A graph the context does not hold.
    let mut renamed = io(&s1);
    renamed.name = "model.0.s2".into();
    let emulator = EmulatedHtp::new(vec![s4, s1]).unwrap();
    let err = QnnChunkModel::open(emulator, &binary, vec![renamed]).unwrap_err().to_string();
    assert!(err.contains("graphRetrieve") && err.contains("`model.0.s2`"), "{err}");
}

//! mllm's on-device runtime contract (docs/deploy.md), checked on what `qwen3_aot` writes: the
//! default context binary (graphs `model.0.s32` and `model.0.s1`, context 1024) of the embedded
//! tiny Qwen3 and of the real model (SmolLM2-135M-Instruct, `scripts/fetch-smollm2`), read back
//! through Qualcomm's `libQnnSystem.so`, point by point against mllm's runtime source
//! (UbiquitousLearning/mllm b9c30702, `mllm/backends/qnn/aot_rt/`), with the model's sizes taken
//! from its `config.json` as mllm's `aot_run` takes them. Also: `report.json` says per artifact
//! which runtime runs it, and `--target-runtime mllm` refuses, before any work, each option mllm's
//! runtime could not run. Fails naming `scripts/fetch-qnn-sdk` / `scripts/fetch-smollm2` when
//! Qualcomm's libraries or the real model are absent.

use std::path::{Path, PathBuf};

use aot::deploy::{check_mllm_contract, MllmModelShape, TargetRuntime};
use aot::{AotOptions, CalibSource, ModelSource};
use backend_qnn::sdk::ffi::BinaryInfo;
use backend_qnn::sdk::{LibraryPaths, SystemApi, FETCH_HINT};
use backend_qnn::{DataType, GraphIo, ScaleOffset};
use models::hf::HfConfig;

/// Qualcomm's HTP backend is a process-wide singleton: one test at a time builds with it.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn read_back(binary: &Path) -> BinaryInfo {
    let paths = LibraryPaths::find().unwrap_or_else(|e| panic!("{e}: {FETCH_HINT}"));
    let bytes = std::fs::read(binary).unwrap();
    SystemApi::load(&paths.system).unwrap().binary_info(&bytes).unwrap()
}

/// Every point of the contract for one graph, written out against mllm's source lines.
fn assert_graph(g: &GraphIo, ar: u32, hf: &HfConfig, ctx: u32) {
    let (l, h, d, vocab) =
        (hf.num_hidden_layers, hf.num_key_value_heads as u32, hf.head_dim as u32, hf.vocab_size as u32);
    let past = ctx - ar;
    let name = &g.name;
    // Binding is by position (QNNBackend.cpp:664-702): the order is the contract; the names are
    // the ones mllm gives its buffers (PromptProcessor.cpp:29-86).
    let inputs: Vec<&str> = g.inputs.iter().map(|t| t.name.as_str()).collect();
    let mut expected = vec!["input_ids".to_string(), "position_ids".into(), "attention_mask".into()];
    expected.extend((0..l).map(|i| format!("past_key_{i}")));
    expected.extend((0..l).map(|i| format!("past_value_{i}")));
    assert_eq!(inputs, expected, "{name}: inputs in binding order");
    let outputs: Vec<&str> = g.outputs.iter().map(|t| t.name.as_str()).collect();
    let mut expected = vec!["logits".to_string()];
    expected.extend((0..l).map(|i| format!("present_key_{i}")));
    expected.extend((0..l).map(|i| format!("present_value_{i}")));
    assert_eq!(outputs, expected, "{name}: outputs in binding order");
    // input_ids [1, ar] and position_ids [ar], INT_32 (PromptProcessor.cpp:28, 33).
    assert_eq!((g.inputs[0].dtype, g.inputs[0].dims.clone()), (DataType::Int32, vec![1, ar]), "{name}");
    assert_eq!((g.inputs[1].dtype, g.inputs[1].dims.clone()), (DataType::Int32, vec![ar]), "{name}");
    // attention_mask [1, 1, ar, ctx] u16 (PromptProcessor.cpp:38), in the encoding mllm's compiler
    // gives it (scale 0.001/65535, zero point 65535: compile_common.hpp:13-14), so the runtime's
    // 65535 (attend) is 0.0 and its 0 (masked) is below (KVCacheManager.cpp:75-76).
    let mask = &g.inputs[2];
    assert_eq!((mask.dtype, mask.dims.clone()), (DataType::UFixedPoint16, vec![1, 1, ar, ctx]), "{name}");
    let so = mask.quant.unwrap();
    assert_eq!(so, ScaleOffset { scale: 0.001 / 65535.0, offset: -65535 }, "{name}: mask encoding");
    assert_eq!(so.dequantize(65535), 0.0);
    assert!(so.dequantize(0) < 0.0);
    // logits: ar x vocab u16 codes with a positive scale (PromptProcessor.cpp:68; the greedy
    // argmax on the codes, QnnAOTModule.cpp:17-21).
    let logits = &g.outputs[0];
    assert_eq!(logits.dtype, DataType::UFixedPoint16, "{name}: logits");
    assert_eq!(logits.dims.iter().product::<u32>(), ar * vocab, "{name}: logits {:?}", logits.dims);
    assert_eq!(logits.dims.last(), Some(&vocab));
    assert!(logits.quant.unwrap().scale > 0.0);
    for i in 0..l {
        for (past_t, present_t, past_dims, present_dims) in [
            (&g.inputs[3 + i], &g.outputs[1 + i], [1, h, d, past], [1, h, d, ar]),
            (&g.inputs[3 + l + i], &g.outputs[1 + l + i], [1, h, past, d], [1, h, ar, d]),
        ] {
            // past [1, H, D, ctx-ar] / [1, H, ctx-ar, D] (PromptProcessor.cpp:47, 56); present: the
            // new positions only, [1, H, D, ar] / [1, H, ar, D] (PromptProcessor.cpp:75, 83), which
            // KVCacheManager copies into the cache at n_past (KVCacheManager.cpp:255-321).
            assert_eq!(past_t.dims, past_dims, "{name} {}", past_t.name);
            assert_eq!(present_t.dims, present_dims, "{name} {}", present_t.name);
            assert_eq!(past_t.dtype, DataType::UFixedPoint8, "{name} {}", past_t.name);
            assert_eq!(present_t.dtype, DataType::UFixedPoint8, "{name} {}", present_t.name);
            // u8 codes with zero point 128, copied unchanged: one encoding for both.
            let q = past_t.quant.unwrap();
            assert_eq!(q.offset, -128, "{name} {}", past_t.name);
            assert!(q.scale > 0.0);
            assert_eq!(present_t.quant, Some(q), "{name} {}", present_t.name);
        }
    }
}

/// The default pair of `dir`'s `qnn/context.bin`, checked point by point and by the library's
/// checker, and the K/V encodings shared between the two graphs (one cache buffer per layer:
/// PromptProcessor.cpp:49, TokenGenerator.cpp:44). The x86 binary holds the same I/O.
fn assert_default_pair(out: &Path, hf: &HfConfig) {
    let info = read_back(&out.join("qnn/context.bin"));
    let names: Vec<&str> = info.graphs.iter().map(|g| g.name.as_str()).collect();
    assert_eq!(names, ["model.0.s32", "model.0.s1"]);
    assert_graph(&info.graphs[0], 32, hf, 1024);
    assert_graph(&info.graphs[1], 1, hf, 1024);
    for (a, b) in info.graphs[0].inputs[3..].iter().zip(&info.graphs[1].inputs[3..]) {
        assert_eq!((&a.name, a.quant), (&b.name, b.quant), "one cache encoding for prefill and decode");
    }
    let shape = MllmModelShape {
        num_layers: hf.num_hidden_layers,
        kv_heads: hf.num_key_value_heads,
        head_dim: hf.head_dim,
        vocab_size: hf.vocab_size,
        context_len: 1024,
    };
    assert_eq!(check_mllm_contract(&info.graphs, &shape), Vec::<String>::new());
    let x86 = read_back(&out.join("qnn/context.x86.bin"));
    assert_eq!(io_shapes(&x86), io_shapes(&info), "the x86 binary's graph I/O");
}

/// A graph's name, and the names and dims of its inputs then outputs.
type GraphShapes = (String, Vec<(String, Vec<u32>)>);

/// Per graph, the names and dims of its inputs then outputs.
fn io_shapes(info: &BinaryInfo) -> Vec<GraphShapes> {
    let tensors = |g: &GraphIo| g.inputs.iter().chain(&g.outputs).map(|t| (t.name.clone(), t.dims.clone())).collect();
    info.graphs.iter().map(|g| (g.name.clone(), tensors(g))).collect()
}

/// `report.json`'s `deploy` for a default run: both runtimes run the device binary, only this
/// project's the x86 one (mllm's allocator needs the device's libcdsprpc.so).
fn assert_deploy(out: &Path, eos: u32) {
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(out.join("report.json")).unwrap()).unwrap();
    let deploy = report["deploy"].as_array().unwrap();
    let runs = |i: usize, rt: &str| deploy[i]["runtimes"][rt]["runs"].as_bool().unwrap();
    assert_eq!(deploy[0]["artifact"], "qnn/context.bin");
    assert_eq!(deploy[0]["runs_on"], "mllm-dsl, mllm", "{deploy:#?}");
    assert!(runs(0, "mllm-dsl") && runs(0, "mllm"));
    assert_eq!(deploy[1]["artifact"], "qnn/context.x86.bin");
    assert!(runs(1, "mllm-dsl") && !runs(1, "mllm"));
    assert!(deploy[1]["runtimes"]["mllm"]["blockers"][0].as_str().unwrap().contains("libcdsprpc.so"));
    let notes = deploy[0]["runtimes"]["mllm"]["notes"].to_string();
    assert!(notes.contains("--ar_len 32"), "{notes}");
    assert!(notes.contains(&format!("EOS [{eos}]")), "{notes}");
}

#[test]
fn the_tiny_default_binary_meets_mllms_runtime_contract() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("aot");
    let opts = AotOptions { target_runtime: TargetRuntime::Mllm, ..AotOptions::embedded(&out) };
    let report = aot::run(&opts).unwrap();
    assert!(report.summary().contains("qnn/context.bin: mllm-dsl, mllm"), "{}", report.summary());
    let hf = HfConfig::from_dir(out.join("embedded/qwen3-dev-f32")).unwrap();
    assert_default_pair(&out, &hf);
    assert_deploy(&out, 2);

    // mllm's runtime loop, driven on Qualcomm's x86 emulation: the same greedy tokens as this
    // project's runtime on the same binary.
    let binary = out.join("qnn/context.x86.bin");
    let prompt = [5u32, 17, 99, 3, 64, 8];
    let theirs = mllm_loop_greedy(&binary, &hf, &prompt, 16);
    let mut runner = aot::Runner::context_binary(&out.join("quantized"), &binary, 32, 1024, false).unwrap();
    let config = runtime::GenerationConfig { max_new_tokens: 16, prefill_chunk: 32, ..Default::default() };
    let ours = runner.generate(&prompt, &config, None, &mut Vec::new()).unwrap().ids;
    eprintln!("mllm's loop: {theirs:?}\nours:        {ours:?}");
    assert_eq!(theirs, ours, "greedy ids: mllm's runtime loop vs this project's runtime, on the same x86 binary");
}

/// mllm's runtime loop (`aot_rt/`: PromptProcessor, TokenGenerator, KVCacheManager; its
/// arithmetic restated, not its code) over Qualcomm's x86 HTP emulation: one byte buffer per
/// input and output bound by position; a K/V cache buffer of `H·D·(ctx − 1)` codes per layer
/// shared by both graphs, rearranged from rows of `ctx − ar` to rows of `ctx − 1` positions when
/// decoding starts, with the first `n_update` new positions of each output row copied in at
/// `n_past`; the u16 mask of 65535 / 0 built and opened column by column; greedy argmax over the
/// u16 logits codes of row `(n − 1) mod ar`. The one thing it cannot do as mllm does is allocate
/// ION shared memory: the emulation takes plain client buffers.
fn mllm_loop_greedy(binary: &Path, hf: &HfConfig, prompt: &[u32], steps: usize) -> Vec<u32> {
    use backend_qnn::sdk::QnnExecApi;
    let paths = LibraryPaths::find().unwrap_or_else(|e| panic!("{e}: {FETCH_HINT}"));
    let bytes = std::fs::read(binary).unwrap();
    let mut api = backend_qnn::sdk::SdkApi::load_for_execution(&paths).unwrap();
    let info = api.binary_info(&bytes).unwrap();
    let context = api.context_create_from_binary(&bytes).unwrap();
    let (l, h, d, vocab, ctx) = (hf.num_hidden_layers, hf.num_key_value_heads, hf.head_dim, hf.vocab_size, 1024usize);
    let (rows, max_cache) = (h * d, ctx - 1);
    let mut k_cache = vec![vec![0u8; rows * max_cache]; l];
    let mut v_cache = vec![vec![0u8; h * max_cache * d]; l];
    let mut k_out = vec![vec![0u8; rows * 32]; l];
    let mut v_out = vec![vec![0u8; h * 32 * d]; l];
    let logits_bytes = |ar: usize| ar * vocab * 2;
    let run = |api: &mut backend_qnn::sdk::SdkApi,
               ar: usize,
               ids: &[i32],
               pos: &[i32],
               mask: &[u16],
               k_cache: &[Vec<u8>],
               v_cache: &[Vec<u8>],
               k_out: &mut [Vec<u8>],
               v_out: &mut [Vec<u8>]|
     -> Vec<u16> {
        let name = format!("model.0.s{ar}");
        assert!(info.graphs.iter().any(|g| g.name == name));
        let graph = api.graph_retrieve(context, &name).unwrap();
        let ids: Vec<u8> = ids.iter().flat_map(|x| x.to_le_bytes()).collect();
        let pos: Vec<u8> = pos.iter().flat_map(|x| x.to_le_bytes()).collect();
        let mask: Vec<u8> = mask.iter().flat_map(|x| x.to_le_bytes()).collect();
        let past = ctx - ar;
        let mut inputs: Vec<&[u8]> = vec![&ids, &pos, &mask];
        inputs.extend(k_cache.iter().map(|k| &k[..rows * past]));
        inputs.extend(v_cache.iter().map(|v| &v[..h * past * d]));
        let mut logits = vec![0u8; logits_bytes(ar)];
        let mut outputs: Vec<&mut [u8]> = vec![&mut logits];
        outputs.extend(k_out.iter_mut().map(|k| &mut k[..rows * ar]));
        outputs.extend(v_out.iter_mut().map(|v| &mut v[..h * ar * d]));
        api.graph_execute(graph, &inputs, &mut outputs).unwrap();
        logits.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]])).collect()
    };
    // K rows of `stride` positions (H·D of them), V blocks of `stride · D` (H of them).
    let update = |k_cache: &mut [Vec<u8>],
                  v_cache: &mut [Vec<u8>],
                  k_out: &[Vec<u8>],
                  v_out: &[Vec<u8>],
                  ar: usize,
                  n_past: usize,
                  n: usize| {
        let stride = ctx - ar;
        for layer in 0..l {
            for r in 0..rows {
                k_cache[layer][r * stride + n_past..][..n].copy_from_slice(&k_out[layer][r * ar..][..n]);
            }
            for head in 0..h {
                v_cache[layer][head * stride * d + n_past * d..][..n * d]
                    .copy_from_slice(&v_out[layer][head * ar * d..][..n * d]);
            }
        }
    };
    let argmax =
        |codes: &[u16]| codes.iter().enumerate().fold(0, |best, (i, &c)| if c > codes[best] { i } else { best }) as u32;
    let mut tokens = Vec::new();
    // Prefill, chunks of 32 from position 0.
    let ar = 32;
    let mut mask = vec![0u16; ar * ctx];
    for i in 0..ar {
        for j in 0..=i {
            mask[i * ctx + ctx - ar + j] = 65535;
        }
    }
    let mut n_past = 0;
    let mut logits = Vec::new();
    for chunk in prompt.chunks(ar) {
        let ids: Vec<i32> = (0..ar).map(|i| chunk.get(i).map_or(0, |&t| t as i32)).collect();
        let pos: Vec<i32> = (0..ar).map(|i| (n_past + i) as i32).collect();
        logits = run(&mut api, ar, &ids, &pos, &mask, &k_cache, &v_cache, &mut k_out, &mut v_out);
        update(&mut k_cache, &mut v_cache, &k_out, &v_out, ar, n_past, chunk.len());
        for row in 0..ar {
            mask[row * ctx + n_past..][..chunk.len()].fill(65535);
        }
        n_past += chunk.len();
    }
    let row = (prompt.len() - 1) % ar;
    tokens.push(argmax(&logits[row * vocab..][..vocab]));
    // Decode: rows of ctx − 32 positions become rows of ctx − 1 (from the last row backwards).
    let (src, dst) = (ctx - ar, ctx - 1);
    for layer in 0..l {
        for r in (0..rows).rev() {
            k_cache[layer].copy_within(r * src..r * src + src, r * dst);
        }
        for head in (0..h).rev() {
            v_cache[layer].copy_within(head * src * d..(head + 1) * src * d, head * dst * d);
        }
    }
    let mut mask = vec![0u16; ctx];
    mask[..n_past].fill(65535);
    mask[ctx - 1] = 65535;
    while tokens.len() < steps {
        let ids = [*tokens.last().unwrap() as i32];
        let logits = run(&mut api, 1, &ids, &[n_past as i32], &mask, &k_cache, &v_cache, &mut k_out, &mut v_out);
        update(&mut k_cache, &mut v_cache, &k_out, &v_out, 1, n_past, 1);
        mask[n_past] = 65535;
        n_past += 1;
        tokens.push(argmax(&logits));
    }
    api.context_free(context).unwrap();
    tokens
}

#[test]
fn smollm2s_default_binary_meets_mllms_runtime_contract() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let model = aot::smollm2_dir().unwrap_or_else(|e| panic!("{e:#}"));
    let tmp = tempfile::tempdir().unwrap();
    // A few sentences are enough: the contract is the graphs' I/O, whatever the ranges.
    let calib = tmp.path().join("calib.txt");
    std::fs::write(&calib, "The cache holds the keys and values of every earlier position.\n").unwrap();
    let out = tmp.path().join("aot");
    let opts = AotOptions {
        source: ModelSource::Float(model.clone()),
        calibration: vec![CalibSource::Text { path: calib, chat: false }],
        target_runtime: TargetRuntime::Mllm,
        ..AotOptions::embedded(&out)
    };
    aot::run(&opts).unwrap();
    let hf = HfConfig::from_dir(&model).unwrap();
    assert_eq!((hf.num_hidden_layers, hf.num_key_value_heads, hf.head_dim), (30, 3, 64));
    assert_default_pair(&out, &hf);
    assert_deploy(&out, 2);
}

#[test]
fn target_runtime_mllm_refuses_what_mllm_cannot_run_before_any_work() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("never");
    let refused = |opts: AotOptions| -> String {
        let started = std::time::Instant::now();
        let e = aot::run(&opts).unwrap_err();
        assert!(matches!(e, aot::AotError::TargetRuntime(_)), "{e:#}");
        assert!(!out.exists(), "nothing is written before the refusal");
        assert!(started.elapsed().as_secs_f64() < 5.0, "refused before any work");
        e.to_string()
    };
    let mllm = || AotOptions { target_runtime: TargetRuntime::Mllm, ..AotOptions::embedded(&out) };
    let e = refused(AotOptions { sink_prefix: vec!["id:1".into()], ..mllm() });
    assert!(e.starts_with("AotOptions::target_runtime mllm refuses AotOptions::sink_prefix: "), "{e}");
    assert!(e.contains("KVCacheManager.cpp"), "{e}");
    let e = refused(AotOptions { chunks: vec![32, 8], ..mllm() });
    assert!(
        e.contains("AotOptions::chunks 32 AotOptions::chunks 8 without AotOptions::chunks 1")
            && e.contains("model.0.s1"),
        "{e}"
    );
    let e = refused(AotOptions { context_binary: aot::ContextBinary::Off, ..mllm() });
    assert!(e.contains("AotOptions::context_binary off"), "{e}");
    // A quantized checkpoint that ships a prefix: the refusal names --quantized.
    let quantized = tmp.path().join("quantized");
    copy_dir(&fixture("pymllm-qwen3-dev-f32"), &quantized);
    let embedded = tmp.path().join("prefix-source");
    let prefix_run = AotOptions {
        sink_prefix: vec!["id:1".into()],
        context_binary: aot::ContextBinary::Off,
        chunks: vec![4, 1],
        context_lens: vec![16],
        ..AotOptions::embedded(&embedded)
    };
    aot::run(&prefix_run).unwrap();
    let prefix_file = std::fs::read_dir(embedded.join("quantized"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.file_name().unwrap().to_string_lossy().contains("sink"))
        .expect("the quantized checkpoint holds its prefix file");
    std::fs::copy(&prefix_file, quantized.join(prefix_file.file_name().unwrap())).unwrap();
    let e = refused(AotOptions { source: ModelSource::Quantized(quantized), ..mllm() });
    assert!(e.starts_with("AotOptions::target_runtime mllm refuses ModelSource::Quantized"), "{e}");
}

fn fixture(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures").join(rel)
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let p = entry.unwrap().path();
        if p.is_file() {
            std::fs::copy(&p, to.join(p.file_name().unwrap())).unwrap();
        }
    }
}

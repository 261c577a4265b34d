//! Loading a broken or surprising checkpoint gives errors that name the tensor, the module that asked
//! for it and what was expected; extra tensors are listed as unused.

use aot::load_float;
use checkpoint::{write_safetensors_atomic, SafetensorsCheckpoint, StDtype};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// A copy of qwen3-dev-f32 whose tensors went through `edit` (name, shape, f32 data).
fn edited_checkpoint(name: &str, edit: impl Fn(&mut Vec<(String, Vec<usize>, Vec<f32>)>)) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/qwen3-dev-f32");
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(src.join("config.json"), dir.join("config.json")).unwrap();
    let ckpt = SafetensorsCheckpoint::open(&src).unwrap();
    let mut tensors: Vec<(String, Vec<usize>, Vec<f32>)> = ckpt
        .keys()
        .iter()
        .map(|k| (k.to_string(), ckpt.info(k).unwrap().1.to_vec(), ckpt.read_f32(k).unwrap()))
        .collect();
    edit(&mut tensors);
    let bytes: Vec<Vec<u8>> = tensors.iter().map(|t| t.2.iter().flat_map(|v| v.to_le_bytes()).collect()).collect();
    let views: Vec<_> =
        tensors.iter().zip(&bytes).map(|(t, b)| (t.0.as_str(), StDtype::F32, t.1.as_slice(), b.as_slice())).collect();
    write_safetensors_atomic(dir.join("model.safetensors"), &views, &BTreeMap::new()).unwrap();
    dir
}

fn load_err(dir: &Path) -> String {
    format!("{:#}", load_float(dir, 64).err().expect("loading must fail"))
}

#[test]
fn missing_tensor_names_key_module_and_near_matches() {
    let dir = edited_checkpoint("missing_tensor", |t| {
        for (name, _, _) in t.iter_mut() {
            if name == "model.layers.1.mlp.up_proj.weight" {
                *name = "model.layers.1.mlp.up_proj.weigth".into();
            }
        }
    });
    let err = load_err(&dir);
    assert!(err.contains("model.layers.1.mlp.up_proj.weight"), "{err}");
    assert!(err.contains("requested by `model.layers.1.mlp.up_proj`"), "{err}");
    assert!(err.contains("model.layers.1.mlp.up_proj.weigth"), "near match missing: {err}");
}

#[test]
fn wrong_shape_names_expected_and_found() {
    let dir = edited_checkpoint("wrong_shape", |t| {
        for (name, shape, data) in t.iter_mut() {
            if name == "model.layers.0.self_attn.q_norm.weight" {
                *shape = vec![4];
                data.truncate(4);
            }
        }
    });
    let err = load_err(&dir);
    assert!(
        err.contains("model.layers.0.self_attn.q_norm.weight") && err.contains("[4]") && err.contains("[8]"),
        "{err}"
    );
}

#[test]
fn unused_tensors_are_listed() {
    let dir = edited_checkpoint("extra_tensor", |t| t.push(("model.extra.bias".into(), vec![2], vec![0.0, 1.0])));
    let loaded = load_float(&dir, 64).unwrap();
    assert_eq!(loaded.unused, vec!["model.extra.bias".to_string()]);
}

#[test]
fn unsupported_model_type_and_corrupt_file_are_clear() {
    let dir = edited_checkpoint("bad_model_type", |_| {});
    let cfg = std::fs::read_to_string(dir.join("config.json")).unwrap().replace("\"qwen3\"", "\"gpt2\"");
    std::fs::write(dir.join("config.json"), cfg).unwrap();
    let err = load_err(&dir);
    assert!(err.contains("gpt2") && err.contains("qwen3"), "{err}");

    let dir = edited_checkpoint("truncated_file", |_| {});
    let file = dir.join("model.safetensors");
    let len = std::fs::metadata(&file).unwrap().len();
    let f = std::fs::OpenOptions::new().write(true).open(&file).unwrap();
    f.set_len(len - 100).unwrap();
    let err = load_err(&dir);
    assert!(err.contains("model.safetensors") && err.contains("truncated"), "{err}");
}

/// A copy of the checkpoint `fixture` with tensor `key` replaced by `dtype` `bytes` (shape kept
/// unless `shape` is given) and `config.json` edited by `config`.
fn with_tensor(
    name: &str,
    fixture: &str,
    key: &str,
    dtype: StDtype,
    bytes: impl Fn(usize) -> Vec<u8>,
    config: impl Fn(String) -> String,
) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures").join(fixture);
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    std::fs::create_dir_all(&dir).unwrap();
    let text = std::fs::read_to_string(src.join("config.json")).unwrap();
    std::fs::write(dir.join("config.json"), config(text)).unwrap();
    let ckpt = SafetensorsCheckpoint::open(&src).unwrap();
    let tensors: Vec<(String, StDtype, Vec<usize>, Vec<u8>)> = ckpt
        .keys()
        .iter()
        .map(|k| {
            let (d, shape) = ckpt.info(k).unwrap();
            let n: usize = shape.iter().product();
            if *k == key {
                (k.to_string(), dtype, shape.to_vec(), bytes(n))
            } else {
                (k.to_string(), d, shape.to_vec(), ckpt.read_bytes(k).unwrap())
            }
        })
        .collect();
    let views: Vec<_> = tensors.iter().map(|t| (t.0.as_str(), t.1, t.2.as_slice(), t.3.as_slice())).collect();
    write_safetensors_atomic(dir.join("model.safetensors"), &views, &BTreeMap::new()).unwrap();
    dir
}

#[test]
fn integer_tensor_where_a_float_weight_is_expected_is_an_error() {
    let key = "model.layers.0.post_attention_layernorm.weight";
    for (dtype, width) in
        [(StDtype::I64, 8), (StDtype::I32, 4), (StDtype::I16, 2), (StDtype::U8, 1), (StDtype::BOOL, 1)]
    {
        let dir =
            with_tensor(&format!("int_weight_{dtype}"), "qwen3-dev-f32", key, dtype, |n| vec![1; n * width], |c| c);
        let err = load_err(&dir);
        assert!(err.contains(key) && err.contains(&dtype.to_string()) && err.contains("float dtype"), "{err}");
    }
}

#[test]
fn infinite_scale_in_a_quantized_checkpoint_is_an_error() {
    let key = "model.embed_tokens.scale";
    let dir = with_tensor(
        "inf_scale",
        "pymllm-qwen3-dev-f32",
        key,
        StDtype::F32,
        |n| f32::INFINITY.to_le_bytes().repeat(n),
        |c| c,
    );
    let err = format!("{:#}", aot::load_model(&dir, 64, aot::RunMode::Auto).err().expect("must fail"));
    assert!(err.contains("model.embed_tokens") && err.contains("inf"), "{err}");
}

#[test]
fn layer_count_that_disagrees_with_the_checkpoint_is_an_error() {
    for (layers, stored) in [(1, "stores 2 layers"), (3, "stores 2 layers"), (100_000_000, "over the limit")] {
        let dir = with_tensor(
            &format!("layers_{layers}"),
            "qwen3-dev-f32",
            "",
            StDtype::F32,
            |_| Vec::new(),
            |c| {
                let mut v: serde_json::Value = serde_json::from_str(&c).unwrap();
                v.as_object_mut().unwrap().remove("layer_types");
                v["num_hidden_layers"] = layers.into();
                v.to_string()
            },
        );
        let err = load_err(&dir);
        assert!(err.contains("num_hidden_layers") && err.contains(&layers.to_string()), "{err}");
        assert!(err.contains(stored), "{err}");
    }
}

/// bf16 products are for a float checkpoint's bf16 weights: a quantized checkpoint is refused by
/// name, and an f32 one loads with a warning that they change nothing.
#[test]
fn bf16_products_refuse_a_quantized_checkpoint_and_warn_on_f32_weights() {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures");
    let quantized = fixtures.join("pymllm-qwen3-dev-f32");
    let err = aot::Runner::cpu_with(&quantized, 64, aot::RunMode::Auto, backend_cpu::Bf16Products::Bf16)
        .err()
        .expect("a quantized checkpoint must be refused");
    let err = format!("{err:#}");
    assert!(err.contains("pymllm-qwen3-dev-f32") && err.contains("quantized"), "{err}");
    let runner =
        aot::Runner::cpu_with(&fixtures.join("qwen3-dev-f32"), 64, aot::RunMode::Auto, backend_cpu::Bf16Products::Bf16)
            .unwrap();
    assert!(runner.notes.iter().any(|n| n.contains("no bf16 tensors")), "{:?}", runner.notes);
    let runner = aot::Runner::cpu_with(
        &fixtures.join("qwen3-dev-bf16"),
        64,
        aot::RunMode::Auto,
        backend_cpu::Bf16Products::Bf16,
    )
    .unwrap();
    assert!(runner.notes.is_empty(), "{:?}", runner.notes);
}

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

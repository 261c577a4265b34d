//! Artifact snapshots and properties for the tiny attention-like example graph.

mod common;

use std::collections::BTreeSet;

use backend_qnn::artifacts::symbols::fnv1a;
use backend_qnn::artifacts::tar::data_offsets;
use backend_qnn::artifacts::{
    model_cpp, netron, summary, write_graph_artifacts, write_shared_artifacts, ArtifactError,
};
use backend_qnn::{QnnGraph, StaticData, TensorType};

const GRAPH: &str = "tiny_attention";

macro_rules! snapshot {
    ($name:expr, $value:expr) => {
        insta::with_settings!({
            snapshot_path => concat!(env!("CARGO_MANIFEST_DIR"), "/../snapshots"),
            prepend_module_to_snapshot => false,
        }, {
            insta::assert_snapshot!($name, $value);
        })
    };
}

fn graph() -> QnnGraph {
    common::tiny_attention(GRAPH)
}

#[test]
fn netron_json_snapshot() {
    snapshot!(format!("qnn__{GRAPH}__netron_json"), netron::render(&graph()));
}

#[test]
fn model_cpp_snapshot() {
    let lib = model_cpp::render(&graph(), GRAPH).unwrap();
    snapshot!(format!("qnn__{GRAPH}__model_cpp"), lib.cpp);
}

#[test]
fn model_bin_listing_snapshot() {
    let lib = model_cpp::render(&graph(), GRAPH).unwrap();
    let offsets = data_offsets(&lib.bin_entries);
    let listing: String = lib
        .bin_entries
        .iter()
        .zip(offsets)
        .map(|(e, off)| {
            format!("{:<64} offset {:>6} size {:>5} fnv1a {:016x}\n", e.name, off, e.data.len(), fnv1a(e.data.bytes()))
        })
        .collect();
    snapshot!(format!("qnn__{GRAPH}__model_bin"), listing);
}

#[test]
fn summary_snapshot() {
    snapshot!(format!("qnn__{GRAPH}__summary"), summary::summarize(&graph()).render());
}

#[test]
fn written_files_are_deterministic_and_atomic() {
    let base = std::env::temp_dir().join(format!("backend-qnn-artifacts-{}", std::process::id()));
    let (a, b) = (base.join("a"), base.join("b"));
    std::fs::create_dir_all(&a).unwrap();
    std::fs::create_dir_all(&b).unwrap();
    let g = graph();
    let pa = write_graph_artifacts(&g, &a).unwrap();
    let pb = write_graph_artifacts(&g, &b).unwrap();
    // Overwriting in place keeps the same bytes.
    let pa2 = write_graph_artifacts(&g, &a).unwrap();
    assert_eq!(pa, pa2);
    for (x, y) in [
        (&pa.netron_json, &pb.netron_json),
        (&pa.model_cpp, &pb.model_cpp),
        (&pa.model_bin, &pb.model_bin),
        (&pa.summary, &pb.summary),
    ] {
        assert_eq!(std::fs::read(x).unwrap(), std::fs::read(y).unwrap(), "{}", x.display());
    }
    let names: BTreeSet<String> =
        std::fs::read_dir(&a).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    let expected: BTreeSet<String> =
        ["json", "cpp", "bin", "summary.txt"].iter().map(|ext| format!("{GRAPH}.{ext}")).collect();
    assert_eq!(names, expected, "no temporary files are left behind");
    // The file written matches the rendered text.
    assert_eq!(std::fs::read_to_string(&pa.netron_json).unwrap(), netron::render(&g));
    std::fs::remove_dir_all(&base).unwrap();
}

#[test]
fn model_bin_holds_every_static_buffer_the_cpp_references() {
    let g = graph();
    let lib = model_cpp::render(&g, GRAPH).unwrap();
    let mut bin = Vec::new();
    backend_qnn::artifacts::tar::write(&mut bin, &lib.bin_entries).unwrap();
    // Every BINVARSTART(sym) has a `<sym>.raw` member and vice versa (what the lib generator
    // needs to link the buffers).
    let referenced: BTreeSet<String> = lib
        .cpp
        .match_indices("BINVARSTART(")
        .map(|(i, _)| {
            let rest = &lib.cpp[i + "BINVARSTART(".len()..];
            format!("{}.raw", &rest[..rest.find(')').unwrap()])
        })
        .collect();
    let members: BTreeSet<String> = lib.bin_entries.iter().map(|e| e.name.clone()).collect();
    assert_eq!(referenced, members);
    // Members hold the exact static bytes, at the offsets the writer reports.
    let offsets = data_offsets(&lib.bin_entries);
    for t in g.tensors.iter().filter(|t| t.tensor_type == TensorType::Static) {
        let data = t.data.as_ref().unwrap().bytes();
        let k = lib
            .bin_entries
            .iter()
            .position(|e| e.data.bytes() == data && e.name.starts_with(&t.name.replace('.', "_")))
            .unwrap_or_else(|| panic!("no member for {}", t.name));
        let off = offsets[k] as usize;
        assert_eq!(&bin[off..off + data.len()], data, "{}", t.name);
    }
    // One addTensor per graph input and static tensor, one addNode per node.
    let statics = g.tensors.iter().filter(|t| t.tensor_type == TensorType::Static).count();
    assert_eq!(lib.cpp.matches("VALIDATE(addTensor_").count(), g.inputs.len() + statics);
    assert_eq!(lib.cpp.matches("VALIDATE(addNode_").count(), g.nodes.len());
    assert_eq!(lib.cpp.matches("model.addNode(QNN_OPCONFIG_VERSION_1").count(), g.nodes.len());
}

#[test]
fn netron_json_describes_every_tensor_and_node() {
    let g = graph();
    let doc: serde_json::Value = serde_json::from_str(&netron::render(&g)).unwrap();
    let tensors = doc["graph"]["tensors"].as_object().unwrap();
    let nodes = doc["graph"]["nodes"].as_object().unwrap();
    assert_eq!(tensors.len(), g.tensors.len());
    assert_eq!(nodes.len(), g.nodes.len());
    for t in &g.tensors {
        let j = &tensors[&t.name];
        assert_eq!(j["type"], t.tensor_type.raw());
        assert_eq!(j["data_type"], t.dtype.raw());
        assert_eq!(j["quant_params"]["encoding"], t.encoding.raw());
        assert_eq!(j["dims"].as_array().unwrap().len(), t.dims.len());
    }
    for n in &g.nodes {
        let j = &nodes[&n.name];
        assert_eq!(j["type"], n.op_type.as_str());
        assert_eq!(j["package"], "qti.aisw");
        let inputs: Vec<&str> = j["input_names"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
        assert_eq!(inputs, n.inputs.iter().map(String::as_str).collect::<Vec<_>>());
    }
    // Graph inputs are APP_WRITE (0) and outputs APP_READ (1) in the JSON.
    assert_eq!(tensors["input_ids"]["type"], 0);
    assert_eq!(tensors["logits"]["type"], 1);
    // The LPBQ weight carries its blockwise parameters.
    let bw = &tensors["model.layers.0.self_attn.q_proj.weight"]["quant_params"]["blockwise_expansion"];
    assert_eq!(bw["axis"], 3);
    assert_eq!(bw["num_blocks_per_axis"], 2);
    assert_eq!(bw["block_scale_bitwidth"], 4);
    // Tensor params are inlined with their data, shaped like their dims.
    let pad = &nodes["model.layers.0.self_attn.q_proj"]["tensor_params"]["pad_amount"]
        ["model.layers.0.self_attn.q_proj.pad_amount"];
    assert_eq!(pad["data"], serde_json::json!([[0, 0], [0, 0]]));
}

#[test]
fn invalid_graphs_and_names_are_rejected() {
    let dir = std::env::temp_dir();
    let mut g = graph();
    g.outputs.clear();
    assert!(matches!(write_graph_artifacts(&g, &dir), Err(ArtifactError::Invalid(_))));
    let mut g = graph();
    g.name = "a/b".into();
    assert!(matches!(write_graph_artifacts(&g, &dir), Err(ArtifactError::FileName { .. })));
    let missing = dir.join(format!("backend-qnn-missing-{}", std::process::id())).join("x");
    let err = write_graph_artifacts(&graph(), &missing).unwrap_err();
    assert!(
        matches!(&err, ArtifactError::File(mllm_dsl::files::FileError::Io { path, .. }) if path.starts_with(&missing)),
        "{err}"
    );
}

/// The graphs of one context binary (a family, a shard's chunk sizes) share one model.bin that
/// holds every static buffer once; graphs whose buffers of one name differ cannot share it.
#[test]
fn graphs_of_one_context_share_one_model_bin() {
    let (a, b) = (common::tiny_attention("model.0.s4"), common::tiny_attention("model.0.s1"));
    let base = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("shared-model-bin");
    let _ = std::fs::remove_dir_all(&base);
    let (dir, fresh) = (base.join("ok"), base.join("refused"));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::create_dir_all(&fresh).unwrap();
    let shared = write_shared_artifacts(&[&a, &b], &dir, "weights").unwrap();
    assert_eq!(shared.model_bin, dir.join("weights.bin"));
    let own = model_cpp::render(&a, "model.0.s4").unwrap().bin_entries;
    let statics: u64 = own.iter().map(|e| e.data.len() as u64).sum();
    assert_eq!(shared.buffer_bytes, statics, "each buffer once, not once per graph");
    let listing = std::process::Command::new("tar").arg("-tf").arg(&shared.model_bin).output().unwrap();
    assert!(listing.status.success());
    let members: BTreeSet<String> = String::from_utf8(listing.stdout).unwrap().lines().map(String::from).collect();
    assert_eq!(members, own.iter().map(|e| e.name.clone()).collect::<BTreeSet<_>>());
    for (g, paths) in [&a, &b].iter().zip(&shared.graphs) {
        assert_eq!(paths.model_bin, shared.model_bin);
        let cpp = std::fs::read_to_string(&paths.model_cpp).unwrap();
        assert!(cpp.contains(&format!("-c {}.cpp -b weights.bin", g.name)), "{}", &cpp[..400]);
        let json: serde_json::Value = serde_json::from_slice(&std::fs::read(&paths.netron_json).unwrap()).unwrap();
        assert_eq!(json["model.bin"], "weights.bin");
    }
    assert!(!dir.join("model.0.s4.bin").exists());

    // One buffer changed in the second graph: refused naming both graphs and the buffer, and
    // nothing is written.
    let mut c = b.clone();
    let t = c.tensors.iter_mut().find(|t| t.tensor_type == TensorType::Static).unwrap();
    let mut bytes = t.data.as_ref().unwrap().bytes().to_vec();
    bytes[0] ^= 1;
    t.data = Some(StaticData::new(bytes));
    let err = write_shared_artifacts(&[&a, &c], &fresh, "weights").unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, ArtifactError::SharedBuffer { .. }), "{text}");
    assert!(text.contains("model.0.s4") && text.contains("model.0.s1") && text.contains(".raw"), "{text}");
    assert_eq!(std::fs::read_dir(&fresh).unwrap().count(), 0);
}

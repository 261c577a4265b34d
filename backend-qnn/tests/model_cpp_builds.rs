//! Compiles the generated `model.cpp`, links the `model.bin` members the way the lib generator
//! does (`tar -x`, then `ld -r -b binary obj/binary/<sym>.raw`), runs it against a stand-in
//! `QnnModel` that prints what it receives (tests/cpp_harness), and compares every tensor, param
//! and node with the graph. g++, ld and tar are required: a missing one fails the test, naming it
//! (`.ci/run` installs them; on Debian: `apt-get install g++ binutils tar`).

mod common;

use std::path::Path;
use std::process::Command;

use backend_qnn::artifacts::symbols::fnv1a;
use backend_qnn::artifacts::write_graph_artifacts;
use backend_qnn::encoding::BlockScales;
use backend_qnn::{Encoding, Param, QnnGraph, QnnTensor, Scalar};

/// Fails naming `tool` when it cannot be run.
fn require(tool: &str) {
    let ok = Command::new(tool).arg("--version").output().is_ok_and(|o| o.status.success());
    assert!(ok, "`{tool} --version` did not run: this test builds the generated model library with g++, ld and tar");
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn scale_offsets_fnv(list: &[backend_qnn::ScaleOffset]) -> u64 {
    let bytes: Vec<u8> =
        list.iter().flat_map(|so| so.scale.to_le_bytes().into_iter().chain(so.offset.to_le_bytes())).collect();
    fnv1a(&bytes)
}

/// The line the harness prints for a tensor (after its tag).
fn tensor_line(t: &QnnTensor) -> String {
    let dims: Vec<String> = t.dims.iter().map(|d| d.to_string()).collect();
    let mut s = format!(
        "{} type={} dtype={} dims={} def={} enc={}",
        t.name,
        t.tensor_type.raw(),
        t.dtype.raw(),
        dims.join(","),
        t.encoding.definition(),
        t.encoding.raw()
    );
    match &t.encoding {
        Encoding::Undefined => {}
        Encoding::ScaleOffset(so) => s += &format!(" so={:08x}/{}", so.scale.to_bits(), so.offset),
        Encoding::AxisScaleOffset { axis, scale_offsets } => {
            s += &format!(" axis={axis} n={} so_fnv={:016x}", scale_offsets.len(), scale_offsets_fnv(scale_offsets))
        }
        Encoding::BlockwiseExpansion(bw) => {
            let storage = match bw.block_scales {
                BlockScales::U8(_) => 0,
                BlockScales::U16(_) => 1,
            };
            s += &format!(
                " bw_axis={} nb={} bits={} storage={storage} so_fnv={:016x} scales_fnv={:016x}",
                bw.axis,
                bw.num_blocks_per_axis,
                bw.block_scale_bitwidth,
                scale_offsets_fnv(&bw.scale_offsets),
                fnv1a(&bw.block_scales.to_le_bytes())
            )
        }
    }
    if let Some(d) = &t.data {
        s += &format!(" size={} data_fnv={:016x}", d.len(), fnv1a(d.bytes()));
    }
    s
}

fn scalar_bits(s: &Scalar) -> u64 {
    match *s {
        Scalar::Float32(v) => u64::from(v.to_bits()),
        Scalar::Float64(v) => v.to_bits(),
        Scalar::UInt64(v) => v,
        other => {
            let width = other.dtype().bit_width();
            let v = other.as_i64().unwrap() as u64;
            if width == 64 {
                v
            } else {
                v & ((1u64 << width) - 1)
            }
        }
    }
}

/// What the harness should print for `graph`, in emission order.
fn expected(graph: &QnnGraph) -> Vec<String> {
    let index = graph.tensor_index();
    let t = |n: &str| &graph.tensors[index[n]];
    let mut lines = vec![format!("G {} validate=1", graph.name)];
    let mut added = std::collections::HashSet::new();
    for name in &graph.inputs {
        lines.push(format!("T {}", tensor_line(t(name))));
        added.insert(name.clone());
    }
    for node in &graph.nodes {
        for name in &node.inputs {
            if t(name).data.is_some() && added.insert(name.clone()) {
                lines.push(format!("T {}", tensor_line(t(name))));
            }
        }
        lines.push(format!("N {} {} {} in={}", node.name, node.package, node.op_type, node.inputs.join(",")));
        for (pname, p) in &node.params {
            lines.push(match p {
                Param::Scalar(s) => format!("S {pname} dtype={} value={:x}", s.dtype().raw(), scalar_bits(s)),
                Param::Tensor(pt) => format!("P {pname}  {}", tensor_line(pt)),
            });
        }
        for name in &node.outputs {
            lines.push(format!("O {}", tensor_line(t(name))));
        }
    }
    lines.push("E 1".into());
    lines
}

#[test]
fn generated_model_cpp_compiles_links_and_hands_qnnmodel_the_graph() {
    for tool in ["g++", "ld", "tar"] {
        require(tool);
    }
    let graph = common::tiny_attention("tiny_attention");
    let dir = std::env::temp_dir().join(format!("backend-qnn-model-lib-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("obj/binary")).unwrap();
    let paths = write_graph_artifacts(&graph, &dir).unwrap();

    // model.bin -> obj/binary/<sym>.raw -> one relocatable object per member.
    run(Command::new("tar").arg("-xf").arg(&paths.model_bin).arg("-C").arg(dir.join("obj/binary")));
    let mut objects = Vec::new();
    let mut members: Vec<_> = std::fs::read_dir(dir.join("obj/binary"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    members.sort();
    for m in &members {
        let obj = format!("{m}.o");
        run(Command::new("ld")
            .current_dir(&dir)
            .args(["-r", "-b", "binary", "-o", &obj])
            .arg(Path::new("obj/binary").join(m)));
        objects.push(dir.join(obj));
    }
    let harness = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/cpp_harness");
    let exe = dir.join("model_lib_harness");
    run(Command::new("g++")
        .args(["-std=c++20", "-Wall", "-Werror", "-Wno-unused-parameter", "-o"])
        .arg(&exe)
        .arg("-I")
        .arg(&harness)
        .arg(&paths.model_cpp)
        .arg(harness.join("harness.cpp"))
        .args(&objects));
    let printed = run(&mut Command::new(&exe));
    let got: Vec<&str> = printed.lines().collect();
    let want = expected(&graph);
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g, w, "line {i}");
    }
    assert_eq!(got.len(), want.len());
    std::fs::remove_dir_all(&dir).unwrap();
}

//! `<graph>.json` in the QNN net.json schema (what the converter writes as `model_net.json` and
//! what QNN Netron opens), following the layout of onnxruntime's QNN JSON dumper
//! (Qualcomm's qnn-model-lib-generator docs):
//!
//! ```text
//! { "model.cpp", "model.bin", "converter_command", "copyright_str", "op_types": [..],
//!   "Total parameters", "Total MACs per inference",
//!   "graph": { "tensors": { name: tensor }, "nodes": { name: node } } }
//! tensor: { "id", "type", "dataFormat", "data_type", "dims", "quant_params",
//!           "axis_format", "src_axis_format", ["params_count" for STATIC] }
//! node:   { "package", "type", "input_names", "output_names",
//!           "scalar_params": { name: { "<dtype value>": v } },
//!           "tensor_params": { name: { tensor_name: tensor + "data" } }, "macs_per_inference" }
//! ```
//!
//! `quant_params` always carries `definition`, `encoding` and `scale_offset` (zeros unless the
//! encoding is SCALE_OFFSET); per-axis encodings add `axis_scale_offset {axis,
//! num_scale_offsets, scale_offsets}` as the converter's JSON does, and blockwise expansion adds
//! `blockwise_expansion {axis, num_scale_offsets, scale_offsets, num_blocks_per_axis,
//! block_scale_bitwidth, block_scale_storage_type, num_block_scales}`; weight and block-scale
//! bytes are counted, not inlined (they live in model.bin). Tensor `id` is the tensor's
//! position in the graph (the QNN id only exists after `tensorCreateGraphTensor`). Keys are
//! sorted, so the output is byte-for-byte deterministic.

use crate::dtype::DataType;
use crate::encoding::{Encoding, ScaleOffset};
use crate::graph::{Param, QnnGraph, QnnTensor, Scalar};
use crate::json::Json;

use super::summary;

/// Render the net.json document of a (validated) graph.
pub fn render(graph: &QnnGraph) -> String {
    render_with_bin(graph, &format!("{}.bin", graph.name))
}

/// [`render`] for a graph whose static buffers live in `bin_file`, shared with the other graphs
/// of its context binary.
pub fn render_with_bin(graph: &QnnGraph, bin_file: &str) -> String {
    let index = graph.tensor_index();
    let mut op_types: Vec<&str> = graph.nodes.iter().map(|n| n.op_type.as_str()).collect();
    op_types.sort_unstable();
    op_types.dedup();

    let tensors =
        graph.tensors.iter().enumerate().map(|(id, t)| (t.name.clone(), tensor_json(t, id, false))).collect::<Vec<_>>();
    let nodes = graph
        .nodes
        .iter()
        .map(|n| {
            let mut scalar_params = Vec::new();
            let mut tensor_params = Vec::new();
            for (name, p) in &n.params {
                match p {
                    Param::Scalar(s) => {
                        scalar_params.push((name.clone(), Json::obj([(s.dtype().raw().to_string(), scalar_json(s))])))
                    }
                    Param::Tensor(t) => {
                        tensor_params.push((name.clone(), Json::obj([(t.name.clone(), tensor_json(t, 0, true))])))
                    }
                }
            }
            let macs = summary::node_macs(n, graph, &index);
            (
                n.name.clone(),
                Json::obj([
                    ("package", Json::str(&n.package)),
                    ("type", Json::str(n.op_type.as_str())),
                    ("input_names", names(&n.inputs)),
                    ("output_names", names(&n.outputs)),
                    ("scalar_params", Json::Obj(scalar_params)),
                    ("tensor_params", Json::Obj(tensor_params)),
                    ("macs_per_inference", Json::str(macs.to_string())),
                ]),
            )
        })
        .collect::<Vec<_>>();
    let s = summary::summarize(graph);
    Json::obj([
        ("model.cpp", Json::str(format!("{}.cpp", graph.name))),
        ("model.bin", Json::str(bin_file)),
        ("converter_command", Json::str("mllm-dsl backend-qnn")),
        ("copyright_str", Json::str("")),
        ("op_types", Json::Arr(op_types.into_iter().map(Json::str).collect())),
        ("Total parameters", Json::str(s.parameters.to_string())),
        ("Total MACs per inference", Json::str(s.macs.to_string())),
        ("graph", Json::obj([("tensors", Json::Obj(tensors)), ("nodes", Json::Obj(nodes))])),
    ])
    .to_pretty(4)
}

fn names(list: &[String]) -> Json {
    Json::Arr(list.iter().map(Json::str).collect())
}

fn scalar_json(s: &Scalar) -> Json {
    match *s {
        Scalar::Float32(v) => Json::F32(v),
        Scalar::Float64(v) => Json::F64(v),
        Scalar::UInt64(v) => i64::try_from(v).map_or(Json::F64(v as f64), Json::Int),
        // Bool is written as 0/1 like the reference dumper.
        _ => Json::Int(s.as_i64().unwrap_or(0)),
    }
}

fn scale_offset_json(so: &ScaleOffset) -> Json {
    Json::obj([("scale", Json::F32(so.scale)), ("offset", Json::Int(so.offset.into()))])
}

fn quant_json(enc: &Encoding) -> Json {
    let zero = ScaleOffset { scale: 0.0, offset: 0 };
    let mut pairs = vec![
        ("definition".to_string(), Json::Int(enc.definition().into())),
        ("encoding".to_string(), Json::Int(enc.raw().into())),
    ];
    match enc {
        Encoding::Undefined => pairs.push(("scale_offset".into(), scale_offset_json(&zero))),
        Encoding::ScaleOffset(so) => pairs.push(("scale_offset".into(), scale_offset_json(so))),
        Encoding::AxisScaleOffset { axis, scale_offsets } => {
            pairs.push(("scale_offset".into(), scale_offset_json(&zero)));
            pairs.push((
                "axis_scale_offset".into(),
                Json::obj([
                    ("axis", Json::Int((*axis).into())),
                    ("num_scale_offsets", Json::Int(scale_offsets.len() as i64)),
                    ("scale_offsets", Json::Arr(scale_offsets.iter().map(scale_offset_json).collect())),
                ]),
            ));
        }
        Encoding::BlockwiseExpansion(bw) => {
            pairs.push(("scale_offset".into(), scale_offset_json(&zero)));
            pairs.push((
                "blockwise_expansion".into(),
                Json::obj([
                    ("axis", Json::Int(bw.axis.into())),
                    ("num_scale_offsets", Json::Int(bw.scale_offsets.len() as i64)),
                    ("scale_offsets", Json::Arr(bw.scale_offsets.iter().map(scale_offset_json).collect())),
                    ("num_blocks_per_axis", Json::Int(bw.num_blocks_per_axis.into())),
                    ("block_scale_bitwidth", Json::Int(bw.block_scale_bitwidth.into())),
                    ("block_scale_storage_type", Json::Int(bw.block_scales.storage_type().into())),
                    ("num_block_scales", Json::Int(bw.block_scales.len() as i64)),
                ]),
            ));
        }
    }
    Json::Obj(pairs)
}

fn tensor_json(t: &QnnTensor, id: usize, with_data: bool) -> Json {
    let mut pairs = vec![
        ("id".to_string(), Json::Int(id as i64)),
        ("type".to_string(), Json::Int(t.tensor_type.raw().into())),
        ("dataFormat".to_string(), Json::Int(0)),
        ("data_type".to_string(), Json::Int(t.dtype.raw().into())),
        ("dims".to_string(), Json::Arr(t.dims.iter().map(|&d| Json::Int(d.into())).collect())),
        ("quant_params".to_string(), quant_json(&t.encoding)),
        ("axis_format".to_string(), Json::str("NOT_YET_DEFINED")),
        ("src_axis_format".to_string(), Json::str("NOT_YET_DEFINED")),
    ];
    if let Some(data) = &t.data {
        if with_data {
            pairs.push(("data".into(), data_json(t.dtype, &t.dims, data.bytes())));
        } else {
            pairs.push(("params_count".into(), Json::str(t.numel().to_string())));
        }
    }
    Json::Obj(pairs)
}

/// Static bytes as nested arrays shaped like `dims` (param tensors are small 32-bit tensors).
fn data_json(dtype: DataType, dims: &[u32], bytes: &[u8]) -> Json {
    let flat: Vec<Json> = match dtype {
        DataType::Float32 => {
            bytes.chunks_exact(4).map(|c| Json::F32(f32::from_le_bytes([c[0], c[1], c[2], c[3]]))).collect()
        }
        DataType::Int32 => {
            bytes.chunks_exact(4).map(|c| Json::Int(i32::from_le_bytes([c[0], c[1], c[2], c[3]]).into())).collect()
        }
        DataType::UInt32 => {
            bytes.chunks_exact(4).map(|c| Json::Int(u32::from_le_bytes([c[0], c[1], c[2], c[3]]).into())).collect()
        }
        DataType::Bool8 | DataType::UInt8 => bytes.iter().map(|&b| Json::Int(b.into())).collect(),
        DataType::Int8 => bytes.iter().map(|&b| Json::Int((b as i8).into())).collect(),
        // Other types do not occur as params of the modelled ops.
        _ => return Json::Arr(Vec::new()),
    };
    nest(flat, dims)
}

fn nest(flat: Vec<Json>, dims: &[u32]) -> Json {
    match dims {
        [] | [_] => Json::Arr(flat),
        [_, rest @ ..] => {
            let chunk: usize = rest.iter().map(|&d| d as usize).product::<usize>().max(1);
            let mut items = flat.into_iter();
            let mut rows = Vec::new();
            loop {
                let row: Vec<Json> = items.by_ref().take(chunk).collect();
                if row.is_empty() {
                    break;
                }
                rows.push(nest(row, rest));
            }
            Json::Arr(rows)
        }
    }
}

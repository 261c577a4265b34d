//! Lowered [`QnnGraph`]s as the SDK layer's [`GraphDesc`]s.
//!
//! The two models stay separate on purpose (the SDK layer is testable on its own, see
//! [`desc`](super::desc)), but share their data types, tensor types and scale/offset pairs;
//! this module maps the rest field by field. Static data is the same
//! [`StaticData`](crate::graph::StaticData) type on both sides, so its handles are cloned, never
//! copied: graphs sharing a weight buffer still share it.

use thiserror::Error;

use super::desc::{BlockwiseExpansion, Encoding, GraphDesc, OpDesc, ParamDesc, ParamValue, Scalar, TensorDesc};
use crate::encoding::{BlockScales, Encoding as GraphEncoding};
use crate::graph::{Param, QnnGraph, QnnTensor, Scalar as GraphScalar};

/// A lowered graph uses something the SDK descriptors cannot carry.
#[derive(Debug, Clone, PartialEq, Error)]
#[error("graph `{graph}`: tensor `{tensor}`: {detail}")]
pub struct ConvertError {
    pub graph: String,
    pub tensor: String,
    pub detail: String,
}

/// Converts `graphs` (in order) into SDK graph descriptions.
pub fn graph_descs(graphs: &[QnnGraph]) -> Result<Vec<GraphDesc>, ConvertError> {
    graphs.iter().map(graph_desc).collect()
}

fn graph_desc(g: &QnnGraph) -> Result<GraphDesc, ConvertError> {
    let tensors = g.tensors.iter().map(|t| tensor(g, t)).collect::<Result<Vec<_>, _>>()?;
    let mut nodes = Vec::with_capacity(g.nodes.len());
    for n in &g.nodes {
        let mut params = Vec::with_capacity(n.params.len());
        for (name, p) in &n.params {
            let value = match p {
                Param::Scalar(s) => ParamValue::Scalar(scalar(*s)),
                Param::Tensor(t) => ParamValue::Tensor(tensor(g, t)?),
            };
            params.push(ParamDesc { name: name.clone(), value });
        }
        nodes.push(OpDesc {
            name: n.name.clone(),
            package: n.package.clone(),
            op_type: n.op_type.as_str().to_string(),
            params,
            inputs: n.inputs.clone(),
            outputs: n.outputs.clone(),
        });
    }
    Ok(GraphDesc { name: g.name.clone(), tensors, inputs: g.inputs.clone(), outputs: g.outputs.clone(), nodes })
}

fn tensor(g: &QnnGraph, t: &QnnTensor) -> Result<TensorDesc, ConvertError> {
    let encoding = match &t.encoding {
        GraphEncoding::Undefined => Encoding::Undefined,
        GraphEncoding::ScaleOffset(so) => Encoding::ScaleOffset(*so),
        GraphEncoding::AxisScaleOffset { axis, scale_offsets } => {
            Encoding::AxisScaleOffset { axis: *axis, scale_offsets: scale_offsets.to_vec() }
        }
        GraphEncoding::BlockwiseExpansion(bw) => {
            let BlockScales::U8(scales) = &bw.block_scales else {
                return Err(ConvertError {
                    graph: g.name.clone(),
                    tensor: t.name.clone(),
                    detail: "16-bit block scales (blocksScale16) are not supported by the SDK descriptors".into(),
                });
            };
            Encoding::BlockwiseExpansion(BlockwiseExpansion {
                axis: bw.axis,
                scale_offsets: bw.scale_offsets.to_vec(),
                num_blocks_per_axis: bw.num_blocks_per_axis,
                block_scale_bitwidth: bw.block_scale_bitwidth,
                block_scales: scales.to_vec(),
            })
        }
    };
    Ok(TensorDesc {
        name: t.name.clone(),
        tensor_type: t.tensor_type,
        dtype: t.dtype,
        dims: t.dims.clone(),
        encoding,
        data: t.data.clone(),
    })
}

fn scalar(s: GraphScalar) -> Scalar {
    match s {
        GraphScalar::Bool8(v) => Scalar::Bool(v),
        GraphScalar::Int8(v) => Scalar::I8(v),
        GraphScalar::Int16(v) => Scalar::I16(v),
        GraphScalar::Int32(v) => Scalar::I32(v),
        GraphScalar::Int64(v) => Scalar::I64(v),
        GraphScalar::UInt8(v) => Scalar::U8(v),
        GraphScalar::UInt16(v) => Scalar::U16(v),
        GraphScalar::UInt32(v) => Scalar::U32(v),
        GraphScalar::UInt64(v) => Scalar::U64(v),
        GraphScalar::Float32(v) => Scalar::F32(v),
        GraphScalar::Float64(v) => Scalar::F64(v),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::{DataType, TensorType};
    use crate::encoding::{BlockwiseExpansion as GraphBw, ScaleOffset};
    use crate::graph::{GraphBuilder, StaticData};
    use crate::opdef::OpType;

    fn graph(name: &str, weight: &StaticData, block_scales: BlockScales) -> QnnGraph {
        let mut b = GraphBuilder::new(name);
        let x = b.input("x", DataType::UFixedPoint16, &[1, 1, 2, 4], GraphEncoding::from_zero_point(0.01, 3));
        let enc = GraphEncoding::BlockwiseExpansion(GraphBw {
            axis: 3,
            scale_offsets: vec![ScaleOffset { scale: 0.5, offset: 0 }; 2].into(),
            num_blocks_per_axis: 2,
            block_scale_bitwidth: 4,
            block_scales,
        });
        let w = b.static_tensor("w", DataType::SFixedPoint4, &[1, 1, 4, 2], enc, weight.clone());
        let y = b
            .node("conv", OpType::Conv2d)
            .input(&x)
            .input(&w)
            .tensor_param_u32("stride", &[2], &[1, 1])
            .tensor_param_u32("pad_amount", &[2, 2], &[0; 4])
            .scalar("group", GraphScalar::UInt32(1))
            .output("y", DataType::UFixedPoint16, &[1, 1, 2, 2], GraphEncoding::from_zero_point(0.02, 5))
            .finish_one();
        b.mark_output(&y);
        b.finish().unwrap()
    }

    #[test]
    fn fields_map_one_to_one_and_buffers_are_shared() {
        let weight = StaticData::new(vec![1u8; 8]);
        let scales = BlockScales::U8(vec![1, 2, 3, 4].into());
        let descs = graph_descs(&[graph("a", &weight, scales.clone()), graph("b", &weight, scales)]).unwrap();
        let (a, b) = (&descs[0], &descs[1]);
        assert_eq!((a.inputs.clone(), a.outputs.clone()), (vec!["x".to_string()], vec!["y".to_string()]));
        let w = a.tensors.iter().find(|t| t.name == "w").unwrap();
        assert_eq!(
            (w.tensor_type, w.dtype, w.dims.clone()),
            (TensorType::Static, DataType::SFixedPoint4, vec![1, 1, 4, 2])
        );
        let Encoding::BlockwiseExpansion(bw) = &w.encoding else { panic!() };
        assert_eq!((bw.axis, bw.num_blocks_per_axis, bw.block_scales.clone()), (3, 2, vec![1, 2, 3, 4]));
        let wb = b.tensors.iter().find(|t| t.name == "w").unwrap();
        assert!(
            w.data.as_ref().unwrap().shares_buffer_with(wb.data.as_ref().unwrap()),
            "one SDK handle per weight buffer"
        );
        let conv = &a.nodes[0];
        assert_eq!((conv.op_type.as_str(), conv.package.as_str()), ("Conv2d", "qti.aisw"));
        assert_eq!(conv.params[2], ParamDesc { name: "group".into(), value: ParamValue::Scalar(Scalar::U32(1)) });
        let ParamValue::Tensor(stride) = &conv.params[0].value else { panic!() };
        assert_eq!(
            (stride.name.as_str(), stride.data.as_ref().unwrap().bytes()),
            ("conv.stride", &[1, 0, 0, 0, 1, 0, 0, 0][..])
        );
        crate::sdk::check_graphs(&descs).unwrap();
    }

    #[test]
    fn sixteen_bit_block_scales_are_refused_by_name() {
        let g = graph("a", &StaticData::new(vec![1u8; 8]), BlockScales::U16(vec![1, 2, 3, 4].into()));
        let err = graph_descs(&[g]).unwrap_err();
        assert_eq!((err.graph.as_str(), err.tensor.as_str()), ("a", "w"));
        assert!(err.to_string().contains("blocksScale16"), "{err}");
    }
}

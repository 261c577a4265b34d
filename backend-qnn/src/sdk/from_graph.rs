//! A lowered [`QnnGraph`] as the SDK layer's [`GraphDesc`], so the graphs the lowering produces
//! can be compiled into a context binary.
//!
//! The two models carry the same facts (the SDK layer is kept independent of the lowering so it
//! can be tested on its own); this is the one place that maps between them. Static bytes are
//! shared, not copied.

use super::desc::{
    BlockwiseExpansion, Encoding, GraphDesc, OpDesc, ParamDesc, ParamValue, Scalar, StaticData, TensorDesc, TensorError,
};
use crate::encoding::{self, BlockScales};
use crate::graph::{self, QnnGraph, QnnTensor};

impl TryFrom<&QnnGraph> for GraphDesc {
    type Error = TensorError;

    fn try_from(g: &QnnGraph) -> Result<GraphDesc, TensorError> {
        let nodes = g
            .nodes
            .iter()
            .map(|n| {
                let params = n
                    .params
                    .iter()
                    .map(|(name, p)| {
                        let value = match p {
                            graph::Param::Scalar(s) => ParamValue::Scalar(scalar(*s)),
                            graph::Param::Tensor(t) => ParamValue::Tensor(tensor(t)?),
                        };
                        Ok(ParamDesc { name: name.clone(), value })
                    })
                    .collect::<Result<Vec<_>, TensorError>>()?;
                Ok(OpDesc {
                    name: n.name.clone(),
                    package: n.package.clone(),
                    op_type: n.op_type.as_str().to_string(),
                    params,
                    inputs: n.inputs.clone(),
                    outputs: n.outputs.clone(),
                })
            })
            .collect::<Result<Vec<_>, TensorError>>()?;
        Ok(GraphDesc {
            name: g.name.clone(),
            tensors: g.tensors.iter().map(tensor).collect::<Result<_, _>>()?,
            inputs: g.inputs.clone(),
            outputs: g.outputs.clone(),
            nodes,
        })
    }
}

fn tensor(t: &QnnTensor) -> Result<TensorDesc, TensorError> {
    let encoding = match &t.encoding {
        encoding::Encoding::Undefined => Encoding::Undefined,
        encoding::Encoding::ScaleOffset(so) => Encoding::ScaleOffset(*so),
        encoding::Encoding::AxisScaleOffset { axis, scale_offsets } => {
            Encoding::AxisScaleOffset { axis: *axis, scale_offsets: scale_offsets.to_vec() }
        }
        encoding::Encoding::BlockwiseExpansion(bw) => {
            let BlockScales::U8(block_scales) = &bw.block_scales else {
                return Err(TensorError {
                    tensor: t.name.clone(),
                    problem: "16-bit block-scale storage (blocksScale16) is not supported by the SDK layer".into(),
                });
            };
            Encoding::BlockwiseExpansion(BlockwiseExpansion {
                axis: bw.axis,
                scale_offsets: bw.scale_offsets.to_vec(),
                num_blocks_per_axis: bw.num_blocks_per_axis,
                block_scale_bitwidth: bw.block_scale_bitwidth,
                block_scales: block_scales.to_vec(),
            })
        }
    };
    Ok(TensorDesc {
        name: t.name.clone(),
        tensor_type: t.tensor_type,
        dtype: t.dtype,
        dims: t.dims.clone(),
        encoding,
        data: t.data.as_ref().map(|d| StaticData::from_owner(d.shared())),
    })
}

fn scalar(s: graph::Scalar) -> Scalar {
    match s {
        graph::Scalar::Bool8(v) => Scalar::Bool(v),
        graph::Scalar::Int8(v) => Scalar::I8(v),
        graph::Scalar::Int16(v) => Scalar::I16(v),
        graph::Scalar::Int32(v) => Scalar::I32(v),
        graph::Scalar::Int64(v) => Scalar::I64(v),
        graph::Scalar::UInt8(v) => Scalar::U8(v),
        graph::Scalar::UInt16(v) => Scalar::U16(v),
        graph::Scalar::UInt32(v) => Scalar::U32(v),
        graph::Scalar::UInt64(v) => Scalar::U64(v),
        graph::Scalar::Float32(v) => Scalar::F32(v),
        graph::Scalar::Float64(v) => Scalar::F64(v),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::{DataType, TensorType};
    use crate::encoding::ScaleOffset;
    use crate::graph::{GraphBuilder, StaticData as GraphData};
    use crate::opdef::OpType;

    #[test]
    fn a_lowered_graph_maps_field_for_field() {
        let mut b = GraphBuilder::new("g");
        let enc = encoding::Encoding::scale_offset(0.5, -3);
        let x = b.input("x", DataType::UFixedPoint16, &[1, 4], enc.clone());
        let w = b.static_tensor("w", DataType::UFixedPoint16, &[1, 4], enc.clone(), GraphData::from_u16(&[1, 2, 3, 4]));
        b.node("add", OpType::ElementWiseAdd)
            .input(&x)
            .input(&w)
            .graph_output("y", DataType::UFixedPoint16, &[1, 4], enc)
            .finish();
        let g = b.finish().unwrap();
        let d = GraphDesc::try_from(&g).unwrap();
        assert_eq!((d.name.as_str(), d.inputs.clone(), d.outputs.clone()), ("g", vec!["x".into()], vec!["y".into()]));
        assert_eq!(d.tensors.len(), g.tensors.len());
        let wd = d.tensors.iter().find(|t| t.name == "w").unwrap();
        assert_eq!(wd.tensor_type, TensorType::Static);
        assert_eq!(wd.encoding, Encoding::ScaleOffset(ScaleOffset { scale: 0.5, offset: -3 }));
        assert_eq!(wd.data.as_ref().unwrap().as_bytes(), g.tensor("w").unwrap().data.as_ref().unwrap().bytes());
        assert_eq!(d.nodes[0].op_type, "ElementWiseAdd");
        assert_eq!(d.nodes[0].inputs, ["x", "w"]);
        super::super::driver::check_graphs(&[d]).unwrap();
    }
}

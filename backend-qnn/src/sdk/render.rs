//! The textual call-log format and the fake context binary.
//!
//! One line per QNN call: `function(arguments) -> result`. The format is chosen so that the
//! C mock provider (`tests/cleanroom/mock_provider.c`) can print the same text from the C
//! structs it receives: integers in decimal, floats like C's `%.8e`, enums by their
//! `QnnTypes.h` names, long arrays as a short prefix plus an FNV-1a digest. `tests/sdk_ffi.rs`
//! compares the two logs line by line, which proves the FFI layer passes
//! exactly what the driver asked for.

use std::fmt::Write as _;

use super::api::{BoundParamValue, BoundTensor, OpConfig};
use super::config::{ContextConfig, DeviceConfig, GraphConfig};
use crate::dtype::DataType;
use crate::encoding::{BlockScales, Encoding, ScaleOffset};
use crate::graph::{QnnTensor, Scalar};
use crate::io::{GraphIo, IoTensor};

/// How many leading entries of a long array are printed before `...`.
const PREFIX_LEN: usize = 4;

/// FNV-1a, 64 bit: a digest both Rust and C compute in a few lines.
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3))
}

/// Formats like C's `printf("%.8e", (double)x)` (glibc): 9 significant digits, exponent with
/// a sign and at least two digits.
pub fn c_exp_f32(x: f32) -> String {
    c_exp(f64::from(x), 8)
}

/// Formats like C's `printf("%.17e", x)`.
pub fn c_exp_f64(x: f64) -> String {
    c_exp(x, 17)
}

fn c_exp(x: f64, precision: usize) -> String {
    if x.is_nan() {
        return if x.is_sign_negative() { "-nan" } else { "nan" }.into();
    }
    if x.is_infinite() {
        return if x < 0.0 { "-inf" } else { "inf" }.into();
    }
    // Rust prints `3.00000000e0`; C prints `3.00000000e+00`. Both round the exact binary
    // value to nearest, ties to even, so only the exponent spelling differs.
    let rust = format!("{x:.precision$e}");
    let (mantissa, exponent) = rust.split_once('e').expect("`{:e}` output has an exponent");
    let exponent: i32 = exponent.parse().expect("`{:e}` exponent is an integer");
    let sign = if exponent < 0 { '-' } else { '+' };
    format!("{mantissa}e{sign}{:02}", exponent.unsigned_abs())
}

fn scale_offsets_bytes(entries: &[ScaleOffset]) -> Vec<u8> {
    // The in-memory layout of `Qnn_ScaleOffset_t[]` on little-endian targets.
    entries.iter().flat_map(|so| so.scale.to_le_bytes().into_iter().chain(so.offset.to_le_bytes())).collect()
}

fn write_list<T>(out: &mut String, items: &[T], mut item: impl FnMut(&mut String, &T)) {
    out.push('[');
    for (i, entry) in items.iter().take(PREFIX_LEN).enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        item(out, entry);
    }
    if items.len() > PREFIX_LEN {
        out.push_str(", ...");
    }
    out.push(']');
}

fn write_scale_offsets(out: &mut String, entries: &[ScaleOffset]) {
    let _ = write!(out, "n={}, ", entries.len());
    write_list(out, entries, |out, so| {
        let _ = write!(out, "({}, {})", c_exp_f32(so.scale), so.offset);
    });
    let _ = write!(out, ", fnv={:016x}", fnv1a64(&scale_offsets_bytes(entries)));
}

/// `none`, `scaleOffset(...)`, `axisScaleOffset(...)` or `blockwiseExpansion(...)`.
pub fn encoding(enc: &Encoding) -> String {
    let mut out = String::new();
    match enc {
        Encoding::Undefined => out.push_str("none"),
        Encoding::ScaleOffset(so) => {
            let _ = write!(out, "scaleOffset({}, {})", c_exp_f32(so.scale), so.offset);
        }
        Encoding::AxisScaleOffset { axis, scale_offsets } => {
            let _ = write!(out, "axisScaleOffset(axis={axis}, ");
            write_scale_offsets(&mut out, scale_offsets);
            out.push(')');
        }
        Encoding::BlockwiseExpansion(bw) => {
            let _ = write!(out, "blockwiseExpansion(axis={}, ", bw.axis);
            write_scale_offsets(&mut out, &bw.scale_offsets);
            let _ = write!(
                out,
                ", blocksPerAxis={}, scaleBitwidth={}, storage={}, blockScales(n={}, ",
                bw.num_blocks_per_axis,
                bw.block_scale_bitwidth,
                match bw.block_scales {
                    BlockScales::U8(_) => 8,
                    BlockScales::U16(_) => 16,
                },
                bw.block_scales.len()
            );
            let scales: Vec<u32> = (0..bw.block_scales.len()).map(|i| bw.block_scales.get(i)).collect();
            write_list(&mut out, &scales, |out, v| {
                let _ = write!(out, "{v}");
            });
            let _ = write!(out, ", fnv={:016x}))", fnv1a64(&bw.block_scales.to_le_bytes()));
        }
    }
    out
}

fn dims(dims: &[u32]) -> String {
    let parts: Vec<String> = dims.iter().map(u32::to_string).collect();
    format!("[{}]", parts.join(","))
}

/// `{name="x", type=APP_WRITE, dtype=..., dims=[..], quant=..., data=...}`.
pub fn tensor(t: &QnnTensor) -> String {
    let data = match &t.data {
        None => "none".to_string(),
        Some(d) => format!("{}B fnv={:016x}", d.len(), fnv1a64(d.bytes())),
    };
    format!(
        "{{name=\"{}\", type={}, dtype={}, dims={}, quant={}, data={}}}",
        t.name,
        t.tensor_type.short_name(),
        t.dtype.short_name(),
        dims(&t.dims),
        encoding(&t.encoding),
        data
    )
}

/// `TYPE value`.
pub fn scalar(s: Scalar) -> String {
    let value = match s {
        Scalar::Bool8(v) => u8::from(v).to_string(),
        Scalar::UInt8(v) => v.to_string(),
        Scalar::Int8(v) => v.to_string(),
        Scalar::UInt16(v) => v.to_string(),
        Scalar::Int16(v) => v.to_string(),
        Scalar::UInt32(v) => v.to_string(),
        Scalar::Int32(v) => v.to_string(),
        Scalar::UInt64(v) => v.to_string(),
        Scalar::Int64(v) => v.to_string(),
        Scalar::Float32(v) => c_exp_f32(v),
        Scalar::Float64(v) => c_exp_f64(v),
    };
    format!("{} {value}", s.dtype().short_name())
}

fn bound(t: &BoundTensor<'_>) -> String {
    format!("{} \"{}\"", t.id, t.tensor.name)
}

/// `{name=.., package=.., type=.., params=[..], inputs=[..], outputs=[..]}`.
pub fn op(op: &OpConfig<'_>) -> String {
    let params: Vec<String> = op
        .params
        .iter()
        .map(|p| match &p.value {
            BoundParamValue::Scalar(s) => format!("{}={}", p.name, scalar(*s)),
            BoundParamValue::Tensor(t) => format!("{}=tensor({})", p.name, bound(t)),
        })
        .collect();
    let inputs: Vec<String> = op.inputs.iter().map(bound).collect();
    let outputs: Vec<String> = op.outputs.iter().map(bound).collect();
    format!(
        "{{name=\"{}\", package=\"{}\", type=\"{}\", params=[{}], inputs=[{}], outputs=[{}]}}",
        op.name,
        op.package,
        op.op_type,
        params.join(", "),
        inputs.join(", "),
        outputs.join(", ")
    )
}

pub fn device_configs(configs: &[DeviceConfig]) -> String {
    let parts: Vec<String> = configs
        .iter()
        .map(|c| match c {
            DeviceConfig::HtpSoc(soc) => format!("htp.soc({soc})"),
            DeviceConfig::HtpSignedPd(on) => format!("htp.signedPd({})", u8::from(*on)),
            DeviceConfig::PlatformInfo(p) => format!(
                "platformInfo(devices=1, cores=1, onChip(vtcmMB={}, soc={}, signedPd={}, dlbc={}, arch={}))",
                p.vtcm_mb,
                p.soc_model,
                u8::from(p.signed_pd_support),
                u8::from(p.dlbc_support),
                p.arch
            ),
        })
        .collect();
    format!("[{}]", parts.join(", "))
}

pub fn context_configs(configs: &[ContextConfig]) -> String {
    let parts: Vec<String> = configs
        .iter()
        .map(|c| match c {
            ContextConfig::HtpWeightSharingEnabled(on) => {
                format!("htp.weightSharingEnabled({})", u8::from(*on))
            }
        })
        .collect();
    format!("[{}]", parts.join(", "))
}

pub fn graph_configs(configs: &[GraphConfig]) -> String {
    let parts: Vec<String> = configs
        .iter()
        .map(|c| match c {
            GraphConfig::HtpOptimization { kind, value } => {
                format!("htp.optimization({}, {})", kind.name(), c_exp_f32(*value))
            }
            GraphConfig::HtpPrecision(p) => format!("htp.precision({})", p.name()),
            GraphConfig::HtpVtcmSizeInMb(mb) => format!("htp.vtcmSizeInMB({mb})"),
            GraphConfig::HtpFoldReluActivationIntoConvOff(on) => {
                format!("htp.foldReluActivationIntoConvOff({})", u8::from(*on))
            }
        })
        .collect();
    format!("[{}]", parts.join(", "))
}

/// A graph as it appears in the fake context binary: its I/O (APP_WRITE / APP_READ tensors in
/// creation order) and node count.
#[derive(Debug, Clone, PartialEq)]
pub struct FakeGraph {
    pub io: GraphIo,
    pub nodes: u32,
}

/// First line of the fake context binary produced by the recording API and the mock provider.
pub const FAKE_BINARY_MAGIC: &str = "QNN-FAKE-CONTEXT-BINARY 2";

/// A deterministic stand-in for a context binary: a text listing of each graph's name, node
/// count and I/O (id, name, dtype, dims and scale/offset), the parts of a real binary's
/// metadata the runtime relies on. One line per tensor:
/// `in|out <id> <name> <DTYPE> <d0>x<d1>.. [<scale %.8e> <offset>]`, with `-` for a tensor
/// that has no id.
pub fn fake_context_binary(graphs: &[FakeGraph]) -> Vec<u8> {
    let mut out = format!("{FAKE_BINARY_MAGIC}\n");
    for g in graphs {
        let _ = writeln!(out, "graph {} nodes={}", g.io.name, g.nodes);
        for (kind, list) in [("in", &g.io.inputs), ("out", &g.io.outputs)] {
            for t in list {
                let d: Vec<String> = t.dims.iter().map(u32::to_string).collect();
                let id = t.id.map_or_else(|| "-".to_string(), |id| id.to_string());
                let _ = write!(out, "{kind} {id} {} {} {}", t.name, t.dtype.short_name(), d.join("x"));
                if let Some(so) = t.quant {
                    let _ = write!(out, " {} {}", c_exp_f32(so.scale), so.offset);
                }
                out.push('\n');
            }
        }
    }
    out.into_bytes()
}

/// The graphs listed by a [`fake_context_binary`]; `None` if `binary` is not one.
pub fn parse_fake_context_binary(binary: &[u8]) -> Option<Vec<FakeGraph>> {
    let text = std::str::from_utf8(binary).ok()?;
    let mut lines = text.lines();
    if lines.next()? != FAKE_BINARY_MAGIC {
        return None;
    }
    let mut graphs: Vec<FakeGraph> = Vec::new();
    for line in lines {
        let fields: Vec<&str> = line.split(' ').collect();
        match fields.as_slice() {
            ["graph", name, nodes] => graphs.push(FakeGraph {
                io: GraphIo { name: name.to_string(), inputs: vec![], outputs: vec![] },
                nodes: nodes.strip_prefix("nodes=")?.parse().ok()?,
            }),
            [kind @ ("in" | "out"), id, name, dtype, dims, quant @ ..] => {
                let quant = match quant {
                    [] => None,
                    [scale, offset] => Some(ScaleOffset { scale: scale.parse().ok()?, offset: offset.parse().ok()? }),
                    _ => return None,
                };
                let dims = if dims.is_empty() {
                    vec![]
                } else {
                    dims.split('x').map(str::parse).collect::<Result<Vec<u32>, _>>().ok()?
                };
                let io = IoTensor {
                    id: if *id == "-" { None } else { Some(id.parse().ok()?) },
                    name: name.to_string(),
                    dtype: DataType::from_short_name(dtype)?,
                    dims,
                    quant,
                };
                let g = &mut graphs.last_mut()?.io;
                if *kind == "in" { &mut g.inputs } else { &mut g.outputs }.push(io);
            }
            _ => return None,
        }
    }
    Some(graphs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn c_style_floats_match_glibc_printf() {
        // Expected strings printed by glibc's printf("%.8e") / ("%.17e") on this machine.
        let cases: [(f32, &str); 8] = [
            (3.0, "3.00000000e+00"),
            (1.0 / 65535.0, "1.52590219e-05"),
            (1e-6, "9.99999997e-07"),
            (0.0, "0.00000000e+00"),
            (-0.0, "-0.00000000e+00"),
            (123_456_789.0, "1.23456792e+08"),
            (1e-40, "9.99994610e-41"),
            (0.1, "1.00000001e-01"),
        ];
        for (x, want) in cases {
            assert_eq!(c_exp_f32(x), want, "{x:?}");
        }
        assert_eq!(c_exp_f64(1e100), "1.00000000000000002e+100");
        assert_eq!(c_exp_f64(0.1), "1.00000000000000006e-01");
        assert_eq!(c_exp_f32(f32::NEG_INFINITY), "-inf");
    }

    #[test]
    fn fnv1a64_reference_values() {
        // Published FNV-1a 64 test vectors.
        assert_eq!(fnv1a64(b""), 0xcbf29ce484222325);
        assert_eq!(fnv1a64(b"a"), 0xaf63dc4c8601ec8c);
        assert_eq!(fnv1a64(b"foobar"), 0x85944171f73967e8);
    }

    #[test]
    fn long_arrays_are_abbreviated() {
        let so: Vec<ScaleOffset> = (1..=6).map(|i| ScaleOffset { scale: i as f32, offset: -i }).collect();
        let text = encoding(&Encoding::AxisScaleOffset { axis: 1, scale_offsets: so.clone().into() });
        let digest = fnv1a64(&scale_offsets_bytes(&so));
        assert_eq!(
            text,
            format!(
                "axisScaleOffset(axis=1, n=6, [(1.00000000e+00, -1), (2.00000000e+00, -2), (3.00000000e+00, -3), (4.00000000e+00, -4), ...], fnv={digest:016x})"
            )
        );
        assert_eq!(&scale_offsets_bytes(&so[..1]), &[0, 0, 0x80, 0x3f, 0xff, 0xff, 0xff, 0xff]);
    }

    #[test]
    fn a_listing_without_ids_round_trips() {
        let t = |id| IoTensor { id, name: "x".into(), dtype: DataType::Int32, dims: vec![1, 4], quant: None };
        let graph =
            FakeGraph { io: GraphIo { name: "g".into(), inputs: vec![t(None)], outputs: vec![t(Some(3))] }, nodes: 1 };
        let binary = fake_context_binary(std::slice::from_ref(&graph));
        assert_eq!(
            binary,
            format!("{FAKE_BINARY_MAGIC}\ngraph g nodes=1\nin - x INT_32 1x4\nout 3 x INT_32 1x4\n").as_bytes()
        );
        assert_eq!(parse_fake_context_binary(&binary), Some(vec![graph]));
    }
}

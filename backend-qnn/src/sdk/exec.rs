//! The run-side QNN C API as a Rust trait: load a context binary, look its graphs up by name,
//! execute them on client buffers (mllm/backends/qnn/aot_rt: the NPU runtime's `contextCreateFromBinary`
//! → `graphRetrieve` → `graphExecute` loop).
//!
//! It is a separate trait from the compile-side [`QnnApi`](super::QnnApi) because a runtime
//! never builds graphs and a builder never executes them; QNN serves both from the same
//! interface table. [`EmulatedHtp`](super::EmulatedHtp) implements it on the CPU with the
//! reference interpreter (the CI stand-in for the SDK's HTP emulation on x86).
//!
//! Buffers are raw bytes in QNN's client-buffer layout: little-endian elements of the tensor's
//! data type, row-major, in the graph's I/O binding order. [`write_codes`] / [`read_codes`]
//! convert between integer codes and that layout.

use thiserror::Error;

use super::api::{ApiError, ContextHandle, GraphHandle};
use crate::dtype::DataType;

/// Why a graph's inputs and outputs cannot be bound for `graphExecute`.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum IoBindingError {
    #[error("no system library (libQnnSystem.so) was loaded to read the binary's graph I/O; open the API with SdkApi::load_for_execution")]
    NoSystemLibrary,
    #[error("{context} was not loaded from a binary")]
    NotFromBinary { context: ContextHandle },
    #[error("the metadata of {context} lists no graph `{graph}`")]
    NotInMetadata { context: ContextHandle, graph: String },
    #[error("{graph} was created, not retrieved from a binary")]
    NotRetrieved { graph: GraphHandle },
    #[error("graph `{graph}`: I/O tensor `{tensor}` has no id from the backend to bind it by")]
    NoTensorId { graph: String, tensor: String },
    #[error("graph `{graph}`: I/O tensor `{tensor}` is {dtype}, which has no client-buffer layout")]
    NoBufferLayout { graph: String, tensor: String, dtype: DataType },
    #[error("graph `{graph}` binds {inputs} inputs and {outputs} outputs, {given_inputs} and {given_outputs} buffers were given")]
    BufferCount { graph: String, inputs: usize, outputs: usize, given_inputs: usize, given_outputs: usize },
    #[error("graph `{graph}`: buffer of `{tensor}` has {given} bytes, expected {expected}")]
    BufferSize { graph: String, tensor: String, given: usize, expected: usize },
    #[error("graph `{graph}`: `{tensor}` exceeds 4 GiB")]
    BufferTooLarge { graph: String, tensor: String },
}

/// The execute-side QNN API.
pub trait QnnExecApi {
    /// `contextCreateFromBinary(backend, device, config, binary, size, &context, profile)`.
    fn context_create_from_binary(&mut self, binary: &[u8]) -> Result<ContextHandle, ApiError>;

    /// `graphRetrieve(context, name, &graph)`.
    fn graph_retrieve(&mut self, context: ContextHandle, name: &str) -> Result<GraphHandle, ApiError>;

    /// `graphExecute(graph, inputs, n, outputs, n, profile, signal)`: `inputs` and `outputs` are
    /// the client buffers of the graph's inputs and outputs in binding order, each exactly the
    /// tensor's size in bytes.
    fn graph_execute(
        &mut self,
        graph: GraphHandle,
        inputs: &[&[u8]],
        outputs: &mut [&mut [u8]],
    ) -> Result<(), ApiError>;

    /// `contextFree(context, profile)`; also invalidates the context's graphs.
    fn context_free(&mut self, context: ContextHandle) -> Result<(), ApiError>;
}

/// Bytes per element of an I/O buffer of `dtype` (`None` for 4-bit, string and undefined types,
/// which never appear as graph I/O).
pub fn io_element_bytes(dtype: DataType) -> Option<usize> {
    match dtype {
        DataType::SFixedPoint4 | DataType::UFixedPoint4 => None,
        _ => dtype.element_bytes(),
    }
}

/// Integer codes of a client buffer of an integer / fixed-point / bool `dtype`.
pub fn read_codes(dtype: DataType, bytes: &[u8]) -> Option<Vec<i64>> {
    dtype.integer_range()?;
    let n = io_element_bytes(dtype)?;
    if !bytes.len().is_multiple_of(n) {
        return None;
    }
    let signed = dtype.is_signed();
    Some(
        bytes
            .chunks_exact(n)
            .map(|c| {
                let mut raw = [0u8; 8];
                raw[..n].copy_from_slice(c);
                let v = u64::from_le_bytes(raw);
                let shift = 64 - 8 * n as u32;
                if signed {
                    ((v << shift) as i64) >> shift
                } else {
                    v as i64
                }
            })
            .collect(),
    )
}

/// Writes `codes` into a client buffer of `dtype`; `None` if the type holds no codes, the
/// sizes differ or a code is outside the type's range.
pub fn write_codes(dtype: DataType, codes: &[i64], out: &mut [u8]) -> Option<()> {
    let (lo, hi) = dtype.integer_range()?;
    let n = io_element_bytes(dtype)?;
    if out.len() != codes.len() * n {
        return None;
    }
    for (&c, dst) in codes.iter().zip(out.chunks_exact_mut(n)) {
        if c < lo || c > hi {
            return None;
        }
        dst.copy_from_slice(&c.to_le_bytes()[..n]);
    }
    Some(())
}

/// f32 values of a FLOAT_32 client buffer.
pub fn read_f32(bytes: &[u8]) -> Vec<f32> {
    bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_through_little_endian_buffers() {
        let cases: [(DataType, Vec<i64>, Vec<u8>); 4] = [
            (DataType::Int32, vec![-2, 70000], vec![0xFE, 0xFF, 0xFF, 0xFF, 0x70, 0x11, 0x01, 0x00]),
            (DataType::UFixedPoint16, vec![65535, 1], vec![0xFF, 0xFF, 0x01, 0x00]),
            (DataType::UFixedPoint8, vec![128, 0], vec![0x80, 0x00]),
            (DataType::SFixedPoint8, vec![-128, 127], vec![0x80, 0x7F]),
        ];
        for (dtype, codes, bytes) in cases {
            let mut out = vec![0u8; bytes.len()];
            write_codes(dtype, &codes, &mut out).unwrap();
            assert_eq!(out, bytes, "{dtype}");
            assert_eq!(read_codes(dtype, &bytes).unwrap(), codes, "{dtype}");
        }
        // Out of range, wrong size, or not an integer type.
        assert!(write_codes(DataType::UFixedPoint8, &[256], &mut [0]).is_none());
        assert!(write_codes(DataType::UFixedPoint16, &[1], &mut [0]).is_none());
        assert!(read_codes(DataType::Float32, &[0; 4]).is_none());
        assert!(read_codes(DataType::UFixedPoint16, &[0; 3]).is_none());
    }
}

//! f32 compute kernels of the CPU backend.
//!
//! Every tensor is a contiguous row-major `f32` slice with an explicit `&[usize]` shape; kernels
//! return new buffers (and the output shape when it is not obvious) and report shape problems as
//! [`KernelError`] instead of panicking. They know nothing about the DSL's tensor or IR types, so
//! the CPU executor can call them directly and they can be tested and benchmarked in isolation.
//!
//! Matrix products run on the `gemm` crate; coarse parallelism runs on a dedicated rayon pool
//! whose size is set with [`set_num_threads`]. Each kernel uses one level of parallelism (rayon
//! over coarse chunks, or one multi-threaded gemm call) and stays single-threaded below a size
//! threshold.
//! Dims are `isize` so that negative dims (`-1` = last) work wherever torch accepts them.

#[cfg(target_arch = "x86_64")]
mod amx_bf16;
mod attention;
#[cfg(target_arch = "x86_64")]
mod bf16_dot;
mod elementwise;
mod error;
mod grid_int4;
mod index_select;
mod math;
mod matmul;
mod matmul_parts;
mod movement;
mod packed;
mod packed_int4;
mod packed_tile;
mod permute;
mod qdq_points;
mod read_ahead;
mod reduce;
mod residual;
mod rms_norm;
mod rope;
pub mod shape;
mod silu_gate;
mod softmax;
mod team;
pub(crate) mod threads;
mod unary;
mod vendor;
mod weight_memory;

pub use attention::{attention, AttentionPoints};
pub use elementwise::{add, binary, div, equal, mul, sub, where_, BinaryOp, BinaryResult};
pub use error::KernelError;
pub use grid_int4::{Grid, DECODE_PREFETCH_ENV};
pub use index_select::index_select;
pub use matmul::{linear_kn, linear_nk, linear_with, matmul, LinearStrategy, WeightLayout};
pub use matmul_parts::{decode_u8, matmul_parts, BatchRepeat, JoinAxis, PartData, RhsPart, RhsParts};
pub use movement::{concat, repeat_interleave, slice};
pub use packed::{
    available_isas, linear_packed, linear_packed_bf16, linear_packed_bf16_with, linear_packed_on_grid,
    linear_packed_with, linears_packed_on_grid, runs_on_grid, Bf16Tile, PackedElems, PackedMatrix, BF16_TILE_ENV,
    INT4_TILE_ENV, PANEL,
};
pub use packed_int4::{Int4Packer, Int4Panels};
pub use packed_tile::Isa;
pub(crate) use permute::keeps_order;
pub use permute::{permute, transpose, transpose_2d};
pub use qdq_points::QdqPoints;
pub use read_ahead::READ_AHEAD_ENV;
pub(crate) use read_ahead::{prefetch_all, prefetch_bytes};
pub use reduce::{reduce, ReduceKind};
pub use residual::{residual_add, ResidualPoints};
pub use rms_norm::rms_norm;
pub use rope::{rotate_half, RopePoints};
pub use shape::broadcast_shape;
pub use silu_gate::{silu_gate, SiluGatePoints};
pub use softmax::{masked_softmax, softmax, MaskedSoftmaxConstants, MaskedSoftmaxPoints};
pub use threads::{num_threads, run_in_pool, set_num_threads};
pub use unary::{exp, neg, sigmoid, silu, unary, unary_inplace, UnaryOp};
pub use weight_memory::WeightBuf;

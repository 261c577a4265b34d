//! The one error type of the kernels: every shape or argument problem is reported, never panicked on.
//!
//! Each variant names the kernel (`op`) and the operand or argument at fault so that the executor can
//! wrap it with the IR node that called it.

use thiserror::Error;

/// A kernel refused its inputs.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum KernelError {
    /// A data slice does not hold exactly `product(shape)` elements.
    #[error("{op}: {operand} has {actual} elements but its shape {shape:?} needs {expected}")]
    DataLength { op: &'static str, operand: &'static str, shape: Vec<usize>, expected: usize, actual: usize },

    /// Two or three shapes do not follow numpy broadcasting rules.
    #[error("{op}: shapes {a:?} and {b:?} cannot be broadcast together")]
    NotBroadcastable { op: &'static str, a: Vec<usize>, b: Vec<usize> },

    /// A (possibly negative) dimension index does not name a dimension of the operand.
    #[error("{op}: dim {dim} is out of range for a tensor of rank {rank}")]
    DimOutOfRange { op: &'static str, dim: isize, rank: usize },

    /// An operand has fewer dimensions than the kernel needs.
    #[error("{op}: {operand} must have rank >= {min_rank}, got shape {shape:?}")]
    RankTooLow { op: &'static str, operand: &'static str, shape: Vec<usize>, min_rank: usize },

    /// The contracted dimensions of a matrix product differ.
    #[error("{op}: inner dimensions differ: {a:?} x {b:?} (K = {k_a} vs {k_b})")]
    InnerDimMismatch { op: &'static str, a: Vec<usize>, b: Vec<usize>, k_a: usize, k_b: usize },

    /// `perm` is not a permutation of `0..rank`.
    #[error("{op}: {perm:?} is not a permutation of the {rank} dims of shape {shape:?}")]
    InvalidPermutation { op: &'static str, perm: Vec<isize>, rank: usize, shape: Vec<usize> },

    /// An index gathered by `index_select` lies outside `0..bound`.
    #[error("{op}: index {index} (position {position} of the indices) is out of range for dim {dim} of size {bound}")]
    IndexOutOfRange { op: &'static str, index: i64, position: usize, dim: usize, bound: usize },

    /// A `concat` part disagrees with the first part outside the concatenated dim.
    #[error("{op}: part {part} has shape {shape:?}, which differs from {first:?} outside dim {dim}")]
    ConcatMismatch { op: &'static str, part: usize, shape: Vec<usize>, first: Vec<usize>, dim: usize },

    /// Any other argument the kernel cannot honour (empty concat, min over an empty dim, ...).
    #[error("{op}: {reason}")]
    InvalidArgument { op: &'static str, reason: String },

    /// The dedicated rayon thread pool could not be built.
    #[error("cannot build a rayon thread pool of {threads} threads: {reason}")]
    ThreadPool { threads: usize, reason: String },
}

//! Elementwise kernels over numpy-broadcast operands: arithmetic (`add`, `sub`, `mul`, `div`),
//! `equal` (1.0 / 0.0) and `where_` (select by a condition).
//!
//! Equal shapes and single-element operands take direct loops; everything else goes through a
//! [`BroadcastPlan`] whose innermost run has stride 1 or 0 per operand, so the hot loop is a plain
//! zip the compiler vectorises. Large outputs are filled in parallel chunks.

use super::shape::{broadcast_shape_for, check_len, numel, BroadcastPlan};
use super::threads::par_fill_new;
use super::KernelError;
use mllm_dsl::simd::widest;
use std::mem::MaybeUninit;

/// Outputs smaller than this are computed on the calling thread (memory-bound loops gain little
/// from a second thread below a few hundred KB).
const MIN_PARALLEL_LEN: usize = 1 << 16;

/// An arithmetic binary operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BinaryOp {
    Add,
    Sub,
    Mul,
    Div,
}

impl BinaryOp {
    fn name(self) -> &'static str {
        match self {
            BinaryOp::Add => "add",
            BinaryOp::Sub => "sub",
            BinaryOp::Mul => "mul",
            BinaryOp::Div => "div",
        }
    }
}

/// `a op b` with numpy broadcasting; returns the data and the broadcast shape.
pub fn binary(
    op: BinaryOp,
    a: &[f32],
    a_shape: &[usize],
    b: &[f32],
    b_shape: &[usize],
) -> Result<(Vec<f32>, Vec<usize>), KernelError> {
    let name = op.name();
    match op {
        BinaryOp::Add => broadcast_binary(
            name,
            a,
            a_shape,
            b,
            b_shape,
            #[inline(always)]
            |x, y| x + y,
        ),
        BinaryOp::Sub => broadcast_binary(
            name,
            a,
            a_shape,
            b,
            b_shape,
            #[inline(always)]
            |x, y| x - y,
        ),
        BinaryOp::Mul => broadcast_binary(
            name,
            a,
            a_shape,
            b,
            b_shape,
            #[inline(always)]
            |x, y| x * y,
        ),
        BinaryOp::Div => broadcast_binary(
            name,
            a,
            a_shape,
            b,
            b_shape,
            #[inline(always)]
            |x, y| x / y,
        ),
    }
}

/// `a + b` with broadcasting.
pub fn add(a: &[f32], a_shape: &[usize], b: &[f32], b_shape: &[usize]) -> BinaryResult {
    binary(BinaryOp::Add, a, a_shape, b, b_shape)
}

/// `a - b` with broadcasting.
pub fn sub(a: &[f32], a_shape: &[usize], b: &[f32], b_shape: &[usize]) -> BinaryResult {
    binary(BinaryOp::Sub, a, a_shape, b, b_shape)
}

/// `a * b` with broadcasting.
pub fn mul(a: &[f32], a_shape: &[usize], b: &[f32], b_shape: &[usize]) -> BinaryResult {
    binary(BinaryOp::Mul, a, a_shape, b, b_shape)
}

/// `a / b` with broadcasting (IEEE: x/0 is ±inf or NaN, as in torch).
pub fn div(a: &[f32], a_shape: &[usize], b: &[f32], b_shape: &[usize]) -> BinaryResult {
    binary(BinaryOp::Div, a, a_shape, b, b_shape)
}

/// Output data and shape of a broadcasting kernel.
pub type BinaryResult = Result<(Vec<f32>, Vec<usize>), KernelError>;

/// `1.0` where `a == b`, else `0.0` (IEEE equality: NaN never equals), with broadcasting.
pub fn equal(a: &[f32], a_shape: &[usize], b: &[f32], b_shape: &[usize]) -> BinaryResult {
    broadcast_binary(
        "equal",
        a,
        a_shape,
        b,
        b_shape,
        #[inline(always)]
        |x, y| if x == y { 1.0 } else { 0.0 },
    )
}

/// `cond != 0 ? a : b` elementwise with all three operands broadcast together (torch.where).
pub fn where_(
    cond: &[f32],
    cond_shape: &[usize],
    a: &[f32],
    a_shape: &[usize],
    b: &[f32],
    b_shape: &[usize],
) -> BinaryResult {
    const OP: &str = "where";
    check_len(OP, "cond", cond, cond_shape)?;
    check_len(OP, "a", a, a_shape)?;
    check_len(OP, "b", b, b_shape)?;
    let ab = broadcast_shape_for(OP, a_shape, b_shape)?;
    let out_shape = broadcast_shape_for(OP, cond_shape, &ab)?;
    let len = numel(&out_shape);
    if len == 0 {
        return Ok((Vec::new(), out_shape));
    }
    let plan = BroadcastPlan::new(&out_shape, [cond_shape, a_shape, b_shape]);
    let [sc, sa, sb] = plan.inner_strides;
    // SAFETY: the loop writes every element of each run.
    let out = unsafe {
        fill_runs(
            len,
            &plan,
            #[inline(always)]
            |out, [oc, oa, ob]| {
                let run = out.len();
                run_where(out, operand(cond, oc, sc, run), sc, operand(a, oa, sa, run), sa, operand(b, ob, sb, run), sb)
            },
        )
    };
    Ok((out, out_shape))
}

/// Shared driver of the two-operand kernels: validates, broadcasts and fills with `f`.
pub(crate) fn broadcast_binary<F>(
    op: &'static str,
    a: &[f32],
    a_shape: &[usize],
    b: &[f32],
    b_shape: &[usize],
    f: F,
) -> BinaryResult
where
    F: Fn(f32, f32) -> f32 + Sync + Send,
{
    check_len(op, "a", a, a_shape)?;
    check_len(op, "b", b, b_shape)?;
    let out_shape = broadcast_shape_for(op, a_shape, b_shape)?;
    let len = numel(&out_shape);
    if len == 0 {
        return Ok((Vec::new(), out_shape));
    }
    // SAFETY (each fill): `run_binary` writes every element of the run it is given (its
    // operands are a value or a run as long).
    let out = unsafe {
        if a.len() == len && b.len() == len {
            // Same element count as the output means neither operand is broadcast.
            fill_widest(
                len,
                #[inline(always)]
                |start, chunk| {
                    let end = start + chunk.len();
                    run_binary(chunk, &a[start..end], 1, &b[start..end], 1, &f)
                },
            )
        } else if b.len() == 1 {
            fill_widest(
                len,
                #[inline(always)]
                |start, chunk| run_binary(chunk, &a[start..start + chunk.len()], 1, b, 0, &f),
            )
        } else if a.len() == 1 {
            fill_widest(
                len,
                #[inline(always)]
                |start, chunk| run_binary(chunk, a, 0, &b[start..start + chunk.len()], 1, &f),
            )
        } else {
            let plan = BroadcastPlan::new(&out_shape, [a_shape, b_shape]);
            let [sa, sb] = plan.inner_strides;
            fill_runs(
                len,
                &plan,
                #[inline(always)]
                |out, [oa, ob]| {
                    let run = out.len();
                    run_binary(out, operand(a, oa, sa, run), sa, operand(b, ob, sb, run), sb, &f)
                },
            )
        }
    };
    Ok((out, out_shape))
}

/// `len` fresh elements, `fill(start, chunk)` writing the chunk of elements `start..start +
/// chunk.len()`: in parallel chunks when large, each chunk's loop compiled again for the widest
/// vectors (`widest`: the default target has only SSE2), with `fill` inlined into it.
///
/// # Safety
/// `fill` writes every element of the chunk it is given.
#[inline(always)]
unsafe fn fill_widest(len: usize, fill: impl Fn(usize, &mut [MaybeUninit<f32>]) + Sync + Send) -> Vec<f32> {
    // SAFETY: the caller's contract is `par_fill_new`'s.
    unsafe {
        par_fill_new(len, MIN_PARALLEL_LEN, |start, chunk| {
            widest(
                #[inline(always)]
                || fill(start, chunk),
            )
        })
    }
}

/// [`fill_widest`] run by run of `plan` (whose output has `len` elements): `visit(out, offsets)`
/// writes one innermost run, `offsets` being its first element's offset in each operand.
///
/// # Safety
/// `visit` writes every element of the run it is given.
#[inline(always)]
unsafe fn fill_runs<const K: usize>(
    len: usize,
    plan: &BroadcastPlan<K>,
    visit: impl Fn(&mut [MaybeUninit<f32>], [usize; K]) + Sync + Send,
) -> Vec<f32> {
    // SAFETY: the plan's runs cover each chunk, and `visit` writes each run whole.
    unsafe {
        fill_widest(
            len,
            #[inline(always)]
            |start, chunk| {
                plan.for_each_run(
                    start,
                    chunk.len(),
                    #[inline(always)]
                    |pos, run, offsets| visit(&mut chunk[pos..pos + run], offsets),
                )
            },
        )
    }
}

/// An operand's part of one innermost run from `at`: the run (stride 1) or its one value (stride 0).
#[inline(always)]
fn operand(data: &[f32], at: usize, stride: usize, run: usize) -> &[f32] {
    &data[at..at + if stride == 0 { 1 } else { run }]
}

/// [`where_`]'s innermost run, operands as in [`run_binary`]. Masked attention scores (condition
/// and scores full runs, the fill value one per row) get a loop of their own so it vectorises.
#[inline(always)]
fn run_where(out: &mut [MaybeUninit<f32>], cond: &[f32], sc: usize, a: &[f32], sa: usize, b: &[f32], sb: usize) {
    match (sc, sa, sb) {
        (1, 1, 0) => {
            let y = b[0];
            for ((o, &c), &x) in out.iter_mut().zip(cond).zip(a) {
                o.write(if c != 0.0 { x } else { y });
            }
        }
        (1, 1, 1) => {
            for (((o, &c), &x), &y) in out.iter_mut().zip(cond).zip(a).zip(b) {
                o.write(if c != 0.0 { x } else { y });
            }
        }
        _ => {
            for (i, o) in out.iter_mut().enumerate() {
                o.write(if cond[i * sc] != 0.0 { a[i * sa] } else { b[i * sb] });
            }
        }
    }
}

/// One innermost run: each operand is either a full run (stride 1) or a single value (stride 0).
/// The four cases are separate loops so each vectorises.
#[inline(always)]
fn run_binary<F: Fn(f32, f32) -> f32>(out: &mut [MaybeUninit<f32>], a: &[f32], sa: usize, b: &[f32], sb: usize, f: &F) {
    match (sa, sb) {
        (0, 0) => out.fill(MaybeUninit::new(f(a[0], b[0]))),
        (0, _) => {
            let x = a[0];
            for (o, &y) in out.iter_mut().zip(b) {
                o.write(f(x, y));
            }
        }
        (_, 0) => {
            let y = b[0];
            for (o, &x) in out.iter_mut().zip(a) {
                o.write(f(x, y));
            }
        }
        _ => {
            for ((o, &x), &y) in out.iter_mut().zip(a).zip(b) {
                o.write(f(x, y));
            }
        }
    }
}

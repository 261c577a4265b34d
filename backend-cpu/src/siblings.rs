//! Sibling linears: the 1-row linears of a decode step that read one input (a layer's q, k and v
//! projections; gate and up), run as one parallel job.
//!
//! A model file calls its linears one at a time, as PyTorch does, and each 1-row product is a
//! parallel job of its own. Small ones pay the job's start and finish (a couple of µs each on a
//! 2-core VM) as often as they stream weights, and below [`kernels::linear_packed_on_grid`]'s
//! parallel threshold (SmolLM2's 576 × 192 k and v projections) they run on one thread. So the
//! executor learns which linears follow one another on the same input — a decode step calls the
//! same ones in the same order every time — and when the first of them comes again, with a new
//! input, it runs all of them in one job ([`kernels::linears_packed_on_grid`]) and keeps the
//! others' outputs until the model asks for them.
//!
//! A wrong guess costs work, never a result: an output computed ahead is handed only to the call
//! it was computed for (the same input storage, which is immutable while shared and kept alive
//! here so its address is not reused; the same matrix and bias buffers; the same product
//! setting), and it is the product alone bit for bit. The state is the calling thread's, bounded: at most
//! [`MAX_SIBLINGS`] per linear and [`MAX_LEARNT`] linears remembered, weights and biases held
//! weakly so a dropped model's are freed.

use crate::kernels::PackedMatrix;
use mllm_dsl::{F32Buffer, Storage};
use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Weak};

/// The environment variable that turns sibling jobs off (`off`), to compare; unset, on.
pub const SIBLINGS_ENV: &str = "MLLM_CPU_SIBLINGS";

/// The most linears run ahead of one call.
pub(crate) const MAX_SIBLINGS: usize = 8;

/// The most linears whose siblings are remembered (a model has a few hundred; past this many,
/// another model's or a dropped one's, the record starts over).
pub(crate) const MAX_LEARNT: usize = 4096;

/// Whether [`SIBLINGS_ENV`] allows sibling jobs ([`crate::knobs`]).
pub(crate) fn enabled() -> bool {
    static ON: crate::knobs::Cached = crate::knobs::Cached::new();
    ON.get(&[true, false], || crate::knobs::var(SIBLINGS_ENV).is_none_or(|v| v != "off"))
}

/// The linears that ran on one input, in order, after the first.
struct Run {
    /// The input, held so that its address stays its own while the run lasts.
    input: Storage,
    /// The product setting the run's outputs were made with (see [`one_row_linear`]).
    setting: u8,
    head: Weak<PackedMatrix>,
    seen: Vec<Linear>,
}

/// A linear's matrix and bias, held weakly: while a weak reference lives, the address it points
/// at is not reused, so an equal address is the same buffer.
#[derive(Clone)]
struct Linear {
    weight: Weak<PackedMatrix>,
    bias: Option<Weak<Vec<f32>>>,
}

impl Linear {
    fn new(weight: &Arc<PackedMatrix>, bias: Option<&F32Buffer>) -> Linear {
        Linear { weight: Arc::downgrade(weight), bias: bias.map(F32Buffer::downgrade) }
    }

    /// Whether this is `weight` with `bias`.
    fn is(&self, weight: &Arc<PackedMatrix>, bias: Option<&F32Buffer>) -> bool {
        self.weight.as_ptr() == Arc::as_ptr(weight)
            && match (&self.bias, bias) {
                (None, None) => true,
                (Some(mine), Some(b)) => Weak::ptr_eq(mine, &b.downgrade()),
                _ => false,
            }
    }

    /// The matrix and bias, if both still live.
    fn upgrade(&self) -> Option<Live> {
        let bias = match &self.bias {
            Some(b) => Some(b.upgrade()?),
            None => None,
        };
        Some((self.weight.upgrade()?, bias))
    }
}

/// A linear's matrix and bias, alive.
type Live = (Arc<PackedMatrix>, Option<Arc<Vec<f32>>>);

/// What followed a linear on its input last time.
struct Learnt {
    /// Held so that no other matrix takes the address this record is kept under.
    _head: Weak<PackedMatrix>,
    siblings: Vec<Linear>,
}

#[derive(Default)]
struct State {
    run: Option<Run>,
    learnt: HashMap<usize, Learnt>,
    /// Outputs of the current run's input computed ahead, in the order they are expected.
    ahead: VecDeque<(Linear, Vec<f32>)>,
}

thread_local! {
    static STATE: RefCell<State> = RefCell::default();
}

/// The identity of a tensor's data.
fn storage_id(s: &Storage) -> usize {
    match s {
        Storage::F32(b) => b.as_ptr() as usize,
        Storage::I64(v) => v.as_ptr() as usize,
        Storage::Native(n) => Arc::as_ptr(n) as *const () as usize,
    }
}

/// What a call finds.
enum Found {
    /// Its output, computed ahead.
    Ahead(Vec<f32>),
    /// Nothing: it runs with these siblings (alive, in order; maybe none).
    Run(Vec<Live>),
}

/// A matrix to multiply and its bias.
pub(crate) type Product<'a> = (&'a PackedMatrix, Option<&'a [f32]>);

/// The output of the 1-row linear `input @ weight + bias` made with product `setting`: computed
/// ahead with an earlier call's job, or now by `compute`, which gets the products to run, this
/// one first and then its learnt siblings whose matrix `fits` accepts, and returns their outputs
/// in that order.
pub(crate) fn one_row_linear<E>(
    input: &Storage,
    weight: &Arc<PackedMatrix>,
    bias: Option<&F32Buffer>,
    setting: u8,
    fits: impl Fn(&PackedMatrix) -> bool,
    compute: impl FnOnce(&[Product<'_>]) -> Result<Vec<Vec<f32>>, E>,
) -> Result<Vec<f32>, E> {
    let found = STATE.with(|s| s.borrow_mut().find(input, weight, bias, setting));
    let siblings = match found {
        Found::Ahead(out) => return Ok(out),
        Found::Run(siblings) => siblings,
    };
    let siblings: Vec<_> = siblings.into_iter().filter(|(w, _)| fits(w)).collect();
    let mut products: Vec<Product<'_>> = Vec::with_capacity(1 + siblings.len());
    products.push((weight, bias.map(|b| &**b)));
    products.extend(siblings.iter().map(|(w, b)| (&**w, b.as_deref().map(Vec::as_slice))));
    let mut outs = compute(&products)?.into_iter();
    let mine = outs.next().unwrap_or_default();
    if !siblings.is_empty() {
        let linears =
            siblings.iter().map(|(w, b)| Linear { weight: Arc::downgrade(w), bias: b.as_ref().map(Arc::downgrade) });
        STATE.with(|s| s.borrow_mut().ahead.extend(linears.zip(outs)));
    }
    Ok(mine)
}

impl State {
    fn find(&mut self, input: &Storage, weight: &Arc<PackedMatrix>, bias: Option<&F32Buffer>, setting: u8) -> Found {
        let input_id = storage_id(input);
        if let Some(run) = self.run.as_mut().filter(|r| storage_id(&r.input) == input_id && r.setting == setting) {
            // The run goes on: its next output may be here already.
            if run.seen.len() < MAX_SIBLINGS {
                run.seen.push(Linear::new(weight, bias));
            }
            match self.ahead.pop_front() {
                Some((linear, out)) if linear.is(weight, bias) => return Found::Ahead(out),
                Some(_) => self.ahead.clear(),
                None => {}
            }
            return Found::Run(Vec::new());
        }
        // A new input: remember what followed the last one's first linear, then start over.
        self.ahead.clear();
        if let Some(run) = self.run.take() {
            if run.head.strong_count() > 0 {
                let head = run.head.as_ptr() as usize;
                if run.seen.is_empty() {
                    self.learnt.remove(&head);
                } else {
                    if self.learnt.len() >= MAX_LEARNT && !self.learnt.contains_key(&head) {
                        self.learnt.clear();
                    }
                    self.learnt.insert(head, Learnt { _head: run.head, siblings: run.seen });
                }
            }
        }
        self.run = Some(Run { input: input.clone(), setting, head: Arc::downgrade(weight), seen: Vec::new() });
        // The record's weak head keeps its address from being reused: the entry at this matrix's
        // address is this matrix's.
        let siblings = match self.learnt.get(&(Arc::as_ptr(weight) as usize)) {
            Some(l) => l.siblings.iter().filter_map(Linear::upgrade).collect(),
            None => Vec::new(),
        };
        Found::Run(siblings)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    fn matrix(k: usize, n: usize, seed: f32) -> Arc<PackedMatrix> {
        let rows: Vec<f32> = (0..k * n).map(|i| (i as f32 * 0.37 + seed).sin()).collect();
        Arc::new(PackedMatrix::from_rows_f32(n, k, &rows).unwrap())
    }

    fn input(k: usize, seed: f32) -> Storage {
        Storage::F32((0..k).map(|i| (i as f32 * 0.11 + seed).cos()).collect::<Vec<f32>>().into())
    }

    /// Runs `w` on `x` through [`one_row_linear`], counting the matrices each job multiplied.
    fn call(x: &Storage, w: &Arc<PackedMatrix>, jobs: &Cell<Vec<usize>>) -> Vec<f32> {
        call_with(x, w, None, jobs)
    }

    fn call_with(x: &Storage, w: &Arc<PackedMatrix>, bias: Option<&F32Buffer>, jobs: &Cell<Vec<usize>>) -> Vec<f32> {
        let Storage::F32(values) = x else { unreachable!() };
        let out = one_row_linear(
            x,
            w,
            bias,
            0,
            |m| m.k() == w.k(),
            |products: &[Product<'_>]| {
                let mut seen = jobs.take();
                seen.push(products.len());
                jobs.set(seen);
                crate::kernels::linears_packed_on_grid(values, 1, products, None)
            },
        );
        out.unwrap()
    }

    #[test]
    fn siblings_run_in_one_job_and_give_each_call_its_own_output() {
        let (q, k, v, o) = (matrix(64, 96, 0.0), matrix(64, 32, 1.0), matrix(64, 32, 2.0), matrix(96, 64, 3.0));
        let jobs = Cell::new(Vec::new());
        for step in 0..3 {
            let x = input(64, step as f32);
            let Storage::F32(xs) = &x else { unreachable!() };
            let outs: Vec<Vec<f32>> = [&q, &k, &v].iter().map(|w| call(&x, w, &jobs)).collect();
            for (w, out) in [&q, &k, &v].iter().zip(&outs) {
                let alone = crate::kernels::linear_packed(xs, 1, w, None).unwrap();
                assert_eq!(out, &alone, "step {step}: bit for bit the product alone");
            }
            // o reads another input: a run of its own.
            let h = input(96, step as f32 + 0.5);
            call(&h, &o, &jobs);
        }
        // Step 0 learns (four jobs of one matrix); then q's job runs k and v, which need none.
        assert_eq!(jobs.take(), [1, 1, 1, 1, 3, 1, 3, 1]);
    }

    #[test]
    fn a_changed_order_or_input_falls_back_and_is_learnt_again() {
        let (q, k, v) = (matrix(64, 32, 0.5), matrix(64, 32, 1.5), matrix(64, 32, 2.5));
        let jobs = Cell::new(Vec::new());
        let x0 = input(64, 0.0);
        [&q, &k, &v].iter().for_each(|w| drop(call(&x0, w, &jobs)));
        // The model now calls v before k: k's output waits ahead, v's call misses it and runs.
        let x1 = input(64, 1.0);
        let Storage::F32(xs) = &x1 else { unreachable!() };
        for w in [&q, &v, &k] {
            assert_eq!(call(&x1, w, &jobs), crate::kernels::linear_packed(xs, 1, w, None).unwrap());
        }
        // k of a different input never gets an output computed for x1's.
        let x2 = input(64, 2.0);
        let Storage::F32(xs2) = &x2 else { unreachable!() };
        assert_eq!(call(&x2, &q, &jobs), crate::kernels::linear_packed(xs2, 1, &q, None).unwrap());
        let x3 = input(64, 3.0);
        let Storage::F32(xs3) = &x3 else { unreachable!() };
        assert_eq!(call(&x3, &v, &jobs), crate::kernels::linear_packed(xs3, 1, &v, None).unwrap());
        // x0: learning (3 jobs); x1: q with k, v ahead (3 matrices), v misses, k runs; x2: q
        // with the learnt v, k (3); x3: v alone.
        assert_eq!(jobs.take(), [1, 1, 1, 3, 1, 1, 3, 1]);
    }

    #[test]
    fn a_dropped_sibling_is_not_run() {
        let (q, k) = (matrix(64, 32, 0.25), matrix(64, 32, 0.75));
        let jobs = Cell::new(Vec::new());
        let x0 = input(64, 0.0);
        call(&x0, &q, &jobs);
        call(&x0, &k, &jobs);
        drop(k);
        call(&input(64, 1.0), &q, &jobs);
        assert_eq!(jobs.take(), [1, 1, 1]);
    }

    #[test]
    fn biases_go_with_their_linears_and_a_new_bias_buffer_is_not_served_an_old_output() {
        let (q, k) = (matrix(64, 32, 0.1), matrix(64, 32, 0.2));
        let (bq, bk) = (F32Buffer::from(vec![0.5f32; 32]), F32Buffer::from(vec![-0.25f32; 32]));
        let jobs = Cell::new(Vec::new());
        let alone = |x: &Storage, w: &PackedMatrix, b: &F32Buffer| {
            let Storage::F32(xs) = x else { unreachable!() };
            crate::kernels::linear_packed(xs, 1, w, Some(b)).unwrap()
        };
        for step in 0..3 {
            let x = input(64, step as f32);
            assert_eq!(call_with(&x, &q, Some(&bq), &jobs), alone(&x, &q, &bq), "step {step}");
            assert_eq!(call_with(&x, &k, Some(&bk), &jobs), alone(&x, &k, &bk), "step {step}");
        }
        // k now comes with another bias buffer (other values): the output made with the old one
        // is dropped, and k runs with its new bias.
        let x = input(64, 7.0);
        let other = F32Buffer::from(vec![3.0f32; 32]);
        assert_eq!(call_with(&x, &q, Some(&bq), &jobs), alone(&x, &q, &bq));
        assert_eq!(call_with(&x, &k, Some(&other), &jobs), alone(&x, &k, &other));
        // Step 0 learns; steps 1, 2 and the last run q's job with k; the last k runs alone.
        assert_eq!(jobs.take(), [1, 1, 2, 2, 2, 1]);
    }
}

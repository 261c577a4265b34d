//! Tracing: running `forward` on symbolic tensors records a [`Program`].
//!
//! ```no_run
//! # use mllm_dsl::trace::{trace, TraceInput};
//! # use mllm_dsl::{DType, Tensor};
//! # struct Model;
//! # impl Model {
//! #     fn forward(&self, ids: &Tensor) -> mllm_dsl::Result<Tensor> { Ok(ids.clone()) }
//! # }
//! # fn demo(model: &Model) -> mllm_dsl::Result<()> {
//! let program = trace(&[TraceInput::new("input_ids", [1, 32], DType::I32)], |inputs| {
//!     model.forward(&inputs[0])
//! })?;
//! # Ok(())
//! # }
//! ```
//!
//! Tracing needs no weights: parameters are symbolic and are registered in `@init` when first used.
//! Each module call becomes a `graph.SubGraphOp` (its region inputs are the values it reads from
//! outside, in first-use order) plus a `graph.CallGraphOp` in the caller.

use crate::dtype::{DType, TensorType};
use crate::error::{Error, Result};
use crate::ir::{CallGraph, LinalgOp, Node, Program, Region, SubGraph, ValueDef, ValueId};
use crate::op::OpKind;
use crate::qdq::QdqAttr;
use crate::scope;
use crate::tensor::{Repr, Tensor};
use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};

/// A symbolic input of a trace.
#[derive(Clone, Debug)]
pub struct TraceInput {
    /// For documentation and error messages only.
    pub name: String,
    pub ty: TensorType,
    /// A QDQ annotation attached by the caller (mllm attaches each layer's KV scale to `past_key_i`).
    pub qdq: Option<QdqAttr>,
}

impl TraceInput {
    pub fn new(name: impl Into<String>, shape: impl Into<Vec<usize>>, dtype: DType) -> Self {
        TraceInput { name: name.into(), ty: TensorType::new(shape, dtype), qdq: None }
    }

    pub fn with_qdq(mut self, qdq: QdqAttr) -> Self {
        self.qdq = Some(qdq);
        self
    }
}

/// Values a module call returns; implemented for tensors, tuples, vectors and options of them.
pub trait ModuleOutput {
    fn collect_tensors<'a>(&'a self, out: &mut Vec<&'a Tensor>);
}

impl ModuleOutput for Tensor {
    fn collect_tensors<'a>(&'a self, out: &mut Vec<&'a Tensor>) {
        out.push(self);
    }
}

impl ModuleOutput for () {
    fn collect_tensors<'a>(&'a self, _: &mut Vec<&'a Tensor>) {}
}

impl<T: ModuleOutput> ModuleOutput for Vec<T> {
    fn collect_tensors<'a>(&'a self, out: &mut Vec<&'a Tensor>) {
        self.iter().for_each(|t| t.collect_tensors(out));
    }
}

impl<T: ModuleOutput> ModuleOutput for Option<T> {
    fn collect_tensors<'a>(&'a self, out: &mut Vec<&'a Tensor>) {
        if let Some(t) = self {
            t.collect_tensors(out);
        }
    }
}

macro_rules! tuple_output {
    ($($t:ident),+) => {
        impl<$($t: ModuleOutput),+> ModuleOutput for ($($t,)+) {
            #[allow(non_snake_case)]
            fn collect_tensors<'a>(&'a self, out: &mut Vec<&'a Tensor>) {
                let ($($t,)+) = self;
                $($t.collect_tensors(out);)+
            }
        }
    };
}
tuple_output!(A, B);
tuple_output!(A, B, C);
tuple_output!(A, B, C, D);
tuple_output!(A, B, C, D, E);

static NEXT_TRACE: AtomicU64 = AtomicU64::new(1);

/// An open region: `@main`'s body or a module call's subgraph.
struct OpenRegion {
    symbol: String,
    /// Index of this subgraph in `Builder::subgraphs` (reserved when the call starts, so subgraphs
    /// print in creation order).
    slot: Option<usize>,
    body: Vec<Node>,
    defined: HashSet<ValueId>,
    free: Vec<ValueId>,
    free_set: HashSet<ValueId>,
}

impl OpenRegion {
    fn new(symbol: String, slot: Option<usize>) -> Self {
        OpenRegion {
            symbol,
            slot,
            body: Vec::new(),
            defined: HashSet::new(),
            free: Vec::new(),
            free_set: HashSet::new(),
        }
    }

    /// Notes a use: values from outside the region (not parameters) become region inputs.
    fn use_value(&mut self, v: ValueId, globals: &HashSet<ValueId>) {
        if !self.defined.contains(&v) && !globals.contains(&v) && self.free_set.insert(v) {
            self.free.push(v);
        }
    }
}

struct Builder {
    id: u64,
    prog: Program,
    init: Vec<Node>,
    subgraphs: Vec<Option<SubGraph>>,
    regions: Vec<OpenRegion>,
    /// Parameter symbol → registered value.
    params: HashMap<String, ValueId>,
    /// Values usable from any region without being a region input (parameters).
    globals: HashSet<ValueId>,
    /// Constant tensor id → emitted value.
    constants: HashMap<u64, ValueId>,
    /// How often each subgraph symbol was used (a second call of a module gets `_1`, like mllm).
    symbol_uses: HashMap<String, usize>,
}

thread_local! {
    static BUILDER: RefCell<Option<Builder>> = const { RefCell::new(None) };
}

/// Whether a trace is being recorded on this thread.
pub fn is_tracing() -> bool {
    BUILDER.with(|b| b.borrow().is_some())
}

fn trace_err(message: impl Into<String>) -> Error {
    Error::Trace { module_path: scope::current_path(), message: message.into() }
}

fn with_builder<R>(f: impl FnOnce(&mut Builder) -> Result<R>) -> Result<R> {
    BUILDER.with(|b| match b.borrow_mut().as_mut() {
        Some(builder) => f(builder),
        None => Err(trace_err("no trace is active")),
    })
}

/// Clears the thread's builder even when the traced closure panics.
struct BuilderGuard;

impl Drop for BuilderGuard {
    fn drop(&mut self) {
        BUILDER.with(|b| b.borrow_mut().take());
    }
}

/// Traces `f` on symbolic inputs and returns the recorded program.
pub fn trace<T, F>(inputs: &[TraceInput], f: F) -> Result<Program>
where
    T: ModuleOutput,
    F: FnOnce(&[Tensor]) -> Result<T>,
{
    if is_tracing() {
        return Err(trace_err("trace() called while another trace is active on this thread"));
    }
    let id = NEXT_TRACE.fetch_add(1, Ordering::Relaxed);
    let mut prog = Program::default();
    let mut main = OpenRegion::new("main".into(), None);
    let mut tensors = Vec::with_capacity(inputs.len());
    for input in inputs {
        let mut def = ValueDef::new(input.ty.clone());
        if let Some(q) = &input.qdq {
            def.qdq = Some(q.clone());
        }
        let v = prog.add_value(def);
        main.defined.insert(v);
        prog.main.inputs.push(v);
        tensors.push(Tensor::from_repr(input.ty.clone(), Repr::Traced { trace: id, value: v }));
    }
    BUILDER.with(|b| {
        *b.borrow_mut() = Some(Builder {
            id,
            prog,
            init: Vec::new(),
            subgraphs: Vec::new(),
            regions: vec![main],
            params: HashMap::new(),
            globals: HashSet::new(),
            constants: HashMap::new(),
            symbol_uses: HashMap::new(),
        })
    });
    let _guard = BuilderGuard;
    let _frame = scope::enter(String::new());
    let out = f(&tensors)?;
    let mut outs = Vec::new();
    out.collect_tensors(&mut outs);
    with_builder(|b| {
        let out_ids = outs.iter().map(|t| b.value_of(t)).collect::<Result<Vec<_>>>()?;
        let main = b.regions.pop().expect("main region");
        if !b.regions.is_empty() {
            return Err(trace_err("a module call was still open at the end of the trace"));
        }
        let mut body = vec![Node::SubGraph(SubGraph {
            symbol: "init".into(),
            device: None,
            attrs: Default::default(),
            region: Region { inputs: vec![], outputs: vec![], body: std::mem::take(&mut b.init) },
        })];
        body.extend(b.subgraphs.drain(..).map(|g| Node::SubGraph(g.expect("every module call closed"))));
        body.extend(main.body);
        body.push(Node::Return(out_ids.clone()));
        b.prog.main.outputs = out_ids;
        b.prog.main.body = body;
        Ok(std::mem::take(&mut b.prog))
    })
}

impl Builder {
    fn current(&mut self) -> &mut OpenRegion {
        self.regions.last_mut().expect("a region is always open while tracing")
    }

    /// The IR value of a tensor, registering parameters and emitting constants on first use.
    fn value_of(&mut self, t: &Tensor) -> Result<ValueId> {
        match t.repr() {
            Repr::Traced { trace, value } if *trace == self.id => Ok(*value),
            Repr::Traced { .. } => Err(trace_err("a tensor from another trace was used")),
            Repr::Param { key } => {
                if let Some(&v) = self.params.get(key.as_ref()) {
                    return Ok(v);
                }
                let mut def = ValueDef::new(t.ty().clone());
                def.symbol = Some(key.to_string());
                let v = self.prog.add_value(def);
                self.init.push(Node::Register { device: t.ty().device, value: v });
                self.params.insert(key.to_string(), v);
                self.globals.insert(v);
                Ok(v)
            }
            Repr::Constant { id, value, qdq } => {
                if let Some(&v) = self.constants.get(id) {
                    return Ok(v);
                }
                let mut def = ValueDef::new(t.ty().clone());
                def.constant = Some(*value);
                def.qdq = qdq.clone();
                let v = self.prog.add_value(def);
                let region = self.current();
                region.body.push(Node::Constant { device: t.ty().device, value: v });
                region.defined.insert(v);
                self.constants.insert(*id, v);
                Ok(v)
            }
            Repr::Eager { .. } => Err(trace_err(
                "an eager tensor (with data) was used while tracing; use Tensor::scalar or qdq!(const ...) for constants",
            )),
        }
    }
}

/// Records one op in the current region and returns its output tensor.
pub(crate) fn record(kind: OpKind, inputs: &[&Tensor], out_ty: TensorType, name: Option<String>) -> Result<Tensor> {
    let name = Some(name.unwrap_or_else(|| scope::anonymous_op_name(kind.type_name())));
    with_builder(|b| {
        let ids = inputs.iter().map(|t| b.value_of(t)).collect::<Result<Vec<_>>>()?;
        let globals = std::mem::take(&mut b.globals);
        for &v in &ids {
            b.current().use_value(v, &globals);
        }
        b.globals = globals;
        let out = b.prog.add_value(ValueDef::new(out_ty.clone()));
        let device = out_ty.device;
        let region = b.current();
        region.defined.insert(out);
        region.body.push(Node::Linalg(LinalgOp {
            device,
            kind,
            name,
            attrs: Default::default(),
            inputs: ids,
            outputs: vec![out],
        }));
        Ok(Tensor::from_repr(out_ty, Repr::Traced { trace: b.id, value: out }))
    })
}

/// Attaches a QDQ annotation to the value of a traced tensor.
pub(crate) fn annotate_qdq(t: &Tensor, qdq: QdqAttr) -> Result<()> {
    with_builder(|b| {
        let v = b.value_of(t)?;
        let def = b.prog.value_mut(v);
        if let Some(old) = &def.qdq {
            return Err(trace_err(format!(
                "value already carries QDQ '{}'; apply '{}' to a new value",
                old.key, qdq.key
            )));
        }
        def.qdq = Some(qdq);
        Ok(())
    })
}

/// Opens the subgraph of a module call. Returns the symbol used.
pub(crate) fn open_subgraph(path: &str) -> Result<String> {
    with_builder(|b| {
        let uses = b.symbol_uses.entry(path.to_string()).or_insert(0);
        let symbol = if *uses == 0 { path.to_string() } else { format!("{path}_{uses}") };
        *uses += 1;
        b.subgraphs.push(None);
        let slot = b.subgraphs.len() - 1;
        b.regions.push(OpenRegion::new(symbol.clone(), Some(slot)));
        Ok(symbol)
    })
}

/// Closes the innermost subgraph with the module's outputs and records the call in the caller.
pub(crate) fn close_subgraph(outputs: &[&Tensor]) -> Result<()> {
    with_builder(|b| {
        let out_ids = outputs.iter().map(|t| b.value_of(t)).collect::<Result<Vec<_>>>()?;
        let globals = std::mem::take(&mut b.globals);
        for &v in &out_ids {
            b.current().use_value(v, &globals);
        }
        let mut region = b.regions.pop().expect("open subgraph");
        let slot = region.slot.expect("closing a module subgraph");
        region.body.push(Node::Return(out_ids.clone()));
        let inputs = region.free.clone();
        b.subgraphs[slot] = Some(SubGraph {
            symbol: region.symbol.clone(),
            device: Some(Default::default()),
            attrs: Default::default(),
            region: Region { inputs: inputs.clone(), outputs: out_ids.clone(), body: region.body },
        });
        let parent = b.current();
        for &v in &inputs {
            parent.use_value(v, &globals);
        }
        parent.defined.extend(out_ids.iter().copied());
        parent.body.push(Node::Call(CallGraph { symbol: region.symbol, inputs, outputs: out_ids }));
        b.globals = globals;
        Ok(())
    })
}

/// Drops the innermost subgraph after an error in the module's `forward`.
pub(crate) fn abort_subgraph() {
    BUILDER.with(|b| {
        if let Some(b) = b.borrow_mut().as_mut() {
            if let Some(r) = b.regions.pop() {
                if let Some(slot) = r.slot {
                    b.subgraphs[slot] = Some(SubGraph {
                        symbol: r.symbol,
                        device: None,
                        attrs: Default::default(),
                        region: Region::default(),
                    });
                }
            }
        }
    })
}

/// Runs a module's `forward` inside its scope (generated by `#[module]`).
pub fn scoped<T: ModuleOutput>(path: Option<String>, f: impl FnOnce() -> Result<T>) -> Result<T> {
    let path =
        path.ok_or_else(|| trace_err("module is not bound: call bind_weights()/declare() on the top module first"))?;
    let subgraph = is_tracing() && !path.is_empty();
    // The frame takes the path; a trace's subgraph needs a copy (eager runs make none).
    let _frame = if subgraph {
        let frame = scope::enter(path.clone());
        open_subgraph(&path)?;
        frame
    } else {
        scope::enter(path)
    };
    match f() {
        Ok(out) => {
            if subgraph {
                let mut ts = Vec::new();
                out.collect_tensors(&mut ts);
                close_subgraph(&ts)?;
            }
            Ok(out)
        }
        Err(e) => {
            if subgraph {
                abort_subgraph();
            }
            Err(e)
        }
    }
}

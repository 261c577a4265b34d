//! The printer: mllm's textual IR grammar (mllm/compile/ir printers), made deterministic and local.
//!
//! - Values are named, not numbered globally, so that one op more or less changes only the lines
//!   that mention it:
//!   - an op's output is named after the op (`model.layers.0.mlp.up_proj`; output `j > 0` of a
//!     multi-output op adds `#j`),
//!   - a parameter after its symbol (`model.layers.0.mlp.up_proj.weight`),
//!   - anything else (`@main`'s inputs, constants, an op without a usable name) gets a number local
//!     to the subgraph that first prints it: `0, 1, ...` in `@main`, `<subgraph>.#0, .#1, ...`
//!     inside `@<subgraph>`.
//!
//!   A name that is taken already gets `~2`, `~3`, ... in print order, so names are unique.
//! - Inside `graph.SubGraphOp @S`, a name that starts with `S.` is written relative, with a leading
//!   dot: `%.up_proj` in `@model.layers.0.mlp` is `%model.layers.0.mlp.up_proj`. Every other name
//!   is written in full. The parser resolves relative names against the enclosing subgraph.
//! - A value prints with its type and attributes where it is defined (region inputs, op outputs,
//!   registers, constants, call results) and as a bare `%name` where it is used.
//! - Attributes are sorted; floats print in Rust's shortest round-trip form.
//! - A line that would exceed [`MAX_LINE`] characters puts one list item per line, and an item that
//!   alone would exceed it (a value with a long name, symbol and spec) puts its `[@symbol]` and
//!   `[attributes]` on lines of their own, indented once more.
//! - Unlike mllm, `@main` lists the trace inputs as its region inputs, so the text is closed SSA
//!   and parses back ([`super::parse`]).
//! - Quantization specs are named `$<name>` after the first value (in print order) that refers to
//!   them, written relative like values (`spec:$.up_proj`), and printed as a table after `@main`
//!   (`quant.specs { $model.layers.0.mlp.up_proj = ... }`), only when the program has any.

use super::{Attr, Attrs, Node, Program, Region, SpecId, ValueId};
use crate::dtype::fmt_shape;
use std::collections::HashMap;
use std::fmt::Write;

/// No printed line is longer than this (mllm's exceed 1,000 characters).
pub const MAX_LINE: usize = 200;

const INDENT: &str = "    ";

/// Value ids in the order the printer first shows them (the order [`Program::canonicalize`]
/// gives the arena).
pub fn numbering(p: &Program) -> Vec<ValueId> {
    scoped_numbering(p).into_iter().map(|(v, _)| v).collect()
}

/// Value ids in print order, each with the symbol of the subgraph that first shows it (`""` for
/// `@main` and for values only ever used).
fn scoped_numbering(p: &Program) -> Vec<(ValueId, &str)> {
    let mut n = Numbering::default();
    n.region_header(&p.main, "");
    n.region_body(&p.main, "");
    // Values referenced but never defined in a typed position (malformed programs) still get names.
    let late: Vec<ValueId> = std::mem::take(&mut n.late);
    for v in late {
        n.def(v, "");
    }
    n.order
}

/// Spec ids in the order the printer names them: first reference by a value in `value_order`.
pub(crate) fn spec_numbering(p: &Program, value_order: &[ValueId]) -> Vec<SpecId> {
    let mut seen = vec![false; p.specs.len()];
    let mut order = Vec::new();
    for v in value_order {
        if let Some(s) = p.value(*v).spec {
            if !std::mem::replace(&mut seen[s.index()], true) {
                order.push(s);
            }
        }
    }
    order
}

#[derive(Default)]
struct Numbering<'a> {
    seen: HashMap<ValueId, usize>,
    order: Vec<(ValueId, &'a str)>,
    late: Vec<ValueId>,
}

impl<'a> Numbering<'a> {
    fn def(&mut self, v: ValueId, scope: &'a str) {
        if !self.seen.contains_key(&v) {
            self.seen.insert(v, self.order.len());
            self.order.push((v, scope));
        }
    }
    fn uses(&mut self, vs: &[ValueId]) {
        self.late.extend(vs.iter().filter(|v| !self.seen.contains_key(v)));
    }
    fn region_header(&mut self, r: &Region, scope: &'a str) {
        r.inputs.iter().for_each(|&v| self.def(v, scope));
        self.uses(&r.outputs);
    }
    fn region_body(&mut self, r: &'a Region, scope: &'a str) {
        for node in &r.body {
            match node {
                Node::SubGraph(g) => {
                    self.region_header(&g.region, &g.symbol);
                    self.region_body(&g.region, &g.symbol);
                }
                Node::Call(c) => {
                    self.uses(&c.inputs);
                    c.outputs.iter().for_each(|&v| self.def(v, scope));
                }
                Node::Linalg(op) => {
                    self.uses(&op.inputs);
                    op.outputs.iter().for_each(|&v| self.def(v, scope));
                }
                Node::Register { value, .. } | Node::Constant { value, .. } => self.def(*value, scope),
                Node::Return(vs) => self.uses(vs),
                Node::Comment(_) => {}
            }
        }
    }
}

/// Whether `name` can stand as a value name: the characters the lexer reads after `%`, starting
/// with a letter, digit or `_` (so it is never taken for a relative name), and without the `#`/`~`
/// the printer adds.
fn usable_name(name: &str) -> bool {
    name.chars().next().is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
        && !name.ends_with(['.', '-'])
}

/// Every value's full name (see the module docs), in print order, for messages that name a value
/// as the printed IR does.
pub fn value_names(p: &Program) -> Vec<(ValueId, String)> {
    // The op that produces each value (an op's outputs are named after it wherever they print).
    let mut producer: HashMap<ValueId, (&str, usize)> = HashMap::new();
    fn walk<'a>(r: &'a Region, producer: &mut HashMap<ValueId, (&'a str, usize)>) {
        for n in &r.body {
            match n {
                Node::Linalg(op) => {
                    if let Some(name) = op.name.as_deref().filter(|n| usable_name(n)) {
                        for (j, v) in op.outputs.iter().enumerate() {
                            producer.entry(*v).or_insert((name, j));
                        }
                    }
                }
                Node::SubGraph(g) => walk(&g.region, producer),
                _ => {}
            }
        }
    }
    walk(&p.main, &mut producer);
    let mut taken: std::collections::HashSet<String> = std::collections::HashSet::new();
    let mut local: HashMap<&str, usize> = HashMap::new();
    let mut out = Vec::new();
    for (v, scope) in scoped_numbering(p) {
        let base = if let Some(&(op, j)) = producer.get(&v) {
            if j == 0 {
                op.to_string()
            } else {
                format!("{op}#{j}")
            }
        } else if let Some(sym) = p.value(v).symbol.as_deref().filter(|s| usable_name(s)) {
            sym.to_string()
        } else {
            let next = local.entry(scope).or_insert(0);
            let k = *next;
            *next += 1;
            if scope.is_empty() {
                k.to_string()
            } else {
                format!("{scope}.#{k}")
            }
        };
        let mut name = base.clone();
        let mut dup = 1;
        while taken.contains(&name) {
            dup += 1;
            name = format!("{base}~{dup}");
        }
        taken.insert(name.clone());
        out.push((v, name));
    }
    out
}

/// `name` as written inside `@scope`: relative (`.rest`) when it starts with `scope.`.
fn spelled<'n>(name: &'n str, scope: &str) -> std::borrow::Cow<'n, str> {
    if !scope.is_empty() {
        if let Some(rest) = name.strip_prefix(scope).filter(|r| r.starts_with('.')) {
            return rest.into();
        }
    }
    name.into()
}

/// A name as written inside `@scope` back to the full name.
pub(crate) fn resolved(written: &str, scope: &str) -> String {
    if written.starts_with('.') && !scope.is_empty() {
        format!("{scope}{written}")
    } else {
        written.to_string()
    }
}

/// Prints a program in mllm's grammar.
pub fn print(p: &Program) -> String {
    let names = value_names(p);
    let order: Vec<ValueId> = names.iter().map(|(v, _)| *v).collect();
    let spec_order = spec_numbering(p, &order);
    let names: HashMap<ValueId, String> = names.into_iter().collect();
    // A spec is named after the first value that refers to it.
    let mut spec_names = HashMap::new();
    for v in &order {
        if let Some(s) = p.value(*v).spec {
            spec_names.entry(s).or_insert_with(|| names[v].clone());
        }
    }
    let pr = Printer { p, names, spec_names };
    let mut out = String::new();
    pr.region("@main ", &p.main, 0, "", &mut out);
    if !spec_order.is_empty() {
        out.push_str("quant.specs {\n");
        for s in &spec_order {
            writeln!(out, "{INDENT}${} = {}", pr.spec_names[s], p.spec(*s)).unwrap();
        }
        out.push_str("}\n");
    }
    out
}

/// One item of a signature's lists, as the parts it may be wrapped between (see [`Printer::typed`]).
type Item = Vec<String>;

struct Printer<'a> {
    p: &'a Program,
    names: HashMap<ValueId, String>,
    spec_names: HashMap<SpecId, String>,
}

impl Printer<'_> {
    fn bare(&self, v: ValueId, scope: &str) -> String {
        format!("%{}", spelled(&self.names[&v], scope))
    }

    /// A value where it is defined, as its parts: `%name:tensor<...>`, then `[@symbol]` and
    /// `[attrs]` when it has them. One item of a signature: the parts joined, or one per line
    /// when the item alone would exceed [`MAX_LINE`].
    fn typed(&self, v: ValueId, scope: &str) -> Item {
        let def = self.p.value(v);
        let mut parts = vec![format!(
            "{}:tensor<{}, {}, {}>",
            self.bare(v, scope),
            fmt_shape(&def.ty.shape),
            def.ty.dtype,
            def.ty.device
        )];
        if let Some(sym) = &def.symbol {
            parts.push(format!("[@{sym}]"));
        }
        let attrs = def.attrs();
        if !attrs.is_empty() {
            let items: Vec<String> = attrs
                .iter()
                .map(|(k, v)| match v {
                    Attr::Spec(id) => format!("{k}:${}", spelled(&self.spec_names[id], scope)),
                    v => format!("{k}:{v}"),
                })
                .collect();
            parts.push(format!("[{}]", items.join(", ")));
        }
        parts
    }

    fn bares(&self, vs: &[ValueId], scope: &str) -> Vec<Item> {
        vs.iter().map(|&v| vec![self.bare(v, scope)]).collect()
    }

    fn typeds(&self, vs: &[ValueId], scope: &str) -> Vec<Item> {
        vs.iter().map(|&v| self.typed(v, scope)).collect()
    }

    /// `head(ins) -> (outs)tail`, wrapped one item per line when too long, and an item's parts one
    /// per line (the later ones indented once more) when the item alone is too long.
    fn signature(&self, indent: usize, head: &str, ins: &[Item], outs: &[Item], tail: &str, out: &mut String) {
        let pad = INDENT.repeat(indent);
        let joined = |items: &[Item]| items.iter().map(|i| i.concat()).collect::<Vec<_>>().join(", ");
        let one = format!("{pad}{head}({}) -> ({}){tail}", joined(ins), joined(outs));
        if one.len() <= MAX_LINE {
            out.push_str(&one);
            out.push('\n');
            return;
        }
        let inner = INDENT.repeat(indent + 1);
        let item = |parts: &Item| -> String {
            let line = format!("{inner}{}", parts.concat());
            if line.len() <= MAX_LINE {
                return line;
            }
            let mut lines = vec![format!("{inner}{}", parts[0])];
            lines.extend(parts[1..].iter().map(|p| format!("{inner}{INDENT}{p}")));
            lines.join("\n")
        };
        let list = |items: &[Item]| -> String {
            if items.is_empty() {
                return String::new();
            }
            let body: Vec<String> = items.iter().map(item).collect();
            format!("\n{}\n{pad}", body.join(",\n"))
        };
        writeln!(out, "{pad}{head}({}) -> ({}){tail}", list(ins), list(outs)).unwrap();
    }

    fn region(&self, head: &str, r: &Region, indent: usize, scope: &str, out: &mut String) {
        self.signature(indent, head, &self.typeds(&r.inputs, scope), &self.bares(&r.outputs, scope), " {", out);
        for node in &r.body {
            self.node(node, indent + 1, scope, out);
        }
        writeln!(out, "{}}}", INDENT.repeat(indent)).unwrap();
    }

    fn node(&self, node: &Node, indent: usize, scope: &str, out: &mut String) {
        let pad = INDENT.repeat(indent);
        match node {
            Node::SubGraph(g) => {
                let device = g.device.map(|d| d.name()).unwrap_or("notype");
                let attrs = if g.attrs.is_empty() { String::new() } else { format!(" {}", attrs_text(&g.attrs)) };
                writeln!(out, "{pad}graph.SubGraphOp @{} {device}{attrs} {{", g.symbol).unwrap();
                self.region("", &g.region, indent + 1, &g.symbol, out);
                writeln!(out, "{pad}}}").unwrap();
            }
            Node::Call(c) => {
                let head = format!("graph.CallGraphOp @{} ", c.symbol);
                self.signature(indent, &head, &self.bares(&c.inputs, scope), &self.typeds(&c.outputs, scope), "", out);
            }
            Node::Linalg(op) => {
                let mut head = format!("linalg.{}.{}Op ", op.device, op.kind.type_name());
                if let Some(name) = &op.name {
                    write!(head, "<name={name:?}> ").unwrap();
                }
                let mut attrs = op.kind.option_attrs();
                attrs.extend(op.attrs.iter().map(|(k, v)| (k.clone(), v.clone())));
                if !attrs.is_empty() {
                    write!(head, "{} ", attrs_text(&attrs)).unwrap();
                }
                self.signature(
                    indent,
                    &head,
                    &self.bares(&op.inputs, scope),
                    &self.typeds(&op.outputs, scope),
                    "",
                    out,
                );
            }
            Node::Register { device, value } => {
                let head = format!("tensor.{device}.register ");
                self.signature(indent, &head, &[], &[self.typed(*value, scope)], "", out);
            }
            Node::Constant { device, value } => {
                let head = format!("tensor.{device}.constant ");
                self.signature(indent, &head, &[], &[self.typed(*value, scope)], "", out);
            }
            Node::Return(vs) => self.signature(indent, "cf.ReturnOp ", &self.bares(vs, scope), &[], "", out),
            Node::Comment(c) => writeln!(out, "{pad}// {c}").unwrap(),
        }
    }
}

/// `[key:value, key:value]`, sorted by key.
pub(crate) fn attrs_text(attrs: &Attrs) -> String {
    let items: Vec<String> = attrs.iter().map(|(k, v)| format!("{k}:{v}")).collect();
    format!("[{}]", items.join(", "))
}

//! The module scope stack: which module's `forward` is running.
//!
//! `#[module]` wraps each `forward` so that entering it pushes a frame with the module path; `qdq!`
//! resolves names against the innermost frame, errors report it, and under tracing anonymous ops are
//! named `<path>.<OpType>.<k>`.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};

pub(crate) struct Frame {
    pub path: String,
    /// QDQ names used in this call, to reject repeats.
    pub qdq_names: HashSet<String>,
    /// Per op type counters for anonymous op names.
    pub op_counts: HashMap<&'static str, usize>,
}

thread_local! {
    static FRAMES: RefCell<Vec<Frame>> = const { RefCell::new(Vec::new()) };
}

/// Pops its frame when dropped (also on panic or early return).
pub(crate) struct FrameGuard(());

impl Drop for FrameGuard {
    fn drop(&mut self) {
        FRAMES.with(|f| f.borrow_mut().pop());
    }
}

pub(crate) fn enter(path: String) -> FrameGuard {
    FRAMES.with(|f| f.borrow_mut().push(Frame { path, qdq_names: HashSet::new(), op_counts: HashMap::new() }));
    FrameGuard(())
}

/// The innermost module path (empty at the top level or outside any module).
pub fn current_path() -> String {
    FRAMES.with(|f| f.borrow().last().map(|fr| fr.path.clone()).unwrap_or_default())
}

/// Records a QDQ name in the innermost frame and gives its checkpoint key: `<path>.<name>`
/// ([`crate::qdq::qdq_key`]), or `name` itself for a global point. `None` if the name was already
/// used in this call. (The path is borrowed, not copied: a decode step runs about a thousand
/// QDQ points.)
pub(crate) fn claim_qdq(name: &str, global: bool) -> Option<String> {
    FRAMES.with(|f| match f.borrow_mut().last_mut() {
        Some(fr) => fr.qdq_names.insert(name.to_string()).then(|| {
            if global {
                name.to_string()
            } else {
                crate::qdq::qdq_key(&fr.path, name)
            }
        }),
        None => Some(name.to_string()),
    })
}

/// `<path>.<OpType>.<k>`, counting per op type in the innermost frame.
pub(crate) fn anonymous_op_name(type_name: &'static str) -> String {
    FRAMES.with(|f| {
        let mut frames = f.borrow_mut();
        let (path, k) = match frames.last_mut() {
            Some(fr) => {
                let c = fr.op_counts.entry(type_name).or_insert(0);
                *c += 1;
                (fr.path.clone(), *c - 1)
            }
            None => (String::new(), 0),
        };
        if path.is_empty() {
            format!("{type_name}.{k}")
        } else {
            format!("{path}.{type_name}.{k}")
        }
    })
}

//! The module scope stack: which module's `forward` is running.
//!
//! `#[module]` wraps each `forward` so that entering it pushes a frame with the module path; `qdq!`
//! resolves names against the innermost frame, errors report it, and under tracing anonymous ops are
//! named `<path>.<OpType>.<k>`.

use std::cell::RefCell;
use std::collections::HashMap;

pub(crate) struct Frame {
    pub path: String,
    /// QDQ names used in this call, to reject repeats ([`QdqNames`]).
    pub qdq_names: QdqNames,
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
    FRAMES.with(|f| f.borrow_mut().push(Frame { path, qdq_names: QdqNames::default(), op_counts: HashMap::new() }));
    FrameGuard(())
}

/// The innermost module path (empty at the top level or outside any module).
pub fn current_path() -> String {
    with_current_path(str::to_string)
}

/// `f` on the innermost module path (empty at the top level), borrowed: no copy of the path.
pub(crate) fn with_current_path<R>(f: impl FnOnce(&str) -> R) -> R {
    FRAMES.with(|frames| f(frames.borrow().last().map_or("", |fr| fr.path.as_str())))
}

/// Records a QDQ name in the innermost frame, as [`claim_qdq`] does, without making its key;
/// `false` if the name was already used in this call.
pub(crate) fn claim_qdq_name(name: &str) -> bool {
    FRAMES.with(|f| f.borrow_mut().last_mut().is_none_or(|fr| fr.qdq_names.insert(name)))
}

/// Records a QDQ name in the innermost frame and gives its checkpoint key: `<path>.<name>`
/// ([`crate::qdq::qdq_key`]), or `name` itself for a global point. `None` if the name was already
/// used in this call. (The path is borrowed, not copied: a decode step runs about a thousand
/// QDQ points.)
pub(crate) fn claim_qdq(name: &str, global: bool) -> Option<String> {
    claim_qdq_name(name).then(|| {
        if global {
            name.to_string()
        } else {
            with_current_path(|path| crate::qdq::qdq_key(path, name))
        }
    })
}

/// The QDQ names of one module call, one after another in one buffer: a call has a few dozen at
/// most, so a scan beats hashing, and a decode step's thousand points allocate no name each.
#[derive(Default)]
pub(crate) struct QdqNames {
    text: String,
    /// Where each name ends in `text`.
    ends: Vec<usize>,
}

impl QdqNames {
    /// Adds `name`; `false` if it is already there.
    fn insert(&mut self, name: &str) -> bool {
        let mut start = 0;
        for &end in &self.ends {
            if &self.text[start..end] == name {
                return false;
            }
            start = end;
        }
        self.text.push_str(name);
        self.ends.push(self.text.len());
        true
    }
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

#[cfg(test)]
mod tests {
    use super::QdqNames;

    #[test]
    fn a_name_is_refused_only_when_it_was_used_whole() {
        let mut names = QdqNames::default();
        assert!(names.insert("up_proj_input_qdq"));
        assert!(names.insert("up_proj"));
        assert!(names.insert("input_qdq"));
        assert!(names.insert(""));
        for used in ["up_proj_input_qdq", "up_proj", "input_qdq", ""] {
            assert!(!names.insert(used), "{used:?} twice");
        }
        assert!(names.insert("up_proj_input_qdq2"));
    }
}

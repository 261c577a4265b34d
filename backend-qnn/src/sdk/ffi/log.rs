//! The backend's log lines, caught so that a failing call's error can quote them.
//!
//! `logCreate` takes a callback `(fmt, level, timestamp, va_list)`. On x86_64 and aarch64 Linux a
//! `va_list` parameter arrives as a pointer (x86_64: the array type decays; aarch64: the 32-byte
//! struct is passed by reference), and libc's `vsnprintf` takes it the same way, so the line is
//! formatted by the C library itself — no C shim, no nightly `c_variadic`.
//!
//! The callback carries no user data, so lines go into one bounded process-wide buffer, each with
//! a sequence number and the thread that logged it. A call notes the sequence number before it
//! starts ([`mark`]); when it fails, [`lines_since`] returns what was logged meanwhile, preferring
//! the calling thread's lines (other threads may be running their own backends). Every line is
//! also echoed to stderr, as QNN's own logger would print it.

use std::collections::VecDeque;
use std::ffi::CStr;
use std::io::Write;
use std::os::raw::{c_char, c_int, c_void};
use std::sync::{Mutex, MutexGuard};
use std::thread::{self, ThreadId};

use super::bindings as b;

/// Lines kept (the oldest are dropped first) and bytes kept per line.
const MAX_LINES: usize = 256;
const MAX_LINE_BYTES: usize = 1024;

extern "C" {
    /// libc's `vsnprintf`, with the `va_list` as the callback received it (see the module docs).
    fn vsnprintf(buf: *mut c_char, size: usize, format: *const c_char, args: *mut c_void) -> c_int;
}

struct Line {
    seq: u64,
    thread: ThreadId,
    text: String,
}

struct Buffer {
    lines: VecDeque<Line>,
    next: u64,
}

static BUFFER: Mutex<Buffer> = Mutex::new(Buffer { lines: VecDeque::new(), next: 0 });

fn buffer() -> MutexGuard<'static, Buffer> {
    // A panic elsewhere while holding the lock leaves the lines intact.
    BUFFER.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The callback registered at `logCreate`, as the bindings type it.
pub(super) fn callback() -> b::QnnLog_Callback_t {
    type Callback = unsafe extern "C" fn(*const c_char, b::QnnLog_Level_t, u64, *mut c_void);
    let f: Callback = on_log;
    // SAFETY: same C signature; the bindings spell the `va_list` parameter as a pointer to the
    // platform's `va_list` type, which is the pointer this function receives.
    unsafe { std::mem::transmute::<Option<Callback>, b::QnnLog_Callback_t>(Some(f)) }
}

unsafe extern "C" fn on_log(format: *const c_char, level: b::QnnLog_Level_t, _timestamp: u64, args: *mut c_void) {
    if format.is_null() {
        return;
    }
    let mut text = [0 as c_char; MAX_LINE_BYTES];
    // SAFETY: `format` and `args` come from the backend as a printf format and its arguments;
    // vsnprintf writes at most `text.len()` bytes, NUL included.
    if unsafe { vsnprintf(text.as_mut_ptr(), text.len(), format, args) } < 0 {
        return;
    }
    // SAFETY: vsnprintf NUL-terminated the buffer.
    let text = unsafe { CStr::from_ptr(text.as_ptr()) }.to_string_lossy();
    // `QnnLog_Level_t` is `c_uint` or `c_int` depending on the header.
    #[allow(clippy::unnecessary_cast)]
    let level = level as u32;
    record(level_name(level), text.trim_end());
}

fn level_name(level: u32) -> &'static str {
    match level {
        1 => "ERROR",
        2 => "WARN",
        3 => "INFO",
        4 => "VERBOSE",
        5 => "DEBUG",
        _ => "LOG",
    }
}

fn record(level: &str, text: &str) {
    let text = format!("{level}: {text}");
    // Never panic inside a C callback: a closed stderr is ignored.
    let _ = writeln!(std::io::stderr(), "QNN {text}");
    let mut buffer = buffer();
    let seq = buffer.next;
    buffer.next += 1;
    if buffer.lines.len() == MAX_LINES {
        buffer.lines.pop_front();
    }
    buffer.lines.push_back(Line { seq, thread: thread::current().id(), text });
}

/// The sequence number the next logged line will get.
pub(super) fn mark() -> u64 {
    buffer().next
}

/// Lines logged since `mark`: the calling thread's, or every thread's when it logged none.
pub(super) fn lines_since(mark: u64) -> Vec<String> {
    let buffer = buffer();
    let recent: Vec<&Line> = buffer.lines.iter().filter(|l| l.seq >= mark).collect();
    let me = thread::current().id();
    let mine: Vec<String> = recent.iter().filter(|l| l.thread == me).map(|l| l.text.clone()).collect();
    if mine.is_empty() {
        recent.iter().map(|l| l.text.clone()).collect()
    } else {
        mine
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_bounded_and_found_by_mark_and_thread() {
        let start = mark();
        record("ERROR", "first");
        let other = thread::spawn(|| record("WARN", "from another thread"));
        other.join().unwrap();
        assert_eq!(lines_since(start), ["ERROR: first"]);
        let later = mark();
        thread::spawn(|| record("WARN", "only another thread")).join().unwrap();
        assert_eq!(lines_since(later), ["WARN: only another thread"]);
        for i in 0..MAX_LINES + 10 {
            record("INFO", &format!("line {i}"));
        }
        let kept = lines_since(0);
        assert!(kept.len() <= MAX_LINES, "{} lines kept", kept.len());
        assert_eq!(kept.last().map(String::as_str), Some(format!("INFO: line {}", MAX_LINES + 9).as_str()));
    }
}

//! How the long steps (calibration, quantization, lowering, evaluation) report progress: through
//! the [`Progress`] the caller passes in its options. The library draws nothing itself; a
//! command-line main passes [`bars`] (indicatif bars on stderr), a test or a service [`silent`]
//! or its own implementation.

use std::fmt::Debug;
use std::sync::Arc;

use indicatif::{MultiProgress, ProgressBar, ProgressStyle};

/// Receives the progress of the pipeline's long steps.
pub trait Progress: Debug + Send + Sync {
    /// A step named `what` (e.g. `calibrating`) of `len` units begins.
    fn start(&self, what: &str, len: usize) -> Box<dyn ProgressStep>;
}

/// The progress of one step.
pub trait ProgressStep: Send + Sync {
    /// `n` more units are done.
    fn inc(&self, n: usize);
    /// `done` of `len` units are done (for steps whose length is learned on the way).
    fn set_position(&self, done: usize, len: usize);
    /// What the step works on now (a graph, a tensor).
    fn set_message(&self, message: &str);
    /// The step is over.
    fn finish(&self);
}

/// Reports nothing.
#[derive(Debug, Default, Clone, Copy)]
pub struct Silent;

impl Progress for Silent {
    fn start(&self, _: &str, _: usize) -> Box<dyn ProgressStep> {
        Box::new(Silent)
    }
}

impl ProgressStep for Silent {
    fn inc(&self, _: usize) {}
    fn set_position(&self, _: usize, _: usize) {}
    fn set_message(&self, _: &str) {}
    fn finish(&self) {}
}

/// indicatif progress bars on stderr (hidden without a TTY), one line each: steps that run at
/// the same time (the evaluation beside the compile) each keep their own line.
#[derive(Debug, Default, Clone)]
pub struct Bars {
    lines: MultiProgress,
}

impl Progress for Bars {
    fn start(&self, what: &str, len: usize) -> Box<dyn ProgressStep> {
        let pb = self.lines.add(ProgressBar::new(len as u64));
        let style = ProgressStyle::with_template("{prefix:>12} [{bar:30}] {pos}/{len} {elapsed_precise} {msg}")
            .expect("valid template")
            .progress_chars("=> ");
        pb.set_style(style);
        pb.set_prefix(what.to_string());
        Box::new(pb)
    }
}

impl ProgressStep for ProgressBar {
    fn inc(&self, n: usize) {
        ProgressBar::inc(self, n as u64);
    }
    fn set_position(&self, done: usize, len: usize) {
        self.set_length(len as u64);
        ProgressBar::set_position(self, done as u64);
    }
    fn set_message(&self, message: &str) {
        ProgressBar::set_message(self, message.to_string());
    }
    fn finish(&self) {
        ProgressBar::finish(self);
    }
}

/// No progress reports.
pub fn silent() -> Arc<dyn Progress> {
    Arc::new(Silent)
}

/// Progress bars on stderr when `show` (a command line's `!--quiet`), else nothing.
pub fn bars(show: bool) -> Arc<dyn Progress> {
    if show {
        Arc::new(Bars::default())
    } else {
        silent()
    }
}

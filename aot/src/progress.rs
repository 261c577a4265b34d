//! Progress bars of the long steps (calibration, quantization, lowering) on stderr.

use indicatif::{ProgressBar, ProgressStyle};

/// A progress bar on stderr (hidden when `progress` is off; indicatif hides it without a TTY).
pub fn bar(progress: bool, len: usize, what: &str) -> ProgressBar {
    if !progress {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::new(len as u64);
    let style = ProgressStyle::with_template("{prefix:>12} [{bar:30}] {pos}/{len} {elapsed_precise} {msg}")
        .expect("valid template")
        .progress_chars("=> ");
    pb.set_style(style);
    pb.set_prefix(what.to_string());
    pb
}

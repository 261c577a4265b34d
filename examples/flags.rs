//! Command-line flags that several of the example mains share, so their names, defaults and help
//! have one owner. Each main takes them with `#[command(flatten)]`.

use std::path::PathBuf;

/// The flags of a main that scores a model on text and reports figures: JSON output, CPU threads,
/// progress bars.
#[derive(clap::Args, Debug)]
pub struct ScoreFlags {
    /// Also write the scores as JSON here.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// CPU threads (0: all cores).
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub threads: usize,
    /// No progress bars.
    #[arg(long)]
    pub quiet: bool,
}

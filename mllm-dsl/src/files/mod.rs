//! Files read and written safely, for every crate of the project.
//!
//! ```no_run
//! use mllm_dsl::files::{read_text_bounded, write_atomic_bytes, StagingDir, CONFIG_SIZE_LIMIT};
//! # fn main() -> Result<(), mllm_dsl::files::FileError> {
//! let text = read_text_bounded("model/config.json".as_ref(), CONFIG_SIZE_LIMIT)?; // regular file, bounded
//! let staging = StagingDir::new("out".as_ref())?;               // fresh, unique, next to `out`
//! write_atomic_bytes(&staging.path().join("config.json"), text.as_bytes())?;
//! staging.commit()?;                                            // `out` replaced in one step
//! # Ok(()) }
//! ```
//!
//! - [`read_bounded`]: configs and JSON are read only from regular files (not FIFOs or devices)
//!   under a size limit, so a bad path cannot hang a run or exhaust memory.
//! - [`write_atomic`]: one file written under a fresh temporary name (created exclusively, never
//!   through a link) and renamed over the target, so readers see the old file or the whole new one.
//! - [`StagingDir`]: a whole output directory built aside and swapped into place only when the
//!   run succeeded; a failed or killed run leaves the previous output untouched.
//! - [`project_cache`]: where the fetch scripts keep what they download.
//! - [`ensure_not_input`]: an output path that would overwrite or remove an input is refused.

mod atomic_write;
mod bounded_read;
mod cache;
mod disjoint;
mod error;
mod staging;

pub use atomic_write::{write_atomic, write_atomic_bytes, write_json_atomic};
pub use bounded_read::{read_bounded, read_text_bounded, CONFIG_SIZE_LIMIT};
pub use cache::project_cache;
pub use disjoint::ensure_not_input;
pub use error::FileError;
pub use staging::StagingDir;

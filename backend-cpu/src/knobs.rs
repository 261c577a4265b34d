//! The CPU backend's speed settings read from the environment, which a benchmark may also change
//! between generations in one process.
//!
//! Each setting (an `MLLM_CPU_*` variable: [`RUNTIME_SETTINGS`]) moves only speed, never results.
//! It is read from the environment the first time it is needed; [`set`] overrides it for the
//! whole process from then on, so that a benchmark can alternate two settings generation by
//! generation in one process (`bench_cpu --paired`) instead of in separate processes, whose
//! figures on a shared host drift apart by more than the effects measured.
//!
//! ```
//! use backend_cpu::knobs;
//! knobs::set(backend_cpu::SIBLINGS_ENV, Some("off")).unwrap();
//! // ... generate: every linear runs alone ...
//! knobs::set(backend_cpu::SIBLINGS_ENV, None).unwrap(); // back to the environment's value
//! assert!(knobs::set("MLLM_CPU_NO_SUCH", Some("x")).is_err());
//! ```

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

/// The settings [`set`] changes: the int4 tile, the read-ahead policy, the decode prefetch, the
/// sibling jobs.
pub const RUNTIME_SETTINGS: [&str; 4] = [
    crate::kernels::INT4_TILE_ENV,
    crate::kernels::READ_AHEAD_ENV,
    crate::kernels::DECODE_PREFETCH_ENV,
    crate::siblings::SIBLINGS_ENV,
];

/// A name [`set`] does not know.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("`{name}` is not a setting the CPU backend changes at run time (it changes {})", RUNTIME_SETTINGS.join(", "))]
pub struct UnknownSetting {
    pub name: String,
}

/// The values [`set`] put in place of the environment's (`None`: back to the environment).
static OVERRIDES: Mutex<Vec<(&str, String)>> = Mutex::new(Vec::new());

/// Bumped by every [`set`]: a [`Cached`] value of an older epoch is read again.
static EPOCH: AtomicU64 = AtomicU64::new(1);

/// `name` as one of [`RUNTIME_SETTINGS`], or the error [`set`] would give for it.
pub fn runtime_setting(name: &str) -> Result<&'static str, UnknownSetting> {
    RUNTIME_SETTINGS.iter().find(|&&n| n == name).copied().ok_or_else(|| UnknownSetting { name: name.to_string() })
}

/// Sets `name` (one of [`RUNTIME_SETTINGS`]) to `value` for this process, or with `None` back to
/// the environment's value. Takes effect from the next product or linear on.
pub fn set(name: &str, value: Option<&str>) -> Result<(), UnknownSetting> {
    let name = runtime_setting(name)?;
    let mut overrides = OVERRIDES.lock().unwrap_or_else(PoisonError::into_inner);
    overrides.retain(|(n, _)| *n != name);
    if let Some(value) = value {
        overrides.push((name, value.to_string()));
    }
    EPOCH.fetch_add(1, Ordering::SeqCst);
    Ok(())
}

/// The value of `name`: [`set`]'s, else the environment's.
pub(crate) fn var(name: &str) -> Option<String> {
    let overrides = OVERRIDES.lock().unwrap_or_else(PoisonError::into_inner);
    match overrides.iter().find(|(n, _)| *n == name) {
        Some((_, value)) => Some(value.clone()),
        None => std::env::var(name).ok(),
    }
}

/// A setting's parsed value, read again after a [`set`]: its epoch and the value's index in
/// one word, so that a reader never pairs a value with another read's epoch.
pub(crate) struct Cached(AtomicU64);

impl Cached {
    pub(crate) const fn new() -> Cached {
        Cached(AtomicU64::new(0))
    }

    /// What `read` gives, one of `all`; read again only after a [`set`].
    pub(crate) fn get<T: Copy + PartialEq>(&self, all: &[T], read: impl FnOnce() -> T) -> T {
        let epoch = EPOCH.load(Ordering::SeqCst);
        let word = self.0.load(Ordering::Relaxed);
        if word >> 8 == epoch {
            if let Some(&value) = all.get((word & 0xFF) as usize) {
                return value;
            }
        }
        let value = read();
        if let Some(index) = all.iter().position(|&v| v == value).filter(|&i| i < 256) {
            self.0.store(epoch << 8 | index as u64, Ordering::Relaxed);
        }
        value
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_setting_is_read_again_after_a_set_and_unknown_names_are_refused() {
        static CACHE: Cached = Cached::new();
        // No other test sets it, and a test that reads it meanwhile only runs at another speed.
        let name = crate::kernels::DECODE_PREFETCH_ENV;
        let read = || {
            CACHE.get(&["unset", "nta", "other"], || match var(name).as_deref() {
                None => "unset",
                Some("nta") => "nta",
                Some(_) => "other",
            })
        };
        let from_env = read();
        set(name, Some("nta")).unwrap();
        assert_eq!(read(), "nta");
        set(name, Some("t0")).unwrap();
        assert_eq!(read(), "other");
        set(name, None).unwrap();
        assert_eq!(read(), from_env);
        let err = set("MLLM_CPU_BF16_TILE", Some("dot")).unwrap_err();
        assert!(
            err.to_string().contains("MLLM_CPU_BF16_TILE") && err.to_string().contains(crate::SIBLINGS_ENV),
            "{err}"
        );
    }
}

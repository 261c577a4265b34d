//! A whole output directory built aside and swapped into place when the run succeeded.
//!
//! Layout next to `out`: `.<out>.lock` (held while a staging directory is made or stale ones are
//! cleaned), `.<out>.staging-XXXXXX/` (one per run, locked by its run with `flock` for as long as
//! it lives). A run killed with SIGKILL loses its lock with the process, so the next run into the
//! same `out` recognises the directory as stale and removes it.

use std::ffi::OsString;
use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};

use super::atomic_write::sync_dir;
use super::error::kind_of;
use super::FileError;

/// A fresh, empty directory next to an output directory; see the module docs.
///
/// Write the run's files under [`StagingDir::path`], then call [`StagingDir::commit`]. Dropping it
/// without committing (an error, a panic) removes it and leaves the previous output as it was.
#[derive(Debug)]
pub struct StagingDir {
    out: PathBuf,
    dir: PathBuf,
    /// Holds the `flock` that marks the directory as in use.
    _lock: File,
    committed: bool,
}

impl StagingDir {
    /// Creates `.<out>.staging-XXXXXX` next to `out` (parent directories are created), after
    /// removing staging directories that runs killed earlier left behind. `out` may be missing or
    /// a directory; a file or a symlink at `out` is refused.
    pub fn new(out: &Path) -> Result<StagingDir, FileError> {
        let name = out.file_name().ok_or_else(|| FileError::NoFileName { path: out.to_path_buf() })?;
        if let Ok(meta) = std::fs::symlink_metadata(out) {
            if !meta.is_dir() {
                return Err(FileError::OutputNotDirectory { path: out.to_path_buf(), kind: kind_of(meta.file_type()) });
            }
        }
        let parent = out.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
        std::fs::create_dir_all(parent).map_err(FileError::io("creating the directory", parent))?;

        let guard = open_nofollow(&parent.join(hidden(name, ".lock")))?;
        guard.lock().map_err(FileError::io("locking", parent.join(hidden(name, ".lock"))))?;
        let prefix = hidden(name, ".staging-");
        remove_stale(parent, &prefix)?;
        // mkdir with a random name: fails rather than reuse anything (a link included) already there.
        let mut builder = tempfile::Builder::new();
        builder.prefix(&prefix).rand_bytes(8);
        // The output directory it becomes gets the usual mode (umask applied), not a temp dir's 0700.
        #[cfg(unix)]
        builder.permissions(std::os::unix::fs::PermissionsExt::from_mode(0o777));
        let dir = builder.tempdir_in(parent).map_err(FileError::io("creating a staging directory in", parent))?.keep();
        let lock = File::open(&dir).map_err(FileError::io("opening", &dir))?;
        lock.lock().map_err(FileError::io("locking", &dir))?;
        drop(guard);
        Ok(StagingDir { out: out.to_path_buf(), dir, _lock: lock, committed: false })
    }

    /// Where the run writes its files.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// The output directory this run replaces.
    pub fn out(&self) -> &Path {
        &self.out
    }

    /// Puts the staged directory at `out` in one step (an atomic exchange where the filesystem
    /// supports it) and removes the previous output. With concurrent runs into one `out`, each
    /// commit replaces a complete directory by another complete one, so the last commit wins whole.
    pub fn commit(mut self) -> Result<(), FileError> {
        let replaced = swap_into_place(&self.dir, &self.out)?;
        self.committed = true;
        if let Some(old) = replaced {
            // Best effort: if this fails (or a concurrent run removes it first), the old output
            // stays under a staging name nobody locks, and the next run into `out` removes it.
            let _ = std::fs::remove_dir_all(&old);
        }
        sync_dir(self.out.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new(".")));
        Ok(())
    }
}

impl Drop for StagingDir {
    fn drop(&mut self) {
        if !self.committed {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// Moves `staged` to `out`; returns where the previous `out` now is, if there was one.
fn swap_into_place(staged: &Path, out: &Path) -> Result<Option<PathBuf>, FileError> {
    // Another run may create or replace `out` between two calls, hence the retries.
    for _ in 0..100 {
        match std::fs::symlink_metadata(out) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => match std::fs::rename(staged, out) {
                Ok(()) => return Ok(None),
                Err(e) if is_not_empty(&e) => continue,
                Err(e) => return Err(FileError::io("moving the staged output to", out)(e)),
            },
            Err(e) => return Err(FileError::io("reading the metadata of", out)(e)),
            Ok(meta) if !meta.is_dir() => {
                return Err(FileError::OutputNotDirectory { path: out.to_path_buf(), kind: kind_of(meta.file_type()) })
            }
            Ok(_) => match exchange(staged, out) {
                // The previous output is now at the staging name.
                Ok(()) => return Ok(Some(staged.to_path_buf())),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(_) => return two_step_swap(staged, out).map(Some),
            },
        }
    }
    Err(FileError::Io {
        action: "replacing (other runs keep replacing it)",
        path: out.to_path_buf(),
        source: std::io::Error::other("gave up after 100 attempts"),
    })
}

/// Fallback where the filesystem cannot exchange two names: the old output is renamed aside,
/// then the staged one into place (`out` is missing for the moment in between).
fn two_step_swap(staged: &Path, out: &Path) -> Result<PathBuf, FileError> {
    let mut aside = staged.as_os_str().to_owned();
    aside.push(".old");
    let aside = PathBuf::from(aside);
    std::fs::rename(out, &aside).map_err(FileError::io("moving the previous output aside", out))?;
    std::fs::rename(staged, out).map_err(FileError::io("moving the staged output to", out))?;
    Ok(aside)
}

#[cfg(target_os = "linux")]
fn exchange(a: &Path, b: &Path) -> std::io::Result<()> {
    use rustix::fs::{renameat_with, RenameFlags, CWD};
    renameat_with(CWD, a, CWD, b, RenameFlags::EXCHANGE).map_err(std::io::Error::from)
}

#[cfg(not(target_os = "linux"))]
fn exchange(_: &Path, _: &Path) -> std::io::Result<()> {
    Err(std::io::Error::from(std::io::ErrorKind::Unsupported))
}

fn is_not_empty(e: &std::io::Error) -> bool {
    matches!(e.kind(), std::io::ErrorKind::DirectoryNotEmpty | std::io::ErrorKind::AlreadyExists)
}

/// `.<name><suffix>`.
fn hidden(name: &std::ffi::OsStr, suffix: &str) -> OsString {
    let mut s = OsString::from(".");
    s.push(name);
    s.push(suffix);
    s
}

/// Opens (creating) a lock file without following a link planted at its name.
fn open_nofollow(path: &Path) -> Result<File, FileError> {
    let mut options = OpenOptions::new();
    options.read(true).write(true).create(true).truncate(false);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32);
    }
    options.open(path).map_err(FileError::io("opening the lock file", path))
}

/// Removes `<prefix>*` directories in `parent` whose run is gone (nobody holds their lock).
/// Called with the parent's `.lock` held, so no run is between creating and locking its own.
fn remove_stale(parent: &Path, prefix: &OsString) -> Result<(), FileError> {
    let prefix = prefix.to_string_lossy();
    let entries = std::fs::read_dir(parent).map_err(FileError::io("listing", parent))?;
    for entry in entries.flatten() {
        let name = entry.file_name();
        if !name.to_string_lossy().starts_with(prefix.as_ref()) {
            continue;
        }
        let path = entry.path();
        let Ok(file_type) = entry.file_type() else { continue };
        if file_type.is_symlink() || !file_type.is_dir() {
            // Not something this module made: a leftover `.old` aside is a directory; links stay.
            continue;
        }
        let Ok(handle) = File::open(&path) else { continue };
        if handle.try_lock().is_ok() {
            std::fs::remove_dir_all(&path).map_err(FileError::io("removing the stale staging directory", &path))?;
        }
    }
    Ok(())
}

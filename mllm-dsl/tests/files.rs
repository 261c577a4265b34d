//! mllm_dsl::files: bounded reads, atomic writes and staged output directories, against the
//! hostile cases the bad-input campaign of issue #14 used (FIFOs, devices, planted links,
//! failed and concurrent runs).

use std::collections::BTreeMap;
use std::path::Path;

use mllm_dsl::files::{
    ensure_not_input, read_bounded, read_text_bounded, write_atomic, write_atomic_bytes, FileError, StagingDir,
    CONFIG_SIZE_LIMIT,
};

/// Every file under `dir` (relative path -> bytes), hidden names included.
fn snapshot(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, Vec<u8>>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let rel = path.strip_prefix(root).unwrap().to_string_lossy().into_owned();
            let meta = std::fs::symlink_metadata(&path).unwrap();
            if meta.is_dir() {
                out.insert(format!("{rel}/"), Vec::new());
                walk(root, &path, out);
            } else if meta.file_type().is_symlink() {
                out.insert(
                    format!("{rel}@"),
                    std::fs::read_link(&path).unwrap().to_string_lossy().into_owned().into_bytes(),
                );
            } else {
                out.insert(rel, std::fs::read(&path).unwrap());
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, dir, &mut out);
    out
}

fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<_> =
        std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    names.sort();
    names
}

fn run_into(out: &Path, files: &[(&str, &str)]) -> Result<(), FileError> {
    let staging = StagingDir::new(out)?;
    for (name, text) in files {
        write_atomic_bytes(&staging.path().join(name), text.as_bytes())?;
    }
    staging.commit()
}

#[test]
fn bounded_read_refuses_fifos_devices_directories_and_big_files() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("config.json");
    assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    // Would block forever (no writer) if the FIFO were opened for a plain read.
    let err = read_bounded(&fifo, CONFIG_SIZE_LIMIT).unwrap_err();
    assert!(matches!(err, FileError::NotRegularFile { kind: "a FIFO", .. }), "{err}");
    assert!(err.to_string().contains("config.json"), "{err}");

    let err = read_bounded(Path::new("/dev/zero"), CONFIG_SIZE_LIMIT).unwrap_err();
    assert!(matches!(err, FileError::NotRegularFile { kind: "a device", .. }), "{err}");
    let err = read_bounded(dir.path(), CONFIG_SIZE_LIMIT).unwrap_err();
    assert!(matches!(err, FileError::NotRegularFile { kind: "a directory", .. }), "{err}");

    let big = dir.path().join("big.json");
    std::fs::write(&big, vec![b' '; 1001]).unwrap();
    let err = read_bounded(&big, 1000).unwrap_err();
    assert!(matches!(err, FileError::TooLarge { limit: 1000, .. }), "{err}");
    assert_eq!(read_bounded(&big, 1001).unwrap().len(), 1001);

    // /proc files report size 0: the limit holds while reading too.
    let err = read_bounded(Path::new("/proc/self/maps"), 10).unwrap_err();
    assert!(matches!(err, FileError::TooLarge { .. }), "{err}");

    std::fs::write(&big, [0xff, 0xfe]).unwrap();
    assert!(matches!(read_text_bounded(&big, 10).unwrap_err(), FileError::NotUtf8 { .. }));
    // A link to a regular file is read like the file.
    let link = dir.path().join("link.json");
    std::os::unix::fs::symlink(&big, &link).unwrap();
    assert_eq!(read_bounded(&link, 10).unwrap(), [0xff, 0xfe]);
}

#[test]
fn atomic_write_never_writes_through_links() {
    let dir = tempfile::tempdir().unwrap();
    let victim = dir.path().join("victim");
    std::fs::write(&victim, "precious").unwrap();
    let target = dir.path().join("report.json");
    // Links planted at the names the old writers used, and at the target itself.
    for planted in ["report.json.tmp", ".report.json.tmp", "report.json"] {
        std::os::unix::fs::symlink(&victim, dir.path().join(planted)).unwrap_or(());
    }
    write_atomic_bytes(&target, b"new").unwrap();
    assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
    assert!(!std::fs::symlink_metadata(&target).unwrap().file_type().is_symlink(), "the link is replaced");
    assert_eq!(std::fs::read(&target).unwrap(), b"new");
}

#[test]
fn failed_atomic_write_leaves_the_old_file_and_no_temporary() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("model.safetensors");
    std::fs::write(&target, "old").unwrap();
    let err = write_atomic(&target, |w| {
        w.write_all(b"half")?;
        Err(std::io::Error::other("disk on fire"))
    })
    .unwrap_err();
    assert!(err.to_string().contains("model.safetensors") && err.to_string().contains("disk on fire"), "{err}");
    assert_eq!(std::fs::read(&target).unwrap(), b"old");
    assert_eq!(names(dir.path()), ["model.safetensors"]);
}

#[test]
fn failed_run_leaves_previous_output_byte_identical() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    run_into(&out, &[("report.json", "run 1"), ("qnn/g.bin", "")]).unwrap_err(); // qnn/ missing
    assert!(!out.exists(), "a failed first run creates no output");
    std::fs::create_dir_all(out.join("qnn")).unwrap();
    std::fs::write(out.join("qnn/g.bin"), "graph 1").unwrap();
    std::fs::write(out.join("report.json"), "run 1").unwrap();
    let before = snapshot(&out);

    {
        let staging = StagingDir::new(&out).unwrap();
        write_atomic_bytes(&staging.path().join("report.json"), b"run 2").unwrap();
        // An error here: the staging directory is dropped without a commit.
    }
    assert_eq!(snapshot(&out), before);
    assert_eq!(names(dir.path()), [".out.lock", "out"], "the staging directory is removed");
}

#[test]
fn commit_replaces_the_whole_output_so_earlier_files_do_not_linger() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    run_into(&out, &[("a.json", "1"), ("b.json", "1")]).unwrap();
    run_into(&out, &[("c.json", "2")]).unwrap();
    assert_eq!(names(&out), ["c.json"]);
    assert_eq!(names(dir.path()), [".out.lock", "out"]);
}

#[test]
fn stale_staging_of_a_killed_run_is_removed_but_a_live_one_is_not() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    // What SIGKILL leaves: a staging directory nobody holds the lock of.
    let stale = dir.path().join(".out.staging-deadbeef");
    std::fs::create_dir_all(stale.join("qnn")).unwrap();
    std::fs::write(stale.join("qnn/half.bin"), "half").unwrap();
    let live = StagingDir::new(&out).unwrap();
    assert!(!stale.exists(), "stale staging directory removed");
    let second = StagingDir::new(&out).unwrap();
    assert!(live.path().is_dir(), "a running run's staging directory is kept");
    drop(second);
    live.commit().unwrap();
    assert_eq!(names(dir.path()), [".out.lock", "out"]);
}

#[test]
fn links_and_files_at_the_output_or_staging_names_are_not_followed() {
    let dir = tempfile::tempdir().unwrap();
    let victim = dir.path().join("victim");
    std::fs::create_dir(&victim).unwrap();
    std::fs::write(victim.join("keep"), "keep").unwrap();
    let before = snapshot(&victim);

    let out = dir.path().join("out");
    std::os::unix::fs::symlink(&victim, &out).unwrap();
    let err = StagingDir::new(&out).unwrap_err();
    assert!(matches!(err, FileError::OutputNotDirectory { kind: "a symbolic link", .. }), "{err}");
    std::fs::remove_file(&out).unwrap();
    std::fs::write(&out, "a file").unwrap();
    assert!(matches!(StagingDir::new(&out).unwrap_err(), FileError::OutputNotDirectory { .. }));
    std::fs::remove_file(&out).unwrap();

    // Links planted at the staging and lock names.
    std::os::unix::fs::symlink(&victim, dir.path().join(".out.staging-aaaaaaaaaaaaaaaa")).unwrap();
    std::os::unix::fs::symlink(victim.join("keep"), dir.path().join(".out.lock")).unwrap();
    let err = StagingDir::new(&out).unwrap_err();
    assert!(err.to_string().contains(".out.lock"), "{err}");
    std::fs::remove_file(dir.path().join(".out.lock")).unwrap();
    run_into(&out, &[("report.json", "ok")]).unwrap();
    assert_eq!(snapshot(&victim), before);
    assert_eq!(names(&out), ["report.json"]);
}

#[test]
fn concurrent_runs_into_one_output_end_with_one_complete_result() {
    for round in 0..5 {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        let runs: Vec<_> = (0..6)
            .map(|id| {
                let out = out.clone();
                std::thread::spawn(move || {
                    let tag = format!("run {id}");
                    let files: Vec<(String, String)> = (0..20).map(|i| (format!("f{i}.txt"), tag.clone())).collect();
                    let files: Vec<(&str, &str)> = files.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
                    run_into(&out, &files)
                })
            })
            .collect();
        for run in runs {
            run.join().unwrap().unwrap();
        }
        let result = snapshot(&out);
        assert_eq!(result.len(), 20, "round {round}: {:?}", result.keys());
        let first = result.values().next().unwrap().clone();
        assert!(result.values().all(|v| *v == first), "round {round}: mixed output {result:?}");
        assert_eq!(names(dir.path()), [".out.lock", "out"], "round {round}");
    }
}

#[test]
fn outputs_that_are_inputs_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("model");
    std::fs::create_dir(&model).unwrap();
    std::fs::write(model.join("model.safetensors"), "weights").unwrap();
    let weights = model.join("model.safetensors");

    let err = ensure_not_input(&weights, &[&weights]).unwrap_err();
    assert!(err.to_string().contains("model.safetensors"), "{err}");
    assert!(ensure_not_input(&model.join("..").join("model").join("model.safetensors"), &[&weights]).is_err());
    assert!(ensure_not_input(&model, &[&weights]).is_err(), "--out DIR replacing the model's directory");
    assert!(ensure_not_input(dir.path(), &[&weights]).is_err(), "an output containing the input");
    let link = dir.path().join("alias");
    std::os::unix::fs::symlink(&model, &link).unwrap();
    assert!(ensure_not_input(&link.join("model.safetensors"), &[&weights]).is_err());

    assert!(ensure_not_input(&dir.path().join("logits.safetensors"), &[&weights, &model]).is_ok());
    assert!(ensure_not_input(&model.join("logits.safetensors"), &[&weights]).is_ok(), "a new file next to an input");
    assert!(ensure_not_input(&dir.path().join("new/out"), &[&model]).is_ok());
}

#[test]
fn outputs_get_the_usual_modes_not_private_temp_modes() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    std::fs::write(dir.path().join("probe"), "").unwrap();
    std::fs::create_dir(dir.path().join("probe-dir")).unwrap();
    let out = dir.path().join("out");
    run_into(&out, &[("report.json", "{}")]).unwrap();
    assert_eq!(mode(&out.join("report.json")), mode(&dir.path().join("probe")));
    assert_eq!(mode(&out), mode(&dir.path().join("probe-dir")));
}

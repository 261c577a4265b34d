//! `fixtures/manifest.json` is the inventory of the test fixtures: every file under `fixtures/`
//! (except the three hand-written top-level files `manifest.json`, `PROVENANCE.md` and
//! `make_fixtures.py`) is listed with its size and sha256, and every listed file is there with
//! exactly those bytes. A fixture changed, added or removed without the manifest fails here,
//! naming the file and the entry to write.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// Top-level files the manifest does not list: itself, the provenance notes, the generator.
const UNLISTED: [&str; 3] = ["manifest.json", "PROVENANCE.md", "make_fixtures.py"];

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures")
}

/// Every file under `dir`, relative to `root` with `/` separators (no `__pycache__`).
fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) {
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        if path.file_name().is_some_and(|n| n == "__pycache__") {
            continue;
        }
        if path.is_dir() {
            walk(root, &path, out);
        } else {
            out.push(path.strip_prefix(root).unwrap().to_string_lossy().replace('\\', "/"));
        }
    }
}

fn entry(bytes: &[u8]) -> serde_json::Value {
    serde_json::json!({ "bytes": bytes.len(), "sha256": format!("{:x}", Sha256::digest(bytes)) })
}

#[test]
fn sha256_of_the_empty_string_is_the_known_one() {
    // FIPS 180-4's SHA-256 of "" and of "abc": the hash this test relies on is the standard one.
    assert_eq!(entry(b"")["sha256"], "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    assert_eq!(entry(b"abc")["sha256"], "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

#[test]
fn manifest_lists_every_fixture_file_with_its_size_and_sha256() {
    let root = fixtures();
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(root.join("manifest.json")).unwrap()).expect("manifest.json is JSON");
    let listed: BTreeMap<String, serde_json::Value> = serde_json::from_value(manifest["files"].clone())
        .expect("manifest.json has `files`: an object of path -> {bytes, sha256}");
    let mut on_disk = Vec::new();
    walk(&root, &root, &mut on_disk);
    on_disk.retain(|p| !UNLISTED.contains(&p.as_str()));
    on_disk.sort();

    let mut problems = Vec::new();
    for path in &on_disk {
        let bytes = std::fs::read(root.join(path)).unwrap();
        let actual = entry(&bytes);
        match listed.get(path) {
            None => problems.push(format!("{path}: not in manifest.json; its entry is \"{path}\": {actual}")),
            Some(want) if *want != actual => {
                problems.push(format!("{path}: manifest.json says {want}, the file is {actual}"))
            }
            Some(_) => {}
        }
    }
    for path in listed.keys().filter(|p| !on_disk.contains(p)) {
        problems.push(format!("{path}: listed in manifest.json but not under fixtures/"));
    }
    assert!(problems.is_empty(), "fixtures/manifest.json is out of date:\n{}", problems.join("\n"));
    assert!(listed.len() > 40, "{} files listed", listed.len());
}

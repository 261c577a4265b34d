//! A minimal, deterministic ustar writer for `model.bin`.
//!
//! `model.bin` is a plain tar with one `<symbol>.raw` member per static buffer (Qualcomm's qnn-model-lib-generator docs;
//! MNN builds it with `tar -cf graph0.bin *.raw`). Members are regular files with mode 0644,
//! uid/gid 0, mtime 0 and empty owner names, so the archive depends only on its contents.

use std::io::{self, Write};

const BLOCK: usize = 512;
/// The largest member an 11-digit octal size field can describe.
pub const MAX_MEMBER_BYTES: u64 = 0o77777777777;

/// One archive member.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BinEntry {
    /// Member name (`<symbol>.raw`), at most 99 bytes.
    pub name: String,
    pub data: crate::graph::StaticData,
}

/// Byte offset of each member's data within the archive written by [`write()`].
pub fn data_offsets(entries: &[BinEntry]) -> Vec<u64> {
    let mut offset = 0u64;
    entries
        .iter()
        .map(|e| {
            let data_at = offset + BLOCK as u64;
            offset = data_at + padded(e.data.len() as u64);
            data_at
        })
        .collect()
}

fn padded(len: u64) -> u64 {
    len.div_ceil(BLOCK as u64) * BLOCK as u64
}

/// Write `entries` as a ustar archive followed by the two zero end blocks.
pub fn write(w: &mut impl Write, entries: &[BinEntry]) -> io::Result<()> {
    for e in entries {
        w.write_all(&header(&e.name, e.data.len() as u64)?)?;
        w.write_all(e.data.bytes())?;
        let pad = padded(e.data.len() as u64) as usize - e.data.len();
        w.write_all(&[0u8; BLOCK][..pad])?;
    }
    w.write_all(&[0u8; 2 * BLOCK])
}

fn octal(field: &mut [u8], value: u64) {
    // `len - 1` octal digits, zero padded, then NUL.
    let digits = field.len() - 1;
    let text = format!("{value:0digits$o}");
    field[..digits].copy_from_slice(text.as_bytes());
    field[digits] = 0;
}

fn header(name: &str, size: u64) -> io::Result<[u8; BLOCK]> {
    let invalid = |msg: String| io::Error::new(io::ErrorKind::InvalidInput, msg);
    if name.is_empty() || name.len() > 99 || !name.is_ascii() {
        return Err(invalid(format!("tar member name `{name}` must be 1..=99 ASCII bytes")));
    }
    if size > MAX_MEMBER_BYTES {
        return Err(invalid(format!("tar member `{name}` is {size} bytes, the limit is {MAX_MEMBER_BYTES}")));
    }
    let mut h = [0u8; BLOCK];
    h[..name.len()].copy_from_slice(name.as_bytes());
    octal(&mut h[100..108], 0o644);
    octal(&mut h[108..116], 0);
    octal(&mut h[116..124], 0);
    octal(&mut h[124..136], size);
    octal(&mut h[136..148], 0);
    h[156] = b'0';
    h[257..263].copy_from_slice(b"ustar\0");
    h[263..265].copy_from_slice(b"00");
    // Checksum: byte sum with the checksum field read as spaces; 6 octal digits, NUL, space.
    h[148..156].copy_from_slice(b"        ");
    let sum: u32 = h.iter().map(|&b| u32::from(b)).sum();
    let text = format!("{sum:06o}");
    h[148..154].copy_from_slice(text.as_bytes());
    h[154] = 0;
    h[155] = b' ';
    Ok(h)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::StaticData;

    /// An independent reader: walks headers, checks magic and checksum, returns members.
    pub(crate) fn read(archive: &[u8]) -> Vec<(String, u64, Vec<u8>)> {
        let mut out = Vec::new();
        let mut at = 0;
        loop {
            let h = &archive[at..at + BLOCK];
            if h.iter().all(|&b| b == 0) {
                assert!(archive[at + BLOCK..at + 2 * BLOCK].iter().all(|&b| b == 0));
                assert_eq!(at + 2 * BLOCK, archive.len());
                return out;
            }
            assert_eq!(&h[257..263], b"ustar\0");
            let field = |r: std::ops::Range<usize>| {
                let s = std::str::from_utf8(&h[r]).unwrap();
                u64::from_str_radix(s.trim_matches(|c| c == '\0' || c == ' '), 8).unwrap()
            };
            let stored = field(148..156);
            let computed: u64 =
                h.iter().enumerate().map(|(i, &b)| if (148..156).contains(&i) { 32 } else { u64::from(b) }).sum();
            assert_eq!(stored, computed, "checksum");
            let name_end = h[..100].iter().position(|&b| b == 0).unwrap_or(100);
            let name = String::from_utf8(h[..name_end].to_vec()).unwrap();
            let size = field(124..136);
            let data_at = (at + BLOCK) as u64;
            out.push((name, data_at, archive[at + BLOCK..at + BLOCK + size as usize].to_vec()));
            at += BLOCK + padded(size) as usize;
        }
    }

    #[test]
    fn round_trips_through_an_independent_reader() {
        let entries = vec![
            BinEntry { name: "a.raw".into(), data: StaticData::new(vec![1u8, 2, 3]) },
            BinEntry { name: "b_block_scales.raw".into(), data: StaticData::new(vec![7u8; 600]) },
            BinEntry { name: "empty.raw".into(), data: StaticData::new(Vec::<u8>::new()) },
        ];
        let mut bytes = Vec::new();
        write(&mut bytes, &entries).unwrap();
        assert_eq!(bytes.len(), 512 + 512 + 512 + 1024 + 512 + 1024);
        let members = read(&bytes);
        let offsets = data_offsets(&entries);
        for ((e, (name, at, data)), off) in entries.iter().zip(&members).zip(&offsets) {
            assert_eq!(&e.name, name);
            assert_eq!(e.data.bytes(), data.as_slice());
            assert_eq!(at, off);
        }
        assert!(write(&mut Vec::new(), &[BinEntry { name: "x".repeat(100), data: StaticData::new(Vec::<u8>::new()) }])
            .is_err());
    }

    #[test]
    fn system_tar_accepts_the_archive_when_available() {
        let path = std::env::temp_dir().join(format!("target-tar-test-{}.tar", std::process::id()));
        let entries = vec![BinEntry { name: "w.raw".into(), data: StaticData::new(vec![9u8; 10]) }];
        let mut bytes = Vec::new();
        write(&mut bytes, &entries).unwrap();
        std::fs::write(&path, &bytes).unwrap();
        let listed = std::process::Command::new("tar").arg("-tvf").arg(&path).output();
        let _ = std::fs::remove_file(&path);
        // Skip silently when no tar binary exists; when it does, it must list our member.
        if let Ok(out) = listed {
            assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
            let text = String::from_utf8_lossy(&out.stdout);
            assert!(text.contains("w.raw") && text.contains(" 10 "), "{text}");
        }
    }
}

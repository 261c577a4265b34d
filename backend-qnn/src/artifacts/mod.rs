//! Files describing one graph, for inspection and for the QNN converter toolchain:
//!
//! - `<graph>.json`: the QNN net.json schema QNN Netron reads ([`netron`], Qualcomm's qnn-model-lib-generator docs);
//! - `<graph>.cpp` + `<graph>.bin`: a `model.cpp` / `model.bin` pair in the shape
//!   `qnn-model-lib-generator` compiles into a model library ([`model_cpp`], [`tar`]);
//! - `<graph>.summary.txt`: ops by type, tensors by dtype, static bytes, MACs ([`summary`]).
//!
//! Every file is written to a fresh temporary name in the target directory and renamed into place
//! ([`mllm_dsl::files::write_atomic`]),
//! and the bytes depend only on the graph (no timestamps, no hash-map iteration order).

pub mod model_cpp;
pub mod netron;
pub mod summary;
pub mod symbols;
pub mod tar;

use std::path::{Path, PathBuf};

use mllm_dsl::files::write_atomic;

use crate::graph::QnnGraph;
use crate::validate::{validate, ValidationError};

/// Why artifacts could not be produced.
#[derive(Debug, thiserror::Error)]
pub enum ArtifactError {
    #[error("graph is invalid: {0}")]
    Invalid(#[from] ValidationError),
    #[error("graph name `{name}` cannot be used as a file name: {detail}")]
    FileName { name: String, detail: String },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    File(#[from] mllm_dsl::files::FileError),
    #[error("model.bin entry `{entry}`: {detail}")]
    Tar { entry: String, detail: String },
    #[error(
        "graphs `{first}` and `{graph}` share a context binary but their static buffer `{entry}` differs; \
         one {bin} cannot hold both"
    )]
    SharedBuffer { entry: String, first: String, graph: String, bin: String },
}

/// Where [`write_graph_artifacts`] put each file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArtifactPaths {
    pub netron_json: PathBuf,
    pub model_cpp: PathBuf,
    pub model_bin: PathBuf,
    pub summary: PathBuf,
}

/// Validate `graph` and write its four artifacts into `dir` (which must exist): the
/// [`write_shared_artifacts`] of a context binary holding this one graph, its model.bin
/// `<graph>.bin`.
pub fn write_graph_artifacts(graph: &QnnGraph, dir: &Path) -> Result<ArtifactPaths, ArtifactError> {
    let mut written = write_shared_artifacts(&[graph], dir, &graph.name)?;
    Ok(written.graphs.remove(0))
}

/// Where [`write_shared_artifacts`] put each file, and how many bytes the shared `model.bin` holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SharedArtifacts {
    /// Per graph, in order: its net.json, model.cpp and summary; `model_bin` is the shared file.
    pub graphs: Vec<ArtifactPaths>,
    pub model_bin: PathBuf,
    /// Bytes of the static buffers in `model_bin` (each once).
    pub buffer_bytes: u64,
}

/// Validate the graphs of one context binary and write each one's `<graph>.json`,
/// `<graph>.cpp` and `<graph>.summary.txt` into `dir`, plus one `<bin_stem>.bin` holding every
/// static buffer once: the graphs of a family or a shard read the same weights, so a buffer of
/// the same symbol must have the same bytes in every graph (else [`ArtifactError::SharedBuffer`]).
pub fn write_shared_artifacts(
    graphs: &[&QnnGraph],
    dir: &Path,
    bin_stem: &str,
) -> Result<SharedArtifacts, ArtifactError> {
    let bin_stem = file_stem(bin_stem)?;
    let model_bin = dir.join(format!("{bin_stem}.bin"));
    let bin_file = format!("{bin_stem}.bin");
    // Members in the order the graphs first use them (one graph: its binding order), each with
    // the graph that first did.
    let mut buffers: Vec<(tar::BinEntry, &str)> = Vec::new();
    let mut member: std::collections::HashMap<String, usize> = Default::default();
    let mut rendered = Vec::with_capacity(graphs.len());
    for graph in graphs {
        validate(graph)?;
        let stem = file_stem(&graph.name)?;
        let lib = model_cpp::render_with_bin(graph, stem, bin_stem)?;
        for entry in lib.bin_entries {
            match member.get(&entry.name) {
                Some(&i) if buffers[i].0.data != entry.data => {
                    return Err(ArtifactError::SharedBuffer {
                        entry: entry.name,
                        first: buffers[i].1.to_string(),
                        graph: graph.name.clone(),
                        bin: model_bin.display().to_string(),
                    })
                }
                Some(_) => {}
                None => {
                    member.insert(entry.name.clone(), buffers.len());
                    buffers.push((entry, graph.name.as_str()));
                }
            }
        }
        rendered.push((graph, stem, lib.cpp));
    }
    let mut paths = Vec::with_capacity(rendered.len());
    for (graph, stem, cpp) in rendered {
        let p = ArtifactPaths {
            netron_json: dir.join(format!("{stem}.json")),
            model_cpp: dir.join(format!("{stem}.cpp")),
            model_bin: model_bin.clone(),
            summary: dir.join(format!("{stem}.summary.txt")),
        };
        write_atomic(&p.netron_json, |w| w.write_all(netron::render_with_bin(graph, &bin_file).as_bytes()))?;
        write_atomic(&p.model_cpp, |w| w.write_all(cpp.as_bytes()))?;
        write_atomic(&p.summary, |w| w.write_all(summary::summarize(graph).render().as_bytes()))?;
        paths.push(p);
    }
    let entries: Vec<tar::BinEntry> = buffers.into_iter().map(|(e, _)| e).collect();
    let buffer_bytes = entries.iter().map(|e| e.data.len() as u64).sum();
    write_atomic(&model_bin, |mut w| tar::write(&mut w, &entries))?;
    Ok(SharedArtifacts { graphs: paths, model_bin, buffer_bytes })
}

fn file_stem(name: &str) -> Result<&str, ArtifactError> {
    let bad = |detail: &str| ArtifactError::FileName { name: name.to_string(), detail: detail.to_string() };
    if name.is_empty() || name == "." || name == ".." {
        return Err(bad("it is empty or a directory name"));
    }
    if name.contains(['/', '\\', '\0']) {
        return Err(bad("it contains a path separator or NUL"));
    }
    Ok(name)
}

//! The token embedding of a sharded build, gathered on the CPU ([`crate::shard`] says why):
//! `qnn/embedding.safetensors` holds the quantized table and the encoding that shard 1's
//! `hidden_states` input carries, and the runtime copies one row per token from it.
//!
//! The file is safetensors with three tensors:
//! - `model.embed_tokens.weight`: u16 `[vocab, hidden]`, the quantized checkpoint's codes;
//! - `model.embed_tokens.scale`: f32 `[1]`;
//! - `model.embed_tokens.offset`: i32 `[1]`, QNN's offset (real = scale × (code + offset)).
//!
//! Codes, scale and zero point come from the quantized checkpoint, as the lowering takes them for
//! the graph's own gather (whose output shares the weight's encoding), so the gathered rows are
//! exactly the codes that gather would have produced; the runtime checks the encoding against
//! shard 1's `hidden_states` input when it opens the set.

use std::collections::BTreeMap;
use std::path::Path;

use backend_qnn::interp::{TensorValue, Values};
use backend_qnn::sharded::TokenEmbedding;
use backend_qnn::{DataType, Encoding, QnnGraph, ScaleOffset};
use checkpoint::{write_safetensors_atomic, SafetensorsCheckpoint, StDtype};

use crate::error::{bail, ensure, Context, Result};
use crate::shard::HIDDEN_STATES;
use mllm_dsl::ir::SpecParams;
use models::keys;

/// The table's file name in `qnn/`.
pub const EMBEDDING_FILE: &str = "embedding.safetensors";

// The table file keeps the checkpoint's key for the codes and adds its encoding beside it.
const WEIGHT: &str = keys::EMBED_TOKENS;
fn scale_key() -> String {
    SpecParams::scale_key(keys::EMBED_TOKENS_MODULE)
}
fn offset_key() -> String {
    format!("{}.offset", keys::EMBED_TOKENS_MODULE)
}

/// Writes the table to `path` (through a temporary name) from the quantized checkpoint `ckpt`:
/// the u16 codes of `model.embed_tokens.weight` and the encoding of `.scale` / `.zero_point`.
pub fn write_table(ckpt: &SafetensorsCheckpoint, path: &Path) -> Result<()> {
    let what = || format!("the CPU embedding table {} from {}", path.display(), ckpt.root().display());
    let (dtype, shape) = ckpt.info(WEIGHT).with_context(what)?;
    let shape = shape.to_vec();
    ensure!(
        dtype == StDtype::U16 && shape.len() == 2,
        "{WEIGHT} in the quantized checkpoint {} is {dtype} {shape:?}; the CPU embedding table needs u16 [vocab, \
         hidden]",
        ckpt.root().display()
    );
    let scale: Vec<f32> = ckpt.read_typed(&scale_key()).with_context(what)?;
    let zero_point: Vec<i32> =
        ckpt.read_typed(&SpecParams::zero_point_key(keys::EMBED_TOKENS_MODULE)).with_context(what)?;
    let ([scale], [zero_point]) = (&scale[..], &zero_point[..]) else {
        bail!("{}: the embedding's scale and zero_point must hold one value each (per-tensor)", what())
    };
    let so = ScaleOffset::from_zero_point(*scale, *zero_point);
    let (scale, offset) = (so.scale.to_le_bytes(), so.offset.to_le_bytes());
    let metadata = BTreeMap::from([(
        "content".to_string(),
        "token embedding lookup table: shard 1's hidden_states = weight[input_ids], real = scale * (code + offset)"
            .to_string(),
    )]);
    let (scale_key, offset_key) = (scale_key(), offset_key());
    let mut written = Ok(());
    ckpt.with_bytes(WEIGHT, |codes| {
        written = write_safetensors_atomic(
            path,
            &[
                (WEIGHT, StDtype::U16, &shape, codes),
                (scale_key.as_str(), StDtype::F32, &[1], &scale),
                (offset_key.as_str(), StDtype::I32, &[1], &offset),
            ],
            &metadata,
        );
    })?;
    written.with_context(what)
}

/// `qnn/embedding.safetensors`, mapped: rows are read from the file as tokens need them.
pub struct EmbeddingTable {
    origin: String,
    file: SafetensorsCheckpoint,
    vocab: usize,
    hidden: usize,
    encoding: ScaleOffset,
}

impl std::fmt::Debug for EmbeddingTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbeddingTable")
            .field("origin", &self.origin)
            .field("vocab", &self.vocab)
            .field("hidden", &self.hidden)
            .field("encoding", &self.encoding)
            .finish()
    }
}

impl EmbeddingTable {
    /// Opens and checks the table: the three tensors with their dtypes and shapes.
    pub fn open(path: &Path) -> Result<EmbeddingTable> {
        let origin = path.display().to_string();
        let file = SafetensorsCheckpoint::open_file(path).with_context(|| format!("opening {origin}"))?;
        let (dtype, shape) = file.info(WEIGHT).with_context(|| format!("reading {origin}"))?;
        let [vocab, hidden] = shape[..] else {
            bail!("{origin}: `{WEIGHT}` is {dtype} {shape:?}, expected u16 [vocab, hidden]")
        };
        ensure!(dtype == StDtype::U16, "{origin}: `{WEIGHT}` is {dtype}, expected u16 codes");
        let one = |key: &str| -> Result<[u8; 4]> {
            let bytes = file.read_bytes(key).with_context(|| format!("reading {origin}"))?;
            bytes.try_into().map_err(|b: Vec<u8>| {
                crate::error::AotError::invalid(format!(
                    "{origin}: `{key}` holds {} bytes, expected one 4-byte value",
                    b.len()
                ))
            })
        };
        let (scale_key, offset_key) = (scale_key(), offset_key());
        ensure!(file.info(&scale_key)?.0 == StDtype::F32, "{origin}: `{scale_key}` must be f32");
        ensure!(file.info(&offset_key)?.0 == StDtype::I32, "{origin}: `{offset_key}` must be i32");
        let encoding =
            ScaleOffset { scale: f32::from_le_bytes(one(&scale_key)?), offset: i32::from_le_bytes(one(&offset_key)?) };
        ensure!(
            encoding.scale.is_finite() && encoding.scale > 0.0,
            "{origin}: `{scale_key}` is {}, expected a positive finite scale",
            encoding.scale
        );
        Ok(EmbeddingTable { origin, file, vocab, hidden, encoding })
    }

    /// Shard 1's `hidden_states` for the token ids of `ids` (an `input_ids` value), shaped as
    /// `first_shard`'s input: for the interpreter and the emulation runs of the chain.
    pub fn hidden_value(&self, first_shard: &QnnGraph, ids: &TensorValue) -> Result<TensorValue> {
        let meta = first_shard
            .tensor(HIDDEN_STATES)
            .with_context(|| format!("graph `{}` has no `{HIDDEN_STATES}` input", first_shard.name))?;
        ensure!(
            meta.dtype == DataType::UFixedPoint16
                && meta.encoding == Encoding::ScaleOffset(self.encoding)
                && meta.dims.last().map(|&d| d as usize) == Some(self.hidden),
            "graph `{}` takes `{HIDDEN_STATES}` as {} {:?} {:?}; {} holds u16 rows of {} with {:?}",
            first_shard.name,
            meta.dtype,
            meta.dims,
            meta.encoding,
            self.origin,
            self.hidden,
            self.encoding
        );
        let Values::Codes(codes) = &ids.values else { bail!("input_ids holds real values, not token ids") };
        let ids: Vec<i32> = codes.iter().map(|&c| i32::try_from(c).unwrap_or(-1)).collect();
        let mut rows = vec![0u8; ids.len() * self.hidden * 2];
        self.gather(&ids, &mut rows).map_err(|d| crate::error::AotError::invalid(format!("{}: {d}", self.origin)))?;
        let codes = rows.chunks_exact(2).map(|b| i64::from(u16::from_le_bytes([b[0], b[1]]))).collect();
        TensorValue::from_codes(meta, codes).with_context(|| format!("shard 1's hidden_states from {}", self.origin))
    }
}

impl TokenEmbedding for EmbeddingTable {
    fn origin(&self) -> &str {
        &self.origin
    }

    fn dims(&self) -> (usize, usize) {
        (self.vocab, self.hidden)
    }

    fn encoding(&self) -> ScaleOffset {
        self.encoding
    }

    fn gather(&self, ids: &[i32], out: &mut [u8]) -> std::result::Result<(), String> {
        let row = self.hidden * 2;
        if out.len() != ids.len() * row {
            return Err(format!("{} bytes for {} rows of {row}", out.len(), ids.len()));
        }
        let mut result = Ok(());
        let read = self.file.with_bytes(WEIGHT, |table| {
            for (dst, &id) in out.chunks_exact_mut(row).zip(ids) {
                match usize::try_from(id).ok().filter(|&i| i < self.vocab) {
                    Some(i) => dst.copy_from_slice(&table[i * row..(i + 1) * row]),
                    None => {
                        result = Err(format!("token id {id} is outside the table's {} rows", self.vocab));
                        return;
                    }
                }
            }
        });
        read.map_err(|e| e.to_string())?;
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use backend_qnn::GraphBuilder;

    fn first_shard(hidden: u32, so: ScaleOffset) -> QnnGraph {
        let mut b = GraphBuilder::new("model.0.s2");
        b.input(HIDDEN_STATES, DataType::UFixedPoint16, &[1, 2, hidden], Encoding::ScaleOffset(so));
        b.finish_unchecked()
    }

    #[test]
    fn rows_round_trip_through_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let (vocab, hidden) = (5usize, 3usize);
        let codes: Vec<u16> = (0..(vocab * hidden) as u16).map(|c| c * 1000).collect();
        let ckpt_path = dir.path().join("model.safetensors");
        let bytes: Vec<u8> = codes.iter().flat_map(|c| c.to_le_bytes()).collect();
        let (scale, zero_point) = (0.5f32.to_le_bytes(), 30000i32.to_le_bytes());
        let tensors: [checkpoint::TensorBytes<'_>; 3] = [
            (WEIGHT, StDtype::U16, &[vocab, hidden], &bytes),
            ("model.embed_tokens.scale", StDtype::F32, &[1], &scale),
            ("model.embed_tokens.zero_point", StDtype::I32, &[1], &zero_point),
        ];
        write_safetensors_atomic(&ckpt_path, &tensors, &BTreeMap::new()).unwrap();
        let ckpt = SafetensorsCheckpoint::open_file(&ckpt_path).unwrap();
        let path = dir.path().join(EMBEDDING_FILE);
        write_table(&ckpt, &path).unwrap();

        let table = EmbeddingTable::open(&path).unwrap();
        let so = ScaleOffset { scale: 0.5, offset: -30000 };
        assert_eq!(table.dims(), (vocab, hidden));
        assert_eq!(table.encoding(), so);
        let mut out = vec![0u8; 2 * hidden * 2];
        table.gather(&[4, 1], &mut out).unwrap();
        let got: Vec<u16> = out.chunks_exact(2).map(|b| u16::from_le_bytes([b[0], b[1]])).collect();
        assert_eq!(got, [12000, 13000, 14000, 3000, 4000, 5000]);
        let e = table.gather(&[5, 0], &mut out).unwrap_err();
        assert!(e.contains("token id 5 is outside the table's 5 rows"), "{e}");

        // The chain's first input, and a graph of another build refused.
        let ids = TensorValue {
            dtype: DataType::Int32,
            dims: vec![1, 2],
            encoding: Encoding::Undefined,
            values: Values::Codes(vec![4, 1]),
        };
        let v = table.hidden_value(&first_shard(hidden as u32, so), &ids).unwrap();
        assert_eq!(v.codes().unwrap(), got.iter().map(|&c| i64::from(c)).collect::<Vec<_>>());
        let other = ScaleOffset { scale: 0.25, offset: -30000 };
        let e = table.hidden_value(&first_shard(hidden as u32, other), &ids).unwrap_err().to_string();
        assert!(e.contains("holds u16 rows of 3"), "{e}");
    }
}

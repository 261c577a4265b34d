//! One memory-mapped GGUF file: header, metadata and tensor table parsed and checked against the
//! file's size up front, tensor data served from the mapping and dequantized on request.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use super::{GgmlType, GgufError, GgufValue};

/// "GGUF" as the little-endian u32 every GGUF file starts with.
const MAGIC: &[u8; 4] = b"GGUF";
/// Data alignment when `general.alignment` is absent.
const DEFAULT_ALIGNMENT: u64 = 32;
/// ggml tensors have at most 4 dimensions.
const MAX_DIMS: u32 = 4;
/// Deepest array nesting accepted, so a hostile file cannot recurse without bound.
const MAX_ARRAY_DEPTH: usize = 4;

/// One tensor's entry in the tensor table.
#[derive(Debug, Clone, PartialEq)]
pub struct GgufTensorInfo {
    pub name: String,
    /// Dimensions in ggml order: `dims[0]` varies fastest (a row's length). The row-major
    /// (PyTorch) shape is the reverse; see [`GgufTensorInfo::shape`].
    pub dims: Vec<u64>,
    pub ggml_type: GgmlType,
    /// Byte offset from the start of the file.
    pub start: u64,
    pub byte_len: u64,
}

impl GgufTensorInfo {
    /// The shape in row-major order (PyTorch's), outermost dimension first.
    pub fn shape(&self) -> Vec<usize> {
        self.dims.iter().rev().map(|&d| d as usize).collect()
    }

    pub fn elements(&self) -> usize {
        self.dims.iter().product::<u64>() as usize
    }
}

/// A GGUF file opened read-only (versions 2 and 3).
pub struct GgufFile {
    path: PathBuf,
    mmap: Mmap,
    version: u32,
    alignment: u64,
    metadata: BTreeMap<String, GgufValue>,
    tensors: Vec<GgufTensorInfo>,
}

impl GgufFile {
    pub fn open(path: impl AsRef<Path>) -> Result<Self, GgufError> {
        let path = path.as_ref();
        let io_err = |source| GgufError::Io { path: path.to_path_buf(), source };
        let file = File::open(path).map_err(io_err)?;
        // SAFETY: the mapping is read-only; as for every mmap-based loader, the file must not be
        // truncated or rewritten while it is open.
        let mmap = unsafe { Mmap::map(&file) }.map_err(io_err)?;
        let (version, alignment, metadata, tensors) = parse(path, &mmap)?;
        Ok(GgufFile { path: path.to_path_buf(), mmap, version, alignment, metadata, tensors })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn version(&self) -> u32 {
        self.version
    }

    /// Alignment of tensor data in bytes (`general.alignment`, default 32).
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    pub fn metadata(&self) -> &BTreeMap<String, GgufValue> {
        &self.metadata
    }

    /// Tensors in the order of the file's tensor table.
    pub fn tensors(&self) -> &[GgufTensorInfo] {
        &self.tensors
    }

    pub fn tensor_info(&self, name: &str) -> Result<&GgufTensorInfo, GgufError> {
        self.tensors
            .iter()
            .find(|t| t.name == name)
            .ok_or_else(|| GgufError::MissingTensor { path: self.path.clone(), tensor: name.to_string() })
    }

    /// The tensor's stored bytes (already checked to lie inside the file).
    pub fn tensor_bytes(&self, info: &GgufTensorInfo) -> &[u8] {
        &self.mmap[info.start as usize..(info.start + info.byte_len) as usize]
    }

    /// The tensor dequantized to f32, in row-major order of [`GgufTensorInfo::shape`].
    pub fn read_f32(&self, name: &str) -> Result<Vec<f32>, GgufError> {
        let info = self.tensor_info(name)?;
        let mut out = vec![0.0f32; info.elements()];
        info.ggml_type.dequantize(self.tensor_bytes(info), &mut out);
        Ok(out)
    }

    /// A metadata value, or an error naming the key and `expected` when it is absent.
    pub fn get(&self, key: &str, expected: &str) -> Result<&GgufValue, GgufError> {
        self.metadata.get(key).ok_or_else(|| GgufError::MissingKey {
            path: self.path.clone(),
            key: key.to_string(),
            expected: expected.to_string(),
        })
    }

    /// Error for a metadata value of the wrong type.
    pub fn wrong_type(&self, key: &str, expected: &str, found: &GgufValue) -> GgufError {
        GgufError::WrongKeyType {
            path: self.path.clone(),
            key: key.to_string(),
            expected: expected.to_string(),
            found: format!("{} {found}", found.type_name()),
        }
    }

    pub fn get_u64(&self, key: &str) -> Result<u64, GgufError> {
        let v = self.get(key, "an unsigned integer")?;
        v.as_u64().ok_or_else(|| self.wrong_type(key, "an unsigned integer", v))
    }

    pub fn get_f64(&self, key: &str) -> Result<f64, GgufError> {
        let v = self.get(key, "a number")?;
        v.as_f64().ok_or_else(|| self.wrong_type(key, "a number", v))
    }

    pub fn get_str(&self, key: &str) -> Result<&str, GgufError> {
        let v = self.get(key, "a string")?;
        v.as_str().ok_or_else(|| self.wrong_type(key, "a string", v))
    }

    /// An array of strings (the vocabulary, the merges).
    pub fn get_str_array(&self, key: &str) -> Result<Vec<&str>, GgufError> {
        let v = self.get(key, "an array of strings")?;
        v.as_array()
            .and_then(|items| items.iter().map(GgufValue::as_str).collect::<Option<Vec<_>>>())
            .ok_or_else(|| self.wrong_type(key, "an array of strings", v))
    }

    /// An array of numbers (token scores).
    pub fn get_f64_array(&self, key: &str) -> Result<Vec<f64>, GgufError> {
        let v = self.get(key, "an array of numbers")?;
        v.as_array()
            .and_then(|items| items.iter().map(GgufValue::as_f64).collect::<Option<Vec<_>>>())
            .ok_or_else(|| self.wrong_type(key, "an array of numbers", v))
    }

    /// An array of integers (token types).
    pub fn get_int_array(&self, key: &str) -> Result<Vec<i64>, GgufError> {
        let v = self.get(key, "an array of integers")?;
        v.as_array()
            .and_then(|items| items.iter().map(GgufValue::as_i64).collect::<Option<Vec<_>>>())
            .ok_or_else(|| self.wrong_type(key, "an array of integers", v))
    }
}

type Parsed = (u32, u64, BTreeMap<String, GgufValue>, Vec<GgufTensorInfo>);

fn parse(path: &Path, bytes: &[u8]) -> Result<Parsed, GgufError> {
    let mut r = Cursor { path, bytes, pos: 0 };
    let magic: [u8; 4] = r.array("magic")?;
    if &magic != MAGIC {
        return Err(r.corrupt_at(0, "magic", format!("expected \"GGUF\", found {magic:02x?} (not a GGUF file?)")));
    }
    let version = r.u32("version")?;
    if !(2..=3).contains(&version) {
        return Err(r.corrupt_at(4, "version", format!("version {version} is not supported (supported: 2, 3)")));
    }
    let tensor_count = r.u64("tensor_count")?;
    let kv_count = r.u64("metadata_kv_count")?;
    // Every entry takes at least 8 bytes (a key's or a name's length), which bounds the counts
    // by the file's size before anything is allocated for them.
    r.check_count(kv_count, 8 + 4, "metadata_kv_count")?;
    let mut metadata = BTreeMap::new();
    for i in 0..kv_count {
        let key = r.string(&format!("metadata key #{i}"))?;
        let value_type = r.u32(&format!("type of metadata '{key}'"))?;
        let value = r.value(value_type, &key, 0)?;
        if metadata.insert(key.clone(), value).is_some() {
            return Err(r.corrupt(&format!("metadata '{key}'"), "key appears twice".into()));
        }
    }
    let alignment = match metadata.get("general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some(v) => match v.as_u64() {
            Some(a) if a > 0 && a.is_power_of_two() => a,
            _ => {
                return Err(GgufError::InvalidKey {
                    path: path.to_path_buf(),
                    key: "general.alignment".into(),
                    reason: format!("expected a power of two, found {} {v}", v.type_name()),
                })
            }
        },
    };
    r.check_count(tensor_count, 8 + 4 + 4 + 8, "tensor_count")?;
    let mut table = Vec::new();
    for i in 0..tensor_count {
        let name = r.string(&format!("name of tensor #{i}"))?;
        let n_dims = r.u32(&format!("tensor '{name}' n_dims"))?;
        if n_dims == 0 || n_dims > MAX_DIMS {
            return Err(r.corrupt(&format!("tensor '{name}' n_dims"), format!("{n_dims} is not in 1..={MAX_DIMS}")));
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        for d in 0..n_dims {
            dims.push(r.u64(&format!("tensor '{name}' dims[{d}]"))?);
        }
        let type_id = r.u32(&format!("tensor '{name}' type"))?;
        let offset = r.u64(&format!("tensor '{name}' offset"))?;
        table.push((name, dims, type_id, offset));
    }
    let data_start = r.pos.div_ceil(alignment as usize) as u64 * alignment;
    let file_len = bytes.len() as u64;
    let mut tensors = Vec::with_capacity(table.len());
    for (name, dims, type_id, offset) in table {
        let bad = |reason: String| GgufError::BadTensor { path: path.to_path_buf(), tensor: name.clone(), reason };
        let ggml_type = GgmlType::from_id(type_id).map_err(|unsupported| GgufError::UnsupportedType {
            path: path.to_path_buf(),
            tensor: name.clone(),
            ggml_type: unsupported.name,
        })?;
        if dims.contains(&0) {
            return Err(bad(format!("dims {dims:?} contain a zero")));
        }
        let elements = dims
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
            .ok_or_else(|| bad(format!("dims {dims:?} overflow")))?;
        if dims[0] % ggml_type.block_len() as u64 != 0 {
            return Err(bad(format!(
                "row length dims[0] = {} is not a multiple of {}'s block of {}",
                dims[0],
                ggml_type.name(),
                ggml_type.block_len()
            )));
        }
        let byte_len =
            ggml_type.bytes_for(elements).ok_or_else(|| bad(format!("byte size of dims {dims:?} overflows")))?;
        if offset % alignment != 0 {
            return Err(bad(format!("data offset {offset} is not a multiple of the alignment {alignment}")));
        }
        let start = data_start.checked_add(offset).ok_or_else(|| bad(format!("data offset {offset} overflows")))?;
        match start.checked_add(byte_len) {
            Some(end) if end <= file_len => {}
            _ => {
                return Err(bad(format!(
                    "data bytes {start}..{} ({} of dims {dims:?}) run past the end of the {file_len}-byte file \
                     (truncated?)",
                    start.saturating_add(byte_len),
                    ggml_type.name()
                )))
            }
        }
        if usize::try_from(elements).is_err() {
            return Err(bad(format!("{elements} elements do not fit this machine's address space")));
        }
        tensors.push(GgufTensorInfo { name, dims, ggml_type, start, byte_len });
    }
    check_no_overlap(path, &tensors)?;
    check_unique_names(path, &tensors)?;
    Ok((version, alignment, metadata, tensors))
}

fn check_no_overlap(path: &Path, tensors: &[GgufTensorInfo]) -> Result<(), GgufError> {
    let mut by_start: Vec<&GgufTensorInfo> = tensors.iter().collect();
    by_start.sort_by_key(|t| t.start);
    for pair in by_start.windows(2) {
        if pair[0].start + pair[0].byte_len > pair[1].start {
            return Err(GgufError::BadTensor {
                path: path.to_path_buf(),
                tensor: pair[1].name.clone(),
                reason: format!("its data overlaps tensor '{}'", pair[0].name),
            });
        }
    }
    Ok(())
}

fn check_unique_names(path: &Path, tensors: &[GgufTensorInfo]) -> Result<(), GgufError> {
    let mut names: Vec<&str> = tensors.iter().map(|t| t.name.as_str()).collect();
    names.sort_unstable();
    match names.windows(2).find(|w| w[0] == w[1]) {
        Some(w) => Err(GgufError::BadTensor {
            path: path.to_path_buf(),
            tensor: w[0].to_string(),
            reason: "the tensor table lists it twice".into(),
        }),
        None => Ok(()),
    }
}

/// Reads the header's little-endian fields, every read checked against the file's end.
struct Cursor<'a> {
    path: &'a Path,
    bytes: &'a [u8],
    pos: usize,
}

impl Cursor<'_> {
    fn corrupt_at(&self, offset: usize, field: &str, reason: String) -> GgufError {
        GgufError::Corrupt { path: self.path.to_path_buf(), offset: offset as u64, field: field.to_string(), reason }
    }

    fn corrupt(&self, field: &str, reason: String) -> GgufError {
        self.corrupt_at(self.pos, field, reason)
    }

    fn take(&mut self, n: u64, field: &str) -> Result<&[u8], GgufError> {
        let left = (self.bytes.len() - self.pos) as u64;
        if n > left {
            return Err(self.corrupt(field, format!("needs {n} bytes, the file has {left} left (truncated?)")));
        }
        let out = &self.bytes[self.pos..self.pos + n as usize];
        self.pos += n as usize;
        Ok(out)
    }

    /// Fails unless `count` items of at least `min_bytes` each can fit in what is left.
    fn check_count(&self, count: u64, min_bytes: u64, field: &str) -> Result<(), GgufError> {
        let left = (self.bytes.len() - self.pos) as u64;
        if count.checked_mul(min_bytes).is_none_or(|need| need > left) {
            return Err(self.corrupt(
                field,
                format!("{count} entries of at least {min_bytes} bytes cannot fit in the {left} bytes left"),
            ));
        }
        Ok(())
    }

    fn array<const N: usize>(&mut self, field: &str) -> Result<[u8; N], GgufError> {
        Ok(self.take(N as u64, field)?.try_into().expect("take returned N bytes"))
    }

    fn u32(&mut self, field: &str) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.array(field)?))
    }

    fn u64(&mut self, field: &str) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.array(field)?))
    }

    fn string(&mut self, field: &str) -> Result<String, GgufError> {
        let start = self.pos;
        let len = self.u64(field)?;
        let bytes = self.take(len, field)?;
        String::from_utf8(bytes.to_vec())
            .map_err(|e| self.corrupt_at(start, field, format!("string is not UTF-8: {e}")))
    }

    fn value(&mut self, value_type: u32, key: &str, depth: usize) -> Result<GgufValue, GgufError> {
        let field = format!("value of metadata '{key}'");
        Ok(match value_type {
            0 => GgufValue::U8(self.array::<1>(&field)?[0]),
            1 => GgufValue::I8(self.array::<1>(&field)?[0] as i8),
            2 => GgufValue::U16(u16::from_le_bytes(self.array(&field)?)),
            3 => GgufValue::I16(i16::from_le_bytes(self.array(&field)?)),
            4 => GgufValue::U32(u32::from_le_bytes(self.array(&field)?)),
            5 => GgufValue::I32(i32::from_le_bytes(self.array(&field)?)),
            6 => GgufValue::F32(f32::from_le_bytes(self.array(&field)?)),
            7 => match self.array::<1>(&field)?[0] {
                0 => GgufValue::Bool(false),
                1 => GgufValue::Bool(true),
                b => return Err(self.corrupt(&field, format!("bool byte is {b}, expected 0 or 1"))),
            },
            8 => GgufValue::String(self.string(&field)?),
            9 => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(self.corrupt(&field, format!("arrays nested deeper than {MAX_ARRAY_DEPTH}")));
                }
                let item_type = self.u32(&format!("array type of metadata '{key}'"))?;
                let count = self.u64(&format!("array length of metadata '{key}'"))?;
                let min_bytes = match item_type {
                    0 | 1 | 7 => 1,
                    2 | 3 => 2,
                    4..=6 => 4,
                    8 | 10..=12 => 8,
                    9 => 12,
                    other => return Err(self.corrupt(&field, format!("unknown array element type {other}"))),
                };
                self.check_count(count, min_bytes, &format!("array length of metadata '{key}'"))?;
                let mut items = Vec::with_capacity(count as usize);
                for _ in 0..count {
                    items.push(self.value(item_type, key, depth + 1)?);
                }
                GgufValue::Array(items)
            }
            10 => GgufValue::U64(u64::from_le_bytes(self.array(&field)?)),
            11 => GgufValue::I64(i64::from_le_bytes(self.array(&field)?)),
            12 => GgufValue::F64(f64::from_le_bytes(self.array(&field)?)),
            other => {
                return Err(
                    self.corrupt(&format!("type of metadata '{key}'"), format!("unknown value type {other} (0..=12)"))
                )
            }
        })
    }
}

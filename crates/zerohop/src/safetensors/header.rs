use crate::storage::SourceFile;
use crate::{Error, Result};
use serde::de::{Deserialize, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::io::Write as _;
use std::marker::PhantomData;

/// Headers larger than this are refused (the reference implementation's
/// limit): a hostile length must not make us allocate gigabytes.
pub const MAX_HEADER_BYTES: u64 = 100_000_000;

/// Element types, as safetensors 0.8 names them. F4 and F6 elements are
/// narrower than a byte: a tensor of them packs its elements into whole
/// bytes (torch's `float4_e2m1fn_x2` holds two F4 per byte element).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[allow(non_camel_case_types)]
pub enum Dtype {
    BOOL,
    F4,
    F6_E2M3,
    F6_E3M2,
    U8,
    I8,
    F8_E5M2,
    F8_E4M3,
    F8_E8M0,
    F8_E4M3FNUZ,
    F8_E5M2FNUZ,
    I16,
    U16,
    F16,
    BF16,
    I32,
    U32,
    F32,
    C64,
    F64,
    I64,
    U64,
}

impl Dtype {
    const ALL: [Dtype; 22] = [
        Dtype::BOOL,
        Dtype::F4,
        Dtype::F6_E2M3,
        Dtype::F6_E3M2,
        Dtype::U8,
        Dtype::I8,
        Dtype::F8_E5M2,
        Dtype::F8_E4M3,
        Dtype::F8_E8M0,
        Dtype::F8_E4M3FNUZ,
        Dtype::F8_E5M2FNUZ,
        Dtype::I16,
        Dtype::U16,
        Dtype::F16,
        Dtype::BF16,
        Dtype::I32,
        Dtype::U32,
        Dtype::F32,
        Dtype::C64,
        Dtype::F64,
        Dtype::I64,
        Dtype::U64,
    ];

    /// Bits per element.
    pub fn bits(self) -> u64 {
        use Dtype::*;
        match self {
            F4 => 4,
            F6_E2M3 | F6_E3M2 => 6,
            BOOL | U8 | I8 | F8_E5M2 | F8_E4M3 | F8_E8M0 | F8_E4M3FNUZ | F8_E5M2FNUZ => 8,
            I16 | U16 | F16 | BF16 => 16,
            I32 | U32 | F32 => 32,
            C64 | F64 | I64 | U64 => 64,
        }
    }

    /// Bytes a tensor of this type and shape holds. An error when the size
    /// overflows, or when sub-byte elements would end in a partial byte
    /// (safetensors refuses those too): `ErrorKind::Format`.
    pub fn byte_len(self, shape: &[u64]) -> Result<u64> {
        let bits = shape
            .iter()
            .try_fold(self.bits(), |acc, &d| acc.checked_mul(d))
            .ok_or_else(|| Error::format(format!("shape {shape:?} is too large")))?;
        if bits % 8 != 0 {
            return Err(Error::format(format!(
                "{} with shape {shape:?} ends in a partial byte ({bits} bits)",
                self.name()
            )));
        }
        Ok(bits / 8)
    }

    /// The name used in headers.
    pub fn name(self) -> &'static str {
        use Dtype::*;
        match self {
            BOOL => "BOOL",
            F4 => "F4",
            F6_E2M3 => "F6_E2M3",
            F6_E3M2 => "F6_E3M2",
            U8 => "U8",
            I8 => "I8",
            F8_E5M2 => "F8_E5M2",
            F8_E4M3 => "F8_E4M3",
            F8_E8M0 => "F8_E8M0",
            F8_E4M3FNUZ => "F8_E4M3FNUZ",
            F8_E5M2FNUZ => "F8_E5M2FNUZ",
            I16 => "I16",
            U16 => "U16",
            F16 => "F16",
            BF16 => "BF16",
            I32 => "I32",
            U32 => "U32",
            F32 => "F32",
            C64 => "C64",
            F64 => "F64",
            I64 => "I64",
            U64 => "U64",
        }
    }

    pub fn parse(s: &str) -> Option<Dtype> {
        Dtype::ALL.into_iter().find(|d| d.name() == s)
    }
}

/// One tensor's entry; offsets are relative to the data section.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<u64>,
    pub begin: u64,
    pub end: u64,
}

impl TensorInfo {
    pub fn len(&self) -> u64 {
        self.end - self.begin
    }

    pub fn is_empty(&self) -> bool {
        self.begin == self.end
    }
}

/// A validated header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    /// Tensors in file order.
    pub tensors: Vec<TensorInfo>,
    pub metadata: BTreeMap<String, String>,
    /// File offset of the data section (8 + header length).
    pub data_start: u64,
    /// Bytes in the data section.
    pub data_len: u64,
}

/// Reads and validates the header of an open file.
pub fn read_header(file: &SourceFile) -> Result<Header> {
    let ctx = |e: Error| e.context(file.path().display());
    let mut len = [0u8; 8];
    if file.len() < 8 {
        return Err(ctx(Error::format(format!(
            "not a safetensors file: {} bytes is shorter than the 8-byte length prefix",
            file.len()
        ))));
    }
    file.read_exact_at(&mut len, 0)?;
    let n = header_len(u64::from_le_bytes(len), file.len()).map_err(ctx)?;
    let mut bytes = vec![0u8; 8 + n as usize];
    file.read_exact_at(&mut bytes, 0)?;
    parse_header(&bytes, file.len()).map_err(ctx)
}

fn header_len(n: u64, file_len: u64) -> Result<u64> {
    if n > MAX_HEADER_BYTES {
        return Err(Error::format(format!(
            "header length {n} exceeds the {MAX_HEADER_BYTES}-byte limit"
        )));
    }
    if 8 + n > file_len {
        return Err(Error::format(format!(
            "header length {n} runs past the end of the file ({file_len} bytes): truncated file?"
        )));
    }
    Ok(n)
}

/// Parses a header from `bytes`, which starts at file offset 0 and holds at
/// least the 8-byte prefix and the header; `file_len` is the whole file's
/// length, against which every tensor is checked.
pub fn parse_header(bytes: &[u8], file_len: u64) -> Result<Header> {
    let prefix: [u8; 8] = bytes
        .get(..8)
        .and_then(|b| b.try_into().ok())
        .ok_or_else(|| {
            Error::format("not a safetensors file: shorter than the 8-byte length prefix")
        })?;
    let n = header_len(u64::from_le_bytes(prefix), file_len)?;
    let json = bytes
        .get(8..8 + n as usize)
        .ok_or_else(|| Error::format(format!("header of {n} bytes is incomplete")))?;
    let root: Fields<&RawValue> = serde_json::from_slice(json).map_err(|e| {
        Error::with_source(crate::ErrorKind::Format, "header is not a JSON object", e)
    })?;
    if let Some(name) = root.repeated() {
        return Err(Error::format(format!(
            "the header names {name:?} more than once"
        )));
    }
    let data_start = 8 + n;
    let data_len = file_len - data_start;
    let mut metadata = BTreeMap::new();
    let mut tensors = Vec::with_capacity(root.0.len());
    for (name, v) in root.0 {
        if name == "__metadata__" {
            metadata = parse_metadata(v)?;
        } else {
            tensors.push(parse_entry(name, v, data_len)?);
        }
    }
    tensors.sort_by(|a, b| (a.begin, a.end, &a.name).cmp(&(b.begin, b.end, &b.name)));
    let mut expected = 0u64;
    for (i, t) in tensors.iter().enumerate() {
        if t.begin < expected {
            let prev = &tensors[i - 1];
            return Err(Error::format(format!(
                "tensors {:?} [{}, {}) and {:?} [{}, {}) overlap",
                prev.name, prev.begin, prev.end, t.name, t.begin, t.end
            )));
        }
        if t.begin > expected {
            return Err(Error::format(format!(
                "gap in the data section: bytes [{expected}, {}) before tensor {:?} belong to no tensor",
                t.begin, t.name
            )));
        }
        expected = t.end;
    }
    if expected != data_len {
        return Err(Error::format(format!(
            "the data section has {data_len} bytes but the tensors cover {expected}"
        )));
    }
    Ok(Header {
        tensors,
        metadata,
        data_start,
        data_len,
    })
}

/// A JSON object's fields in order, repeated keys included (a JSON map
/// would silently keep only the last of them): the header's entries, and
/// each entry's fields.
struct Fields<V>(Vec<(String, V)>);

impl<V> Fields<V> {
    /// The first key given more than once, if any.
    fn repeated(&self) -> Option<&str> {
        let mut seen = HashSet::with_capacity(self.0.len());
        self.0
            .iter()
            .map(|(k, _)| k.as_str())
            .find(|k| !seen.insert(*k))
    }
}

/// The fields of `json`, an object whose keys must differ; `None` if it is
/// not an object.
fn unique_fields(json: &RawValue) -> Option<Result<Map<String, Value>>> {
    let fields: Fields<Value> = serde_json::from_str(json.get()).ok()?;
    Some(match fields.repeated() {
        Some(k) => Err(Error::format(format!(
            "field {k:?} is given more than once"
        ))),
        None => Ok(fields.0.into_iter().collect()),
    })
}

impl<'de, V: Deserialize<'de>> Deserialize<'de> for Fields<V> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct Entries<V>(PhantomData<V>);
        impl<'de, V: Deserialize<'de>> Visitor<'de> for Entries<V> {
            type Value = Fields<V>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(
                self,
                mut map: A,
            ) -> std::result::Result<Fields<V>, A::Error> {
                let mut entries = Vec::new();
                while let Some(entry) = map.next_entry()? {
                    entries.push(entry);
                }
                Ok(Fields(entries))
            }
        }
        d.deserialize_map(Entries(PhantomData))
    }
}

fn parse_metadata(v: &RawValue) -> Result<BTreeMap<String, String>> {
    let obj = unique_fields(v)
        .ok_or_else(|| Error::format("__metadata__ must be an object of strings"))?
        .map_err(|e| e.context("__metadata__"))?;
    obj.iter()
        .map(|(k, v)| match v {
            Value::String(s) => Ok((k.clone(), s.clone())),
            _ => Err(Error::format(format!(
                "__metadata__ value for {k:?} is not a string"
            ))),
        })
        .collect()
}

/// One entry's fields as written, read in one pass (a map of JSON values
/// per entry cost about 2 µs a tensor: milliseconds in a model of
/// thousands); `parse_entry` checks them.
#[derive(Default)]
struct EntryFields {
    dtype: Option<Value>,
    shape: Option<Value>,
    data_offsets: Option<Value>,
    /// The first repeated or unknown field.
    problem: Option<String>,
}

impl<'de> Deserialize<'de> for EntryFields {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct Entry;
        impl<'de> Visitor<'de> for Entry {
            type Value = EntryFields;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a tensor entry object")
            }
            fn visit_map<A: MapAccess<'de>>(
                self,
                mut map: A,
            ) -> std::result::Result<EntryFields, A::Error> {
                let mut e = EntryFields::default();
                while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
                    let repeated = match &*key {
                        "dtype" => e.dtype.replace(map.next_value()?).is_some(),
                        "shape" => e.shape.replace(map.next_value()?).is_some(),
                        "data_offsets" => e.data_offsets.replace(map.next_value()?).is_some(),
                        other => {
                            map.next_value::<IgnoredAny>()?;
                            e.problem
                                .get_or_insert_with(|| format!("unknown field {other:?}"));
                            continue;
                        }
                    };
                    if repeated {
                        e.problem.get_or_insert_with(|| {
                            format!("field {key:?} is given more than once")
                        });
                    }
                }
                Ok(e)
            }
        }
        d.deserialize_map(Entry)
    }
}

/// An entry as a well-formed header writes it, read with no JSON value per
/// field (a header of 3,280 tensors: 1.8 ms rather than 2.1 on a 2-core
/// development host, through `_native.safetensors_layout`). Any other
/// entry (a field missing, repeated, unknown or of another type) is read
/// again as `EntryFields`, whose errors say what is wrong with it.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct WellFormedEntry<'a> {
    #[serde(borrow)]
    dtype: std::borrow::Cow<'a, str>,
    shape: Vec<u64>,
    data_offsets: (u64, u64),
}

fn parse_entry(name: String, v: &RawValue, data_len: u64) -> Result<TensorInfo> {
    let bad = |what: &str| Error::format(format!("tensor {name:?}: {what}"));
    let (dtype, shape, begin, end) = match serde_json::from_str::<WellFormedEntry>(v.get()) {
        Ok(e) => (
            dtype_named(&name, &e.dtype)?,
            e.shape,
            e.data_offsets.0,
            e.data_offsets.1,
        ),
        Err(_) => entry_fields(&name, v)?,
    };
    if begin > end {
        return Err(bad(&format!("data_offsets [{begin}, {end}] are reversed")));
    }
    if end > data_len {
        return Err(bad(&format!(
            "data_offsets end {end} lies past the end of the data section ({data_len} bytes): truncated file?"
        )));
    }
    let bytes = dtype
        .byte_len(&shape)
        .map_err(|e| e.context(format!("tensor {name:?}")))?;
    if bytes != end - begin {
        return Err(bad(&format!(
            "{} with shape {shape:?} needs {bytes} bytes but data_offsets span {}",
            dtype.name(),
            end - begin
        )));
    }
    Ok(TensorInfo {
        name,
        dtype,
        shape,
        begin,
        end,
    })
}

fn dtype_named(tensor: &str, dtype: &str) -> Result<Dtype> {
    Dtype::parse(dtype)
        .ok_or_else(|| Error::format(format!("tensor {tensor:?}: unsupported dtype {dtype:?}")))
}

/// The fields of an entry that is not well formed, or the error that says
/// why: (dtype, shape, begin, end).
fn entry_fields(name: &str, v: &RawValue) -> Result<(Dtype, Vec<u64>, u64, u64)> {
    let bad = |what: &str| Error::format(format!("tensor {name:?}: {what}"));
    let fields: EntryFields = match serde_json::from_str(v.get()) {
        Ok(f) => f,
        // The top level parsed already: the entry is valid JSON, not a map.
        Err(_) => return Err(bad("entry is not an object")),
    };
    if let Some(problem) = fields.problem {
        return Err(bad(&problem));
    }
    let dtype_name = fields
        .dtype
        .as_ref()
        .and_then(Value::as_str)
        .ok_or_else(|| bad("missing or non-string dtype"))?;
    let dtype = dtype_named(name, dtype_name)?;
    let ints = |key: &str, v: Option<Value>| -> Result<Vec<u64>> {
        v.as_ref()
            .and_then(Value::as_array)
            .ok_or_else(|| bad(&format!("missing or non-array {key}")))?
            .iter()
            .map(|x| {
                x.as_u64().ok_or_else(|| {
                    bad(&format!(
                        "{key} holds a value that is not a non-negative integer"
                    ))
                })
            })
            .collect()
    };
    let shape = ints("shape", fields.shape)?;
    let offsets = ints("data_offsets", fields.data_offsets)?;
    let [begin, end] = offsets[..] else {
        return Err(bad("data_offsets must hold exactly two integers"));
    };
    Ok((dtype, shape, begin, end))
}

/// Serializes a header for `tensors` (in data order, contiguous from 0,
/// names distinct), padded with spaces (which JSON ignores) so the data
/// section starts at a multiple of `align` (a power of two >= 8; 4096 lets
/// the data be written with O_DIRECT). Returns the bytes to write at file
/// offset 0. The metadata comes first, then the tensors in data order, as
/// safetensors writes them. The JSON is written as it goes: a data file of
/// a checkpoint names thousands of tensors, and a tree of JSON values made
/// first took a dozen allocations for each.
pub fn serialize_header(
    tensors: &[TensorInfo],
    metadata: &BTreeMap<String, String>,
    align: u64,
) -> Vec<u8> {
    assert!(
        align.is_power_of_two() && align >= 8,
        "bad header alignment"
    );
    // The length goes in front once the JSON is known.
    let mut out = Vec::with_capacity(64 + tensors.len() * 96);
    out.extend_from_slice(&[0; 8]);
    out.push(b'{');
    if !metadata.is_empty() {
        out.extend_from_slice(b"\"__metadata__\":");
        serde_json::to_writer(&mut out, metadata).expect("strings serialize");
    }
    for (i, t) in tensors.iter().enumerate() {
        if i > 0 || !metadata.is_empty() {
            out.push(b',');
        }
        serde_json::to_writer(&mut out, &t.name).expect("a string serializes");
        write!(out, ":{{\"dtype\":\"{}\",\"shape\":[", t.dtype.name()).expect("a Vec takes writes");
        for (k, d) in t.shape.iter().enumerate() {
            let comma = if k > 0 { "," } else { "" };
            write!(out, "{comma}{d}").expect("a Vec takes writes");
        }
        write!(out, "],\"data_offsets\":[{},{}]}}", t.begin, t.end).expect("a Vec takes writes");
    }
    out.push(b'}');
    let json = out.len() as u64 - 8;
    let padded = (8 + json).next_multiple_of(align) - 8;
    out.resize(8 + padded as usize, b' ');
    out[..8].copy_from_slice(&padded.to_le_bytes());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(json: &str, data: usize) -> (Vec<u8>, u64) {
        let mut b = (json.len() as u64).to_le_bytes().to_vec();
        b.extend_from_slice(json.as_bytes());
        let len = b.len() as u64 + data as u64;
        (b, len)
    }

    fn err(json: &str, data: usize) -> String {
        let (b, len) = file(json, data);
        parse_header(&b, len).unwrap_err().to_string()
    }

    #[test]
    fn valid_header_parses_with_metadata_and_zero_size_tensor() {
        let (b, len) = file(
            r#"{"__metadata__":{"format":"pt"},"b":{"dtype":"BF16","shape":[2,3],"data_offsets":[4,16]},
               "a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"z":{"dtype":"U8","shape":[0],"data_offsets":[16,16]}}"#,
            16,
        );
        let h = parse_header(&b, len).unwrap();
        assert_eq!(
            h.tensors
                .iter()
                .map(|t| t.name.as_str())
                .collect::<Vec<_>>(),
            ["a", "b", "z"]
        );
        assert_eq!(h.metadata["format"], "pt");
        assert_eq!(h.data_len, 16);
        assert!(h.tensors[2].is_empty());
    }

    #[test]
    fn each_violation_has_a_clear_error() {
        let overlap = r#"{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},
                          "b":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}}"#;
        let huge =
            r#"{"a":{"dtype":"U8","shape":[4294967296,4294967296,16],"data_offsets":[0,4]}}"#;
        let cases: &[(&str, usize, &str)] = &[
            (
                r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#,
                4,
                "past the end",
            ),
            (
                r#"{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}"#,
                8,
                "needs 12 bytes",
            ),
            (overlap, 6, "overlap"),
            (
                r#"{"a":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}}"#,
                6,
                "gap",
            ),
            (
                r#"{"a":{"dtype":"Q4","shape":[4],"data_offsets":[0,4]}}"#,
                4,
                "unsupported dtype",
            ),
            (
                r#"{"a":{"dtype":"U8","shape":[-1],"data_offsets":[0,4]}}"#,
                4,
                "non-negative",
            ),
            (
                r#"{"a":{"dtype":"U8","shape":[4],"data_offsets":[4,0]}}"#,
                4,
                "reversed",
            ),
            (
                r#"{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4],"x":1}}"#,
                4,
                "unknown field",
            ),
            (huge, 4, "too large"),
            (
                r#"{"a":{"dtype":"F4","shape":[3],"data_offsets":[0,2]}}"#,
                2,
                "partial byte",
            ),
            (r#"[1,2]"#, 0, "not a JSON object"),
            (
                r#"{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}"#,
                4,
                "cover 2",
            ),
            (r#"{"__metadata__":{"k":1}}"#, 0, "not a string"),
            (
                r#"{"a":{"dtype":"U8","shape":[1],"data_offsets":[0]}}"#,
                1,
                "exactly two",
            ),
            // Entries that are not well formed, each read again for its
            // error.
            (
                r#"{"a":{"dtype":"U8","dtype":"U8","shape":[4],"data_offsets":[0,4]}}"#,
                4,
                r#"field "dtype" is given more than once"#,
            ),
            (
                r#"{"a":{"dtype":"U8","data_offsets":[0,4]}}"#,
                4,
                "missing or non-array shape",
            ),
            (
                r#"{"a":{"dtype":8,"shape":[4],"data_offsets":[0,4]}}"#,
                4,
                "missing or non-string dtype",
            ),
            (
                r#"{"a":{"dtype":"Q4","shape":"x","data_offsets":[0,4]}}"#,
                4,
                "unsupported dtype",
            ),
            (
                r#"{"a":{"dtype":"U8","shape":[4.0],"data_offsets":[0,4]}}"#,
                4,
                "shape holds a value that is not a non-negative integer",
            ),
            (r#"{"a":[1]}"#, 0, "entry is not an object"),
        ];
        for &(json, data, needle) in cases {
            let e = err(json, data);
            assert!(e.contains(needle), "{json}: {e}");
        }
    }

    #[test]
    fn a_name_given_twice_is_reported_as_such() {
        let twice = r#"{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},
                        "b":{"dtype":"U8","shape":[4],"data_offsets":[4,8]},
                        "a":{"dtype":"U8","shape":[4],"data_offsets":[8,12]}}"#;
        let e = err(twice, 12);
        assert!(e.contains(r#"names "a" more than once"#), "{e}");
        assert!(!e.contains("gap"), "{e}");
        let metadata_twice = r#"{"__metadata__":{"k":"v"},"__metadata__":{"k":"w"}}"#;
        let e = err(metadata_twice, 0);
        assert!(e.contains(r#"names "__metadata__" more than once"#), "{e}");
    }

    #[test]
    fn a_field_given_twice_is_refused() {
        let dtype_twice = r#"{"a":{"dtype":"U8","shape":[4],"dtype":"F32","data_offsets":[0,4]}}"#;
        let e = err(dtype_twice, 4);
        assert!(
            e.contains(r#"tensor "a": field "dtype" is given more than once"#),
            "{e}"
        );
        let key_twice = r#"{"__metadata__":{"k":"v","k":"w"}}"#;
        let e = err(key_twice, 0);
        assert!(
            e.contains(r#"__metadata__: field "k" is given more than once"#),
            "{e}"
        );
    }

    #[test]
    fn every_dtype_name_parses_back_and_sub_byte_types_pack() {
        for d in Dtype::ALL {
            assert_eq!(Dtype::parse(d.name()), Some(d));
        }
        assert_eq!(Dtype::parse("f32"), None);
        assert_eq!(Dtype::F4.byte_len(&[2, 4]).unwrap(), 4);
        assert_eq!(Dtype::F6_E2M3.byte_len(&[4]).unwrap(), 3);
        assert_eq!(Dtype::F8_E4M3FNUZ.byte_len(&[3]).unwrap(), 3);
        assert_eq!(Dtype::C64.byte_len(&[]).unwrap(), 8);
        for bad in [
            Dtype::F6_E3M2.byte_len(&[3]),
            Dtype::U64.byte_len(&[u64::MAX]),
        ] {
            assert_eq!(bad.unwrap_err().kind(), crate::ErrorKind::Format);
        }
    }

    #[test]
    fn hostile_lengths_are_refused_without_allocating() {
        let mut b = u64::MAX.to_le_bytes().to_vec();
        b.push(b'{');
        assert!(parse_header(&b, 9)
            .unwrap_err()
            .to_string()
            .contains("exceeds"));
        let b = 100u64.to_le_bytes();
        assert!(parse_header(&b, 50)
            .unwrap_err()
            .to_string()
            .contains("past the end of the file"));
        assert!(parse_header(&[1, 2], 2).is_err());
    }

    #[test]
    fn serialized_header_is_the_json_of_its_tensors_in_data_order() {
        let names = ["z\"quote\\back", "é中\u{1}\n", "a", "layers.0.w"];
        let ts: Vec<TensorInfo> = names
            .iter()
            .enumerate()
            .map(|(i, n)| TensorInfo {
                name: n.to_string(),
                dtype: Dtype::F8_E4M3,
                shape: vec![2, i as u64, 3],
                begin: 6 * i as u64 * (i as u64).saturating_sub(1) / 2,
                end: 6 * i as u64 * (i as u64 + 1) / 2,
            })
            .collect();
        for meta in [
            BTreeMap::new(),
            BTreeMap::from([("k\"".to_string(), "v\\".to_string())]),
        ] {
            let b = serialize_header(&ts, &meta, 8);
            let json = std::str::from_utf8(&b[8..]).unwrap().trim_end();
            let mut want = serde_json::Map::new();
            if !meta.is_empty() {
                want.insert("__metadata__".into(), serde_json::to_value(&meta).unwrap());
            }
            for t in &ts {
                want.insert(
                    t.name.clone(),
                    serde_json::json!({"dtype": "F8_E4M3", "shape": t.shape, "data_offsets": [t.begin, t.end]}),
                );
            }
            assert_eq!(
                serde_json::from_str::<Value>(json).unwrap(),
                Value::Object(want)
            );
            // Keys in data order, the metadata first.
            let at = |k: &str| json.find(&serde_json::to_string(k).unwrap()).unwrap();
            let mut keys: Vec<&str> = names.to_vec();
            if !meta.is_empty() {
                keys.insert(0, "__metadata__");
            }
            assert!(keys.windows(2).all(|w| at(w[0]) < at(w[1])), "{json}");
            let h = parse_header(&b, b.len() as u64 + ts.last().unwrap().end).unwrap();
            assert_eq!(h.metadata, meta);
            assert_eq!(h.tensors.len(), names.len());
        }
    }

    #[test]
    fn serialize_round_trips_and_aligns_data() {
        let ts = vec![
            TensorInfo {
                name: "w".into(),
                dtype: Dtype::BF16,
                shape: vec![3, 5],
                begin: 0,
                end: 30,
            },
            TensorInfo {
                name: "e".into(),
                dtype: Dtype::F8_E4M3,
                shape: vec![0],
                begin: 30,
                end: 30,
            },
        ];
        let meta = BTreeMap::from([("format".to_string(), "pt".to_string())]);
        let b = serialize_header(&ts, &meta, 8);
        assert_eq!(b.len() % 8, 0);
        let b4k = serialize_header(&ts, &meta, 4096);
        assert_eq!(b4k.len(), 4096);
        assert_eq!(
            parse_header(&b4k, 4096 + 30).unwrap().tensors,
            parse_header(&b, b.len() as u64 + 30).unwrap().tensors
        );
        let h = parse_header(&b, b.len() as u64 + 30).unwrap();
        assert_eq!(h.metadata, meta);
        assert_eq!(h.tensors.len(), 2);
        assert_eq!(h.data_start, b.len() as u64);
    }
}

//! The manifest: what a checkpoint holds and where, with a checksum per
//! chunk. Stored as `manifest.json`, `{"xxh3":"<hex>","manifest":{...}}`,
//! the hash covering the manifest object's exact bytes, so one flipped byte
//! anywhere is caught. It is untrusted input: [`Manifest::decode`] checks
//! every field before anything uses it (and is fuzzed).

use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashSet};
use zerohop::safetensors::Dtype;
use zerohop::{Error, ErrorKind, Result};

pub const FORMAT: &str = "zerohop-checkpoint";
/// The newest version written: 2 where a region is split over data files
/// (an entry has `pieces`), else 1, which every reader of version 1 reads.
pub const VERSION: u32 = 2;
pub const MANIFEST_FILE: &str = "manifest.json";
pub const CHECKSUM: &str = "xxh3-64";
/// Manifests beyond this size are refused before parsing.
pub const MAX_MANIFEST_BYTES: u64 = 256 << 20;

/// The whole manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub format: String,
    pub version: u32,
    /// The chunk checksum: always `xxh3-64` in version 1.
    pub checksum: String,
    /// Chunks are the pieces of each data file between multiples of this.
    pub chunk_bytes: u64,
    /// The checkpoint this one was saved against (a sibling directory's
    /// name), for incremental saves.
    pub parent: Option<String>,
    /// The caller's own key/value strings.
    pub metadata: BTreeMap<String, String>,
    pub files: Vec<DataFile>,
    pub entries: Vec<Entry>,
    pub chunks: Vec<Chunk>,
}

/// One safetensors data file of the checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DataFile {
    pub name: String,
    pub bytes: u64,
    /// The safetensors header's length (where the data starts) and its
    /// xxh3-64: chunks cover the data, this covers the rest of the file.
    pub header_bytes: u64,
    pub header_xxh3: String,
}

/// One saved tensor or raw region.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Entry {
    pub name: String,
    /// safetensors dtype name; `None` for a raw region (stored as `U8`).
    pub dtype: Option<String>,
    /// `None` for a raw region.
    pub shape: Option<Vec<u64>>,
    pub bytes: u64,
    /// Index into `files`, and the absolute offset of the first byte there.
    pub file: usize,
    pub offset: u64,
    /// A region split over several data files (so that one large region is
    /// written by every writer at once): its pieces in order, the first at
    /// `file` and `offset`. Empty when the entry lies whole there.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pieces: Vec<Piece>,
}

/// One piece of a split entry: `bytes` bytes at `offset` of file `file`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Piece {
    pub file: usize,
    pub offset: u64,
    pub bytes: u64,
}

impl Entry {
    /// Where the entry's bytes lie, in order: each piece, and where in the
    /// entry it starts.
    pub fn placement(&self) -> Vec<(Piece, u64)> {
        if self.pieces.is_empty() {
            let whole = Piece {
                file: self.file,
                offset: self.offset,
                bytes: self.bytes,
            };
            return vec![(whole, 0)];
        }
        let mut at = 0;
        self.pieces
            .iter()
            .map(|p| {
                at += p.bytes;
                (*p, at - p.bytes)
            })
            .collect()
    }
}

/// One checksummed chunk of a data file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Chunk {
    pub file: usize,
    pub offset: u64,
    pub len: u64,
    /// xxh3-64 of the chunk's bytes, 16 hex digits.
    pub xxh3: String,
    /// Set when an incremental save found this chunk unchanged: the bytes
    /// live in the same file and offset of that sibling checkpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stored_in: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Envelope<'a> {
    xxh3: String,
    #[serde(borrow)]
    manifest: &'a serde_json::value::RawValue,
}

/// The checksum of chunk bytes, as stored.
pub fn chunk_checksum(bytes: &[u8]) -> String {
    checksum_hex(twox_hash::XxHash3_64::oneshot(bytes))
}

/// How a checksum is written in the manifest.
pub fn checksum_hex(sum: u64) -> String {
    format!("{sum:016x}")
}

impl Manifest {
    /// The bytes of `manifest.json`.
    pub fn encode(&self) -> Vec<u8> {
        let body = serde_json::to_string(self).expect("a manifest serializes");
        format!(
            "{{\"xxh3\":\"{}\",\"manifest\":{body}}}\n",
            chunk_checksum(body.as_bytes())
        )
        .into_bytes()
    }

    /// Parses and checks `manifest.json` bytes.
    pub fn decode(bytes: &[u8]) -> Result<Manifest> {
        if bytes.len() as u64 > MAX_MANIFEST_BYTES {
            return Err(Error::format(format!(
                "manifest of {} bytes exceeds the {MAX_MANIFEST_BYTES}-byte limit",
                bytes.len()
            )));
        }
        let env: Envelope = serde_json::from_slice(bytes).map_err(|e| {
            Error::with_source(ErrorKind::Format, "manifest is not a zerohop manifest", e)
        })?;
        let body = env.manifest.get();
        let actual = chunk_checksum(body.as_bytes());
        if actual != env.xxh3 {
            return Err(Error::new(
                ErrorKind::Integrity,
                format!(
                    "manifest checksum mismatch (stored {}, computed {actual}): the manifest is damaged",
                    env.xxh3
                ),
            ));
        }
        let m: Manifest = serde_json::from_str(body)
            .map_err(|e| Error::with_source(ErrorKind::Format, "manifest fields are wrong", e))?;
        m.validate()?;
        Ok(m)
    }

    // `Manifest::read`, from a checkpoint directory, is in `location`: it
    // reads through the checkpoint's `Location`.

    /// Total bytes of all entries.
    pub fn bytes(&self) -> u64 {
        self.entries.iter().map(|e| e.bytes).sum()
    }

    /// The entry holding absolute `offset` of file `file`, and the offset
    /// inside it: how a bad chunk is named.
    pub fn locate(&self, file: usize, offset: u64) -> Option<(&Entry, u64)> {
        self.entries.iter().find_map(|e| {
            e.placement()
                .into_iter()
                .find(|(p, _)| p.file == file && p.offset <= offset && offset < p.offset + p.bytes)
                .map(|(p, at)| (e, at + offset - p.offset))
        })
    }

    /// Names the chunk at `offset` of `file` for error messages.
    pub fn describe_chunk(&self, file: usize, offset: u64) -> String {
        let f = &self.files[file].name;
        match self.locate(file, offset) {
            Some((e, at)) => format!("entry {:?} at byte {at} ({f}, offset {offset})", e.name),
            None => format!("{f}, offset {offset}"),
        }
    }

    /// The error for chunk number `chunk` of the checkpoint `at` not
    /// matching its checksum.
    pub fn damaged_chunk(&self, at: &dyn std::fmt::Display, chunk: usize) -> Error {
        let c = &self.chunks[chunk];
        Error::new(
            ErrorKind::Integrity,
            format!(
                "{}: chunk of {} does not match its checksum{}: the checkpoint is damaged",
                at,
                self.describe_chunk(c.file, c.offset),
                c.stored_in
                    .as_ref()
                    .map_or(String::new(), |s| format!(" (stored in {s})"))
            ),
        )
    }

    /// A split entry: two pieces or more, none empty, the first where the
    /// entry says, together its size; and only in a version-2 manifest.
    fn check_pieces(&self, e: &Entry) -> Result<()> {
        if e.pieces.is_empty() {
            return Ok(());
        }
        let first = e.pieces[0];
        let total = e
            .pieces
            .iter()
            .try_fold(0u64, |sum, p| sum.checked_add(p.bytes));
        if self.version < 2
            || e.pieces.len() < 2
            || e.pieces.iter().any(|p| p.bytes == 0)
            || (first.file, first.offset) != (e.file, e.offset)
            || total != Some(e.bytes)
        {
            return Err(Error::format(format!(
                "manifest: the pieces of entry {:?} do not make it up",
                e.name
            )));
        }
        Ok(())
    }

    /// What `decode` checks once the manifest is parsed: a save checks the
    /// manifest it is about to commit with it.
    pub(crate) fn validate(&self) -> Result<()> {
        let bad = |what: String| Err(Error::format(format!("manifest: {what}")));
        if self.format != FORMAT || !(1..=VERSION).contains(&self.version) {
            return bad(format!(
                "format {:?} version {} is not {FORMAT:?} version 1 to {VERSION}",
                self.format, self.version
            ));
        }
        if self.checksum != CHECKSUM {
            return bad(format!("unknown checksum {:?}", self.checksum));
        }
        if !self.chunk_bytes.is_power_of_two() || !(4096..=1 << 30).contains(&self.chunk_bytes) {
            return bad(format!(
                "chunk size {} is not a power of two in [4 KiB, 1 GiB]",
                self.chunk_bytes
            ));
        }
        if let Some(p) = &self.parent {
            check_name(p, "parent")?;
        }
        let mut names = HashSet::new();
        for f in &self.files {
            check_name(&f.name, "data file")?;
            check_hex(&f.header_xxh3)?;
            let header_limit = zerohop::safetensors::MAX_HEADER_BYTES + 8 + 4096;
            if f.header_bytes < 8 || f.header_bytes > f.bytes || f.header_bytes > header_limit {
                return bad(format!(
                    "data file {:?} has a header of {} bytes",
                    f.name, f.header_bytes
                ));
            }
            if !names.insert(f.name.as_str()) {
                return bad(format!("data file {:?} listed twice", f.name));
            }
        }
        // Per file: where its data starts and the entries and chunks tile it.
        let mut per_file: Vec<Vec<(u64, u64)>> = vec![Vec::new(); self.files.len()];
        let mut entry_names = HashSet::new();
        for e in &self.entries {
            if !entry_names.insert(e.name.as_str()) {
                return bad(format!("entry {:?} listed twice", e.name));
            }
            check_type(e)?;
            self.check_pieces(e)?;
            for (p, _) in e.placement() {
                let file = self.files.get(p.file).ok_or_else(|| {
                    Error::format(format!(
                        "manifest: entry {:?} names file #{}",
                        e.name, p.file
                    ))
                })?;
                if p.offset
                    .checked_add(p.bytes)
                    .is_none_or(|end| end > file.bytes)
                {
                    return bad(format!(
                        "entry {:?} runs past the end of {}",
                        e.name, file.name
                    ));
                }
                per_file[p.file].push((p.offset, p.bytes));
            }
        }
        let mut chunks: Vec<Vec<&Chunk>> = vec![Vec::new(); self.files.len()];
        for c in &self.chunks {
            if c.file >= self.files.len() {
                return bad(format!("a chunk names file #{}", c.file));
            }
            check_hex(&c.xxh3)?;
            if let Some(s) = &c.stored_in {
                check_name(s, "chunk location")?;
            }
            chunks[c.file].push(c);
        }
        for (i, f) in self.files.iter().enumerate() {
            let entries = &mut per_file[i];
            entries.sort_unstable();
            let start = f.header_bytes;
            let mut at = start;
            for &(offset, len) in entries.iter() {
                if offset != at {
                    return bad(format!(
                        "entries of {} leave a gap or overlap at {at}",
                        f.name
                    ));
                }
                at += len;
            }
            if at != f.bytes {
                return bad(format!(
                    "entries of {} end at {at}, not at its end {}",
                    f.name, f.bytes
                ));
            }
            let mut at = start;
            for c in &chunks[i] {
                // `at <= f.bytes` here, so only the block end can overflow.
                let block_end = (c.offset / self.chunk_bytes + 1).saturating_mul(self.chunk_bytes);
                if c.offset != at
                    || c.len == 0
                    || c.offset.checked_add(c.len) != Some(block_end.min(f.bytes))
                {
                    return bad(format!(
                        "chunks of {} do not tile its data in {}-byte blocks (at offset {at})",
                        f.name, self.chunk_bytes
                    ));
                }
                at += c.len;
            }
            if at != f.bytes {
                return bad(format!(
                    "chunks of {} stop at {at} before its end {}",
                    f.name, f.bytes
                ));
            }
        }
        Ok(())
    }
}

fn check_type(e: &Entry) -> Result<()> {
    let bad = |what: &str| {
        Err(Error::format(format!(
            "manifest: entry {:?}: {what}",
            e.name
        )))
    };
    match (&e.dtype, &e.shape) {
        (None, None) => Ok(()),
        (Some(d), Some(shape)) => {
            let dtype = Dtype::parse(d).ok_or_else(|| {
                Error::format(format!("manifest: entry {:?}: unknown dtype {d:?}", e.name))
            })?;
            if dtype.byte_len(shape).ok() != Some(e.bytes) {
                return bad("dtype and shape disagree with its size");
            }
            Ok(())
        }
        _ => bad("dtype and shape must both be given, or neither (a raw region)"),
    }
}

fn check_hex(sum: &str) -> Result<()> {
    if sum.len() != 16 || !sum.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(Error::format(format!(
            "manifest: checksum {sum:?} is not 16 hex digits"
        )));
    }
    Ok(())
}

/// A name that stays inside its directory: no separators, no dot files.
pub(crate) fn check_name(name: &str, what: &str) -> Result<()> {
    if name.is_empty() || name.starts_with('.') || name.contains(['/', '\0']) || name.len() > 255 {
        return Err(Error::format(format!(
            "manifest: {what} name {name:?} is not a plain file name"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two data files of 4,096-byte headers and 8 KiB of data each, holding
    /// one raw entry split 8 KiB + 8 KiB.
    fn split_manifest() -> Manifest {
        let file = |name: &str| DataFile {
            name: name.into(),
            bytes: 4096 + 8192,
            header_bytes: 4096,
            header_xxh3: "0123456789abcdef".into(),
        };
        let chunk = |file| Chunk {
            file,
            offset: 4096,
            len: 4096,
            xxh3: "0123456789abcdef".into(),
            stored_in: None,
        };
        let second = |file| Chunk {
            offset: 8192,
            ..chunk(file)
        };
        Manifest {
            format: FORMAT.into(),
            version: 2,
            checksum: CHECKSUM.into(),
            chunk_bytes: 4096,
            parent: None,
            metadata: BTreeMap::new(),
            files: vec![file("a"), file("b")],
            entries: vec![Entry {
                name: "slab".into(),
                dtype: None,
                shape: None,
                bytes: 16384,
                file: 0,
                offset: 4096,
                pieces: vec![
                    Piece {
                        file: 0,
                        offset: 4096,
                        bytes: 8192,
                    },
                    Piece {
                        file: 1,
                        offset: 4096,
                        bytes: 8192,
                    },
                ],
            }],
            chunks: vec![chunk(0), second(0), chunk(1), second(1)],
        }
    }

    #[test]
    fn split_entries_are_read_back_and_placed() {
        let m = split_manifest();
        let back = Manifest::decode(&m.encode()).unwrap();
        assert_eq!(back, m);
        let placement = back.entries[0].placement();
        assert_eq!(placement[1].0.file, 1);
        assert_eq!(placement[1].1, 8192);
        // A byte of the second piece is named by its place in the entry.
        let (entry, at) = back.locate(1, 4096 + 100).unwrap();
        assert_eq!((entry.name.as_str(), at), ("slab", 8192 + 100));
        assert!(back.describe_chunk(1, 4096 + 100).contains("at byte 8292"));
    }

    #[test]
    fn pieces_that_do_not_make_up_their_entry_are_refused() {
        let broken: [fn(&mut Manifest); 5] = [
            |m| m.entries[0].bytes = 16385,
            |m| m.entries[0].offset = 8192,
            |m| m.version = 1,
            |m| m.entries[0].pieces[1].offset = 8192,
            |m| {
                // One piece alone says nothing the entry does not.
                m.entries[0].pieces.truncate(1);
                m.entries[0].bytes = 8192;
            },
        ];
        for (i, breaks) in broken.iter().enumerate() {
            let mut m = split_manifest();
            breaks(&mut m);
            let err = Manifest::decode(&m.encode()).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::Format, "case {i}: {err}");
        }
    }
}

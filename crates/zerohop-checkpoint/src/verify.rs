//! Checking a stored checkpoint without a GPU, and removing one safely.

use crate::location::Location;
use crate::manifest::checksum_hex;
use crate::restore::Sources;
use zerohop::storage::{range_sums, FileRange};
use zerohop::{Error, ErrorKind, Progress, Result};

/// What a successful verification covered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verified {
    pub chunks: usize,
    pub bytes: u64,
    /// Chunks read from the checkpoints an incremental save referenced.
    pub referenced_chunks: usize,
}

/// Reads every chunk of the checkpoint `at` (following references to
/// parent checkpoints) with `threads` readers and checks its checksum, and
/// checks every data file's size and header. Fails naming the first bad
/// chunk in file order. `progress` hears of the bytes checked.
pub fn verify(at: &Location, threads: usize, progress: Option<Progress<'_>>) -> Result<Verified> {
    let m = at.manifest()?;
    let sources = Sources::open(at, &m)?;
    let ranges: Vec<FileRange> = m
        .chunks
        .iter()
        .map(|c| FileRange {
            file: sources.index(c.file, c.stored_in.as_deref()),
            offset: c.offset,
            len: c.len,
        })
        .collect();
    let sums = range_sums(&sources.files, &ranges, threads, progress)?;
    if let Some(i) = (0..sums.len()).find(|&i| checksum_hex(sums[i]) != m.chunks[i].xxh3) {
        return Err(m.damaged_chunk(at, i));
    }
    Ok(Verified {
        chunks: m.chunks.len(),
        bytes: m.chunks.iter().map(|c| c.len).sum(),
        referenced_chunks: m.chunks.iter().filter(|c| c.stored_in.is_some()).count(),
    })
}

/// The checkpoints in the same store as `at` that reference it (as
/// parent, or for stored chunks).
pub fn dependents(at: &Location) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for name in at.store.list()? {
        if name == at.name {
            continue;
        }
        // A sibling whose manifest cannot be read might depend on `at`:
        // refuse rather than guess. (A save in flight checks its parent
        // again just before it commits.)
        let m = at.sibling(&name)?.manifest()?;
        let uses = m.parent.as_deref() == Some(at.name.as_str())
            || m.chunks
                .iter()
                .any(|c| c.stored_in.as_deref() == Some(at.name.as_str()));
        if uses {
            out.push(name);
        }
    }
    Ok(out)
}

/// Deletes the checkpoint `at`, refusing while another checkpoint still
/// needs its chunks.
pub fn remove(at: &Location) -> Result<()> {
    at.manifest()?;
    let deps = dependents(at)?;
    if !deps.is_empty() {
        return Err(Error::new(
            ErrorKind::AlreadyExists,
            format!(
                "{at} is still needed by checkpoint(s) {}: remove those first",
                deps.join(", ")
            ),
        ));
    }
    at.store.remove(&at.name)
}

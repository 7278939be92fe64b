//! Checking a stored checkpoint without a GPU, and removing one safely.

use crate::location::Location;
use crate::manifest::checksum_hex;
use crate::restore::Sources;
use std::hash::Hasher;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use twox_hash::XxHash3_64;
use zerohop::{Error, ErrorKind, Progress, Result};

/// Bytes read and hashed at a time.
const PIECE: usize = 8 << 20;

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
    let next = AtomicUsize::new(0);
    let bad: Mutex<Option<usize>> = Mutex::new(None);
    let failed: Mutex<Option<Error>> = Mutex::new(None);
    std::thread::scope(|s| {
        for _ in 0..threads.clamp(1, 64) {
            s.spawn(|| {
                // Chunks are hashed in bounded pieces, whatever size the
                // (untrusted) manifest claims for them.
                let mut buf = vec![0u8; PIECE];
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(c) = m.chunks.get(i) else { break };
                    let file = &sources.files[sources.index(c.file, c.stored_in.as_deref())];
                    let mut hash = XxHash3_64::new();
                    let mut at = 0;
                    while at < c.len {
                        let n = PIECE.min((c.len - at) as usize);
                        if let Err(e) = file.read_exact_at(&mut buf[..n], c.offset + at) {
                            failed.lock().unwrap().get_or_insert(e);
                            return;
                        }
                        hash.write(&buf[..n]);
                        at += n as u64;
                        if let Some(p) = progress {
                            p(n as u64);
                        }
                    }
                    if checksum_hex(hash.finish()) != c.xxh3 {
                        let mut b = bad.lock().unwrap();
                        *b = Some(b.map_or(i, |j| j.min(i)));
                    }
                }
            });
        }
    });
    if let Some(e) = failed.into_inner().unwrap() {
        return Err(e);
    }
    if let Some(i) = bad.into_inner().unwrap() {
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

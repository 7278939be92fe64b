//! Checking a checkpoint on disk without a GPU, and removing one safely.

use crate::manifest::{checksum_hex, Manifest};
use crate::restore::Sources;
use std::hash::Hasher;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use twox_hash::XxHash3_64;
use zerohop::storage::{atomic, sync_dir};
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

/// Reads every chunk of the checkpoint at `dir` (following references to
/// parent checkpoints) with `threads` readers and checks its checksum, and
/// checks every data file's size and header. Fails naming the first bad
/// chunk in file order. `progress` hears of the bytes checked.
pub fn verify(dir: &Path, threads: usize, progress: Option<Progress<'_>>) -> Result<Verified> {
    let m = Manifest::read(dir)?;
    let sources = Sources::open(dir, &m)?;
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
        return Err(m.damaged_chunk(dir, i));
    }
    Ok(Verified {
        chunks: m.chunks.len(),
        bytes: m.chunks.iter().map(|c| c.len).sum(),
        referenced_chunks: m.chunks.iter().filter(|c| c.stored_in.is_some()).count(),
    })
}

/// The checkpoints in the same directory as `dir` that reference it (as
/// parent, or for stored chunks).
pub fn dependents(dir: &Path) -> Result<Vec<String>> {
    let name = dir
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| Error::invalid(format!("{} has no usable name", dir.display())))?;
    let parent = atomic::parent_of(dir);
    let mut out = Vec::new();
    let listing = std::fs::read_dir(parent).map_err(|e| Error::io(parent, "cannot list", e))?;
    for entry in listing.flatten() {
        let path = entry.path();
        // Dot entries are temporaries of saves in flight or crashed: a
        // save in flight checks its parent again just before it commits.
        let hidden = entry.file_name().to_string_lossy().starts_with('.');
        if hidden || path == dir || !path.join(crate::MANIFEST_FILE).is_file() {
            continue;
        }
        // A sibling whose manifest cannot be read might depend on `dir`:
        // refuse rather than guess.
        let m = Manifest::read(&path)?;
        let uses = m.parent.as_deref() == Some(name)
            || m.chunks
                .iter()
                .any(|c| c.stored_in.as_deref() == Some(name));
        if uses {
            out.push(entry.file_name().to_string_lossy().into_owned());
        }
    }
    out.sort();
    Ok(out)
}

/// Deletes the checkpoint at `dir`, refusing while another checkpoint
/// still needs its chunks. The directory is first renamed to a temporary
/// name, so a crash mid-delete never leaves a half checkpoint that looks
/// whole.
pub fn remove(dir: &Path) -> Result<()> {
    Manifest::read(dir)?;
    let deps = dependents(dir)?;
    if !deps.is_empty() {
        return Err(Error::new(
            ErrorKind::AlreadyExists,
            format!(
                "{} is still needed by checkpoint(s) {}: remove those first",
                dir.display(),
                deps.join(", ")
            ),
        ));
    }
    let tmp = atomic::temp_sibling(dir)?;
    std::fs::rename(dir, &tmp).map_err(|e| Error::io(dir, "cannot move aside", e))?;
    sync_dir(atomic::parent_of(dir))?;
    std::fs::remove_dir_all(&tmp).map_err(|e| Error::io(&tmp, "cannot remove", e))
}

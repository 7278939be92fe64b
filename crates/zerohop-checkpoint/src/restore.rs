//! Restoring: streams a checkpoint's data through the engine's read
//! pipeline into device memory, and checks every chunk's checksum: on the
//! device, where its kernel can hash the chunks where they landed, so the
//! host reads the bytes only to move them; else in the staging slot, before
//! the chunk is copied on.

use crate::checksums;
use crate::location::Location;
use crate::manifest::{checksum_hex, chunk_checksum, Manifest, Piece};
use crate::save::check_geometry;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use zerohop::plan::{region_holding, TransferPlan};
use zerohop::storage::SourceFile;
use zerohop::{DeviceBuffer, Engine, Error, ErrorKind, Progress, Result, TransferStats};

/// A restored checkpoint in fresh device allocations, one per entry.
pub struct Restored {
    pub manifest: Manifest,
    /// In manifest order, one buffer per entry.
    pub buffers: Vec<DeviceBuffer>,
    pub stats: TransferStats,
}

/// Restores the checkpoint `at` into new device allocations.
pub fn restore(engine: &Engine, at: &Location, progress: Option<Progress<'_>>) -> Result<Restored> {
    let manifest = at.manifest()?;
    // The data files are checked (sizes, headers) before any memory is
    // allocated for what the manifest claims.
    let sources = Sources::open(at, &manifest)?;
    let buffers = manifest
        .entries
        .iter()
        .map(|e| engine.device().alloc(e.bytes as usize))
        .collect::<Result<Vec<_>>>()?;
    let into: Vec<(&DeviceBuffer, u64)> = buffers.iter().map(|b| (b, 0)).collect();
    let stats = restore_entries(engine, at, &manifest, sources, &buffers, &into, progress)?;
    Ok(Restored {
        manifest,
        buffers,
        stats,
    })
}

/// Restores the checkpoint `at` into existing regions, named as saved.
/// Every entry needs a target of exactly its size, and every target an
/// entry; otherwise nothing is read and the mismatch is the error.
pub fn restore_into(
    engine: &Engine,
    at: &Location,
    targets: &[(&str, DeviceBuffer)],
    progress: Option<Progress<'_>>,
) -> Result<TransferStats> {
    restore_manifest_into(engine, at, &at.manifest()?, targets, &[], progress)
}

/// `restore_into` with `at`'s manifest already read (`at.manifest()`):
/// a caller that looks at the entries first reads and decodes it once
/// (a few milliseconds for thousands of entries). `blocks` are
/// allocations that hold several targets each (tensors that share a
/// block): a target inside one is read into it, so that one device copy
/// fills targets that follow each other there and in a data file.
pub fn restore_manifest_into(
    engine: &Engine,
    at: &Location,
    manifest: &Manifest,
    targets: &[(&str, DeviceBuffer)],
    blocks: &[DeviceBuffer],
    progress: Option<Progress<'_>>,
) -> Result<TransferStats> {
    let by_name: HashMap<&str, &DeviceBuffer> = targets.iter().map(|(n, b)| (*n, b)).collect();
    if by_name.len() != targets.len() {
        return Err(Error::invalid("a target name is given twice"));
    }
    let mut ordered = Vec::with_capacity(manifest.entries.len());
    for e in &manifest.entries {
        let b = by_name.get(e.name.as_str()).ok_or_else(|| {
            Error::invalid(format!("{at}: entry {:?} has no target region", e.name))
        })?;
        if b.len() as u64 != e.bytes {
            return Err(Error::invalid(format!(
                "{at}: entry {:?} holds {} bytes but its target region has {}",
                e.name,
                e.bytes,
                b.len()
            )));
        }
        ordered.push((*b).clone());
    }
    // Every entry found a target of its own (names are unique), so a
    // target is left over only when there are more targets than entries.
    if targets.len() > manifest.entries.len() {
        let names: HashSet<&str> = manifest.entries.iter().map(|e| e.name.as_str()).collect();
        if let Some((extra, _)) = targets.iter().find(|(n, _)| !names.contains(n)) {
            return Err(Error::invalid(format!(
                "{at}: target {extra:?} is not in the checkpoint"
            )));
        }
    }
    let sources = Sources::open(at, manifest)?;
    let into = within_blocks(&ordered, blocks);
    restore_entries(engine, at, manifest, sources, &ordered, &into, progress)
}

/// Where each target's bytes are read into: the block of `blocks` that
/// holds it, at its offset there, else the target itself.
fn within_blocks<'b>(
    targets: &'b [DeviceBuffer],
    blocks: &'b [DeviceBuffer],
) -> Vec<(&'b DeviceBuffer, u64)> {
    let mut by_addr: Vec<&DeviceBuffer> = blocks.iter().collect();
    by_addr.sort_unstable_by_key(|b| (b.addr(), b.len()));
    let ranges: Vec<(u64, u64)> = by_addr.iter().map(|b| (b.addr(), b.len() as u64)).collect();
    targets
        .iter()
        .map(
            |t| match region_holding(&ranges, t.addr(), t.len() as u64) {
                Some(k) if by_addr[k].device() == t.device() => {
                    (by_addr[k], t.addr() - by_addr[k].addr())
                }
                _ => (t, 0),
            },
        )
        .collect()
}

/// Where one chunk's bytes are read from, and what they must hash to.
struct Expected<'m> {
    offset: u64,
    len: u64,
    xxh3: &'m str,
    chunk: usize,
}

/// Reads `m`'s entries into `targets` (in manifest order), each through
/// `into`: the buffer its bytes are read into and where it starts there.
fn restore_entries(
    engine: &Engine,
    at: &Location,
    m: &Manifest,
    sources: Sources,
    targets: &[DeviceBuffer],
    into: &[(&DeviceBuffer, u64)],
    progress: Option<Progress<'_>>,
) -> Result<TransferStats> {
    check_geometry(engine, m.chunk_bytes)?;
    let mut plan = TransferPlan::new();
    // Per opened file, the chunks read from it, by offset.
    let mut expected: Vec<Vec<Expected>> = (0..sources.files.len()).map(|_| Vec::new()).collect();
    // Per chunk, in manifest order, the device memory it lands in, for the
    // device to hash; None where the device cannot hash, or where a chunk
    // holds bytes that land nowhere (between entries).
    let mut landed: Option<Vec<Vec<DeviceBuffer>>> = checksums::device_can_hash(engine)
        .is_ok()
        .then(|| Vec::with_capacity(m.chunks.len()));
    // Per data file, the entries' pieces in it: (entry, piece, where the
    // piece starts in its entry), by offset.
    let mut by_file: Vec<Vec<(usize, Piece, u64)>> = vec![Vec::new(); m.files.len()];
    for (i, e) in m.entries.iter().enumerate() {
        for (p, at) in e.placement() {
            by_file[p.file].push((i, p, at));
        }
    }
    for pieces in &mut by_file {
        pieces.sort_by_key(|(_, p, _)| p.offset);
    }
    for (ci, c) in m.chunks.iter().enumerate() {
        let src = sources.index(c.file, c.stored_in.as_deref());
        expected[src].push(Expected {
            offset: c.offset,
            len: c.len,
            xxh3: &c.xxh3,
            chunk: ci,
        });
        // The pieces this chunk overlaps; each comes from `src`.
        let pieces = &by_file[c.file];
        let first = pieces.partition_point(|(_, p, _)| p.offset + p.bytes <= c.offset);
        let mut lands = Vec::new();
        for &(i, p, at) in pieces[first..]
            .iter()
            .take_while(|(_, p, _)| p.offset < c.offset + c.len)
        {
            let from = c.offset.max(p.offset);
            let to = (c.offset + c.len).min(p.offset + p.bytes);
            if from < to {
                let in_entry = at + from - p.offset;
                let (buffer, start) = into[i];
                plan.add(
                    &sources.files,
                    src,
                    from,
                    to - from,
                    buffer,
                    start + in_entry,
                )?;
                if landed.is_some() {
                    lands.push(targets[i].slice(in_entry as usize, (to - from) as usize)?);
                }
            }
        }
        if lands.iter().map(|b| b.len() as u64).sum::<u64>() != c.len {
            landed = None;
        }
        if let Some(landed) = &mut landed {
            landed.push(lands);
        }
    }
    let mut fell_back = None;
    if let Some(landed) = landed {
        let mut stats = engine.transfer(&sources.files, &plan, progress)?;
        match checksums::on_device(engine, &landed) {
            Ok((sums, seconds)) => {
                if let Some(ci) =
                    (0..m.chunks.len()).find(|&ci| checksum_hex(sums[ci]) != m.chunks[ci].xxh3)
                {
                    return Err(m.damaged_chunk(at, ci));
                }
                stats.notes.push(format!(
                    "every chunk checked on the device after the transfer, in {:.1} ms",
                    seconds * 1e3
                ));
                return Ok(stats);
            }
            // Read again, checking each chunk in staging.
            Err(e) => {
                fell_back = Some(format!(
                    "the device's hashing failed ({e}); read again, every chunk checked in staging"
                ))
            }
        }
    }
    let verified = AtomicUsize::new(0);
    let check = |file: usize, start: u64, bytes: &[u8]| -> Result<()> {
        let end = start + bytes.len() as u64;
        let list = &expected[file];
        let first = list.partition_point(|x| x.offset < start);
        for x in list[first..].iter().take_while(|x| x.offset + x.len <= end) {
            let rel = (x.offset - start) as usize;
            if chunk_checksum(&bytes[rel..rel + x.len as usize]) != x.xxh3 {
                return Err(m.damaged_chunk(at, x.chunk));
            }
            verified.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    };
    let mut stats = engine.transfer_checked(&sources.files, &plan, &check, progress)?;
    let n = verified.into_inner();
    if n != m.chunks.len() {
        return Err(Error::new(
            ErrorKind::Integrity,
            format!("{at}: only {n} of {} chunks were verified", m.chunks.len()),
        ));
    }
    stats.notes.extend(fell_back);
    Ok(stats)
}

/// The data files a restore reads: the checkpoint's own, and those of the
/// checkpoints its unchanged chunks are stored in.
pub(crate) struct Sources {
    pub files: Vec<SourceFile>,
    /// (data file number, holder) -> index into `files`.
    index: HashMap<(usize, Option<String>), usize>,
}

impl Sources {
    pub fn open(at: &Location, m: &Manifest) -> Result<Sources> {
        let mut s = Sources {
            files: Vec::new(),
            index: HashMap::new(),
        };
        for (f, holder) in m
            .chunks
            .iter()
            .map(|c| (c.file, c.stored_in.clone()))
            .chain((0..m.files.len()).map(|f| (f, None)))
        {
            if s.index.contains_key(&(f, holder.clone())) {
                continue;
            }
            let name = &m.files[f].name;
            let file = match holder {
                None => at.store.open_data(&at.name, name)?,
                Some(ref h) => at.store.open_data(h, name).map_err(|e| {
                    if e.kind() == ErrorKind::NotFound {
                        Error::new(
                            ErrorKind::NotFound,
                            format!(
                                "{at}: unchanged chunks are stored in checkpoint {h:?}, \
                                 which is missing ({e})"
                            ),
                        )
                    } else {
                        e
                    }
                })?,
            };
            // A parent's file may be longer or shorter than ours (regions
            // changed size); each chunk read from it is bounds-checked when
            // planned and checksummed when read.
            if holder.is_none() && file.len() != m.files[f].bytes {
                return Err(Error::new(
                    ErrorKind::Integrity,
                    format!(
                        "{}: {} bytes, but the manifest says {}",
                        file.path().display(),
                        file.len(),
                        m.files[f].bytes
                    ),
                ));
            }
            if holder.is_none() {
                check_header(&file, &m.files[f])?;
            }
            s.index.insert((f, holder), s.files.len());
            s.files.push(file);
        }
        Ok(s)
    }

    pub fn index(&self, file: usize, holder: Option<&str>) -> usize {
        self.index[&(file, holder.map(str::to_string))]
    }
}

/// Checks a data file's header bytes against the manifest's checksum.
pub(crate) fn check_header(file: &SourceFile, f: &crate::manifest::DataFile) -> Result<()> {
    let mut header = vec![0u8; f.header_bytes as usize];
    file.read_exact_at(&mut header, 0)?;
    if chunk_checksum(&header) != f.header_xxh3 {
        return Err(Error::new(
            ErrorKind::Integrity,
            format!(
                "{}: header bytes [0, {}) do not match their checksum: the file is damaged",
                file.path().display(),
                f.header_bytes
            ),
        ));
    }
    Ok(())
}

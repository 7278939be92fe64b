//! The save's write step: writes the data files while every chunk is
//! checksummed, on the device where it can hash (during the writes, or
//! before them when an incremental save needs the sums to pick what to
//! write), else on the host as each chunk passes through staging.

use crate::baseline::Baseline;
use crate::checksums::{self, ChecksumSite};
use crate::layout::{ChunkSlot, SaveLayout};
use crate::manifest::{checksum_hex, chunk_checksum, Chunk, DataFile};
use crate::store::NewCheckpoint;
use std::ops::Range;
use zerohop::{DeviceBuffer, Engine, Error, ErrorKind, Progress, Result, TransferStats};

/// Writes the data of `layout` (files of `new`) and checksums its chunks;
/// returns the transfer, every chunk, where they were checksummed, and
/// the seconds waited for the device's checksums after the data was
/// written.
pub(crate) fn write_hashed(
    engine: &Engine,
    layout: &SaveLayout,
    new: &dyn NewCheckpoint,
    base: &Baseline,
    progress: Option<Progress<'_>>,
) -> Result<(TransferStats, Vec<Chunk>, ChecksumSite, f64)> {
    let pieces = layout.chunk_pieces()?;
    match checksums::device_can_hash(engine) {
        // Nothing is compared with a parent, so nothing waits for the sums:
        // the device hashes while the data is copied and written.
        Ok(()) if base.name.is_none() => {
            write_while_hashing(engine, layout, new, &pieces, progress)
        }
        can => {
            let (sums, site) = match can {
                Ok(()) => match checksums::on_device(engine, &pieces) {
                    Ok((sums, seconds)) => {
                        let site = ChecksumSite::Device {
                            seconds,
                            overlapped: false,
                        };
                        (Some(sums), site)
                    }
                    Err(e) => {
                        let why = format!("the device's hashing failed ({e})");
                        (None, ChecksumSite::Host { why })
                    }
                },
                Err(why) => (None, ChecksumSite::Host { why }),
            };
            let stats = write_changed(engine, layout, sums.as_deref(), base, progress)?;
            Ok((stats, seen_chunks(&layout.slots)?, site, 0.0))
        }
    }
}

/// Writes every byte of `layout` while the device hashes `pieces`; where
/// the hashing fails, the written files are hashed instead.
fn write_while_hashing(
    engine: &Engine,
    layout: &SaveLayout,
    new: &dyn NewCheckpoint,
    pieces: &[Vec<DeviceBuffer>],
    progress: Option<Progress<'_>>,
) -> Result<(TransferStats, Vec<Chunk>, ChecksumSite, f64)> {
    let (stats, hashed, waited) = std::thread::scope(|s| {
        let hashing = s.spawn(|| checksums::on_device(engine, pieces));
        let stats = engine.write(&layout.files, &layout.plan, None, progress);
        let t = std::time::Instant::now();
        let hashed = hashing.join().unwrap_or_else(|_| {
            Err(Error::new(
                ErrorKind::Device,
                "the checksum thread panicked",
            ))
        });
        (stats, hashed, t.elapsed().as_secs_f64())
    });
    let stats = stats?;
    let (sums, site) = match hashed {
        Ok((sums, seconds)) => {
            let sums = sums.into_iter().map(checksum_hex).collect();
            let site = ChecksumSite::Device {
                seconds,
                overlapped: true,
            };
            (sums, site)
        }
        // The data is written: hash it from the files instead.
        Err(e) => {
            let why = format!("the device's hashing failed ({e}); the files were hashed");
            let sums = checksums::from_files(new, &layout.data_files, &layout.slots)?;
            (sums, ChecksumSite::Host { why })
        }
    };
    let chunks = layout
        .slots
        .iter()
        .zip(sums)
        .map(|(c, sum)| c.chunk(sum, None))
        .collect();
    Ok((stats, chunks, site, waited))
}

/// Writes the chunks the parent does not already hold, taking each
/// chunk's checksum from `sums` (the device's) or else from its bytes in
/// staging; every chunk's sum is then in its slot.
fn write_changed(
    engine: &Engine,
    layout: &SaveLayout,
    sums: Option<&[u64]>,
    base: &Baseline,
    progress: Option<Progress<'_>>,
) -> Result<TransferStats> {
    let filter = |file: usize, start: u64, bytes: &[u8]| -> Result<Vec<Range<u64>>> {
        keep_changed(
            &layout.slots,
            sums,
            &layout.data_files,
            base,
            file,
            start,
            bytes,
        )
    };
    engine.write(&layout.files, &layout.plan, Some(&filter), progress)
}
/// The chunks as [`keep_changed`] saw them; every one must have been seen.
fn seen_chunks(slots: &[ChunkSlot]) -> Result<Vec<Chunk>> {
    slots
        .iter()
        .map(|c| {
            let seen = c.seen.lock().unwrap_or_else(|p| p.into_inner()).take();
            let (xxh3, stored_in) = seen.ok_or_else(|| {
                Error::new(
                    ErrorKind::Io,
                    format!(
                        "chunk at offset {} of data file #{} was never written",
                        c.offset, c.file
                    ),
                )
            })?;
            Ok(c.chunk(xxh3, stored_in))
        })
        .collect()
}

/// The write filter: takes each chunk's checksum in the window (from `sums`,
/// computed by the device, or else hashing the bytes) and keeps the chunks
/// the parent does not already hold.
fn keep_changed(
    slots: &[ChunkSlot],
    sums: Option<&[u64]>,
    files: &[DataFile],
    base: &Baseline,
    file: usize,
    start: u64,
    bytes: &[u8],
) -> Result<Vec<Range<u64>>> {
    let end = start + bytes.len() as u64;
    let first = slots.partition_point(|c| (c.file, c.offset) < (file, start));
    let mut keep: Vec<Range<u64>> = Vec::new();
    for (k, c) in slots[first..]
        .iter()
        .enumerate()
        .take_while(|(_, c)| c.file == file && c.offset < end)
    {
        if c.offset + c.len > end {
            return Err(Error::new(
                ErrorKind::InvalidInput,
                format!("chunk at offset {} straddles a staging window", c.offset),
            ));
        }
        let rel = c.offset - start;
        let sum = match sums {
            Some(sums) => checksum_hex(sums[first + k]),
            None => chunk_checksum(&bytes[rel as usize..(rel + c.len) as usize]),
        };
        let key = (files[file].name.clone(), c.offset, c.len);
        let stored_in = match base.chunks.get(&key) {
            Some((old, holder)) if *old == sum => Some(holder.clone()),
            _ => None,
        };
        if stored_in.is_none() {
            match keep.last_mut() {
                Some(r) if r.end == rel => r.end = rel + c.len,
                _ => keep.push(rel..rel + c.len),
            }
        }
        *c.seen.lock().unwrap_or_else(|p| p.into_inner()) = Some((sum, stored_in));
    }
    Ok(keep)
}

//! Saving: regions of device memory into a new checkpoint, sharded across
//! data files written in parallel, committed atomically.
//! Every chunk is checksummed by the device where it can (a GPU kernel, run
//! while the data is written: the host never reads the bytes to hash
//! them), else on the host as it passes through staging.

use crate::baseline::Baseline;
use crate::checksums::ChecksumSite;
use crate::layout::SaveLayout;
use crate::location::Location;
use crate::manifest::{Manifest, CHECKSUM, FORMAT, VERSION};
use crate::request::{Region, SaveOptions};
use crate::store::NewCheckpoint;
use crate::write_step::write_hashed;
use std::time::Instant;
use zerohop::{Engine, Error, ErrorKind, Progress, Result, TransferStats};

/// What a save did.
#[derive(Debug, Clone)]
pub struct Saved {
    pub manifest: Manifest,
    /// The data transfer (bytes copied off the device, written, skipped).
    pub stats: TransferStats,
    /// From the call until the checkpoint was durable and in place.
    pub seconds: f64,
    /// Data bytes actually written (less than the total when incremental).
    pub written_bytes: u64,
    /// Where the chunks were checksummed.
    pub checksums: ChecksumSite,
    /// Where the time around the data transfer went.
    pub phases: SavePhases,
}

/// Where a save's time went besides the data transfer (`Saved::stats`),
/// all included in `Saved::seconds`.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct SavePhases {
    /// Before the data moves: the new directory, the data files created
    /// and sized, their headers written.
    pub layout_seconds: f64,
    /// After the data was written, waiting for the device's checksums.
    pub checksum_wait_seconds: f64,
    /// The manifest built, checked, written and committed (synced, renamed
    /// into place).
    pub commit_seconds: f64,
}

/// Saves `regions` as the new checkpoint `at`, which must not exist. The
/// store shows nothing under its name until the manifest, written last,
/// commits it: a crash or an error leaves either no checkpoint or a
/// complete one (see [`crate::CheckpointStore::begin`]).
pub fn save(
    engine: &Engine,
    regions: &[Region],
    at: &Location,
    opts: &SaveOptions,
    progress: Option<Progress<'_>>,
) -> Result<Saved> {
    let started = Instant::now();
    check_geometry(engine, opts.chunk_bytes)?;
    let mut names = std::collections::HashSet::new();
    if let Some(r) = regions.iter().find(|r| !names.insert(r.name.as_str())) {
        return Err(Error::invalid(format!(
            "region name {:?} is used twice",
            r.name
        )));
    }
    let base = Baseline::of(at, opts.parent.as_ref())?;
    let new = at.store.begin(&at.name)?;
    let begun = started.elapsed().as_secs_f64();
    let (manifest, encoded, stats, checksums, mut phases) =
        write_checkpoint(engine, regions, &*new, opts, &base, progress)?;
    let committing = Instant::now();
    check_holders(at, &manifest)?;
    new.commit(&encoded)?;
    phases.layout_seconds += begun;
    phases.commit_seconds += committing.elapsed().as_secs_f64();
    Ok(Saved {
        written_bytes: stats.direct_bytes
            + stats.buffered_bytes
            + stats.mapped_bytes
            + stats.remote_bytes,
        manifest,
        stats,
        seconds: started.elapsed().as_secs_f64(),
        checksums,
        phases,
    })
}

/// The checkpoints holding our unchanged chunks must still be there just
/// before we commit (`remove` cannot see a child that has not committed).
fn check_holders(at: &Location, m: &Manifest) -> Result<()> {
    let holders: std::collections::BTreeSet<&str> = m
        .chunks
        .iter()
        .filter_map(|c| c.stored_in.as_deref())
        .collect();
    for holder in holders {
        let held = at.sibling(holder)?;
        if let Err(e) = held.manifest() {
            return Err(Error::new(
                ErrorKind::NotFound,
                format!("parent checkpoint {held} was removed during the save ({e})"),
            ));
        }
    }
    Ok(())
}

pub(crate) fn check_geometry(engine: &Engine, chunk_bytes: u64) -> Result<()> {
    let slot = engine.config().staging.slot_bytes as u64;
    if !chunk_bytes.is_power_of_two() || !(4096..=1 << 30).contains(&chunk_bytes) {
        return Err(Error::invalid(format!(
            "checkpoint chunks of {chunk_bytes} bytes: a power of two from 4 KiB to 1 GiB is needed"
        )));
    }
    if !slot.is_multiple_of(chunk_bytes) {
        return Err(Error::invalid(format!(
            "checkpoint chunks of {chunk_bytes} bytes need staging slots that are a multiple of them (slots are {slot} bytes)"
        )));
    }
    Ok(())
}

/// Writes the checkpoint's data in two steps: the layout of the data
/// files, then their data with every chunk checksummed; returns the
/// manifest to commit, and its encoding.
fn write_checkpoint(
    engine: &Engine,
    regions: &[Region],
    new: &dyn NewCheckpoint,
    opts: &SaveOptions,
    base: &Baseline,
    progress: Option<Progress<'_>>,
) -> Result<(Manifest, Vec<u8>, TransferStats, ChecksumSite, SavePhases)> {
    let t = Instant::now();
    let layout = SaveLayout::new(engine, regions, new, base, opts)?;
    let layout_seconds = t.elapsed().as_secs_f64();
    let (stats, chunks, site, checksum_wait_seconds) =
        write_hashed(engine, &layout, new, base, progress)?;
    let t = Instant::now();
    let split = layout.entries.iter().any(|e| !e.pieces.is_empty());
    let manifest = Manifest {
        format: FORMAT.into(),
        version: if split { VERSION } else { 1 },
        checksum: CHECKSUM.into(),
        chunk_bytes: opts.chunk_bytes,
        parent: base.name.clone(),
        metadata: opts.metadata.clone(),
        files: layout.data_files,
        entries: layout.entries,
        chunks,
    };
    // Never commit what a reader would refuse. The checks run on the
    // manifest itself: parsing its 0.7 MB encoding back, for 3,280 tensors,
    // took as long again as encoding it.
    manifest
        .validate()
        .map_err(|e| e.context("the new manifest is not valid"))?;
    let encoded = manifest.encode();
    let phases = SavePhases {
        layout_seconds,
        checksum_wait_seconds,
        commit_seconds: t.elapsed().as_secs_f64(),
    };
    Ok((manifest, encoded, stats, site, phases))
}

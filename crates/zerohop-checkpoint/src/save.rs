//! Saving: regions of device memory into a new checkpoint directory,
//! sharded across data files written in parallel, committed atomically.
//! Every chunk is checksummed by the device where it can (a GPU kernel, run
//! while the data is written: the host never reads the bytes to hash
//! them), else on the host as it passes through staging.

use crate::baseline::Baseline;
use crate::checksums::ChecksumSite;
use crate::hashing::write_hashed;
use crate::layout::SaveLayout;
use crate::manifest::{Manifest, CHECKSUM, FORMAT, MANIFEST_FILE, VERSION};
use crate::request::{Region, SaveOptions};
use std::path::Path;
use std::time::Instant;
use zerohop::storage::{atomic, sync_dir};
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
}

/// Saves `regions` as a new checkpoint at `dir` (which must not exist; its
/// parent directory is created if needed). The data goes to a temporary
/// sibling directory, which is made durable and then renamed to `dir`: a
/// crash leaves either no checkpoint at `dir` or a complete one. Leftovers
/// of crashed saves in the same parent directory are removed first.
pub fn save(
    engine: &Engine,
    regions: &[Region],
    dir: &Path,
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
    let parent_dir = atomic::parent_of(dir);
    atomic::create_dir_durable(parent_dir)?;
    if dir.exists() {
        return Err(Error::new(
            ErrorKind::AlreadyExists,
            format!("{} already exists: save to a new directory", dir.display()),
        ));
    }
    let base = Baseline::of(dir, opts.parent.as_deref())?;
    atomic::remove_stale_temps_in(parent_dir);
    let tmp = atomic::temp_sibling(dir)?;
    std::fs::create_dir(&tmp).map_err(|e| Error::io(&tmp, "cannot create", e))?;
    let saved = write_checkpoint(engine, regions, &tmp, opts, &base, progress).and_then(
        |(manifest, stats, checksums)| {
            check_holders(dir, &manifest)?;
            atomic::commit_new(&tmp, dir)?;
            Ok((manifest, stats, checksums))
        },
    );
    match saved {
        Ok((manifest, stats, checksums)) => Ok(Saved {
            written_bytes: stats.direct_bytes + stats.buffered_bytes,
            manifest,
            stats,
            seconds: started.elapsed().as_secs_f64(),
            checksums,
        }),
        Err(e) => {
            let _ = std::fs::remove_dir_all(&tmp);
            Err(e)
        }
    }
}

/// The checkpoints holding our unchanged chunks must still be there just
/// before we commit (`remove` cannot see a child that has not committed).
fn check_holders(dir: &Path, m: &Manifest) -> Result<()> {
    let holders: std::collections::BTreeSet<&str> = m
        .chunks
        .iter()
        .filter_map(|c| c.stored_in.as_deref())
        .collect();
    for holder in holders {
        let held = atomic::parent_of(dir).join(holder);
        if !held.join(MANIFEST_FILE).is_file() {
            return Err(Error::new(
                ErrorKind::NotFound,
                format!(
                    "parent checkpoint {} was removed during the save",
                    held.display()
                ),
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

/// Writes the checkpoint into `tmp` in three steps: the layout of the
/// data files, their data with every chunk checksummed, and the manifest.
fn write_checkpoint(
    engine: &Engine,
    regions: &[Region],
    tmp: &Path,
    opts: &SaveOptions,
    base: &Baseline,
    progress: Option<Progress<'_>>,
) -> Result<(Manifest, TransferStats, ChecksumSite)> {
    let layout = SaveLayout::new(engine, regions, tmp, opts)?;
    let (stats, chunks, site) = write_hashed(engine, &layout, tmp, base, progress)?;
    let manifest = Manifest {
        format: FORMAT.into(),
        version: VERSION,
        checksum: CHECKSUM.into(),
        chunk_bytes: opts.chunk_bytes,
        parent: base.name.clone(),
        metadata: opts.metadata.clone(),
        files: layout.data_files,
        entries: layout.entries,
        chunks,
    };
    write_manifest(tmp, &manifest)?;
    Ok((manifest, stats, site))
}

fn write_manifest(dir: &Path, m: &Manifest) -> Result<()> {
    use std::io::Write;
    // Never commit what a reader would refuse.
    Manifest::decode(&m.encode()).map_err(|e| e.context("the new manifest is not valid"))?;
    let path = dir.join(MANIFEST_FILE);
    let mut f =
        std::fs::File::create_new(&path).map_err(|e| Error::io(&path, "cannot create", e))?;
    f.write_all(&m.encode())
        .and_then(|()| f.sync_all())
        .map_err(|e| Error::io(&path, "cannot write", e))?;
    sync_dir(dir)
}

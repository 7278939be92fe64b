//! Saving: regions of device memory into a new checkpoint directory,
//! sharded across data files written in parallel, committed atomically.
//! Every chunk is checksummed by the device where it can (a GPU kernel, run
//! while the data is written: the host never reads the bytes to hash
//! them), else on the host as it passes through staging.

use crate::checksums::{self, ChecksumSite};
use crate::manifest::{
    checksum_hex, chunk_checksum, Chunk, DataFile, Entry, Manifest, CHECKSUM, FORMAT,
    MANIFEST_FILE, VERSION,
};
use std::collections::{BTreeMap, HashMap};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Instant;
use zerohop::plan::TransferPlan;
use zerohop::safetensors::{layout, Dtype, TensorToSave};
use zerohop::storage::{atomic, sync_dir, SinkFile};
use zerohop::{DeviceBuffer, Engine, Error, ErrorKind, Progress, Result, TransferStats};

/// Default chunk size: one checksum per 4 MiB.
pub const DEFAULT_CHUNK_BYTES: u64 = 4 << 20;

/// A region of device memory to save: a typed tensor or raw bytes.
#[derive(Debug, Clone)]
pub struct Region {
    pub name: String,
    /// `Some((dtype, shape))` for a tensor; `None` for raw bytes.
    pub tensor: Option<(Dtype, Vec<u64>)>,
    pub data: DeviceBuffer,
}

impl Region {
    pub fn tensor(
        name: impl Into<String>,
        dtype: Dtype,
        shape: Vec<u64>,
        data: DeviceBuffer,
    ) -> Self {
        Region {
            name: name.into(),
            tensor: Some((dtype, shape)),
            data,
        }
    }

    pub fn raw(name: impl Into<String>, data: DeviceBuffer) -> Self {
        Region {
            name: name.into(),
            tensor: None,
            data,
        }
    }
}

/// How to save.
#[derive(Debug, Clone)]
pub struct SaveOptions {
    /// Save incrementally against this checkpoint (a sibling directory):
    /// chunks whose checksum is unchanged are referenced, not rewritten.
    pub parent: Option<PathBuf>,
    /// Data files to spread the regions over (several writers at once);
    /// default: the engine's I/O thread count, at most one per region.
    pub shards: Option<usize>,
    /// Checksum granularity; must divide the engine's staging slot size.
    pub chunk_bytes: u64,
    /// Stored in the manifest and in each data file's header.
    pub metadata: BTreeMap<String, String>,
}

impl Default for SaveOptions {
    fn default() -> Self {
        SaveOptions {
            parent: None,
            shards: None,
            chunk_bytes: DEFAULT_CHUNK_BYTES,
            metadata: BTreeMap::new(),
        }
    }
}

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

/// The parent's chunks an incremental save may reference.
struct Baseline {
    /// Directory name to record as `parent`.
    name: Option<String>,
    /// (file name, offset, len) -> (checksum, the checkpoint holding the bytes).
    chunks: HashMap<(String, u64, u64), (String, String)>,
}

impl Baseline {
    fn of(dir: &Path, parent: Option<&Path>) -> Result<Baseline> {
        let Some(parent) = parent else {
            return Ok(Baseline {
                name: None,
                chunks: HashMap::new(),
            });
        };
        let same_dir = |p: &Path| atomic::parent_of(p).canonicalize().ok();
        if same_dir(parent).is_none() || same_dir(parent) != same_dir(dir) {
            return Err(Error::invalid(format!(
                "the parent checkpoint {} must be a sibling of {}",
                parent.display(),
                dir.display()
            )));
        }
        let name = parent
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| Error::invalid(format!("{} has no usable name", parent.display())))?
            .to_string();
        let m = Manifest::read(parent)?;
        let chunks = m
            .chunks
            .iter()
            .map(|c| {
                let holder = c.stored_in.clone().unwrap_or_else(|| name.clone());
                (
                    (m.files[c.file].name.clone(), c.offset, c.len),
                    (c.xxh3.clone(), holder),
                )
            })
            .collect();
        Ok(Baseline {
            name: Some(name),
            chunks,
        })
    }
}

/// Splits regions over `n` shards, largest first onto the lightest shard,
/// keeping the callers' order inside each shard (so equal inputs give equal
/// layouts, which incremental saves rely on).
fn shard(regions: &[Region], n: usize) -> Vec<Vec<usize>> {
    let mut order: Vec<usize> = (0..regions.len()).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(regions[i].data.len()));
    let mut load = vec![0u64; n];
    let mut shards = vec![Vec::new(); n];
    for i in order {
        let lightest = (0..n).min_by_key(|&s| (load[s], s)).expect("n >= 1");
        load[lightest] += regions[i].data.len() as u64;
        shards[lightest].push(i);
    }
    for s in &mut shards {
        s.sort_unstable();
    }
    shards
}

/// One chunk's place, and what the save learned of it.
pub(crate) struct ChunkSlot {
    pub file: usize,
    pub offset: u64,
    pub len: u64,
    seen: Mutex<Option<(String, Option<String>)>>,
}

impl ChunkSlot {
    fn chunk(&self, xxh3: String, stored_in: Option<String>) -> Chunk {
        Chunk {
            file: self.file,
            offset: self.offset,
            len: self.len,
            xxh3,
            stored_in,
        }
    }
}

fn write_checkpoint(
    engine: &Engine,
    regions: &[Region],
    tmp: &Path,
    opts: &SaveOptions,
    base: &Baseline,
    progress: Option<Progress<'_>>,
) -> Result<(Manifest, TransferStats, ChecksumSite)> {
    let n = opts
        .shards
        .unwrap_or(engine.config().io_threads)
        .clamp(1, regions.len().max(1));
    let mut metadata = opts.metadata.clone();
    metadata.insert("format".into(), "zerohop-checkpoint".into());
    let mut files = Vec::new();
    let mut plan = TransferPlan::new();
    let mut data_files = Vec::new();
    let mut entries = Vec::new();
    // Per data file: each tensor's file offset and bytes, in file order.
    let mut placed: Vec<Vec<(u64, DeviceBuffer)>> = Vec::new();
    for (s, members) in shard(regions, n).into_iter().enumerate() {
        let tensors: Vec<TensorToSave> = members
            .iter()
            .map(|&i| {
                let r = &regions[i];
                let (dtype, shape) = r
                    .tensor
                    .clone()
                    .unwrap_or((Dtype::U8, vec![r.data.len() as u64]));
                TensorToSave {
                    name: r.name.clone(),
                    dtype,
                    shape,
                    data: r.data.clone(),
                }
            })
            .collect();
        let layout = layout(&tensors, &metadata)?;
        let name = format!("data-{s:05}.safetensors");
        layout.start_file(engine, &tmp.join(&name), &tensors, &mut files, &mut plan)?;
        placed.push(
            tensors
                .iter()
                .zip(&layout.tensors)
                .map(|(t, info)| (layout.data_start + info.begin, t.data.clone()))
                .collect(),
        );
        for (&i, info) in members.iter().zip(&layout.tensors) {
            let r = &regions[i];
            entries.push(Entry {
                name: r.name.clone(),
                dtype: r.tensor.as_ref().map(|(d, _)| d.name().to_string()),
                shape: r.tensor.as_ref().map(|(_, s)| s.clone()),
                bytes: info.len(),
                file: s,
                offset: layout.data_start + info.begin,
            });
        }
        data_files.push(DataFile {
            name,
            bytes: layout.file_len,
            header_bytes: layout.data_start,
            header_xxh3: chunk_checksum(&layout.header),
        });
    }
    let slots = chunk_slots(&data_files, opts.chunk_bytes);
    let pieces = checksums::chunk_pieces(&slots, &placed)?;
    let (stats, chunks, site) = match checksums::device_can_hash(engine) {
        Ok(()) if base.name.is_none() => {
            // Nothing is compared with a parent, so nothing waits for the
            // sums: the device hashes while the data is copied and written.
            let (stats, hashed) = write_while_hashing(engine, &files, &plan, &pieces, progress)?;
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
                    let sums = checksums::from_files(tmp, &data_files, &slots)?;
                    (sums, ChecksumSite::Host { why })
                }
            };
            let chunks = slots
                .iter()
                .zip(sums)
                .map(|(c, sum)| c.chunk(sum, None))
                .collect();
            (stats, chunks, site)
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
            let filter = |file: usize, start: u64, bytes: &[u8]| -> Result<Vec<Range<u64>>> {
                keep_changed(
                    &slots,
                    sums.as_deref(),
                    &data_files,
                    base,
                    file,
                    start,
                    bytes,
                )
            };
            let stats = engine.write(&files, &plan, Some(&filter), progress)?;
            (stats, seen_chunks(slots)?, site)
        }
    };
    let manifest = Manifest {
        format: FORMAT.into(),
        version: VERSION,
        checksum: CHECKSUM.into(),
        chunk_bytes: opts.chunk_bytes,
        parent: base.name.clone(),
        metadata: opts.metadata.clone(),
        files: data_files,
        entries,
        chunks,
    };
    write_manifest(tmp, &manifest)?;
    Ok((manifest, stats, site))
}

/// Writes every byte of `plan` while the device hashes `pieces`; returns
/// the transfer and the hashing's outcome (the sums and its seconds).
fn write_while_hashing(
    engine: &Engine,
    files: &[SinkFile],
    plan: &TransferPlan,
    pieces: &[Vec<DeviceBuffer>],
    progress: Option<Progress<'_>>,
) -> Result<(TransferStats, checksums::DeviceSums)> {
    let (stats, hashed) = std::thread::scope(|s| {
        let hashing = s.spawn(|| checksums::on_device(engine, pieces));
        let stats = engine.write(files, plan, None, progress);
        let hashed = hashing.join().unwrap_or_else(|_| {
            Err(Error::new(
                ErrorKind::Device,
                "the checksum thread panicked",
            ))
        });
        (stats, hashed)
    });
    Ok((stats?, hashed))
}

/// The chunks as [`keep_changed`] saw them; every one must have been seen.
fn seen_chunks(slots: Vec<ChunkSlot>) -> Result<Vec<Chunk>> {
    slots
        .into_iter()
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

/// Every chunk of every data file, in file order.
fn chunk_slots(files: &[DataFile], chunk_bytes: u64) -> Vec<ChunkSlot> {
    let mut out = Vec::new();
    for (i, f) in files.iter().enumerate() {
        let mut at = f.header_bytes;
        while at < f.bytes {
            let end = ((at / chunk_bytes + 1) * chunk_bytes).min(f.bytes);
            out.push(ChunkSlot {
                file: i,
                offset: at,
                len: end - at,
                seen: Mutex::new(None),
            });
            at = end;
        }
    }
    out
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

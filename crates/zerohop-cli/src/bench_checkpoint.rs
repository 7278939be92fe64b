//! `zerohop bench checkpoint`: save device memory as a checkpoint and
//! restore it, beside the raw O_DIRECT write and read rates of the same
//! directory measured in the same run.

use crate::bench::AlignedBuf;
use crate::common::{gib, EngineArgs};
use clap::Args;
use serde::Serialize;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::Instant;
use zerohop::cache_drop::drop_from_page_cache;
use zerohop::storage::{BackendKind, IoMode, SourceFile};
use zerohop::{DeviceBuffer, Engine, Error, ErrorKind, Result};
use zerohop_checkpoint::{self as ckpt, Region, SaveOptions};

#[derive(Args, Debug)]
pub struct BenchCheckpointArgs {
    /// Device memory to checkpoint, e.g. 16GiB.
    #[arg(long, value_parser = crate::common::parse_size)]
    pub size: u64,
    /// Directory to save into (its file system is what is measured).
    #[arg(long)]
    pub dir: PathBuf,
    /// Size of each region (tensor) of the checkpoint.
    #[arg(long, value_parser = crate::common::parse_size, default_value = "256MiB")]
    pub region: u64,
    #[command(flatten)]
    pub engine: EngineArgs,
    /// Keep the checkpoint afterwards.
    #[arg(long)]
    pub keep: bool,
    #[arg(long)]
    pub json: bool,
}

#[derive(Serialize)]
struct Report {
    dir: String,
    bytes: u64,
    device: String,
    /// From one cache-resident buffer per writer.
    raw_write: Vec<Rate>,
    /// From data in RAM, as a save's data is.
    raw_write_from_ram: Vec<Rate>,
    raw_read: Vec<Rate>,
    save_gbps: f64,
    seconds_to_durable: f64,
    restore_gbps: f64,
    restore_cache: String,
    contents_match: bool,
    save_ratio_to_raw_write: f64,
    save_ratio_to_raw_write_from_ram: f64,
    restore_ratio_to_raw_read: f64,
    staging_bytes: u64,
    checksums: String,
    save: zerohop::TransferStats,
    restore: zerohop::TransferStats,
}

#[derive(Serialize)]
struct Rate {
    how: String,
    gbps: f64,
}

/// 64 MiB of random bytes; region `r` holds it rotated by a region-specific
/// amount, repeated, so misplaced or stale bytes show on comparison.
const BLOCK: usize = 64 << 20;

pub fn run(a: &BenchCheckpointArgs) -> Result<()> {
    if a.region == 0 || a.size == 0 {
        return Err(Error::invalid("--size and --region must be positive"));
    }
    let say = |s: String| {
        if !a.json {
            println!("{s}")
        }
    };
    std::fs::create_dir_all(&a.dir).map_err(|e| Error::io(&a.dir, "cannot create", e))?;
    let engine = a.engine.engine()?;
    let threads = engine.config().io_threads;
    say(format!("device   {}", engine.device().describe()));
    say(format!(
        "target   {} ({} to save)",
        a.dir.display(),
        gib(a.size)
    ));

    // The storage limits, measured first with the same bytes. Data to save
    // sits in RAM, never in the CPU's caches, so the raw write from RAM is
    // the limit for any writer of real data (on a memory file system, a
    // copy from RAM to RAM); the cached source shows the file system alone.
    let mut raw_write = Vec::new();
    let mut raw_write_from_ram = Vec::new();
    let mut raw_read = Vec::new();
    for source in [Source::Cached, Source::Ram] {
        for t in [threads, 2 * threads] {
            let files = raw_write_files(&a.dir, a.size, t, source)?;
            say(format!(
                "limit    raw write ({}, {t} files in parallel, fsync, {source}): {:.2} GB/s",
                files.how, files.gbps
            ));
            let rate = Rate {
                how: format!("{} x{t}", files.how),
                gbps: files.gbps,
            };
            match source {
                Source::Cached => raw_write.push(rate),
                Source::Ram => raw_write_from_ram.push(rate),
            }
            if matches!(source, Source::Cached) && t == threads {
                // Reads of the same files at 1x and 2x the readers.
                for r in [threads, 2 * threads] {
                    let (how, gbps) = raw_read_files(&files.paths, r)?;
                    say(format!(
                        "limit    raw read ({how}, {r} readers over {t} files): {gbps:.2} GB/s"
                    ));
                    raw_read.push(Rate {
                        how: format!("{how} x{r}"),
                        gbps,
                    });
                }
            }
            for p in &files.paths {
                let _ = std::fs::remove_file(p);
            }
        }
    }
    let best_write = raw_write.iter().map(|r| r.gbps).fold(0.0, f64::max);
    let best_write_from_ram = raw_write_from_ram
        .iter()
        .map(|r| r.gbps)
        .fold(0.0, f64::max);
    let best_read = raw_read.iter().map(|r| r.gbps).fold(0.0, f64::max);

    let fill = Instant::now();
    let block = random_block();
    let regions = fill_regions(&engine, a.size, a.region, &block)?;
    say(format!(
        "filled   {} regions of {} in {:.1} s (not timed)",
        regions.len(),
        gib(a.region.min(a.size)),
        fill.elapsed().as_secs_f64()
    ));

    let dir = a
        .dir
        .join(format!("zerohop-bench-checkpoint-{}", std::process::id()));
    let saved = ckpt::save(&engine, &regions, &dir, &SaveOptions::default(), None)?;
    let save_gbps = a.size as f64 / saved.seconds / 1e9;
    say(format!(
        "save     {save_gbps:.2} GB/s: durable after {:.2} s ({} data files, checksums and commit included) via {}",
        saved.seconds,
        saved.manifest.files.len(),
        saved.stats.path
    ));
    say(format!("profile  {}", saved.stats.profile.describe()));
    say(format!("checksum {}", saved.checksums));

    let mut cache = Vec::new();
    for f in &saved.manifest.files {
        let (how, left) = drop_from_page_cache(&dir.join(&f.name))
            .map_err(|e| Error::io(&dir, "cannot drop the cache of", e))?;
        cache.push((how, left));
    }
    let left = cache.iter().map(|c| c.1).fold(0.0, f64::max);
    let how = cache
        .first()
        .map_or("nothing".into(), |c| format!("{:?}", c.0));
    let restore_cache = format!(
        "page cache dropped with {how} before restore; up to {:.0}% stayed cached{}",
        left * 100.0,
        if left > 0.5 {
            " (memory file system)"
        } else {
            ""
        }
    );
    let restored = ckpt::restore(&engine, &dir, None)?;
    let restore_gbps = restored.stats.gbps;
    say(format!(
        "restore  {restore_gbps:.2} GB/s into fresh device memory, every chunk verified, via {} ({restore_cache})",
        restored.stats.path
    ));
    let contents_match = compare(&engine, &restored, &regions, &block)?;
    say(format!(
        "compare  restored contents {}",
        if contents_match {
            "match what was saved"
        } else {
            "DIFFER"
        }
    ));
    if !a.keep {
        ckpt::remove(&dir)?;
    }
    let report = Report {
        dir: a.dir.display().to_string(),
        bytes: a.size,
        device: engine.device().describe(),
        raw_write,
        raw_write_from_ram,
        raw_read,
        save_gbps,
        seconds_to_durable: saved.seconds,
        restore_gbps,
        restore_cache,
        contents_match,
        save_ratio_to_raw_write: save_gbps / best_write,
        save_ratio_to_raw_write_from_ram: save_gbps / best_write_from_ram,
        restore_ratio_to_raw_read: restore_gbps / best_read,
        staging_bytes: saved.stats.staging_bytes,
        checksums: saved.checksums.to_string(),
        save: saved.stats,
        restore: restored.stats,
    };
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).expect("report serializes")
        );
    } else {
        println!(
            "result   save {save_gbps:.2} GB/s = {:.1}% of the best raw write ({best_write:.2}), {:.1}% of the best raw write from RAM ({best_write_from_ram:.2}); restore {restore_gbps:.2} GB/s = {:.1}% of the raw read ({best_read:.2})",
            100.0 * report.save_ratio_to_raw_write,
            100.0 * report.save_ratio_to_raw_write_from_ram,
            100.0 * report.restore_ratio_to_raw_read
        );
        println!(
            "host     staging held: {} (bound: {})",
            gib(report.staging_bytes),
            gib(engine.config().staging.total_bytes as u64)
        );
    }
    if !contents_match {
        return Err(Error::new(
            ErrorKind::Integrity,
            "restored contents differ from what was saved",
        ));
    }
    Ok(())
}

fn random_block() -> Vec<u8> {
    let mut s = 0x2545_F491_4F6C_DD1Du64;
    let mut v = vec![0u8; BLOCK];
    for c in v.chunks_exact_mut(8) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        c.copy_from_slice(&s.to_le_bytes());
    }
    v
}

/// Region `r`'s 64 MiB period: the block rotated by a region-specific amount.
fn period(block: &[u8], r: usize) -> Vec<u8> {
    let rot = (r * 4099 * 4096) % block.len();
    [&block[rot..], &block[..rot]].concat()
}

fn fill_regions(engine: &Engine, size: u64, region: u64, block: &[u8]) -> Result<Vec<Region>> {
    let mut regions = Vec::new();
    let mut left = size;
    while left > 0 {
        let n = left.min(region) as usize;
        let r = regions.len();
        let buf = engine.device().alloc(n)?;
        let p = period(block, r);
        for at in (0..n).step_by(BLOCK) {
            let len = BLOCK.min(n - at);
            engine.device().write_from_host(&buf, at, &p[..len])?;
        }
        regions.push(Region::raw(format!("region.{r:05}"), buf));
        left -= n as u64;
    }
    Ok(regions)
}

fn compare(
    engine: &Engine,
    restored: &ckpt::Restored,
    regions: &[Region],
    block: &[u8],
) -> Result<bool> {
    let mut got = vec![0u8; BLOCK];
    for (e, buf) in restored.manifest.entries.iter().zip(&restored.buffers) {
        let r = regions
            .iter()
            .position(|g| g.name == e.name)
            .ok_or_else(|| Error::invalid(format!("restored an unknown entry {:?}", e.name)))?;
        let p = period(block, r);
        if !same(engine, buf, &p, &mut got)? {
            return Ok(false);
        }
    }
    Ok(true)
}

fn same(engine: &Engine, buf: &DeviceBuffer, period: &[u8], scratch: &mut [u8]) -> Result<bool> {
    for at in (0..buf.len()).step_by(BLOCK) {
        let len = BLOCK.min(buf.len() - at);
        engine.device().read_back(buf, at, &mut scratch[..len])?;
        if scratch[..len] != period[..len] {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Where a raw writer's bytes come from.
#[derive(Clone, Copy)]
enum Source {
    /// One 8 MiB buffer per writer, written again and again: it stays in
    /// the CPU's caches, so the file system alone sets the rate.
    Cached,
    /// 256 MiB per writer (gigabytes in all, far beyond any cache), written
    /// piece after piece, as data to save is read from RAM.
    Ram,
}

impl Source {
    fn bytes_per_writer(self) -> usize {
        match self {
            Source::Cached => RAW_PIECE,
            Source::Ram => 256 << 20,
        }
    }
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Source::Cached => "from a cache-resident 8 MiB buffer",
            Source::Ram => "from 256 MiB of RAM per writer",
        })
    }
}

/// Bytes per raw write call.
const RAW_PIECE: usize = 8 << 20;

struct RawFiles {
    paths: Vec<PathBuf>,
    how: &'static str,
    gbps: f64,
}

/// Writes `total` bytes split over `threads` files in `dir`, one writer
/// each, 8 MiB at a time from `source` with O_DIRECT (buffered where
/// refused), then fsyncs them and the directory: the storage side's write
/// limit.
fn raw_write_files(dir: &Path, total: u64, threads: usize, source: Source) -> Result<RawFiles> {
    let per = total
        .div_ceil(threads as u64)
        .next_multiple_of(RAW_PIECE as u64);
    let paths: Vec<PathBuf> = (0..threads)
        .map(|t| dir.join(format!(".zerohop-raw-{}-{t}", std::process::id())))
        .collect();
    let direct = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(libc::O_DIRECT)
        .open(&paths[0])
        .is_ok();
    let open = |p: &Path| {
        let mut o = OpenOptions::new();
        o.write(true).create(true).truncate(true);
        if direct {
            o.custom_flags(libc::O_DIRECT);
        }
        o.open(p).map_err(|e| Error::io(p, "cannot create", e))
    };
    // Writers fill their sources before the clock starts (first touches of
    // fresh memory are slow on some VMs).
    let ready = std::sync::Barrier::new(threads + 1);
    let mut started = Instant::now();
    std::thread::scope(|s| -> Result<()> {
        let ready = &ready;
        let handles: Vec<_> = paths
            .iter()
            .map(|p| {
                s.spawn(move || -> Result<()> {
                    let mut buf = AlignedBuf::new(source.bytes_per_writer());
                    buf.as_mut_slice().fill(0x5a);
                    let opened = open(p);
                    ready.wait();
                    let f: File = opened?;
                    let pieces = buf.as_mut_slice().chunks(RAW_PIECE).cycle();
                    for (at, piece) in (0..per).step_by(RAW_PIECE).zip(pieces) {
                        f.write_all_at(piece, at)
                            .map_err(|e| Error::io(p, "raw write failed in", e))?;
                    }
                    f.sync_all().map_err(|e| Error::io(p, "cannot fsync", e))
                })
            })
            .collect();
        ready.wait();
        started = Instant::now();
        handles.into_iter().try_for_each(|h| {
            h.join()
                .unwrap_or_else(|_| Err(Error::invalid("writer panicked")))
        })
    })?;
    zerohop::storage::sync_dir(dir)?;
    Ok(RawFiles {
        gbps: (per * threads as u64) as f64 / started.elapsed().as_secs_f64() / 1e9,
        paths,
        how: if direct { "O_DIRECT" } else { "buffered" },
    })
}

/// Reads the raw files back after dropping them from the page cache, with
/// `threads` readers (io_uring, O_DIRECT where allowed) taking 8 MiB pieces
/// of any file: the storage side's read limit, read the way restores read.
fn raw_read_files(paths: &[PathBuf], threads: usize) -> Result<(String, f64)> {
    for p in paths {
        drop_from_page_cache(p).map_err(|e| Error::io(p, "cannot drop the cache of", e))?;
    }
    let direct = paths
        .iter()
        .map(|p| SourceFile::open(p).map(|f| f.direct_capable()))
        .collect::<Result<Vec<_>>>()?;
    let mode = if direct.iter().all(|&d| d) {
        IoMode::Direct
    } else {
        IoMode::Buffered
    };
    let paths: Vec<&Path> = paths.iter().map(PathBuf::as_path).collect();
    let (name, gbps) = crate::bench::raw_read(&paths, BackendKind::Auto, mode, threads)?;
    Ok((format!("{name} {mode:?}"), gbps))
}

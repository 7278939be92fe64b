//! `zerohop bench checkpoint`: save device memory as a checkpoint and
//! restore it, beside the raw O_DIRECT write and read rates of the same
//! directory measured in the same run.

use clap::Args;
use serde::Serialize;
use std::path::PathBuf;
use std::time::Instant;
use zerohop::cache_drop::{drop_from_page_cache, CacheDrop};
use zerohop::{DeviceBuffer, Engine, Error, ErrorKind, Result};
use zerohop_checkpoint::{self as ckpt, Location, Region, SaveOptions, Saved};
use zerohop_cmd::engine_args::EngineArgs;
use zerohop_cmd::raw_io::{fill_random, raw_read_files, raw_write_files, Source};
use zerohop_cmd::size::human_bytes;

#[derive(Args, Debug)]
pub struct BenchCheckpointArgs {
    /// Device memory to checkpoint, e.g. 16GiB (GiB: 1024^3, GB: 10^9); not 0.
    #[arg(long, value_parser = zerohop_cmd::size::parse_length)]
    pub size: u64,
    /// Directory to save into (its file system is what is measured), or
    /// s3://bucket/[prefix] (the object store is).
    #[arg(long)]
    pub dir: PathBuf,
    /// Size of each region (tensor) of the checkpoint.
    #[arg(long, value_parser = zerohop_cmd::size::parse_length, default_value = "256MiB")]
    pub region: u64,
    #[command(flatten)]
    pub engine: EngineArgs,
    /// Keep the checkpoint afterwards.
    #[arg(long)]
    pub keep: bool,
    /// Rounds of a raw upload and a save, alternated, with an s3:// --dir
    /// (a server's upload rate drifts); the best and the medians are
    /// compared. A directory takes one.
    #[arg(long, default_value_t = 1, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=16))]
    pub rounds: usize,
    /// Print one JSON object instead of text.
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
pub(super) struct Rate {
    pub how: String,
    pub gbps: f64,
}

/// 64 MiB of random bytes; each 64 MiB piece of the regions holds it
/// rotated and stamped by the piece's number (see [`piece`]), so misplaced
/// or stale bytes show on comparison.
const BLOCK: usize = 64 << 20;

/// The bench for a directory (`checkpoint_s3` has an object store's).
pub fn run(a: &BenchCheckpointArgs) -> Result<()> {
    if a.rounds != 1 {
        return Err(Error::invalid(
            "--rounds is for s3:// targets: a directory's bench runs once",
        ));
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
        human_bytes(a.size)
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
        human_bytes(a.region.min(a.size)),
        fill.elapsed().as_secs_f64()
    ));

    let dir = a
        .dir
        .join(format!("zerohop-bench-checkpoint-{}", std::process::id()));
    let at = Location::dir(&dir)?;
    let saved = ckpt::save(&engine, &regions, &at, &SaveOptions::default(), None)?;
    let save_gbps = a.size as f64 / saved.seconds / 1e9;
    for line in save_lines(
        &saved,
        save_gbps,
        "durable",
        "data files, checksums and commit included",
    ) {
        say(line);
    }

    let mut cache = Vec::new();
    for f in &saved.manifest.files {
        let (how, left) = drop_from_page_cache(&dir.join(&f.name))
            .map_err(|e| Error::io(&dir, "cannot drop the cache of", e))?;
        cache.push((how, left));
    }
    let left = cache.iter().map(|c| c.1).fold(0.0, f64::max);
    let restore_cache = match cache.first().map(|c| c.0) {
        Some(CacheDrop::MemoryFileSystem) | None => {
            "page cache kept: a memory file system".to_string()
        }
        Some(how) => format!(
            "page cache dropped with {how:?} before restore; up to {:.0}% stayed cached",
            left * 100.0
        ),
    };
    let restored = ckpt::restore(&engine, &at, None)?;
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
        ckpt::remove(&at)?;
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
    let text = [
        format!(
            "result   save {save_gbps:.2} GB/s = {:.1}% of the best raw write ({best_write:.2}), {:.1}% of the best raw write from RAM ({best_write_from_ram:.2}); restore {restore_gbps:.2} GB/s = {:.1}% of the raw read ({best_read:.2})",
            100.0 * report.save_ratio_to_raw_write,
            100.0 * report.save_ratio_to_raw_write_from_ram,
            100.0 * report.restore_ratio_to_raw_read
        ),
        format!(
            "host     staging held: {} (bound: {})",
            human_bytes(report.staging_bytes),
            human_bytes(engine.config().staging.total_bytes as u64)
        ),
    ];
    conclude(a.json, &report, &text, contents_match)
}

/// A save's lines of the text report: its rate, when it was `done` (for
/// example durable) and what its `files` hold, then where its workers'
/// time went and where the checksums were computed.
pub(super) fn save_lines(saved: &Saved, gbps: f64, done: &str, files: &str) -> [String; 3] {
    [
        format!(
            "save     {gbps:.2} GB/s: {done} after {:.2} s ({} {files}; the transfer {:.2} s, of it {:.2} s making the files durable) via {}",
            saved.seconds,
            saved.manifest.files.len(),
            saved.stats.seconds,
            saved.stats.sync_seconds,
            saved.stats.path
        ),
        format!("profile  {}", saved.stats.profile.describe()),
        format!("checksum {}", saved.checksums),
    ]
}

/// Prints `report` as JSON, or else the `text` lines; an error if the
/// restored contents did not match what was saved.
pub(super) fn conclude(
    json: bool,
    report: &impl Serialize,
    text: &[String],
    contents_match: bool,
) -> Result<()> {
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(report).expect("report serializes")
        );
    } else {
        text.iter().for_each(|line| println!("{line}"));
    }
    if !contents_match {
        return Err(Error::new(
            ErrorKind::Integrity,
            "restored contents differ from what was saved",
        ));
    }
    Ok(())
}

pub(super) fn random_block() -> Vec<u8> {
    let mut v = vec![0u8; BLOCK];
    fill_random(&mut v);
    v
}

/// Piece `g` (the g-th 64 MiB of all regions): the block rotated by a
/// piece-specific amount, with `g` stamped into every 4 KiB page. No 4 KiB
/// page repeats anywhere, so an object store that keeps identical blocks
/// once (Garage does) stores every byte the bench saves.
fn piece(block: &[u8], g: u64) -> Vec<u8> {
    let rot = (g as usize * 4099 * 4096) % block.len();
    let mut p = [&block[rot..], &block[..rot]].concat();
    stamp(&mut p, g);
    p
}

/// Writes `tag` into the first bytes of every 4 KiB page of `bytes`.
pub(super) fn stamp(bytes: &mut [u8], tag: u64) {
    for page in bytes.chunks_mut(4096) {
        let n = page.len().min(8);
        page[..n].copy_from_slice(&tag.to_le_bytes()[..n]);
    }
}

pub(super) fn fill_regions(
    engine: &Engine,
    size: u64,
    region: u64,
    block: &[u8],
) -> Result<Vec<Region>> {
    let mut regions = Vec::new();
    let mut left = size;
    let mut g = 0;
    while left > 0 {
        let n = left.min(region) as usize;
        let buf = engine.device().alloc(n)?;
        for at in (0..n).step_by(BLOCK) {
            let len = BLOCK.min(n - at);
            engine
                .device()
                .write_from_host(&buf, at, &piece(block, g)[..len])?;
            g += 1;
        }
        regions.push(Region::raw(format!("region.{:05}", regions.len()), buf));
        left -= n as u64;
    }
    Ok(regions)
}

pub(super) fn compare(
    engine: &Engine,
    restored: &ckpt::Restored,
    regions: &[Region],
    block: &[u8],
) -> Result<bool> {
    // Each region's first piece number, as `fill_regions` counted them.
    let first: Vec<u64> = regions
        .iter()
        .scan(0, |g, r| {
            let at = *g;
            *g += r.data.len().div_ceil(BLOCK) as u64;
            Some(at)
        })
        .collect();
    let mut got = vec![0u8; BLOCK];
    for (e, buf) in restored.manifest.entries.iter().zip(&restored.buffers) {
        let r = regions
            .iter()
            .position(|g| g.name == e.name)
            .ok_or_else(|| Error::invalid(format!("restored an unknown entry {:?}", e.name)))?;
        if !same(engine, buf, block, first[r], &mut got)? {
            return Ok(false);
        }
    }
    Ok(true)
}

fn same(
    engine: &Engine,
    buf: &DeviceBuffer,
    block: &[u8],
    first: u64,
    scratch: &mut [u8],
) -> Result<bool> {
    for (g, at) in (first..).zip((0..buf.len()).step_by(BLOCK)) {
        let len = BLOCK.min(buf.len() - at);
        engine.device().read_back(buf, at, &mut scratch[..len])?;
        if scratch[..len] != piece(block, g)[..len] {
            return Ok(false);
        }
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use std::hash::{BuildHasher, RandomState};

    /// No 4 KiB page repeats within or across pieces, so a deduplicating
    /// store keeps every byte; a piece is the same each time it is made.
    #[test]
    fn pieces_share_no_page() {
        let block = random_block();
        let hasher = RandomState::new();
        let mut seen = HashSet::new();
        for g in [0, 1, 256, 257] {
            let p = piece(&block, g);
            assert!(p == piece(&block, g));
            for page in p.chunks(4096) {
                let h = hasher.hash_one(page);
                assert!(seen.insert(h), "a page of piece {g} repeats");
            }
        }
    }
}

//! `zerohop bench checkpoint --dir s3://bucket/prefix`: a checkpoint saved
//! to an object store and restored, beside the server's raw multipart
//! upload and ranged GET rates measured in the same run, and the process's
//! host memory while it saves and restores.

use super::checkpoint::{
    compare, conclude, fill_random, fill_regions, random_block, save_lines, stamp,
    BenchCheckpointArgs, Rate,
};
use super::raw_io::raw_read;
use crate::size::human_bytes;
use serde::Serialize;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use zerohop::device::StagingMemory;
use zerohop::storage::{BackendKind, IoMode};
use zerohop::{Device, Engine, Error, Result, TransferStats};
use zerohop_checkpoint::{self as ckpt, SaveOptions};
use zerohop_s3::{MultipartUpload, S3Client, S3Config, S3Url};

#[derive(Serialize)]
struct Report {
    at: String,
    bytes: u64,
    device: String,
    part_bytes: u64,
    /// Parallel multipart uploads of parts from RAM.
    raw_upload: Vec<Rate>,
    /// Parallel ranged GETs of the saved data objects.
    raw_get: Vec<Rate>,
    save_gbps: f64,
    seconds_to_durable: f64,
    restore_gbps: f64,
    contents_match: bool,
    save_ratio_to_raw_upload: f64,
    restore_ratio_to_raw_get: f64,
    staging_bytes: u64,
    /// Growth of the process's resident memory over its size before the
    /// save (the restore), at its highest while saving (restoring).
    save_rss_growth_bytes: u64,
    restore_rss_growth_bytes: u64,
    checksums: String,
    save: TransferStats,
    restore: TransferStats,
}

/// Bytes each raw upload measurement sends at most: deleted objects stay on
/// some servers for a while (Garage collects their blocks ten minutes
/// later), and four of them beside the checkpoint must fit a server on
/// tmpfs.
const RAW_UPLOAD_MAX_BYTES: u64 = 8 << 30;

pub fn run(a: &BenchCheckpointArgs, url: &str) -> Result<()> {
    let say = |s: String| {
        if !a.json {
            println!("{s}")
        }
    };
    let config = zerohop_s3::config_for_uploads(a.engine.config());
    let engine = Engine::new(a.engine.open_device()?, config)?;
    let threads = engine.config().io_threads;
    let part = engine.config().staging.slot_bytes;
    let root = S3Url::parse(url.trim_end_matches('/'))?;
    let client = Arc::new(S3Client::new(&S3Config::from_env()?, &root.bucket)?);
    let name = format!("zerohop-bench-checkpoint-{}", std::process::id());
    let prefix = if root.key.is_empty() {
        String::new()
    } else {
        format!("{}/", root.key)
    };
    say(format!("device   {}", engine.device().describe()));
    say(format!(
        "target   {url} ({} to save, parts of {})",
        human_bytes(a.size),
        human_bytes(part as u64)
    ));

    // The server's upload rate drifts: measured before the save and after
    // it, the best of all is the limit.
    let mut raw_upload = Vec::new();
    let raw_bytes = a.size.min(RAW_UPLOAD_MAX_BYTES);
    // From ordinary memory at the save's concurrency and twice it, and
    // from pinned staging memory (what the save sends from) at the save's.
    let sources = [
        (threads, PartMemory::Heap, false),
        (2 * threads, PartMemory::Heap, false),
        (
            threads,
            PartMemory::Staging(engine.device().as_ref()),
            false,
        ),
        (threads, PartMemory::Heap, true),
    ];
    let mut measure_uploads = |when: &str| -> Result<()> {
        for (t, memory, interleaved) in sources {
            let gbps = upload_rate(
                &client,
                &format!("{prefix}{name}-raw"),
                raw_bytes,
                part,
                t,
                memory,
                interleaved,
            )?;
            let how = format!(
                "{t} objects in parallel, {} in parts of {} from {}{}",
                human_bytes(raw_bytes),
                human_bytes(part as u64),
                memory.describe(),
                if interleaved {
                    ", parts interleaved"
                } else {
                    ""
                }
            );
            say(format!(
                "limit    raw multipart upload {when} ({how}): {gbps:.2} GB/s"
            ));
            raw_upload.push(Rate {
                how: format!("multipart upload: {how}, {when}"),
                gbps,
            });
        }
        Ok(())
    };
    measure_uploads("before the save")?;

    let block = random_block();
    let regions = fill_regions(&engine, a.size, a.region, &block)?;
    let at =
        zerohop_s3::checkpoint_at(&format!("s3://{}/{prefix}{name}", root.bucket), part as u64)?;
    let rss_before = resident_bytes();
    let (saved, save_peak) =
        while_sampling_rss(|| ckpt::save(&engine, &regions, &at, &SaveOptions::default(), None));
    let saved = saved?;
    let save_gbps = a.size as f64 / saved.seconds / 1e9;
    for line in save_lines(
        &saved,
        save_gbps,
        "committed",
        "data objects, checksums included",
    ) {
        say(line);
    }
    measure_uploads("after the save")?;
    let best_upload = raw_upload.iter().map(|r| r.gbps).fold(0.0, f64::max);

    let objects: Vec<String> = saved
        .manifest
        .files
        .iter()
        .map(|f| format!("s3://{}/{prefix}{name}/{}", root.bucket, f.name))
        .collect();
    let paths: Vec<&Path> = objects.iter().map(Path::new).collect();
    let mut raw_get = Vec::new();
    for t in [threads, 2 * threads] {
        let r = raw_read(&paths, BackendKind::Auto, IoMode::Buffered, t, part)?;
        say(format!(
            "limit    raw ranged GETs ({t} in flight, {} each, the saved objects): {:.2} GB/s",
            human_bytes(part as u64),
            r.gbps
        ));
        raw_get.push(Rate {
            how: format!("ranged GETs x{t}"),
            gbps: r.gbps,
        });
    }
    let best_get = raw_get.iter().map(|r| r.gbps).fold(0.0, f64::max);

    let rss_before_restore = resident_bytes();
    let (restored, restore_peak) = while_sampling_rss(|| ckpt::restore(&engine, &at, None));
    let restored = restored?;
    let restore_gbps = restored.stats.gbps;
    say(format!(
        "restore  {restore_gbps:.2} GB/s into fresh device memory, every chunk verified, via {}",
        restored.stats.path
    ));
    let contents_match = compare(&engine, &restored, &regions, &block)?;
    let restore_stats = restored.stats.clone();
    drop(restored);
    if !a.keep {
        ckpt::remove(&at)?;
    }
    let report = Report {
        at: at.to_string(),
        bytes: a.size,
        device: engine.device().describe(),
        part_bytes: part as u64,
        raw_upload,
        raw_get,
        save_gbps,
        seconds_to_durable: saved.seconds,
        restore_gbps,
        contents_match,
        save_ratio_to_raw_upload: save_gbps / best_upload,
        restore_ratio_to_raw_get: restore_gbps / best_get,
        staging_bytes: saved.stats.staging_bytes,
        save_rss_growth_bytes: save_peak.saturating_sub(rss_before),
        restore_rss_growth_bytes: restore_peak.saturating_sub(rss_before_restore),
        checksums: saved.checksums.to_string(),
        save: saved.stats,
        restore: restore_stats,
    };
    let on_host = engine.device().describe().starts_with("host");
    let text = [
        format!(
            "result   save {save_gbps:.2} GB/s = {:.1}% of the best raw multipart upload ({best_upload:.2}); restore {restore_gbps:.2} GB/s = {:.1}% of the best raw ranged GETs ({best_get:.2})",
            100.0 * report.save_ratio_to_raw_upload,
            100.0 * report.restore_ratio_to_raw_get,
        ),
        format!(
            "host     resident memory grew by at most {} while saving and {} while restoring; staging {}{}",
            human_bytes(report.save_rss_growth_bytes),
            human_bytes(report.restore_rss_growth_bytes),
            human_bytes(report.staging_bytes),
            if on_host {
                " (a restore into host memory allocates the data itself there)"
            } else {
                ""
            }
        ),
    ];
    conclude(a.json, &report, &text, contents_match)
}

/// Where a raw upload's parts are sent from.
#[derive(Clone, Copy)]
enum PartMemory<'a> {
    /// Ordinary process memory.
    Heap,
    /// The device's staging memory (pinned host memory for CUDA), as the
    /// engine's slots.
    Staging(&'a dyn Device),
}

impl PartMemory<'_> {
    fn describe(&self) -> &'static str {
        match self {
            PartMemory::Heap => "RAM",
            PartMemory::Staging(d) if d.pins_staging() => "pinned staging memory",
            PartMemory::Staging(_) => "staging memory",
        }
    }

    /// A buffer holding a copy of `bytes`.
    fn buffer(&self, bytes: &[u8]) -> Result<PartBuffer> {
        Ok(match self {
            PartMemory::Heap => PartBuffer::Heap(bytes.to_vec()),
            PartMemory::Staging(device) => {
                let mut b = PartBuffer::Staging(device.alloc_staging(bytes.len())?);
                b.bytes().copy_from_slice(bytes);
                b
            }
        })
    }
}

enum PartBuffer {
    Heap(Vec<u8>),
    Staging(Box<dyn StagingMemory>),
}

impl PartBuffer {
    fn bytes(&mut self) -> &mut [u8] {
        match self {
            PartBuffer::Heap(v) => v,
            // SAFETY: the staging memory owns `len()` bytes at
            // `as_mut_ptr()` for its lifetime, no device copy uses it here,
            // and `&mut self` keeps the slice the only reference to it.
            PartBuffer::Staging(m) => unsafe {
                std::slice::from_raw_parts_mut(m.as_mut_ptr(), m.len())
            },
        }
    }
}

/// The rate of `threads` multipart uploads in parallel, together `bytes`
/// long, each part sent from one buffer of `part` bytes in `memory`: each
/// thread sends its own object's parts in order, or (`interleaved`) every
/// thread takes the next part of all, round the objects, as the engine's
/// workers take windows. The uploads are started first and completed
/// last, as a save does; the objects (under `prefix`) are deleted
/// afterwards.
fn upload_rate(
    client: &Arc<S3Client>,
    prefix: &str,
    bytes: u64,
    part: usize,
    threads: usize,
    memory: PartMemory<'_>,
    interleaved: bool,
) -> Result<f64> {
    let parts = bytes.div_ceil(part as u64) as usize;
    let threads = threads.clamp(1, parts.max(1));
    // Random bytes, every part stamped with its own number (a server that
    // keeps identical blocks once would otherwise store almost nothing).
    let mut random = vec![0u8; part];
    fill_random(&mut random);
    let t = Instant::now();
    let keys: Vec<String> = (0..threads).map(|i| format!("{prefix}/{i:05}")).collect();
    let uploads = keys
        .iter()
        .map(|k| MultipartUpload::start(client.clone(), k))
        .collect::<Result<Vec<_>>>()?;
    // Part k (from 0) is part k / threads + 1 of object k % threads: every
    // object gets its share, all within one part.
    let next = AtomicUsize::new(0);
    let send = |i: usize| -> Result<()> {
        let mut buf = memory.buffer(&random)?;
        let mut own = (i..parts).step_by(threads);
        loop {
            let k = if interleaved {
                next.fetch_add(1, Ordering::Relaxed)
            } else {
                own.next().unwrap_or(parts)
            };
            if k >= parts {
                return Ok(());
            }
            let buf = buf.bytes();
            stamp(buf, k as u64);
            uploads[k % threads].upload_part((k / threads + 1) as u16, buf)?;
        }
    };
    in_threads((0..threads).map(|i| move || send(i)))?;
    in_threads(
        uploads
            .into_iter()
            .map(|u| move || u.complete(false).map(drop)),
    )?;
    let seconds = t.elapsed().as_secs_f64();
    for k in &keys {
        client.delete(k)?;
    }
    Ok((parts * part) as f64 / seconds / 1e9)
}

/// Runs each of `jobs` on a thread of its own; the first error, if any.
fn in_threads<F>(jobs: impl Iterator<Item = F>) -> Result<()>
where
    F: FnOnce() -> Result<()> + Send,
{
    std::thread::scope(|s| {
        let handles: Vec<_> = jobs.map(|f| s.spawn(f)).collect();
        handles.into_iter().try_for_each(|h| {
            h.join()
                .unwrap_or_else(|_| Err(Error::invalid("an uploader panicked")))
        })
    })
}

/// Runs `f` while another thread samples the process's resident memory;
/// returns `f`'s result and the highest sample.
fn while_sampling_rss<T>(f: impl FnOnce() -> T) -> (T, u64) {
    let done = AtomicBool::new(false);
    std::thread::scope(|s| {
        let sampler = s.spawn(|| {
            let mut peak = resident_bytes();
            while !done.load(Ordering::Relaxed) {
                peak = peak.max(resident_bytes());
                std::thread::sleep(Duration::from_millis(5));
            }
            peak.max(resident_bytes())
        });
        let out = f();
        done.store(true, Ordering::Relaxed);
        (out, sampler.join().unwrap_or(0))
    })
}

/// The process's resident memory (VmRSS), 0 where it cannot be read.
fn resident_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

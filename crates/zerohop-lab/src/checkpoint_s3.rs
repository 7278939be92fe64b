//! `zerohop bench checkpoint --dir s3://bucket/prefix`: a checkpoint saved
//! to an object store and restored, beside the server's raw multipart
//! upload and ranged GET rates measured in the same run, and the process's
//! host memory while it saves and restores.

use crate::checkpoint::{
    compare, conclude, fill_regions, random_block, save_lines, stamp, BenchCheckpointArgs, Rate,
};
use serde::Serialize;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use zerohop::storage::{BackendKind, IoMode};
use zerohop::{Engine, Error, Result, TransferStats};
use zerohop_checkpoint::{self as ckpt, SaveOptions};
use zerohop_cmd::raw_io::{fill_random, raw_read};
use zerohop_cmd::size::human_bytes;
use zerohop_s3::{MultipartUpload, S3Client, S3Config, S3Url};

#[derive(Serialize)]
struct Report {
    at: String,
    bytes: u64,
    device: String,
    part_bytes: u64,
    rounds: usize,
    /// Parallel multipart uploads of parts from RAM, each round's before
    /// its save.
    raw_upload: Vec<Rate>,
    /// Parallel ranged GETs of the last save's data objects.
    raw_get: Vec<Rate>,
    /// Each round's save.
    save_gbps: Vec<f64>,
    seconds_to_durable: f64,
    restore_gbps: f64,
    contents_match: bool,
    /// The best save over the best raw upload (any concurrency).
    save_ratio_to_raw_upload: f64,
    /// The median save over the median raw upload at the save's
    /// concurrency.
    save_median_ratio_to_raw_upload: f64,
    restore_ratio_to_raw_get: f64,
    staging_bytes: u64,
    /// Growth of the process's resident memory over its size before a
    /// save (the restore), at its highest while saving (restoring).
    save_rss_growth_bytes: u64,
    restore_rss_growth_bytes: u64,
    checksums: String,
    /// The last save's.
    save: TransferStats,
    restore: TransferStats,
}

/// Bytes each raw upload measurement sends at most: deleted objects stay on
/// some servers for a while (Garage collects their blocks ten minutes
/// later), and the uploads beside the checkpoints must fit a server on
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
        "target   {url} ({} to save, parts of {}, {} rounds)",
        human_bytes(a.size),
        human_bytes(part as u64),
        a.rounds
    ));
    let block = random_block();
    let regions = fill_regions(&engine, a.size, a.region, &block)?;

    // The server's upload rate drifts by a tenth or more between runs of
    // one configuration: raw uploads and saves alternate, as many of each,
    // and are compared best to best and median to median.
    let raw_bytes = a.size.min(RAW_UPLOAD_MAX_BYTES);
    let mut raw_upload = Vec::new();
    let mut same_concurrency = Vec::new();
    let mut save_gbps = Vec::new();
    let mut rss_growth = 0;
    let mut last = None;
    for round in 1..=a.rounds {
        for t in [threads, 2 * threads] {
            let gbps = upload_rate(&client, &format!("{prefix}{name}-raw"), raw_bytes, part, t)?;
            say(format!(
                "limit    raw multipart upload, round {round} ({t} objects in parallel, {} in parts of {} from RAM, taken round the objects): {gbps:.2} GB/s",
                human_bytes(raw_bytes),
                human_bytes(part as u64)
            ));
            raw_upload.push(Rate {
                how: format!("multipart upload x{t}, round {round}"),
                gbps,
            });
            if t == threads {
                same_concurrency.push(gbps);
            }
        }
        let at = zerohop_names::checkpoint_at(
            &format!("s3://{}/{prefix}{name}-{round}", root.bucket),
            part as u64,
        )?;
        let rss_before = resident_bytes();
        let (saved, peak) = while_sampling_rss(|| {
            ckpt::save(&engine, &regions, &at, &SaveOptions::default(), None)
        });
        let saved = saved?;
        rss_growth = rss_growth.max(peak.saturating_sub(rss_before));
        let gbps = a.size as f64 / saved.seconds / 1e9;
        save_gbps.push(gbps);
        for line in save_lines(
            &saved,
            gbps,
            &format!("committed in round {round}"),
            "data objects, checksums included",
        ) {
            say(line);
        }
        if let Some((older, _)) = last.replace((at, saved)) {
            ckpt::remove(&older)?;
        }
    }
    let (at, saved) = last.ok_or_else(|| Error::invalid("--rounds must be at least 1"))?;
    let best_upload = raw_upload.iter().map(|r| r.gbps).fold(0.0, f64::max);
    let best_save = save_gbps.iter().copied().fold(0.0, f64::max);

    let objects: Vec<String> = saved
        .manifest
        .files
        .iter()
        .map(|f| format!("{}/{}", at, f.name))
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
        rounds: a.rounds,
        save_median_ratio_to_raw_upload: median(&save_gbps) / median(&same_concurrency),
        raw_upload,
        raw_get,
        save_gbps,
        seconds_to_durable: saved.seconds,
        restore_gbps,
        contents_match,
        save_ratio_to_raw_upload: best_save / best_upload,
        restore_ratio_to_raw_get: restore_gbps / best_get,
        staging_bytes: saved.stats.staging_bytes,
        save_rss_growth_bytes: rss_growth,
        restore_rss_growth_bytes: restore_peak.saturating_sub(rss_before_restore),
        checksums: saved.checksums.to_string(),
        save: saved.stats,
        restore: restore_stats,
    };
    let on_host = engine.device().describe().starts_with("host");
    let text = [
        format!(
            "result   save {best_save:.2} GB/s (best of {}) = {:.1}% of the best raw multipart upload ({best_upload:.2}); medians at the save's concurrency: {:.1}%",
            a.rounds,
            100.0 * report.save_ratio_to_raw_upload,
            100.0 * report.save_median_ratio_to_raw_upload,
        ),
        format!(
            "result   restore {restore_gbps:.2} GB/s = {:.1}% of the best raw ranged GETs ({best_get:.2})",
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

/// The middle value (the mean of the two middle ones for an even count).
fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// The rate of `threads` multipart uploads in parallel, together `bytes`
/// long, each part sent from a buffer of `part` bytes in RAM; the threads
/// take the parts round the objects, as the engine's workers take a
/// save's windows. The uploads are started first and completed last, as
/// a save's are; the objects (under `prefix`) are deleted afterwards.
fn upload_rate(
    client: &Arc<S3Client>,
    prefix: &str,
    bytes: u64,
    part: usize,
    threads: usize,
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
    let send = || -> Result<()> {
        let mut buf = random.clone();
        loop {
            let k = next.fetch_add(1, Ordering::Relaxed);
            if k >= parts {
                return Ok(());
            }
            stamp(&mut buf, k as u64);
            uploads[k % threads].upload_part((k / threads + 1) as u16, &buf)?;
        }
    };
    in_threads((0..threads).map(|_| send))?;
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

#[cfg(test)]
mod tests {
    use super::median;

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
        assert_eq!(median(&[7.0]), 7.0);
        assert!(median(&[]).is_nan());
    }
}

//! `zerohop bench raw-read`: the storage side's read rate for one
//! configuration (block size, reads in flight, O_DIRECT or the page
//! cache), cold: files into host memory only, no device, no engine.

use clap::{Args, ValueEnum};
use serde::Serialize;
use std::path::PathBuf;
use zerohop::cache_drop::{drop_from_page_cache, CacheDrop};
use zerohop::storage::{BackendKind, IoMode};
use zerohop::{Error, Result};
use zerohop_cmd::raw_io::raw_read;
use zerohop_cmd::size::{human_bytes, ByteSize};

#[derive(Args, Debug)]
pub struct BenchRawReadArgs {
    /// Files to read, whole, in this order; or objects, s3://bucket/key
    /// (ranged GETs of BLOCK bytes; nothing to drop from a cache).
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
    /// Bytes per read, e.g. 1MiB (a multiple of 4KiB with --direct always).
    #[arg(long, default_value_t = ByteSize(8 << 20))]
    pub block: ByteSize,
    /// Reader threads, each with one blocking pread in flight, all taking
    /// the next block from one shared cursor over the files.
    #[arg(long, default_value_t = 16)]
    pub threads: usize,
    /// O_DIRECT into page-aligned buffers (always; an error where the file
    /// system refuses it) or reads through the page cache (never).
    #[arg(long, value_enum, default_value_t = RawDirect::Never)]
    pub direct: RawDirect,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RawDirect {
    Always,
    Never,
}

/// What `bench raw-read --json` prints.
#[derive(Serialize)]
struct Report {
    files: Vec<String>,
    bytes: u64,
    block: u64,
    threads: usize,
    direct: RawDirect,
    backend: &'static str,
    /// How the files were dropped from the page cache first (none for
    /// objects).
    cache_drop: Option<CacheDrop>,
    /// The largest fraction of a file still cached after the drop.
    cache_left: f64,
    seconds: f64,
    /// Decimal: bytes / seconds / 1e9.
    gbps: f64,
    /// User + system CPU time of the process during the reads.
    cpu_seconds: f64,
    cpu_seconds_per_gb: f64,
}

pub fn run(a: &BenchRawReadArgs) -> Result<()> {
    if a.threads == 0 {
        return Err(Error::invalid("--threads must be at least 1"));
    }
    if a.block.0 == 0 {
        return Err(Error::invalid("--block must be at least 1 byte"));
    }
    // A missing or unreadable file is named before anything else happens.
    let files = zerohop_names::open_sources(&a.files)?;
    let (mut cache_drop, mut cache_left) = (None, 0.0f64);
    for f in files.iter().filter(|f| f.local_fds().is_some()) {
        let f = f.path();
        let (how, left) =
            drop_from_page_cache(f).map_err(|e| Error::io(f, "cannot drop the cache of", e))?;
        cache_drop = Some(how);
        cache_left = cache_left.max(left);
    }
    if cache_left > 0.01 {
        eprintln!(
            "warning: {:.0}% of a file stayed in the page cache (tmpfs keeps it all)",
            cache_left * 100.0
        );
    }
    let mode = match a.direct {
        RawDirect::Always => IoMode::Direct,
        RawDirect::Never => IoMode::Buffered,
    };
    let paths: Vec<&std::path::Path> = a.files.iter().map(PathBuf::as_path).collect();
    let r = raw_read(&paths, BackendKind::Pread, mode, a.threads, a.block.bytes())?;
    let report = Report {
        files: a.files.iter().map(|p| p.display().to_string()).collect(),
        bytes: r.bytes,
        block: a.block.0,
        threads: a.threads,
        direct: a.direct,
        backend: r.backend,
        cache_drop,
        cache_left,
        seconds: r.seconds,
        gbps: r.gbps,
        cpu_seconds: r.cpu_seconds,
        cpu_seconds_per_gb: r.cpu_seconds / (r.bytes as f64 / 1e9).max(1e-9),
    };
    if a.json {
        println!(
            "{}",
            serde_json::to_string(&report).expect("the report serializes")
        );
        return Ok(());
    }
    println!(
        "raw read {} file(s), {} ({} bytes) into host memory",
        report.files.len(),
        human_bytes(report.bytes),
        report.bytes
    );
    println!(
        "config   block {}, {} threads ({}), {}; {}",
        a.block,
        a.threads,
        report.backend,
        match a.direct {
            RawDirect::Always => "O_DIRECT",
            RawDirect::Never => "buffered",
        },
        match cache_drop {
            Some(CacheDrop::DropCaches) => "cache dropped by drop_caches",
            Some(CacheDrop::Fadvise) => "cache dropped by fadvise(DONTNEED)",
            Some(CacheDrop::MemoryFileSystem) => "cache kept: a memory file system",
            None => "no page cache to drop (objects)",
        }
    );
    println!(
        "result   {:.2} GB/s, {:.3} s, CPU {:.2} s ({:.3} s/GB)",
        report.gbps, report.seconds, report.cpu_seconds, report.cpu_seconds_per_gb
    );
    Ok(())
}

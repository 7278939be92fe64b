//! `zerohop bench load`: zerohop's load rate beside the limits it is judged
//! against, all measured in the same run: pinned host->device copy bandwidth
//! and the raw read rate of the same file into host memory.

use clap::Args;
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;
use zerohop::cache_drop::{drop_from_page_cache, CacheDrop};
use zerohop::safetensors::{self, Allocation};
use zerohop::storage::{BackendKind, IoMode};
use zerohop::{Device, Engine, Error, Result, TransferStats};
use zerohop_cmd::engine_args::{EngineArgs, HotArg};
use zerohop_cmd::raw_io::{raw_read, warm, RAW_BLOCK};
use zerohop_cmd::size::human_bytes;

#[derive(Args, Debug)]
pub struct BenchLoadArgs {
    /// The file to load: a .safetensors model, or any file as raw bytes.
    pub file: PathBuf,
    /// Drop the file from the page cache before every timed read.
    #[arg(long)]
    pub cold: bool,
    /// Timed loads per route.
    #[arg(long, default_value_t = 3)]
    pub repeat: usize,
    /// Also time each hot route on its own (staged CPU copies vs page-cache DMA).
    #[arg(long)]
    pub compare_routes: bool,
    #[command(flatten)]
    pub engine: EngineArgs,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

#[derive(Serialize)]
struct Limit {
    name: String,
    gbps: f64,
}

#[derive(Serialize)]
struct Contended {
    read_gbps: f64,
    h2d_gbps: f64,
}

#[derive(Serialize)]
struct Run {
    route: String,
    gbps: f64,
    stats: TransferStats,
}

#[derive(Serialize)]
struct Report {
    file: String,
    bytes: u64,
    mode: &'static str,
    cache_drop: Option<CacheDrop>,
    device: String,
    h2d_pinned_gbps: f64,
    raw_reads: Vec<Limit>,
    /// Raw read and pinned H2D measured at the same time (hot runs only).
    contended: Option<Contended>,
    runs: Vec<Run>,
    best_gbps: f64,
    ratio_to_h2d: f64,
    ratio_to_best_raw_read: f64,
    staging_bytes: u64,
}

pub fn run(a: &BenchLoadArgs) -> Result<()> {
    let device = a.engine.open_device()?;
    let size = std::fs::metadata(&a.file)
        .map_err(|e| Error::io(&a.file, "cannot stat", e))?
        .len();
    let mode = if a.cold { "cold" } else { "hot" };
    let say = |s: String| {
        if !a.json {
            println!("{s}")
        }
    };
    say(format!(
        "file     {} ({}), {mode}",
        a.file.display(),
        human_bytes(size)
    ));
    say(format!("device   {}", device.describe()));

    // On host memory the "device copy" is a CPU memcpy between host buffers.
    let (copy_limit, copy_limit_short) = if device.pins_staging() {
        ("pinned host->device copy", "pinned H2D")
    } else {
        ("host memcpy between host buffers (no GPU)", "host memcpy")
    };
    let mut h2d_probe = H2dProbe::new(device.as_ref())?;
    let h2d = h2d_probe.run(H2dProbe::ROUNDS)?;
    say(format!("limit    {copy_limit}: {h2d:.2} GB/s"));

    let mut page_cache = PageCache {
        file: &a.file,
        cold: a.cold,
        dropped_with: None,
    };
    let threads = a.engine.config().io_threads;
    let raw_reads = raw_read_limits(&a.file, a.cold, threads, &mut page_cache, &say)?;
    let best_raw = raw_reads.iter().map(|l| l.gbps).fold(0.0, f64::max);
    // The staged hot route reads the page cache and feeds the GPU at once,
    // and both draw on host memory bandwidth: measure them side by side.
    let mut contended = None;
    if !a.cold && matches!(device.kind(), zerohop::DeviceKind::Cuda(_)) {
        page_cache.prepare()?;
        let (read, copy) = std::thread::scope(|s| {
            let copier = s.spawn(|| h2d_probe.run(2 * H2dProbe::ROUNDS));
            let read = raw_read(
                &[&a.file],
                BackendKind::Auto,
                IoMode::Buffered,
                threads,
                RAW_BLOCK,
            );
            (read, copier.join().expect("H2D copier does not panic"))
        });
        let (read, copy) = (read?.gbps, copy?);
        say(format!("limit    both at once: raw read {read:.2} GB/s with pinned H2D copies running throughout (they averaged {copy:.2} GB/s over their longer run)"));
        drop(h2d_probe);
        contended = Some(Contended {
            read_gbps: read,
            h2d_gbps: copy,
        });
    }

    let (runs, staging_bytes) = timed_loads(a, &device, &mut page_cache, &say)?;
    let best = runs.iter().map(|r| r.gbps).fold(0.0, f64::max);
    let report = Report {
        file: a.file.display().to_string(),
        bytes: size,
        mode,
        cache_drop: page_cache.dropped_with,
        device: device.describe(),
        h2d_pinned_gbps: h2d,
        raw_reads,
        contended,
        runs,
        best_gbps: best,
        ratio_to_h2d: best / h2d,
        ratio_to_best_raw_read: if best_raw > 0.0 { best / best_raw } else { 0.0 },
        staging_bytes,
    };
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).expect("report serializes")
        );
    } else {
        println!("result   best {best:.2} GB/s = {:.1}% of {copy_limit_short}, {:.1}% of the best raw read ({best_raw:.2} GB/s)", 100.0 * report.ratio_to_h2d, 100.0 * report.ratio_to_best_raw_read);
        println!(
            "host     staging held: {} (bound: {})",
            human_bytes(staging_bytes),
            human_bytes(a.engine.config().staging.total_bytes as u64)
        );
        if let Some(how) = report.cache_drop {
            println!("cold     page cache emptied with {how:?} before each timed read");
        }
    }
    Ok(())
}

/// What each timed read starts from: the file dropped from the page cache
/// (cold), or read into it (hot).
struct PageCache<'a> {
    file: &'a Path,
    cold: bool,
    /// How the file was dropped, the last time it was.
    dropped_with: Option<CacheDrop>,
}

impl PageCache<'_> {
    fn prepare(&mut self) -> Result<()> {
        if !self.cold {
            return warm(self.file);
        }
        let (how, left) = drop_from_page_cache(self.file)
            .map_err(|e| Error::io(self.file, "cannot drop cache of", e))?;
        self.dropped_with = Some(how);
        if left > 0.01 {
            eprintln!(
                "warning: {:.0}% of the file stayed in the page cache",
                left * 100.0
            );
        }
        Ok(())
    }
}

/// The storage side's best: each read mode at 1x, 2x and 4x the engine's
/// thread count, so the limit a load is compared against is not a weak one.
fn raw_read_limits(
    file: &Path,
    cold: bool,
    threads: usize,
    page_cache: &mut PageCache<'_>,
    say: &dyn Fn(String),
) -> Result<Vec<Limit>> {
    let modes: &[(BackendKind, IoMode)] = if cold {
        &[
            (BackendKind::IoUring, IoMode::Direct),
            (BackendKind::IoUring, IoMode::Buffered),
            (BackendKind::Pread, IoMode::Buffered),
        ]
    } else {
        &[(BackendKind::Auto, IoMode::Buffered)]
    };
    let mut limits = Vec::new();
    for &(backend, io) in modes {
        for t in [threads, 2 * threads, 4 * threads] {
            page_cache.prepare()?;
            match raw_read(&[file], backend, io, t, RAW_BLOCK) {
                Ok(r) => {
                    let (name, gbps) = (r.backend, r.gbps);
                    say(format!("limit    raw read into host memory ({name}, {io:?}, {t} threads): {gbps:.2} GB/s"));
                    limits.push(Limit {
                        name: format!("{name} {io:?} x{t}"),
                        gbps,
                    });
                }
                Err(e) => say(format!(
                    "limit    raw read ({backend:?}, {io:?}) not measured: {e}"
                )),
            }
        }
    }
    Ok(limits)
}

/// `--repeat` timed loads per hot route (the engine's, or each with
/// `--compare-routes`); returns them and the most staging any held.
fn timed_loads(
    a: &BenchLoadArgs,
    device: &Arc<dyn Device>,
    page_cache: &mut PageCache<'_>,
    say: &dyn Fn(String),
) -> Result<(Vec<Run>, u64)> {
    let mut routes = vec![(a.engine.hot_route, "auto")];
    if a.compare_routes && !a.cold {
        routes = vec![
            (HotArg::Auto, "auto"),
            (HotArg::Mapped, "mapped"),
            (HotArg::Staged, "staged"),
            (HotArg::Dma, "page-cache dma"),
        ];
    }
    let mut runs = Vec::new();
    let mut staging_bytes = 0;
    for (route, label) in routes {
        let mut args = a.engine.clone();
        args.hot_route = route;
        let engine = Engine::new(device.clone(), args.config())?;
        for i in 0..a.repeat.max(1) {
            page_cache.prepare()?;
            let stats = load_once(&engine, &a.file)?;
            staging_bytes = staging_bytes.max(stats.staging_bytes);
            say(format!(
                "run      {label:<15} #{i}: {:.2} GB/s ({:.3} s) via {}",
                stats.gbps, stats.seconds, stats.path
            ));
            say(format!("profile  {}", stats.profile.describe()));
            for n in &stats.notes {
                say(format!("note     {n}"));
            }
            runs.push(Run {
                route: label.to_string(),
                gbps: stats.gbps,
                stats,
            });
        }
    }
    Ok((runs, staging_bytes))
}

fn load_once(engine: &Engine, file: &Path) -> Result<TransferStats> {
    if file.extension().is_some_and(|e| e == "safetensors") {
        Ok(safetensors::load_safetensors(engine, &[file], Allocation::PerFile, None)?.stats)
    } else {
        Ok(engine.load_files(&[file], None)?.1)
    }
}

/// Pinned host->device copies: 4 queues each copying a 64 MiB pinned buffer
/// into its own region of a 1 GiB device buffer. Allocated (and warmed) once,
/// so a timed run starts copying at once.
struct H2dProbe {
    dst: zerohop::DeviceBuffer,
    srcs: Vec<Box<dyn zerohop::device::StagingMemory>>,
    queues: Vec<Box<dyn zerohop::device::CopyQueue>>,
}

impl H2dProbe {
    const CHUNK: usize = 64 << 20;
    const QUEUES: usize = 4;
    /// Rounds for the limit: 8 GiB in all.
    const ROUNDS: usize = 32;

    fn new(device: &dyn Device) -> Result<Self> {
        let mut probe = H2dProbe {
            dst: device.alloc(Self::QUEUES * 4 * Self::CHUNK)?,
            srcs: (0..Self::QUEUES)
                .map(|_| device.alloc_staging(Self::CHUNK))
                .collect::<Result<_>>()?,
            queues: (0..Self::QUEUES)
                .map(|_| device.new_queue())
                .collect::<Result<_>>()?,
        };
        probe.run(2)?;
        Ok(probe)
    }

    /// GB/s of `rounds` rounds of copies on every queue.
    fn run(&mut self, rounds: usize) -> Result<f64> {
        let t = Instant::now();
        for r in 0..rounds {
            for (q, (queue, src)) in self.queues.iter().zip(self.srcs.iter_mut()).enumerate() {
                let at = self.dst.addr() + ((q * 4 + r % 4) * Self::CHUNK) as u64;
                // SAFETY: the source is our staging buffer, the destination a
                // region inside `dst`; both live until the fences below pass.
                unsafe { queue.copy_to_device(src.as_mut_ptr(), at, Self::CHUNK)? };
            }
        }
        let fences: Vec<_> = self
            .queues
            .iter()
            .map(|q| q.record())
            .collect::<Result<_>>()?;
        for f in fences {
            f.wait()?;
        }
        Ok((rounds * Self::QUEUES * Self::CHUNK) as f64 / t.elapsed().as_secs_f64() / 1e9)
    }
}

//! The engine: one per device. It owns the staging pool and the read
//! backend, chooses each file's route, and runs transfers.

mod write;

use crate::device::{Device, DeviceBuffer};
use crate::host_read::HostRead;
use crate::hot::FileMapping;
use crate::hot_choice::{self, HotChoice};
use crate::pipeline::{self, Job, Moved, Progress, ReadCheck, WindowRoute, WorkItem, Worker};
use crate::plan::{split_extents, windows, Extent, TransferPlan};
use crate::staging::{StagingConfig, StagingPool};
use crate::stats::TransferStats;
use crate::storage::{
    self, BackendKind, IoMode, PwriteBackend, ReadBackend, SourceFile, WriteBackend, DIRECT_ALIGN,
};
use crate::{Error, Result};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// When to read with O_DIRECT.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DirectIo {
    /// O_DIRECT for files that are not in the page cache, where allowed.
    Auto,
    /// O_DIRECT wherever the file system allows it.
    Always,
    /// Always through the page cache.
    Never,
}

/// Which route hot files (already in the page cache) take.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HotRoute {
    /// Whichever of the two the engine measures faster on this machine.
    Auto,
    /// CPU copies from the page cache into staging slots.
    Staged,
    /// The GPU copies from the registered page-cache pages.
    PageCacheDma,
}

/// Engine settings; the defaults suit the reference machine (see README).
#[derive(Debug, Clone, serde::Serialize)]
pub struct EngineConfig {
    pub staging: StagingConfig,
    /// I/O worker threads (each with its own reader and copy queue).
    pub io_threads: usize,
    pub backend: BackendKind,
    pub direct_io: DirectIo,
    pub hot_route: HotRoute,
    /// Bytes pinned per page-cache DMA window.
    pub dma_window_bytes: usize,
    /// A file counts as hot when at least this fraction of it is cached.
    pub hot_threshold: f64,
    /// Hot bytes each route moves while `HotRoute::Auto` measures which is
    /// faster (needs 4x this much hot data to measure).
    pub hot_probe_bytes: u64,
    /// Where to remember that measurement across processes (per device and
    /// kernel); `None` measures once per engine. The CLI uses
    /// [`hot_choice::default_file`].
    pub hot_choice_file: Option<std::path::PathBuf>,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            staging: StagingConfig::default(),
            io_threads: crate::probe::cpus().clamp(2, 16),
            backend: BackendKind::Auto,
            direct_io: DirectIo::Auto,
            hot_route: HotRoute::Auto,
            dma_window_bytes: 64 << 20,
            hot_threshold: 0.98,
            hot_probe_bytes: 512 << 20,
            hot_choice_file: None,
        }
    }
}

/// Buffered reads into staging slots: the route for hot files until measured.
const STAGED: WindowRoute = WindowRoute::Staged(IoMode::Buffered);

/// What one or more pipeline runs of a transfer did.
#[derive(Default)]
struct Phase {
    moved: Moved,
    windows: usize,
    threads: usize,
    notes: Vec<String>,
}

impl Phase {
    fn absorb(&mut self, o: Phase) {
        self.moved.add(o.moved);
        self.windows += o.windows;
        self.threads = self.threads.max(o.threads);
        self.notes.extend(o.notes);
    }
}

/// How a file's bytes travel, before the hot route is decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FileRoute {
    Fixed(WindowRoute),
    /// In the page cache, with `HotRoute::Auto`: the engine's measured choice.
    Hot,
}

/// Moves bytes from files into one device's memory.
pub struct Engine {
    device: Arc<dyn Device>,
    pool: Mutex<StagingPool>,
    backend: Arc<dyn ReadBackend>,
    writer: Arc<dyn WriteBackend>,
    config: EngineConfig,
    /// What the hot routes measured, once measured (or read from
    /// `hot_choice_file`).
    hot_choice: Mutex<Option<HotChoice>>,
    hot_choice_key: String,
}

impl Engine {
    /// Allocates the staging pool once and picks the read backend.
    pub fn new(device: Arc<dyn Device>, config: EngineConfig) -> Result<Self> {
        let backend = storage::backend(config.backend).map_err(|e| {
            Error::with_source(crate::ErrorKind::Io, "io_uring is not available", e)
        })?;
        Self::with_backend(device, config, backend)
    }

    /// As [`Engine::new`] with a given backend (e.g. a fault-injecting one).
    pub fn with_backend(
        device: Arc<dyn Device>,
        config: EngineConfig,
        backend: Arc<dyn ReadBackend>,
    ) -> Result<Self> {
        if config.io_threads == 0 {
            return Err(Error::invalid("io_threads must be at least 1"));
        }
        if config.dma_window_bytes == 0
            || !config
                .dma_window_bytes
                .is_multiple_of(crate::hot::page_size())
        {
            return Err(Error::invalid(
                "dma_window_bytes must be a positive multiple of the page size",
            ));
        }
        let pool = StagingPool::new(device.as_ref(), config.staging)?;
        let hot_choice_key = hot_choice::key(&device.describe());
        let remembered = match (&config.hot_choice_file, config.hot_route) {
            (Some(file), HotRoute::Auto) => hot_choice::load(file, &hot_choice_key),
            _ => None,
        };
        Ok(Engine {
            device,
            pool: Mutex::new(pool),
            backend,
            writer: Arc::new(PwriteBackend),
            config,
            hot_choice: Mutex::new(remembered),
            hot_choice_key,
        })
    }

    /// Replaces the write backend (e.g. with a fault-injecting one).
    pub fn with_write_backend(mut self, writer: Arc<dyn WriteBackend>) -> Self {
        self.writer = writer;
        self
    }

    pub fn device(&self) -> &Arc<dyn Device> {
        &self.device
    }

    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    pub fn backend_name(&self) -> &'static str {
        self.backend.name()
    }

    /// Opens files for a transfer.
    pub fn open_files<P: AsRef<Path>>(paths: &[P]) -> Result<Vec<SourceFile>> {
        paths.iter().map(|p| SourceFile::open(p.as_ref())).collect()
    }

    /// Loads each whole file into a new device buffer of its size.
    pub fn load_files<P: AsRef<Path>>(
        &self,
        paths: &[P],
        progress: Option<Progress<'_>>,
    ) -> Result<(Vec<DeviceBuffer>, TransferStats)> {
        let files = Self::open_files(paths)?;
        let mut plan = TransferPlan::new();
        let mut buffers = Vec::with_capacity(files.len());
        for (i, f) in files.iter().enumerate() {
            let buf = self.device.alloc(f.len() as usize)?;
            plan.add(&files, i, 0, f.len(), &buf, 0)?;
            buffers.push(buf);
        }
        let stats = self.transfer(&files, &plan, progress)?;
        Ok((buffers, stats))
    }

    /// Reads `dst.len()` bytes of `file` from `offset` into host memory the
    /// caller owns (pinned or not), in place: no staging, no device. As
    /// [`Engine::read_many_to_host`] with one piece.
    pub fn read_to_host(
        &self,
        file: &SourceFile,
        offset: u64,
        dst: &mut [u8],
    ) -> Result<TransferStats> {
        self.read_many_to_host(vec![(file, offset, dst)])
    }

    /// Reads each `(file, offset, dst)` piece into host memory the caller
    /// owns (e.g. the tensors of a model loaded to the CPU), all pieces
    /// sharing the engine's backend and I/O threads. O_DIRECT per
    /// `direct_io` where `dst`, the offset and the length are 4 KiB aligned.
    pub fn read_many_to_host(
        &self,
        pieces: Vec<(&SourceFile, u64, &mut [u8])>,
    ) -> Result<TransferStats> {
        // Whether a file is cached is asked once per file, not per piece.
        let mut cold = std::collections::HashMap::new();
        let reads = pieces
            .into_iter()
            .map(|(file, offset, dst)| HostRead {
                file,
                offset,
                dst,
                direct: match self.config.direct_io {
                    DirectIo::Never => false,
                    DirectIo::Always => true,
                    DirectIo::Auto => *cold
                        .entry(file.path())
                        .or_insert_with(|| file.resident_fraction() < self.config.hot_threshold),
                },
            })
            .collect();
        crate::host_read::read_to_host(self.backend.as_ref(), self.config.io_threads, reads)
    }

    /// Runs a planned transfer. Returns only when every byte has arrived (or
    /// with the first error; partial success is never reported). Transfers
    /// on one engine run one at a time: they share its staging pool.
    pub fn transfer(
        &self,
        files: &[SourceFile],
        plan: &TransferPlan,
        progress: Option<Progress<'_>>,
    ) -> Result<TransferStats> {
        self.run_transfer(files, plan, None, progress)
    }

    /// As [`Engine::transfer`], with `check` shown every window's bytes in
    /// its staging slot before they are copied to the device; an error from
    /// it stops the transfer. Every window takes the staged route (the
    /// page-cache DMA route never puts the bytes where the CPU sees them).
    pub fn transfer_checked(
        &self,
        files: &[SourceFile],
        plan: &TransferPlan,
        check: ReadCheck<'_>,
        progress: Option<Progress<'_>>,
    ) -> Result<TransferStats> {
        self.run_transfer(files, plan, Some(check), progress)
    }

    fn run_transfer(
        &self,
        files: &[SourceFile],
        plan: &TransferPlan,
        check: Option<ReadCheck<'_>>,
        progress: Option<Progress<'_>>,
    ) -> Result<TransferStats> {
        let started = Instant::now();
        let cpu_before = crate::stats::cpu_seconds();
        let mut pool = self.pool.lock().unwrap_or_else(|p| p.into_inner());
        plan.check_device(self.device.kind())?;
        self.wait_for_streams(plan.streams())?;
        let routes: Vec<FileRoute> = files
            .iter()
            .map(|f| match self.route_for(f) {
                FileRoute::Fixed(WindowRoute::Staged(mode)) => {
                    FileRoute::Fixed(WindowRoute::Staged(mode))
                }
                _ if check.is_some() => FileRoute::Fixed(STAGED),
                r => r,
            })
            .collect();
        let (hot, other): (Vec<Extent>, Vec<Extent>) = plan
            .extents()
            .iter()
            .partition(|e| routes[e.file] == FileRoute::Hot);
        let mut done = Phase::default();
        let (hot_route, hot_left) =
            self.choose_hot_route(files, hot, &mut pool, progress, &mut done)?;
        let extents: Vec<Extent> = hot_left.into_iter().chain(other).collect();
        let route_of = |f: usize| match routes[f] {
            FileRoute::Fixed(r) => r,
            FileRoute::Hot => hot_route,
        };
        done.absorb(self.run_phase(files, &extents, route_of, &mut pool, check, progress)?);

        let mut stats = TransferStats {
            device: self.device.describe(),
            bytes: plan.bytes(),
            backend: self.backend.name().to_string(),
            direct_bytes: done.moved.direct,
            buffered_bytes: done.moved.buffered,
            page_cache_dma_bytes: done.moved.page_cache_dma,
            staging_bytes: pool.bytes(),
            io_threads: done.threads,
            files: files.len(),
            windows: done.windows,
            profile: done.moved.profile,
            notes: done.notes,
            ..Default::default()
        };
        debug_assert_eq!(
            stats.direct_bytes + stats.buffered_bytes + stats.page_cache_dma_bytes,
            plan.bytes()
        );
        stats.finish(started, cpu_before);
        Ok(stats)
    }

    /// The route for hot files, and the hot extents still to move. With
    /// `HotRoute::Auto` and no earlier measurement, the first transfer with
    /// enough hot bytes moves a probe's worth by each route (staged, then
    /// page-cache DMA), timing both; the faster takes the rest, and later
    /// transfers (and processes, with `hot_choice_file`).
    fn choose_hot_route(
        &self,
        files: &[SourceFile],
        hot: Vec<Extent>,
        pool: &mut StagingPool,
        progress: Option<Progress<'_>>,
        done: &mut Phase,
    ) -> Result<(WindowRoute, Vec<Extent>)> {
        if hot.is_empty() {
            return Ok((STAGED, hot));
        }
        if let Some(choice) = *self.hot_choice.lock().unwrap_or_else(|p| p.into_inner()) {
            let kept = self
                .config
                .hot_choice_file
                .as_ref()
                .map_or(String::new(), |p| format!(" (kept in {})", p.display()));
            done.notes.push(format!(
                "hot route measured earlier{kept}: {}",
                choice.describe()
            ));
            return Ok((choice.route(), hot));
        }
        let probe = self.config.hot_probe_bytes;
        if hot.iter().map(|e| e.len).sum::<u64>() < 4 * probe {
            // Too little to measure: the staged route, which pins no
            // page-cache pages and won on the reference machine.
            return Ok((STAGED, hot));
        }
        let (a, rest) = split_extents(&hot, probe);
        let (b, rest) = split_extents(&rest, probe);
        let mut timed = |extents: Vec<Extent>, route: WindowRoute| -> Result<f64> {
            let t = Instant::now();
            done.absorb(self.run_phase(files, &extents, |_| route, pool, None, progress)?);
            Ok(probe as f64 / t.elapsed().as_secs_f64() / 1e9)
        };
        let choice = HotChoice {
            staged_gbps: timed(a, STAGED)?,
            dma_gbps: timed(b, WindowRoute::PageCacheDma)?,
        };
        done.notes.push(format!(
            "hot route measured on this transfer: {}",
            choice.describe()
        ));
        *self.hot_choice.lock().unwrap_or_else(|p| p.into_inner()) = Some(choice);
        if let Some(file) = &self.config.hot_choice_file {
            hot_choice::store(file, &self.hot_choice_key, choice);
        }
        Ok((choice.route(), rest))
    }

    /// One pipeline run over `extents`, each file taking `route_of(file)`.
    fn run_phase(
        &self,
        files: &[SourceFile],
        extents: &[Extent],
        route_of: impl Fn(usize) -> WindowRoute,
        pool: &mut StagingPool,
        check: Option<ReadCheck<'_>>,
        progress: Option<Progress<'_>>,
    ) -> Result<Phase> {
        let mut routes: Vec<WindowRoute> = (0..files.len()).map(route_of).collect();
        let (maps, mut notes) = self.map_dma_files(files, extents, &mut routes);
        let items = self.work_items(extents, &routes, pool.config().slot_bytes as u64);
        let windows = items.len();
        let shares = pool.worker_shares(self.config.io_threads.min(windows));
        let threads = shares.len();
        let mut workers = Vec::with_capacity(threads);
        for share in shares {
            workers.push(Worker {
                slots: share,
                queue: self.device.new_queue()?,
                reader: self.backend.reader().map_err(|e| {
                    Error::with_source(
                        crate::ErrorKind::Io,
                        format!("cannot start a {} reader", self.backend.name()),
                        e,
                    )
                })?,
            });
        }
        let job = Job {
            device: self.device.as_ref(),
            files,
            maps: &maps,
            items,
            check,
            progress,
        };
        let (moved, pin_refusal) = pipeline::run(&job, workers)?;
        if let Some(why) = pin_refusal {
            notes.push(format!(
                "page-cache DMA could not pin pages ({why}); those windows were staged instead"
            ));
        }
        Ok(Phase {
            moved,
            windows,
            threads,
            notes,
        })
    }

    /// Waits for the work queued on the streams of borrowed buffers (see
    /// [`TransferPlan::streams`]), so nothing touches memory a framework's
    /// kernels still use.
    fn wait_for_streams(&self, streams: std::collections::BTreeSet<u64>) -> Result<()> {
        for s in streams {
            // SAFETY: buffers carry a stream only through
            // `DeviceBuffer::borrowed_on_stream`, whose caller vouches that
            // it is a live stream of the buffer's device.
            unsafe { self.device.wait_for_stream(s)? };
        }
        Ok(())
    }

    /// The route for a file: `Hot` for files in the page cache (per
    /// `hot_route`), else staged reads, O_DIRECT per `direct_io`.
    fn route_for(&self, f: &SourceFile) -> FileRoute {
        let hot = f.resident_fraction() >= self.config.hot_threshold;
        match self.config.hot_route {
            HotRoute::PageCacheDma => return FileRoute::Fixed(WindowRoute::PageCacheDma),
            HotRoute::Auto if hot => return FileRoute::Hot,
            _ => {}
        }
        let direct = f.direct_capable()
            && match self.config.direct_io {
                DirectIo::Never => false,
                DirectIo::Always => true,
                DirectIo::Auto => !hot,
            };
        FileRoute::Fixed(WindowRoute::Staged(if direct {
            IoMode::Direct
        } else {
            IoMode::Buffered
        }))
    }

    /// Maps every DMA-route file. A file that cannot be mapped takes the
    /// staged route instead, and a note says so.
    fn map_dma_files(
        &self,
        files: &[SourceFile],
        extents: &[Extent],
        routes: &mut [WindowRoute],
    ) -> (Vec<Option<FileMapping>>, Vec<String>) {
        let mut used = vec![false; files.len()];
        for e in extents {
            used[e.file] = true;
        }
        let mut notes = Vec::new();
        let maps = files
            .iter()
            .zip(routes.iter_mut())
            .zip(used)
            .map(|((f, r), used)| {
                if *r != WindowRoute::PageCacheDma || f.is_empty() || !used {
                    return None;
                }
                FileMapping::new(f)
                    .map_err(|e| {
                        notes.push(format!(
                            "{}: page-cache DMA unavailable ({e}); staged instead",
                            f.path().display()
                        ));
                        *r = WindowRoute::Staged(IoMode::Buffered);
                    })
                    .ok()
            })
            .collect();
        (maps, notes)
    }

    fn work_items(
        &self,
        extents: &[Extent],
        routes: &[WindowRoute],
        slot_bytes: u64,
    ) -> Vec<WorkItem> {
        let page = crate::hot::page_size() as u64;
        let dma_cap = (self.config.dma_window_bytes as u64).max(page);
        let (dma, staged): (Vec<Extent>, Vec<Extent>) = extents
            .iter()
            .partition(|e| routes[e.file] == WindowRoute::PageCacheDma);
        let mut items: Vec<WorkItem> = windows(&staged, slot_bytes, DIRECT_ALIGN)
            .into_iter()
            .map(|w| WorkItem {
                route: routes[w.file],
                window: w,
            })
            .collect();
        items.extend(windows(&dma, dma_cap, page).into_iter().map(|w| WorkItem {
            route: WindowRoute::PageCacheDma,
            window: w,
        }));
        items.sort_by_key(|i| (i.window.file, i.window.start));
        items
    }
}

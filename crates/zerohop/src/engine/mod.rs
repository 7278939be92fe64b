//! The engine: one per device. It owns the staging pool and the read
//! backend, chooses each file's route ([`route`]), and runs transfers
//! through the read pipeline ([`read_pipeline`]) or, for saves, the write
//! pipeline ([`write_pipeline`]).

mod config;
pub mod hot_choice;
mod page_cache_dma;
mod read_pipeline;
mod route;
#[cfg(test)]
mod tests;
mod workers;
mod write;
mod write_pipeline;

pub use config::{DirectIo, EngineConfig};
pub use read_pipeline::ReadCheck;
pub use route::HotRoute;
pub(crate) use route::Route;
pub use workers::Progress;
pub use write_pipeline::WriteFilter;

use crate::device::{Device, DeviceBuffer};
use crate::host_read::HostRead;
use crate::plan::{work_items, Extent, TransferPlan};
use crate::staging::StagingPool;
use crate::stats::TransferStats;
use crate::storage::{self, PwriteBackend, ReadBackend, SourceFile, WriteBackend};
use crate::{Error, Result};
use hot_choice::HotChoice;
use read_pipeline::{Job, Moved, Worker};
use route::{FileRoute, STAGED};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Instant;

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

/// Moves bytes from files into one device's memory.
pub struct Engine {
    device: Arc<dyn Device>,
    pool: Mutex<StagingPool>,
    backend: Arc<dyn ReadBackend>,
    writer: Arc<dyn WriteBackend>,
    config: EngineConfig,
    /// Whether the device's copies may read file mappings (see
    /// [`route::copies_by_dma`]): the page-cache DMA route needs it.
    dma_copies: bool,
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
                .is_multiple_of(rustix::param::page_size())
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
            dma_copies: route::copies_by_dma(device.as_ref()),
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

    /// Opens files for a transfer; anything but a regular file (a
    /// directory, a FIFO, a device) is refused without blocking.
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
    /// A file that changes size or is modified meanwhile is an error.
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
    /// with the first error; partial success is never reported). A file
    /// that changes size or is modified during the transfer is an error
    /// that says what changed. Transfers on one engine run one at a time:
    /// they share its staging pool.
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
        self.wait_for_streams(plan.streams())?;
        let routes: Vec<FileRoute> = files
            .iter()
            .map(|f| match self.route_for(f) {
                r @ FileRoute::Fixed(Route::Staged(_)) => r,
                _ if check.is_some() => FileRoute::Fixed(STAGED),
                r => r,
            })
            .collect();
        let (hot, other): (Vec<Extent>, Vec<Extent>) = plan
            .extents()
            .iter()
            .partition(|e| routes[e.file] == FileRoute::MeasuredHot);
        let mut done = Phase::default();
        if self.config.hot_route == HotRoute::PageCacheDma && !self.dma_copies {
            done.notes.push(route::NO_DMA_NOTE.into());
        }
        let (hot_route, hot_left) =
            self.choose_hot_route(files, hot, &mut pool, progress, &mut done)?;
        let extents: Vec<Extent> = hot_left.into_iter().chain(other).collect();
        let route_of = |f: usize| match routes[f] {
            FileRoute::Fixed(r) => r,
            FileRoute::MeasuredHot => hot_route,
        };
        done.absorb(self.run_phase(files, &extents, route_of, &mut pool, check, progress)?);
        files.iter().try_for_each(SourceFile::check_unchanged)?;

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

    /// One pipeline run over `extents`, each file taking `route_of(file)`.
    fn run_phase(
        &self,
        files: &[SourceFile],
        extents: &[Extent],
        route_of: impl Fn(usize) -> Route,
        pool: &mut StagingPool,
        check: Option<ReadCheck<'_>>,
        progress: Option<Progress<'_>>,
    ) -> Result<Phase> {
        let mut routes: Vec<Route> = (0..files.len()).map(route_of).collect();
        let (maps, mut notes) = page_cache_dma::map_files(files, extents, &mut routes);
        let items = work_items(
            extents,
            &routes,
            pool.config().slot_bytes as u64,
            self.config.dma_window_bytes as u64,
        );
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
        let (moved, pin_refusal) = read_pipeline::run(&job, workers)?;
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
}

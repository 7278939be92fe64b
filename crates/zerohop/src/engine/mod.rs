//! The engine: one per device. It owns the staging pool and the read and
//! write backends. Its rooms: `route` chooses each file's route; `load`
//! runs loads through `read_pipeline` (measuring the hot route first where
//! it must, remembered in `hot_choice`), for which `page_cache_dma` maps
//! the files of the mapped-copy and page-cache DMA routes, and takes its
//! claims off a `work`; `chain` lets reads join one pipeline run; `write`
//! runs saves through `write_pipeline`; `workers` is what the two
//! pipelines share; `config` the settings.

mod chain;
mod claims;
mod config;
pub mod hot_choice;
mod load;
mod page_cache_dma;
mod read_pipeline;
mod route;
mod work;
mod workers;
mod write;
mod write_pipeline;

pub use chain::ReadChain;
pub use config::{DirectIo, EngineConfig, HotRoute};
pub use read_pipeline::ReadCheck;
pub use work::{OnArrival, PlannedRead};
pub use workers::Progress;
pub use write_pipeline::WriteFilter;

use crate::crew::Crew;
use crate::device::{Device, DeviceBuffer};
use crate::host_read::HostRead;
use crate::plan::TransferPlan;
use crate::staging::StagingPool;
use crate::stats::TransferStats;
use crate::storage::{self, PwriteBackend, ReadBackend, SourceFile, WriteBackend};
use crate::{Error, Result};
use hot_choice::HotChoice;
use std::path::Path;
use std::sync::{Arc, Mutex};

/// Moves bytes between files and one device's memory.
pub struct Engine {
    device: Arc<dyn Device>,
    pool: Mutex<StagingPool>,
    backend: Arc<dyn ReadBackend>,
    writer: Arc<dyn WriteBackend>,
    config: EngineConfig,
    /// Whether the device's copies may read file mappings (see
    /// `Device::copies_by_dma`): the page-cache DMA route needs it.
    dma_copies: bool,
    /// What the hot routes measured, once measured (or read from
    /// `hot_choice_file`).
    hot_choice: Mutex<Option<HotChoice>>,
    hot_choice_key: String,
    /// The workers' copy queues, kept between transfers (loads and saves).
    queues: workers::QueuePool,
    /// Seconds the engine took to make, until its first transfer takes it.
    setup_seconds: Mutex<Option<f64>>,
    /// Helpers for the copies of small transfers (see `crew`).
    crew: Crew,
}

/// The most threads one mapped copy of a small transfer is shared by: a
/// 4 MiB copy took 628 us on one thread, 200 on four and 146 on eight on
/// the reference H200 machine (`bench/probe/small_copy.c`).
const CREW_WIDTH: usize = 8;

impl Engine {
    /// Allocates the staging pool once and picks the read backend.
    pub fn new(device: Arc<dyn Device>, config: EngineConfig) -> Result<Self> {
        let segment = config.read_request_bytes;
        if segment == 0 || !segment.is_multiple_of(storage::DIRECT_ALIGN as usize) {
            return Err(Error::invalid(format!(
                "read_request_bytes must be a positive multiple of {}",
                storage::DIRECT_ALIGN
            )));
        }
        let backend = storage::backend_with_segment(config.backend, segment).map_err(|e| {
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
        let started = std::time::Instant::now();
        if config.io_threads == 0 || config.remote_streams == 0 {
            return Err(Error::invalid(
                "io_threads and remote_streams must be at least 1",
            ));
        }
        let page = rustix::param::page_size();
        for (name, bytes) in [
            ("dma_window_bytes", config.dma_window_bytes),
            ("mapped_window_bytes", config.mapped_window_bytes),
            ("write_window_bytes", config.write_window_bytes),
        ] {
            if bytes == 0 || !bytes.is_multiple_of(page) {
                return Err(Error::invalid(format!(
                    "{name} must be a positive multiple of the page size ({page})"
                )));
            }
        }
        let pool = StagingPool::new(config.staging)?;
        let queues = workers::QueuePool::filled(device.as_ref(), config.io_threads)?;
        let hot_choice_key = hot_choice::key(&device.describe());
        let crew = Crew::new(config.io_threads.min(CREW_WIDTH) - 1);
        let remembered = match (&config.hot_choice_file, config.hot_route) {
            (Some(file), HotRoute::Auto) => hot_choice::load(file, &hot_choice_key),
            _ => None,
        };
        Ok(Engine {
            dma_copies: device.copies_by_dma(),
            device,
            pool: Mutex::new(pool),
            backend,
            writer: Arc::new(PwriteBackend),
            config,
            hot_choice: Mutex::new(remembered),
            hot_choice_key,
            queues,
            setup_seconds: Mutex::new(Some(started.elapsed().as_secs_f64())),
            crew,
        })
    }

    /// Allocates the staging pool now, where the first transfer would, and
    /// starts pinning it (which goes on in the background where the device
    /// pins in pieces): for callers with time to spare before their first
    /// transfer. The engine's setup is then not on any transfer's path, and
    /// no transfer's stats count it.
    pub fn allocate_staging(&self) -> Result<()> {
        let mut pool = self.pool.lock().unwrap_or_else(|p| p.into_inner());
        pool.allocate(self.device.as_ref())?;
        self.take_setup_seconds();
        Ok(())
    }

    /// The engine's setup time for the first transfer that asks, 0 after.
    fn take_setup_seconds(&self) -> f64 {
        let mut setup = self.setup_seconds.lock().unwrap_or_else(|p| p.into_inner());
        setup.take().unwrap_or(0.0)
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

    /// How many files a large save spreads over to write at its best: as
    /// many as the windows its workers keep copied and not yet written
    /// (one per staging slot). Workers take the next window round-robin
    /// across the files, so with fewer files two of them often write into
    /// one at once, and a memory file system serializes writes into a file.
    /// Checkpoint saves of 8 GiB into tmpfs on an H100 machine moved 28.8 -
    /// 30.6 GB/s into 32 files against 25.0 - 26.5 into 16, medians of 4
    /// (`bench/probe/save_configs.py`).
    pub fn write_spread(&self) -> usize {
        self.config.staging.slot_count()
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
        self.load_sources(&Self::open_files(paths)?, progress)
    }

    /// As [`Engine::load_files`], from sources already opened (local files
    /// or remote objects).
    pub fn load_sources(
        &self,
        files: &[SourceFile],
        progress: Option<Progress<'_>>,
    ) -> Result<(Vec<DeviceBuffer>, TransferStats)> {
        let mut plan = TransferPlan::new();
        let mut buffers = Vec::with_capacity(files.len());
        for (i, f) in files.iter().enumerate() {
            let buf = self.device.alloc(f.len() as usize)?;
            plan.add(files, i, 0, f.len(), &buf, 0)?;
            buffers.push(buf);
        }
        let stats = self.transfer(files, &plan, progress)?;
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
        // Whether a file's pieces are cached is asked once per file, of the
        // pieces only.
        let mut ranges: std::collections::HashMap<*const SourceFile, Vec<(u64, u64)>> =
            std::collections::HashMap::new();
        for (file, offset, dst) in &pieces {
            ranges
                .entry(std::ptr::from_ref(*file))
                .or_default()
                .push((*offset, dst.len() as u64));
        }
        let mut direct = std::collections::HashMap::new();
        for (file, _, _) in &pieces {
            let key = std::ptr::from_ref(*file);
            direct
                .entry(key)
                .or_insert_with(|| self.reads_direct(|| self.is_hot(file, &ranges[&key])));
        }
        let reads = pieces
            .into_iter()
            .map(|(file, offset, dst)| HostRead {
                direct: direct[&std::ptr::from_ref(file)],
                file,
                offset,
                dst,
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
    /// it stops the transfer. Every window is a whole slot, as restores
    /// check whole chunks; files in the page cache are copied out of their
    /// mapping (page-cache DMA never puts the bytes where the CPU sees them),
    /// the others read into the slots.
    pub fn transfer_checked(
        &self,
        files: &[SourceFile],
        plan: &TransferPlan,
        check: ReadCheck<'_>,
        progress: Option<Progress<'_>>,
    ) -> Result<TransferStats> {
        self.run_transfer(files, plan, Some(check), progress)
    }
}

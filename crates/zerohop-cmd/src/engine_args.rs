//! Engine settings on the command line, shared by the commands.

use crate::size::ByteSize;
use clap::{Args, ValueEnum};
use std::sync::Arc;
use zerohop::staging::StagingConfig;
use zerohop::storage::BackendKind;
use zerohop::{Device, DeviceName, DirectIo, Engine, EngineConfig, HotRoute, Result};

/// Engine settings on the command line.
#[derive(Args, Debug, Clone)]
pub struct EngineArgs {
    #[arg(long, default_value = "auto", help = zerohop::device::DEVICE_HELP)]
    pub device: String,
    /// I/O worker threads (by default one per CPU, at least 2, at most 16).
    #[arg(long, default_value_t = EngineConfig::default().io_threads)]
    pub threads: usize,
    /// Workers of loads from object stores (s3://), each with one ranged
    /// GET open at a time and one staging slot (so at most --staging /
    /// --slot of them).
    #[arg(long, default_value_t = EngineConfig::default().remote_streams)]
    pub remote_streams: usize,
    /// Bytes per ranged GET of an object at most (each filling staging
    /// slots in turn), e.g. 16MiB.
    #[arg(long, default_value_t = ByteSize(EngineConfig::default().remote_read_bytes))]
    pub remote_read: ByteSize,
    /// Staging memory in total (pinned on a GPU), e.g. 256MiB.
    #[arg(long, default_value_t = ByteSize(StagingConfig::default().total_bytes as u64))]
    pub staging: ByteSize,
    /// Staging slot size (one read), e.g. 8MiB.
    #[arg(long, default_value_t = ByteSize(StagingConfig::default().slot_bytes as u64))]
    pub slot: ByteSize,
    /// How files are read: auto (io_uring where the kernel allows it, else
    /// pread threads), io-uring, pread.
    #[arg(long, value_enum, default_value_t = BackendArg::Auto)]
    pub backend: BackendArg,
    /// Bytes per read request (io_uring splits each slot's read into
    /// requests of this size, all in flight at once), e.g. 512KiB.
    #[arg(long, default_value_t = ByteSize(EngineConfig::default().read_request_bytes as u64))]
    pub read_request: ByteSize,
    /// O_DIRECT: auto (for files not in the page cache), always, never.
    #[arg(long, value_enum, default_value_t = DirectArg::Auto)]
    pub direct: DirectArg,
    /// Route for files in the page cache: auto (mapped, or dma where the
    /// engine measured it faster), mapped (CPU copies out of the file's
    /// mapping), staged (read() into the slots), dma (page-cache DMA).
    #[arg(long, value_enum, default_value_t = HotArg::Auto)]
    pub hot_route: HotArg,
    /// Bytes per copy of the mapped route (at most a slot), e.g. 2MiB.
    #[arg(long, default_value_t = ByteSize(EngineConfig::default().mapped_window_bytes as u64))]
    pub mapped_window: ByteSize,
    /// Bytes per window of a write into local files (at most a slot), e.g. 2MiB.
    #[arg(long, default_value_t = ByteSize(EngineConfig::default().write_window_bytes as u64))]
    pub write_window: ByteSize,
    /// Bytes pinned per page-cache DMA window, e.g. 64MiB.
    #[arg(long, default_value_t = ByteSize(EngineConfig::default().dma_window_bytes as u64))]
    pub dma_window: ByteSize,
}

#[derive(ValueEnum, Debug, Clone, Copy)]
pub enum BackendArg {
    Auto,
    IoUring,
    Pread,
}

#[derive(ValueEnum, Debug, Clone, Copy)]
pub enum DirectArg {
    Auto,
    Always,
    Never,
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum HotArg {
    Auto,
    Mapped,
    Staged,
    Dma,
}

impl EngineArgs {
    pub fn config(&self) -> EngineConfig {
        let mut c = EngineConfig {
            io_threads: self.threads,
            remote_streams: self.remote_streams,
            remote_read_bytes: self.remote_read.0,
            ..EngineConfig::keeping_hot_choice()
        };
        c.staging = StagingConfig {
            total_bytes: self.staging.bytes(),
            slot_bytes: self.slot.bytes(),
        };
        c.backend = match self.backend {
            BackendArg::Auto => BackendKind::Auto,
            BackendArg::IoUring => BackendKind::IoUring,
            BackendArg::Pread => BackendKind::Pread,
        };
        c.direct_io = match self.direct {
            DirectArg::Auto => DirectIo::Auto,
            DirectArg::Always => DirectIo::Always,
            DirectArg::Never => DirectIo::Never,
        };
        c.hot_route = match self.hot_route {
            HotArg::Auto => HotRoute::Auto,
            HotArg::Mapped => HotRoute::Mapped,
            HotArg::Staged => HotRoute::Staged,
            HotArg::Dma => HotRoute::PageCacheDma,
        };
        c.dma_window_bytes = self.dma_window.bytes();
        c.read_request_bytes = self.read_request.bytes();
        c.mapped_window_bytes = self.mapped_window.bytes();
        c.write_window_bytes = self.write_window.bytes();
        c
    }

    pub fn open_device(&self) -> Result<Arc<dyn Device>> {
        open_device_or_host(&self.device)
    }

    pub fn engine(&self) -> Result<Engine> {
        Engine::new(self.open_device()?, self.config())
    }
}

/// `auto` means the first GPU, or host memory (with a note) when there is none.
pub fn open_device_or_host(spec: &str) -> Result<Arc<dyn Device>> {
    let name: DeviceName = spec.parse()?;
    let resolved = name.resolve()?;
    if name == DeviceName::Auto && resolved == DeviceName::Host {
        let why = match zerohop::device::cuda_driver_summary() {
            Err(e) => e.to_string(),
            Ok(_) => "the driver sees no GPU".into(),
        };
        eprintln!("note: no GPU available ({why}); using host memory instead (same pipeline)");
    }
    resolved.open()
}

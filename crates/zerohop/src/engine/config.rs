//! The engine's settings.

use crate::staging::StagingConfig;
use crate::storage::BackendKind;

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

/// Which route hot files (already in the page cache) take. Page-cache DMA
/// runs only on devices that copy by DMA (GPUs); elsewhere hot files take
/// the mapped-copy route, and with `PageCacheDma` a note says so.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HotRoute {
    /// Mapped copies, or page-cache DMA where the engine measures that
    /// faster on this machine (devices that copy by DMA only).
    Auto,
    /// The CPU copies out of the file's mapping into staging slots.
    Mapped,
    /// `read()` into staging slots (the kernel copies out of the page cache).
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
    /// Workers of a transfer from remote objects (object stores), each
    /// with one request open at a time and one staging slot (so at most
    /// the slot count of them): they wait on the server, not on the CPU,
    /// so more of them than `io_threads` pay.
    pub remote_streams: usize,
    /// Bytes per request to a remote object, at most: a worker reads a
    /// run of the object's consecutive windows from one response (each
    /// into a staging slot in turn), so the server sees fewer, larger
    /// requests while host memory stays in the slots.
    pub remote_read_bytes: u64,
    pub backend: BackendKind,
    /// Bytes per read request: io_uring splits each slot's read into
    /// requests of this size, all in flight at once.
    pub read_request_bytes: usize,
    pub direct_io: DirectIo,
    pub hot_route: HotRoute,
    /// Bytes pinned per page-cache DMA window.
    pub dma_window_bytes: usize,
    /// Bytes per window of the mapped-copy route (at most a staging slot):
    /// small enough that the copy into the slot is still in the CPU's
    /// cache when the device reads it. A small transfer is not cut finer
    /// to spread it over workers: a 1 MiB `get_slice` cut in four for four
    /// workers took 323 us in the engine against 275 us on one thread (the
    /// reference H200 machine, `bench/probe/slice_calls.py`), their thread
    /// starts and copy queues costing more than they saved. Its window's
    /// copy is shared with the engine's parked helpers instead (`crew`).
    pub mapped_window_bytes: usize,
    /// Bytes per window of a write into local files that no filter sees
    /// (at most a slot; windows a filter sees, and the parts of remote
    /// objects, are whole slots). Finer windows leave fewer bytes copied
    /// off the device and not yet written, which may then stay in the
    /// CPU's cache until their write reads them.
    pub write_window_bytes: usize,
    /// A file counts as hot when at least this fraction of it is cached.
    pub hot_threshold: f64,
    /// Hot bytes each route moves while `HotRoute::Auto` measures which is
    /// faster (needs 4x this much hot data to measure).
    pub hot_probe_bytes: u64,
    /// Where to remember that measurement across processes (per device and
    /// kernel); `None` measures once per engine. See
    /// [`EngineConfig::keeping_hot_choice`].
    pub hot_choice_file: Option<std::path::PathBuf>,
}

impl EngineConfig {
    /// The defaults, with the hot-route measurement kept in
    /// [`hot_choice::default_file`](super::hot_choice::default_file): the
    /// CLI, the Python package and the preloaded library share it, so only
    /// the first of them on a machine measures. A measurement costs its
    /// transfer two pipeline runs, and more where the files were just
    /// written (a preloaded process's first resume, right after its
    /// suspend).
    pub fn keeping_hot_choice() -> Self {
        EngineConfig {
            hot_choice_file: super::hot_choice::default_file(),
            ..EngineConfig::default()
        }
    }
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            staging: StagingConfig::default(),
            io_threads: crate::machine::availability::available_cpus().clamp(2, 16),
            // Ranged GETs of an 8.33 GB object from a local S3 server on
            // the reference H200 machine: 16 MiB x 32 in flight ran at
            // 3.06 - 3.71 GB/s, 4 MiB x 16 (one slot per request) at
            // 2.64 - 2.96.
            remote_streams: 32,
            remote_read_bytes: 16 << 20,
            backend: BackendKind::Auto,
            // Cold loads on the reference machine's disk, a fresh file
            // each, measured on the reference H200 machine: 256 KiB
            // requests 2.30 GB/s, 512 KiB 2.22, 1 MiB 1.84-2.20, 4 MiB 2.03.
            read_request_bytes: 256 << 10,
            direct_io: DirectIo::Auto,
            hot_route: HotRoute::Auto,
            dma_window_bytes: 64 << 20,
            // Measured on the reference H200 machine: 4 MiB windows in
            // 4 MiB slots ran at 50.5-50.7 GB/s, 2 MiB ones at 47.3, 8 MiB
            // ones (in 8 MiB slots) at 41-49.
            mapped_window_bytes: 4 << 20,
            // Half the default slot. Saves of 8 GiB into tmpfs on the
            // reference H200 machine went as fast through 2 MiB windows as
            // through whole 4 MiB slots, or faster (one tensor at 20.6 -
            // 20.8 GB/s against 16.4 - 17.6 in one machine start, within
            // the rounds' spread in others); 1 MiB ones were slower.
            write_window_bytes: 2 << 20,
            hot_threshold: 0.98,
            hot_probe_bytes: 512 << 20,
            hot_choice_file: None,
        }
    }
}

//! The storage side: opened source files and interchangeable read backends
//! (io_uring and a plain `pread` loop), and files being written with their
//! write backends. Fault-injecting wrappers for tests are in
//! `zerohop::testing`.

pub mod atomic;
mod bus_guard;
mod fds;
mod file;
mod mapping;
mod origin;
pub use origin::Origin;
mod psync;
mod sink;
mod stamp;
mod uring;
mod write_mapping;

pub use fds::{blocking, regular_file_len, reopen_direct, FilePair};
pub(crate) use fds::{open_regular, Access};
pub(crate) use file::RemoteStream;
pub use file::{IoMode, RemoteObject, SourceFile};
pub use mapping::{page_cache_residency, FileMapping, GuardedMapping};
pub use psync::PreadBackend;
pub use sink::{sync_dir, write_mode, PwriteBackend, RemoteSink, SinkFile, WriteBackend};
pub use uring::{UringBackend, DEFAULT_SEGMENT as DEFAULT_READ_REQUEST};
pub use write_mapping::WriteMapping;

use std::io;
use std::sync::Arc;

/// A file of known length, named in errors: what a plan's extents refer to
/// (sources of loads, sinks of saves).
pub trait SizedFile {
    fn path(&self) -> &std::path::Path;
    fn len(&self) -> u64;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Sources and sinks (each derefs to its [`Origin`]).
impl<F, R> SizedFile for F
where
    F: std::ops::Deref<Target = Origin<R>>,
    R: 'static,
{
    fn path(&self) -> &std::path::Path {
        Origin::path(self)
    }
    fn len(&self) -> u64 {
        Origin::len(self)
    }
}

/// Whether `file` lives on a memory file system (tmpfs, ramfs): its pages
/// are the memory, so they cannot be dropped from a cache, and writes into
/// one file wait for each other on its lock.
pub fn in_memory(file: &std::fs::File) -> bool {
    /// `f_type`s of memory file systems in `statfs` (linux/magic.h).
    const TMPFS_MAGIC: u64 = 0x0102_1994;
    const RAMFS_MAGIC: u64 = 0x8584_58f6;
    rustix::fs::fstatfs(file)
        .is_ok_and(|fs| [TMPFS_MAGIC, RAMFS_MAGIC].contains(&(fs.f_type as u64)))
}

/// Alignment used for O_DIRECT offsets, lengths and buffers. 4 KiB satisfies
/// every common logical block size (512 B and 4 KiB).
pub const DIRECT_ALIGN: u64 = 4096;

/// Which backend to read with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BackendKind {
    /// io_uring when the kernel allows it, else `pread`.
    Auto,
    IoUring,
    Pread,
}

/// A way of reading files; each I/O worker gets its own [`BlockReader`].
pub trait ReadBackend: Send + Sync {
    fn name(&self) -> &'static str;
    fn reader(&self) -> io::Result<Box<dyn BlockReader>>;
}

/// One worker's reader of local files (see [`SourceFile::read_block`]).
pub trait BlockReader: Send {
    /// Fills `buf` from `offset`, stopping early only at end of file.
    /// Returns the number of bytes read. With `IoMode::Direct`, `offset`,
    /// `buf.len()` and the buffer address are multiples of [`DIRECT_ALIGN`].
    fn read_at(
        &mut self,
        file: &FilePair,
        mode: IoMode,
        offset: u64,
        buf: &mut [u8],
    ) -> io::Result<usize>;
}

/// Picks a backend: io_uring if asked or available, else `pread`.
pub fn backend(kind: BackendKind) -> io::Result<Arc<dyn ReadBackend>> {
    backend_with_segment(kind, DEFAULT_READ_REQUEST)
}

/// As [`backend`], io_uring splitting each read into requests of
/// `segment` bytes kept in flight together.
pub fn backend_with_segment(kind: BackendKind, segment: usize) -> io::Result<Arc<dyn ReadBackend>> {
    match kind {
        BackendKind::Pread => Ok(Arc::new(PreadBackend)),
        BackendKind::IoUring => Ok(Arc::new(UringBackend::probe()?.with_segment(segment))),
        BackendKind::Auto => Ok(match UringBackend::probe() {
            Ok(b) => Arc::new(b.with_segment(segment)),
            Err(_) => Arc::new(PreadBackend),
        }),
    }
}

//! The storage side: opened source files and interchangeable read backends
//! (io_uring and a plain `pread` loop), and files being written with their
//! write backends. Fault-injecting wrappers for tests are in
//! `zerohop::testing`.

pub mod atomic;
mod bus_guard;
mod descriptors;
mod file_pair;
mod mapping;
mod origin;
mod psync;
mod range_hash;
mod remote;
mod sink;
mod source_file;
mod stamp;
mod uring;
mod write_mapping;

pub use descriptors::grow_descriptor_table;
pub use file_pair::{
    blocking, regular_file_len, reopen_direct, BlockReader, FilePair, IoMode, ReadBackend,
    DIRECT_ALIGN,
};
pub(crate) use file_pair::{open_regular, Access};
pub use mapping::{page_cache_residency, FileMapping, GuardedMapping};
pub use origin::Origin;
pub use psync::PreadBackend;
pub use range_hash::{range_sums, FileRange};
pub use remote::RemoteObject;
pub(crate) use remote::RemoteStream;
pub use sink::{sync_dir, write_mode, PwriteBackend, RemoteSink, SinkFile, WriteBackend};
pub use source_file::SourceFile;
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

/// Which backend to read with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BackendKind {
    /// io_uring when the kernel allows it, else `pread`.
    Auto,
    IoUring,
    Pread,
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

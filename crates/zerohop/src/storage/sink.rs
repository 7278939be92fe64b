//! The write side of storage: files being written ([`SinkFile`]) and
//! interchangeable write backends (`pwrite`, and a fault-injecting wrapper).

use super::fds::{blocking, open_regular, Access};
use super::{regular_file_len, reopen_direct, FilePair, IoMode, DIRECT_ALIGN};
use crate::{Error, Result};
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

/// A file being written, sized up front, with an O_DIRECT descriptor when
/// the file system accepts one.
#[derive(Debug)]
pub struct SinkFile {
    fds: FilePair,
    /// Whether a write makes the file's directory entry durable too: yes
    /// for files zerohop created; no for descriptors a client passed (the
    /// client made that entry, and its path may mean nothing here).
    sync_parent: bool,
}

impl std::ops::Deref for SinkFile {
    type Target = FilePair;
    fn deref(&self) -> &FilePair {
        &self.fds
    }
}

impl SinkFile {
    /// Creates `path` (which must not exist) with length `len`. Bytes never
    /// written read as zeros (the file is sparse there).
    pub fn create_new(path: &Path, len: u64) -> Result<Self> {
        let buffered = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(path)
            .map_err(|e| Error::io(path, "cannot create", e))?;
        buffered
            .set_len(len)
            .map_err(|e| Error::io(path, "cannot size", e))?;
        Ok(Self::with_direct(path, buffered, len))
    }

    /// Opens `path` for writing in place, creating it if missing; never
    /// truncates, and extends it to `min_len` bytes if it is shorter.
    pub fn open_for_update(path: &Path, min_len: u64) -> Result<Self> {
        // Never blocks, and refuses anything but a regular file (a FIFO
        // there would wait for a reader).
        let (buffered, opened) = open_regular(path, Access::WriteOrCreate)?;
        let len = extend_to(&buffered, path, opened.len, min_len)?;
        Ok(Self::with_direct(path, buffered, len))
    }

    /// Writes through descriptors someone else opened (see
    /// [`SourceFile::from_descriptors`](super::SourceFile::from_descriptors):
    /// non-blocking ones are replaced likewise), extending the file to
    /// `min_len` if it is shorter. A descriptor opened with O_APPEND is
    /// refused: every write through it would land at the file's end,
    /// whatever offset it was meant for.
    pub fn from_descriptors(
        buffered: File,
        direct: Option<File>,
        label: &Path,
        min_len: u64,
    ) -> Result<Self> {
        let len = regular_file_len(&buffered, label)?;
        for fd in std::iter::once(&buffered).chain(direct.as_ref()) {
            let flags = rustix::fs::fcntl_getfl(fd)
                .map_err(|e| Error::io(label, "cannot read the flags of", e.into()))?;
            if flags.contains(rustix::fs::OFlags::APPEND) {
                return Err(Error::invalid(format!(
                    "{}: opened with O_APPEND, so writes would land at its end instead of \
                     at their offsets; open it without O_APPEND to write through zerohop",
                    label.display()
                )));
            }
        }
        let buffered = blocking(buffered, label)?;
        let direct = direct.map(|d| blocking(d, label)).transpose()?;
        let len = extend_to(&buffered, label, len, min_len)?;
        Ok(SinkFile {
            fds: FilePair::new(label, buffered, direct, len),
            sync_parent: false,
        })
    }

    fn with_direct(path: &Path, buffered: File, len: u64) -> Self {
        // The O_DIRECT twin reopens this very file, write-only like it, not
        // the path again (which may name another file, or a FIFO, by now).
        // Some file systems (older tmpfs, FUSE) refuse O_DIRECT: buffered only.
        let direct = reopen_direct(&buffered);
        SinkFile {
            fds: FilePair::new(path, buffered, direct, len),
            sync_parent: true,
        }
    }

    /// Whether writes also sync the parent directory (see the field).
    pub fn syncs_parent(&self) -> bool {
        self.sync_parent
    }
}

/// Which descriptor suits a write of `len` bytes at `offset`: O_DIRECT when
/// both are aligned and the file allows it.
pub fn write_mode(file: &SinkFile, offset: u64, len: u64) -> IoMode {
    if file.direct_capable()
        && offset.is_multiple_of(DIRECT_ALIGN)
        && len.is_multiple_of(DIRECT_ALIGN)
    {
        IoMode::Direct
    } else {
        IoMode::Buffered
    }
}

/// A way of writing files; shared by the write workers.
pub trait WriteBackend: Send + Sync {
    fn name(&self) -> &'static str;
    /// Writes all of `buf` at `offset`. With `IoMode::Direct`, `offset`,
    /// `buf.len()` and the buffer address are multiples of [`DIRECT_ALIGN`].
    fn write_at(&self, file: &SinkFile, mode: IoMode, offset: u64, buf: &[u8]) -> io::Result<()>;
    /// Makes the file's data and size durable (`fsync`).
    fn sync(&self, file: &SinkFile) -> io::Result<()>;
}

/// Blocking `pwrite` from each worker thread.
#[derive(Debug, Clone, Copy, Default)]
pub struct PwriteBackend;

impl WriteBackend for PwriteBackend {
    fn name(&self) -> &'static str {
        "pwrite"
    }

    fn write_at(&self, file: &SinkFile, mode: IoMode, offset: u64, buf: &[u8]) -> io::Result<()> {
        file.fd_for(mode).write_all_at(buf, offset)
    }

    fn sync(&self, file: &SinkFile) -> io::Result<()> {
        file.fd_for(IoMode::Buffered).sync_all()
    }
}

/// Makes the entries of directory `dir` durable (after creating, renaming
/// or removing files in it).
pub fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| Error::io(dir, "cannot sync directory", e))
}

/// Extends `file` (now `len` bytes) to `min_len` if it is shorter; returns
/// its length after.
fn extend_to(file: &File, label: &Path, len: u64, min_len: u64) -> Result<u64> {
    if len < min_len {
        file.set_len(min_len)
            .map_err(|e| Error::io(label, "cannot extend", e))?;
    }
    Ok(len.max(min_len))
}

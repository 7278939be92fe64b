use super::fds::{blocking, open_regular, Access};
use super::origin::Origin;
use super::stamp::FileStamp;
use super::{BlockReader, FilePair};
use crate::{Error, ErrorKind, Result};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// How a file's bytes are read or written: through the page cache or with
/// O_DIRECT (a storage mode that both staged routes and saves use).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum IoMode {
    /// Through the page cache.
    Buffered,
    /// O_DIRECT: storage DMA straight into the staging slot.
    Direct,
}

/// Bytes that live away from this machine (an object in an object store),
/// read by range. Implemented outside the engine (`zerohop-s3`): the engine
/// reads a [`SourceFile`] made with [`SourceFile::remote`] as it reads a
/// local one, into its staging slots.
pub trait RemoteObject: Send + Sync + std::fmt::Debug {
    /// Fills `buf` from `offset`, stopping early only at the object's end;
    /// returns the number of bytes read. Fails, saying so, where the object
    /// is no longer the one opened (replaced meanwhile): never mixed bytes.
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<usize>;
}

/// A source opened for reading: a local file (with an O_DIRECT descriptor
/// when the file system accepts one) or a remote object.
#[derive(Debug)]
pub struct SourceFile {
    origin: Origin<Box<dyn RemoteObject>>,
    /// What a local file looked like when opened: a read that sees it
    /// change reports how. `None` for a remote object (its reads check its
    /// ETag).
    opened: Option<FileStamp>,
}

impl std::ops::Deref for SourceFile {
    type Target = Origin<Box<dyn RemoteObject>>;
    fn deref(&self) -> &Self::Target {
        &self.origin
    }
}

impl SourceFile {
    /// Opens `path` for reading. Anything but a regular file (a directory,
    /// a FIFO, a device, a socket) is a clear error, and the open never
    /// blocks (opening a FIFO would wait for a writer).
    pub fn open(path: &Path) -> Result<Self> {
        let (buffered, opened) = open_regular(path, Access::Read)?;
        // The O_DIRECT twin reopens this very file, not the path again (which
        // may name something else by now). tmpfs and some FUSE file systems
        // refuse O_DIRECT (EINVAL): then only buffered reads are possible.
        let direct = super::reopen_direct(&buffered);
        Ok(Self::local(path, buffered, direct, opened))
    }

    /// Reads through descriptors someone else opened (the agent's clients
    /// pass theirs): `buffered` and, where possible, an O_DIRECT twin (see
    /// [`super::reopen_direct`]). `label` names the file in errors. A
    /// non-blocking descriptor is replaced by a blocking one for the same
    /// file (see [`blocking`]); the caller's stays as it was.
    pub fn from_descriptors(buffered: File, direct: Option<File>, label: &Path) -> Result<Self> {
        let opened = FileStamp::of(&buffered, label)?;
        let buffered = blocking(buffered, label)?;
        let direct = direct.map(|d| blocking(d, label)).transpose()?;
        Ok(Self::local(label, buffered, direct, opened))
    }

    /// A remote object of `len` bytes, named `label` in errors and stats
    /// (its URL, say).
    pub fn remote(label: impl Into<PathBuf>, len: u64, object: Box<dyn RemoteObject>) -> Self {
        SourceFile {
            origin: Origin::Remote {
                label: label.into(),
                len,
                object,
            },
            opened: None,
        }
    }

    fn local(label: &Path, buffered: File, direct: Option<File>, opened: FileStamp) -> Self {
        SourceFile {
            origin: Origin::Local(FilePair::new(label, buffered, direct, opened.len)),
            opened: Some(opened),
        }
    }

    /// Fills `buf` from `offset`, stopping early only at the end: a local
    /// file through `reader` (a worker's, of the engine's backend), a remote
    /// object by its own ranged reads. Returns the number of bytes read.
    pub fn read_block(
        &self,
        reader: &mut dyn BlockReader,
        mode: IoMode,
        offset: u64,
        buf: &mut [u8],
    ) -> std::io::Result<usize> {
        match &self.origin {
            Origin::Local(fds) => reader.read_at(fds, mode, offset, buf),
            Origin::Remote { object, .. } => object.read_at(offset, buf),
        }
    }

    /// An error saying how the file changed since it was opened (its size,
    /// its modification time or its status change time), if it did. Best
    /// effort: see [`FileStamp::changed_since`]. A remote object checks
    /// itself on every read.
    pub fn check_unchanged(&self) -> Result<()> {
        let (Origin::Local(fds), Some(opened)) = (&self.origin, &self.opened) else {
            return Ok(());
        };
        let now = FileStamp::of(fds.fd_for(IoMode::Buffered), self.path())?;
        match now.changed_since(opened) {
            None => Ok(()),
            Some(what) => Err(Error::new(
                ErrorKind::Io,
                format!("{} {what} since it was opened", self.path().display()),
            )),
        }
    }

    /// Reads `buf.len()` bytes at `offset` (through the page cache), for
    /// header parsing.
    pub fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        let read = match &self.origin {
            Origin::Local(fds) => fds.fd_for(IoMode::Buffered).read_exact_at(buf, offset),
            Origin::Remote { object, .. } => match object.read_at(offset, buf) {
                Ok(n) if n < buf.len() => Err(std::io::ErrorKind::UnexpectedEof.into()),
                other => other.map(drop),
            },
        };
        read.map_err(|e| {
            Error::io(
                self.path(),
                &format!("cannot read {} bytes at {offset} of", buf.len()),
                e,
            )
        })
    }

    /// Fraction of the file's pages resident in the page cache (0.0 to 1.0;
    /// 0.0 for a remote object).
    pub fn resident_fraction(&self) -> f64 {
        self.local_fds().map_or(0.0, |fds| {
            super::page_cache_residency(fds.fd_for(IoMode::Buffered), fds.len()).unwrap_or(0.0)
        })
    }
}

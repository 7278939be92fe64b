use super::fds::{blocking, open_regular, Access};
use super::stamp::FileStamp;
use super::FilePair;
use crate::{Error, ErrorKind, Result};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

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

/// A source file opened for reading, with an O_DIRECT descriptor when the
/// file system accepts one.
#[derive(Debug)]
pub struct SourceFile {
    fds: FilePair,
    /// What the file looked like when opened: a read that sees it change
    /// reports how.
    opened: FileStamp,
}

impl std::ops::Deref for SourceFile {
    type Target = FilePair;
    fn deref(&self) -> &FilePair {
        &self.fds
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
        Ok(Self::new(path, buffered, direct, opened))
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
        Ok(Self::new(label, buffered, direct, opened))
    }

    fn new(label: &Path, buffered: File, direct: Option<File>, opened: FileStamp) -> Self {
        SourceFile {
            fds: FilePair::new(label, buffered, direct, opened.len),
            opened,
        }
    }

    /// An error saying how the file changed since it was opened (its size,
    /// its modification time or its status change time), if it did. Best
    /// effort: see [`FileStamp::changed_since`].
    pub fn check_unchanged(&self) -> Result<()> {
        let now = FileStamp::of(self.fd_for(IoMode::Buffered), self.path())?;
        match now.changed_since(&self.opened) {
            None => Ok(()),
            Some(what) => Err(Error::new(
                ErrorKind::Io,
                format!("{} {what} since it was opened", self.path().display()),
            )),
        }
    }

    /// Reads at `offset` through the page cache, for header parsing.
    pub fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.fd_for(IoMode::Buffered)
            .read_exact_at(buf, offset)
            .map_err(|e| {
                Error::io(
                    self.path(),
                    &format!("cannot read {} bytes at {offset} of", buf.len()),
                    e,
                )
            })
    }

    /// Fraction of the file's pages resident in the page cache (0.0 to 1.0).
    pub fn resident_fraction(&self) -> f64 {
        super::page_cache_residency(self.fd_for(IoMode::Buffered), self.len()).unwrap_or(0.0)
    }
}

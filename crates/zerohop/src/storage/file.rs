use super::FilePair;
use crate::{Error, Result};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

/// How a file's bytes are read.
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
}

impl std::ops::Deref for SourceFile {
    type Target = FilePair;
    fn deref(&self) -> &FilePair {
        &self.fds
    }
}

impl SourceFile {
    /// Opens `path` for reading; a directory or missing file is a clear error.
    pub fn open(path: &Path) -> Result<Self> {
        let buffered = File::open(path).map_err(|e| Error::io(path, "cannot open", e))?;
        let meta = buffered
            .metadata()
            .map_err(|e| Error::io(path, "cannot stat", e))?;
        if meta.is_dir() {
            return Err(Error::invalid(format!(
                "{} is a directory, not a file",
                path.display()
            )));
        }
        if !meta.is_file() {
            return Err(Error::invalid(format!(
                "{} is not a regular file",
                path.display()
            )));
        }
        // tmpfs and some FUSE file systems refuse O_DIRECT (EINVAL): then only
        // buffered reads are possible.
        let direct = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(path)
            .ok();
        Ok(SourceFile {
            fds: FilePair::new(path, buffered, direct, meta.len()),
        })
    }

    /// Reads through descriptors someone else opened (the agent's clients
    /// pass theirs): `buffered` and, where possible, an O_DIRECT twin (see
    /// [`super::reopen_direct`]). `label` names the file in errors.
    pub fn from_descriptors(buffered: File, direct: Option<File>, label: &Path) -> Result<Self> {
        let len = super::fds::regular_file_len(&buffered, label)?;
        Ok(SourceFile {
            fds: FilePair::new(label, buffered, direct, len),
        })
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
        crate::probe::page_cache_residency(self.fd_for(IoMode::Buffered), self.len()).unwrap_or(0.0)
    }
}

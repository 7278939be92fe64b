//! Storage backends that inject faults: failed and short reads, full disks,
//! failed writes and `fsync`s.

use crate::storage::{BlockReader, FilePair, IoMode, ReadBackend, WriteBackend};
use rustix::io::Errno;
use std::io;
use std::sync::Arc;

/// A fault to inject into reads that cover a file offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The read fails with EIO.
    Eio { at: u64 },
    /// The file appears to end at `at`: reads return fewer bytes, as a file
    /// truncated under us would.
    ShortRead { at: u64 },
    /// O_DIRECT reads fail with EINVAL, as on file systems that accept the
    /// flag at open but not the read (older tmpfs, some FUSE).
    RefuseDirect,
}

/// Wraps a backend and injects [`Fault`]s (tests and fault drills).
pub struct FaultyBackend {
    inner: Arc<dyn ReadBackend>,
    faults: Vec<Fault>,
}

impl FaultyBackend {
    pub fn new(inner: Arc<dyn ReadBackend>, faults: Vec<Fault>) -> Self {
        FaultyBackend { inner, faults }
    }
}

impl ReadBackend for FaultyBackend {
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn reader(&self) -> io::Result<Box<dyn BlockReader>> {
        Ok(Box::new(FaultyReader {
            inner: self.inner.reader()?,
            faults: self.faults.clone(),
        }))
    }
}

struct FaultyReader {
    inner: Box<dyn BlockReader>,
    faults: Vec<Fault>,
}

impl BlockReader for FaultyReader {
    fn read_at(
        &mut self,
        file: &FilePair,
        mode: IoMode,
        offset: u64,
        buf: &mut [u8],
    ) -> io::Result<usize> {
        let end = offset + buf.len() as u64;
        let mut limit = buf.len();
        for f in &self.faults {
            match *f {
                Fault::Eio { at } if (offset..end).contains(&at) => {
                    return Err(io::Error::from(Errno::IO))
                }
                Fault::ShortRead { at } if at < end => {
                    limit = limit.min(at.saturating_sub(offset) as usize)
                }
                Fault::RefuseDirect if mode == IoMode::Direct => {
                    return Err(io::Error::from(Errno::INVAL))
                }
                _ => {}
            }
        }
        self.inner.read_at(file, mode, offset, &mut buf[..limit])
    }
}

/// A fault to inject into writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteFault {
    /// Writes reaching past byte `at` of any file fail with ENOSPC, as on a
    /// full file system.
    NoSpace { at: u64 },
    /// The write covering byte `at` fails with EIO.
    Eio { at: u64 },
    /// `fsync` fails with EIO (the kernel lost dirty pages).
    SyncFails,
}

/// Wraps a write backend and injects [`WriteFault`]s.
pub struct FaultyWriteBackend {
    inner: Arc<dyn WriteBackend>,
    faults: Vec<WriteFault>,
}

impl FaultyWriteBackend {
    pub fn new(inner: Arc<dyn WriteBackend>, faults: Vec<WriteFault>) -> Self {
        FaultyWriteBackend { inner, faults }
    }
}

impl WriteBackend for FaultyWriteBackend {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn write_at(&self, file: &FilePair, mode: IoMode, offset: u64, buf: &[u8]) -> io::Result<()> {
        let end = offset + buf.len() as u64;
        for f in &self.faults {
            match *f {
                WriteFault::NoSpace { at } if end > at => {
                    return Err(io::Error::from(Errno::NOSPC))
                }
                WriteFault::Eio { at } if (offset..end).contains(&at) => {
                    return Err(io::Error::from(Errno::IO))
                }
                _ => {}
            }
        }
        self.inner.write_at(file, mode, offset, buf)
    }

    fn sync(&self, file: &FilePair) -> io::Result<()> {
        if self.faults.contains(&WriteFault::SyncFails) {
            return Err(io::Error::from(Errno::IO));
        }
        self.inner.sync(file)
    }
}

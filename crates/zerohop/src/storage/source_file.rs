use super::fds::{blocking, open_regular, Access};
use super::origin::Origin;
use super::stamp::FileStamp;
use super::{BlockReader, FilePair, GuardedMapping};
use crate::{Error, ErrorKind, Result};
use std::fs::File;
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

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

    /// Bytes `offset .. end` (`end` at most the object's length), to be
    /// read in order: the read pipeline fills a run of consecutive windows
    /// from one stream, so the server sees few large requests while host
    /// memory stays in staging slots. The same guarantee as `read_at`:
    /// never bytes of another version.
    fn read_stream(&self, offset: u64, end: u64) -> std::io::Result<Box<dyn Read + Send>>;
}

/// A run of a remote object's bytes, read window by window in file order
/// (see [`RemoteObject::read_stream`]).
pub(crate) struct RemoteStream {
    bytes: Box<dyn Read + Send>,
    /// File offset of the next byte `bytes` yields.
    pos: u64,
    end: u64,
}

impl RemoteStream {
    /// Opens `object`'s bytes `offset .. end`.
    pub(crate) fn open(object: &dyn RemoteObject, offset: u64, end: u64) -> std::io::Result<Self> {
        assert!(offset <= end, "a remote stream's range is reversed");
        Ok(RemoteStream {
            bytes: object.read_stream(offset, end)?,
            pos: offset,
            end,
        })
    }

    /// Fills `buf` from `offset` (at or past every byte read so far: what
    /// lies between is read and dropped), stopping early only where the
    /// stream ends. Returns the number of bytes read into `buf`.
    pub(crate) fn read_at(&mut self, offset: u64, buf: &mut [u8]) -> std::io::Result<usize> {
        assert!(
            offset >= self.pos,
            "remote windows are streamed in file order"
        );
        let gap = offset - self.pos;
        let skipped = std::io::copy(&mut (&mut self.bytes).take(gap), &mut std::io::sink())?;
        self.pos += skipped;
        if skipped < gap {
            return Ok(0);
        }
        let want = buf.len().min(self.end.saturating_sub(offset) as usize);
        let mut got = 0;
        while got < want {
            match self.bytes.read(&mut buf[got..want]) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        self.pos += got as u64;
        Ok(got)
    }
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
    /// A local file's read-only mapping, made by the first transfer that
    /// copies out of it and kept for the next: a file opened once and read
    /// many times (`safe_open`) is mapped once. Or why it could not be.
    mapping: OnceLock<std::result::Result<GuardedMapping, String>>,
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
            mapping: OnceLock::new(),
        }
    }

    fn local(label: &Path, buffered: File, direct: Option<File>, opened: FileStamp) -> Self {
        SourceFile {
            origin: Origin::Local(FilePair::new(label, buffered, direct, opened.len)),
            opened: Some(opened),
            mapping: OnceLock::new(),
        }
    }

    /// The file's read-only mapping (kept: see the field), or why there
    /// is none: a remote object, an empty file, a file that cannot be
    /// mapped.
    pub fn mapping(&self) -> std::result::Result<&GuardedMapping, &str> {
        let made = self.mapping.get_or_init(|| match &self.origin {
            Origin::Local(fds) if !self.is_empty() => {
                GuardedMapping::new(fds.fd_for(IoMode::Buffered), self.len())
                    .map_err(|e| e.to_string())
            }
            Origin::Local(_) => Err("the file is empty".into()),
            Origin::Remote { .. } => Err("a remote object has no mapping".into()),
        });
        made.as_ref().map_err(String::as_str)
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

    /// Fraction of the pages of `ranges` (byte offset, length) resident in
    /// the page cache (0.0 to 1.0; 1.0 where they hold no page; 0.0 for a
    /// remote object).
    pub fn resident_fraction(&self, ranges: &[(u64, u64)]) -> f64 {
        // The kept mapping where there is one: no mapping made to ask.
        if let Some(Ok(map)) = self.mapping.get() {
            return map.resident_fraction_of(ranges).unwrap_or(0.0);
        }
        self.local_fds().map_or(0.0, |fds| {
            let fd = fds.fd_for(IoMode::Buffered);
            super::page_cache_residency(fd, fds.len(), ranges).unwrap_or(0.0)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::{unlinked_file, MemoryObject};

    #[test]
    fn a_file_is_mapped_once_for_all_its_reads_and_an_empty_one_not_at_all() {
        let f = unlinked_file("mapped-once", 3 << 20);
        f.write_all_at(b"zerohop", 1 << 20).unwrap();
        let label = Path::new("mapped-once");
        let source = SourceFile::from_descriptors(f, None, label).unwrap();
        let first = source.mapping().unwrap();
        let mut got = [0u8; 7];
        first.copy_to(1 << 20, &mut got).unwrap();
        assert_eq!(&got, b"zerohop");
        let again = source.mapping().unwrap();
        assert!(std::ptr::eq(first, again), "mapped a second time");
        assert_eq!(first.range(0, 1).0, again.range(0, 1).0);

        let empty = SourceFile::from_descriptors(unlinked_file("mapped-empty", 0), None, label);
        assert_eq!(empty.unwrap().mapping().unwrap_err(), "the file is empty");
        let remote = SourceFile::remote("s3://b/k", 3, Box::new(MemoryObject(vec![1, 2, 3])));
        assert!(remote.mapping().is_err());
    }

    #[test]
    fn a_remote_stream_fills_windows_in_order_skipping_gaps() {
        let object = MemoryObject((0..=255u8).collect());
        let mut s = RemoteStream::open(&object, 10, 200).unwrap();
        let mut buf = [0u8; 8];
        assert_eq!(s.read_at(10, &mut buf).unwrap(), 8);
        assert_eq!(buf, [10, 11, 12, 13, 14, 15, 16, 17]);
        // A gap is read through; the next window starts past it.
        assert_eq!(s.read_at(100, &mut buf[..3]).unwrap(), 3);
        assert_eq!(buf[..3], [100, 101, 102]);
        // The stream's end cuts the last window short.
        assert_eq!(s.read_at(196, &mut buf).unwrap(), 4);
        assert_eq!(buf[..4], [196, 197, 198, 199]);
        assert_eq!(s.read_at(250, &mut buf).unwrap(), 0);
    }

    #[test]
    #[should_panic(expected = "streamed in file order")]
    fn a_remote_stream_never_goes_back() {
        let object = MemoryObject(vec![7; 64]);
        let mut s = RemoteStream::open(&object, 0, 64).unwrap();
        let mut buf = [0u8; 16];
        s.read_at(16, &mut buf).unwrap();
        s.read_at(8, &mut buf).unwrap();
    }
}

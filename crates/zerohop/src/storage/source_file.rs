//! Sources of loads: a local file or a remote object opened for reading
//! ([`SourceFile`]).

use super::file_pair::{
    blocking, open_regular, reopen_direct, Access, BlockReader, FilePair, IoMode,
};
use super::mapping::{page_cache_residency, GuardedMapping};
use super::origin::Origin;
use super::remote::RemoteObject;
use super::stamp::FileStamp;
use crate::{Error, ErrorKind, Result};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

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
        let direct = reopen_direct(&buffered);
        Ok(Self::local(path, buffered, direct, opened))
    }

    /// Reads through descriptors someone else opened (the agent's clients
    /// pass theirs): `buffered` and, where possible, an O_DIRECT twin (see
    /// [`reopen_direct`]). `label` names the file in errors. A
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
            page_cache_residency(fd, fds.len(), ranges).unwrap_or(0.0)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::ReadBackend;
    use crate::test_support::{
        identity, non_blocking, remove_test_file, status_flags, test_file, unlinked_file,
        MemoryObject,
    };
    use rustix::fs::OFlags;

    #[test]
    fn a_file_is_mapped_once_for_all_its_reads_and_an_empty_one_not_at_all() {
        let f = unlinked_file("mapped-once", 3 << 20);
        f.write_all_at(b"zerohop", 1 << 20).unwrap();
        let label = Path::new("mapped-once");
        let source = SourceFile::from_descriptors(f, None, label).unwrap();
        let first = source.mapping().unwrap();
        let mut got = [0u8; 7];
        first.copy_to(1 << 20, &mut got, None).unwrap();
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
    fn a_non_blocking_descriptor_is_read_through_a_blocking_one() {
        let data: Vec<u8> = (0..64 << 10).map(|i| (i % 251) as u8).collect();
        let path = test_file("nonblocking-source", &data);
        let client = non_blocking(&path, false);
        let passed = client.try_clone().unwrap();
        let direct = reopen_direct(&passed);
        let file = SourceFile::from_descriptors(passed, direct, Path::new("label")).unwrap();
        for mode in [IoMode::Buffered, IoMode::Direct] {
            let fd = file.local_fds().unwrap().fd_for(mode);
            assert!(!status_flags(fd).contains(OFlags::NONBLOCK), "{mode:?}");
            assert_eq!(
                status_flags(fd) & OFlags::ACCMODE,
                OFlags::RDONLY,
                "{mode:?}"
            );
            assert_eq!(identity(fd), identity(&client), "{mode:?}");
        }
        assert!(
            status_flags(&client).contains(OFlags::NONBLOCK),
            "the client's own description is left as it was"
        );
        let mut backends: Vec<Box<dyn ReadBackend>> = vec![Box::new(crate::storage::PreadBackend)];
        if let Ok(uring) = crate::storage::UringBackend::probe() {
            backends.push(Box::new(uring));
        }
        for backend in backends {
            let mut got = vec![0u8; data.len()];
            let n = file
                .read_block(
                    backend.reader().unwrap().as_mut(),
                    IoMode::Buffered,
                    0,
                    &mut got,
                )
                .unwrap();
            assert!(n == data.len() && got == data, "{}", backend.name());
        }
        remove_test_file(&path);
    }

    /// What leaves an open file's bytes as they were is no change: another
    /// file renamed over its path (an atomic replace, as zerohop's saves
    /// do) and a chmod, though both change its status change time.
    #[test]
    fn an_atomic_replace_of_the_path_or_a_chmod_is_no_change() {
        use std::os::unix::fs::PermissionsExt;
        let path = test_file("replaced", &[1u8; 4096]);
        let file = SourceFile::open(&path).unwrap();
        // Past the file system's timestamp tick, so a new time would differ.
        std::thread::sleep(std::time::Duration::from_millis(50));
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let other = test_file("replacement", &[2u8; 8192]);
        std::fs::rename(&other, &path).unwrap();
        file.check_unchanged().unwrap();
        remove_test_file(&path);
        // The replacement's directory, empty now, goes too.
        remove_test_file(&other);
    }

    #[test]
    fn a_file_whose_size_reads_as_zero_but_holds_bytes_is_refused() {
        let err = SourceFile::open(Path::new("/proc/self/status")).unwrap_err();
        assert!(
            err.to_string()
                .contains("size reads as 0 bytes but it holds data"),
            "{err}"
        );
        // A really empty file opens, as 0 bytes.
        let empty = test_file("empty", &[]);
        assert_eq!(SourceFile::open(&empty).unwrap().len(), 0);
        remove_test_file(&empty);
    }
}

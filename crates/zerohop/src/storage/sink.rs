//! The write side of storage: files (or remote objects) being written
//! ([`SinkFile`]) and interchangeable write backends of local files
//! (`pwrite`, and a fault-injecting wrapper).

use super::file_pair::{
    blocking, open_regular, regular_file_len, reopen_direct, Access, FilePair, IoMode, DIRECT_ALIGN,
};
use super::in_memory;
use super::origin::Origin;
use crate::{Error, Result};
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Bytes that go to a remote object (an object store's multipart upload),
/// written a whole part at a time: the engine hands it each part straight
/// from a staging slot. Implemented outside the engine (`zerohop-s3`).
pub trait RemoteSink: Send + Sync + std::fmt::Debug {
    /// Bytes per part: every part but the last is this long (the engine's
    /// staging slots must be too).
    fn part_bytes(&self) -> u64;
    /// Writes the part that starts at `offset` (a multiple of
    /// `part_bytes`): `buf` is all of it. Parts may come from several
    /// threads, in any order.
    fn write_part(&self, offset: u64, buf: &[u8]) -> io::Result<()>;
    /// Fills the `len` bytes of the part at `offset` without the engine's
    /// bytes, when a write filter kept none of them (an incremental save
    /// found them unchanged): a store copies them, server-side, from an
    /// object it was told of. A sink that cannot refuses, and the write
    /// fails.
    fn copy_part(&self, offset: u64, len: u64) -> io::Result<()> {
        let _ = len;
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!("the part at {offset} was filtered out, and this object cannot copy it from elsewhere"),
        ))
    }
    /// Makes the object whole and visible, once every part was written.
    /// An object never finished (dropped) never appears.
    fn finish(&self) -> io::Result<()>;
}

/// Host bytes a remote object may hold for its parts (a safetensors
/// header, say): they go out with the part they fall in.
const MAX_REMOTE_HOST_BYTES: usize = 64 << 20;

/// A file being written, sized up front, with an O_DIRECT descriptor when
/// the file system accepts one; or a remote object.
#[derive(Debug)]
pub struct SinkFile {
    origin: Origin<Box<dyn RemoteSink>>,
    /// Whether a write makes the file's directory entry durable too: yes
    /// for files zerohop created; no for descriptors a client passed (the
    /// client made that entry, and its path may mean nothing here), nor
    /// for a remote object.
    sync_parent: bool,
    /// A remote object's host bytes written so far (offset, bytes), laid
    /// over its parts.
    host_bytes: Mutex<Vec<(u64, Vec<u8>)>>,
}

impl std::ops::Deref for SinkFile {
    type Target = Origin<Box<dyn RemoteSink>>;
    fn deref(&self) -> &Self::Target {
        &self.origin
    }
}

impl SinkFile {
    /// A remote object of `len` bytes, named `label` in errors and stats.
    pub fn remote(label: impl Into<PathBuf>, len: u64, sink: Box<dyn RemoteSink>) -> Self {
        SinkFile {
            origin: Origin::Remote {
                label: label.into(),
                len,
                object: sink,
            },
            sync_parent: false,
            host_bytes: Mutex::default(),
        }
    }

    fn local(fds: FilePair, sync_parent: bool) -> Self {
        SinkFile {
            origin: Origin::Local(fds),
            sync_parent,
            host_bytes: Mutex::default(),
        }
    }

    /// Keeps host `bytes` at `offset` of a remote object, to go out with
    /// the part they fall in.
    pub(crate) fn keep_host_bytes(&self, offset: u64, bytes: &[u8]) -> Result<()> {
        assert!(
            self.remote().is_some(),
            "host bytes are kept for remote objects only"
        );
        let mut kept = self.host_bytes.lock().unwrap_or_else(|p| p.into_inner());
        let total: usize = kept.iter().map(|(_, b)| b.len()).sum::<usize>() + bytes.len();
        if total > MAX_REMOTE_HOST_BYTES || offset + bytes.len() as u64 > self.len() {
            return Err(Error::invalid(format!(
                "{}: {} host bytes at {offset} do not fit (at most {MAX_REMOTE_HOST_BYTES} \
                 inside the object)",
                self.path().display(),
                bytes.len()
            )));
        }
        kept.push((offset, bytes.to_vec()));
        Ok(())
    }

    /// Whether kept host bytes fall in the `len` bytes from `start`.
    pub(crate) fn holds_host_bytes_in(&self, start: u64, len: u64) -> bool {
        self.host_bytes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .any(|(at, bytes)| *at < start + len && start < at + bytes.len() as u64)
    }

    /// Lays the kept host bytes that fall in `part` (the object's bytes
    /// from `start`) over it.
    pub(crate) fn overlay_host_bytes(&self, start: u64, part: &mut [u8]) {
        let end = start + part.len() as u64;
        for (at, bytes) in self
            .host_bytes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
        {
            let (from, to) = ((*at).max(start), (at + bytes.len() as u64).min(end));
            if from < to {
                part[(from - start) as usize..(to - start) as usize]
                    .copy_from_slice(&bytes[(from - at) as usize..(to - at) as usize]);
            }
        }
    }

    /// Creates `path` (which must not exist) with length `len`. Bytes never
    /// written read as zeros (the file is sparse there). Opened for reading
    /// too, so that writers may map it (see
    /// [`WriteMapping`](super::WriteMapping)).
    pub fn create_new(path: &Path, len: u64) -> Result<Self> {
        let buffered = OpenOptions::new()
            .read(true)
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
        Ok(Self::local(
            FilePair::new(label, buffered, direct, len),
            false,
        ))
    }

    fn with_direct(path: &Path, buffered: File, len: u64) -> Self {
        // The O_DIRECT twin reopens this very file, write-only like it, not
        // the path again (which may name another file, or a FIFO, by now).
        // Some file systems (older tmpfs, FUSE) refuse O_DIRECT: buffered
        // only. A memory file system gets none: tmpfs takes O_DIRECT (Linux
        // 6.6 on) but copies through its pages all the same, and checkpoint
        // saves into it took 4 - 8 % longer until durable with O_DIRECT
        // writes than without (an H100 machine, two machine starts,
        // `bench/probe/save_configs.py`).
        let direct = if in_memory(&buffered) {
            None
        } else {
            reopen_direct(&buffered)
        };
        Self::local(FilePair::new(path, buffered, direct, len), true)
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

/// A way of writing local files; shared by the write workers.
pub trait WriteBackend: Send + Sync {
    fn name(&self) -> &'static str;
    /// Writes all of `buf` at `offset`. With `IoMode::Direct`, `offset`,
    /// `buf.len()` and the buffer address are multiples of [`DIRECT_ALIGN`].
    fn write_at(&self, file: &FilePair, mode: IoMode, offset: u64, buf: &[u8]) -> io::Result<()>;
    /// Makes the file's data and size durable (`fsync`).
    fn sync(&self, file: &FilePair) -> io::Result<()>;
    /// Whether a file of a memory file system that several workers write
    /// at once may be written through a mapping of it instead of this
    /// backend (see [`WriteMapping`](super::WriteMapping)). No by default:
    /// a backend that injects faults or counts writes sees every write.
    fn allows_mapped_writes(&self) -> bool {
        false
    }
}

/// Blocking `pwrite` from each worker thread.
#[derive(Debug, Clone, Copy, Default)]
pub struct PwriteBackend;

impl WriteBackend for PwriteBackend {
    fn name(&self) -> &'static str {
        "pwrite"
    }

    fn write_at(&self, file: &FilePair, mode: IoMode, offset: u64, buf: &[u8]) -> io::Result<()> {
        file.fd_for(mode).write_all_at(buf, offset)
    }

    fn sync(&self, file: &FilePair) -> io::Result<()> {
        file.fd_for(IoMode::Buffered).sync_all()
    }

    fn allows_mapped_writes(&self) -> bool {
        true
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::{identity, non_blocking, remove_test_file, status_flags, test_file};
    use rustix::fs::OFlags;

    #[test]
    fn a_non_blocking_descriptor_is_written_through_a_blocking_one() {
        let path = test_file("nonblocking-sink", b"");
        let client = non_blocking(&path, true);
        let passed = client.try_clone().unwrap();
        let sink = SinkFile::from_descriptors(passed, None, Path::new("label"), 8192).unwrap();
        let fd = sink.local_fds().unwrap().fd_for(IoMode::Buffered);
        assert!(!status_flags(fd).contains(OFlags::NONBLOCK));
        assert_eq!(status_flags(fd) & OFlags::ACCMODE, OFlags::WRONLY);
        assert!(status_flags(&client).contains(OFlags::NONBLOCK));
        crate::storage::PwriteBackend
            .write_at(
                sink.local_fds().unwrap(),
                IoMode::Buffered,
                4096,
                b"written",
            )
            .unwrap();
        let back = std::fs::read(&path).unwrap();
        assert!(back.len() == 8192 && &back[4096..4103] == b"written");
        remove_test_file(&path);
    }

    /// A file of a memory file system is written without O_DIRECT, one
    /// elsewhere with it where the file system takes it.
    #[test]
    fn memory_file_systems_are_written_buffered() {
        let on_disk = test_file("direct-sink", b"");
        let mut memory_seen = false;
        for dir in [Path::new("/dev/shm"), on_disk.parent().unwrap()] {
            let path = dir.join(format!("zerohop-sink-{}", std::process::id()));
            let Ok(sink) = SinkFile::create_new(&path, 8192) else {
                continue;
            };
            let fd = sink.local_fds().unwrap().fd_for(IoMode::Buffered);
            if in_memory(fd) {
                memory_seen = true;
                assert!(
                    !sink.direct_capable(),
                    "no O_DIRECT on a memory file system"
                );
            } else {
                assert_eq!(sink.direct_capable(), reopen_direct(fd).is_some());
            }
            std::fs::remove_file(&path).unwrap();
        }
        remove_test_file(&on_disk);
        if !memory_seen {
            crate::test_support::skip("no memory file system at /dev/shm");
        }
    }

    #[test]
    fn an_append_only_descriptor_is_refused_for_writes() {
        let path = test_file("append-sink", b"");
        let client = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        let e = SinkFile::from_descriptors(client, None, Path::new("label"), 8192).unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::InvalidInput, "{e}");
        assert!(e.to_string().contains("O_APPEND"), "{e}");
        assert_eq!(
            std::fs::metadata(&path).unwrap().len(),
            0,
            "nothing written"
        );
        remove_test_file(&path);
    }

    /// The O_DIRECT twin of a file opened for update is that very file,
    /// write-only like it (where the file system allows O_DIRECT at all).
    #[test]
    fn the_direct_twin_of_a_sink_is_the_same_file_write_only() {
        let path = test_file("sink-twin", b"");
        let sink = SinkFile::open_for_update(&path, 8192).unwrap();
        // The path now names another file: the twin must not follow it.
        let other = test_file("sink-other", b"other");
        std::fs::rename(&other, &path).unwrap();
        remove_test_file(&other);
        if sink.direct_capable() {
            let fds = sink.local_fds().unwrap();
            let (direct, buffered) = (fds.fd_for(IoMode::Direct), fds.fd_for(IoMode::Buffered));
            assert!(status_flags(direct).contains(OFlags::DIRECT));
            assert_eq!(status_flags(direct) & OFlags::ACCMODE, OFlags::WRONLY);
            assert_eq!(identity(direct), identity(buffered));
        } else {
            crate::test_support::skip("this file system refuses O_DIRECT");
        }
        remove_test_file(&path);
    }
}

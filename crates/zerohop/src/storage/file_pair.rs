//! A file opened twice ([`FilePair`]): through the page cache, and with
//! O_DIRECT where the file system allows it. Sources (loads) and sinks
//! (saves) both hold one, opened by the helpers here: regular files only,
//! never blocking, the O_DIRECT twin reopened from the very same file.
//! Which of the two is used is an [`IoMode`]; a [`ReadBackend`] is a way of
//! reading them.

use super::stamp::{not_regular, FileStamp};
use rustix::fs::OFlags;
use std::fs::{File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

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

/// Alignment used for O_DIRECT offsets, lengths and buffers. 4 KiB satisfies
/// every common logical block size (512 B and 4 KiB).
pub const DIRECT_ALIGN: u64 = 4096;

#[derive(Debug)]
pub struct FilePair {
    path: PathBuf,
    buffered: File,
    direct: Option<File>,
    len: u64,
    /// Set when the file system accepted O_DIRECT at open but refused an
    /// operation (older tmpfs, some FUSE): later ones go buffered.
    direct_refused: AtomicBool,
}

impl FilePair {
    pub(crate) fn new(path: &Path, buffered: File, direct: Option<File>, len: u64) -> Self {
        FilePair {
            path: path.to_owned(),
            buffered,
            direct,
            len,
            direct_refused: AtomicBool::new(false),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether O_DIRECT is possible on this file.
    pub fn direct_capable(&self) -> bool {
        self.direct.is_some() && !self.direct_refused.load(Ordering::Relaxed)
    }

    /// Remembers that O_DIRECT fails here, so later I/O goes buffered.
    pub fn refuse_direct(&self) {
        self.direct_refused.store(true, Ordering::Relaxed);
    }

    /// The descriptor for `mode` (buffered when direct is unavailable).
    pub fn fd_for(&self, mode: IoMode) -> &File {
        match (&self.direct, mode) {
            (Some(f), IoMode::Direct) if self.direct_capable() => f,
            _ => &self.buffered,
        }
    }
}

/// What a file is opened for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Access {
    Read,
    /// Writing in place, creating the file if missing (never truncating).
    WriteOrCreate,
}

/// An O_DIRECT descriptor for the file behind `file`, with the same access
/// mode (never more), reopened through `/proc/self/fd` (see [`reopen`]):
/// O_DIRECT set with `fcntl` would change the caller's own descriptor too.
/// `None` where the file system refuses O_DIRECT.
pub fn reopen_direct(file: &File) -> Option<File> {
    reopen(file, OFlags::DIRECT).ok()
}

/// `file`, or where it is non-blocking, the same file reopened without
/// O_NONBLOCK (keeping O_DIRECT, which changes what I/O does):
/// io_uring fails a read of a non-blocking file with EAGAIN rather than
/// wait for storage, and clearing the flag with `fcntl` would change the
/// description the caller (a client of the agent) shares.
pub fn blocking(file: File, label: &Path) -> crate::Result<File> {
    let flags = rustix::fs::fcntl_getfl(&file)
        .map_err(|e| crate::Error::io(label, "cannot read the flags of", e.into()))?;
    // An O_PATH descriptor is left as it is: it grants no I/O, and `reopen`
    // refuses it.
    if !flags.contains(OFlags::NONBLOCK) || flags.contains(OFlags::PATH) {
        return Ok(file);
    }
    reopen(&file, flags & OFlags::DIRECT)
        .map_err(|e| crate::Error::io(label, "cannot reopen without O_NONBLOCK", e))
}

/// The file behind `file` opened anew through `/proc/self/fd`, so it is
/// that very file even if its path now names another, with the same access
/// mode and the status flags `flags`. The open is non-blocking (it fails
/// at once on a file another process holds a lease on, instead of waiting
/// for the lease to break); that flag is cleared after unless in `flags`.
fn reopen(file: &File, flags: OFlags) -> std::io::Result<File> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::OpenOptionsExt;
    let current = rustix::fs::fcntl_getfl(file)?;
    // An O_PATH descriptor grants no I/O; its access bits read as O_RDONLY,
    // and reopening it would grant reads.
    if current.contains(OFlags::PATH) {
        return Err(rustix::io::Errno::BADF.into());
    }
    let mode = current & OFlags::ACCMODE;
    let reopened = std::fs::OpenOptions::new()
        .read(mode != OFlags::WRONLY)
        .write(mode != OFlags::RDONLY)
        .custom_flags((flags | OFlags::NONBLOCK).bits() as i32)
        .open(format!("/proc/self/fd/{}", file.as_raw_fd()))?;
    rustix::fs::fcntl_setfl(&reopened, flags)?;
    Ok(reopened)
}

/// Opens `path` for `access` and returns it with its stamp, refusing
/// anything but a regular file. The open never blocks: it is made with
/// O_NONBLOCK, so opening a FIFO does not wait for its other end and
/// opening a file another process holds a lease on fails at once instead
/// of waiting for the lease to break; the flag is cleared again once the
/// file is known to be regular.
pub(crate) fn open_regular(path: &Path, access: Access) -> crate::Result<(File, FileStamp)> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut options = OpenOptions::new();
    match access {
        Access::Read => options.read(true),
        Access::WriteOrCreate => options.write(true).create(true).truncate(false),
    };
    let file = options
        .custom_flags(OFlags::NONBLOCK.bits() as i32)
        .open(path)
        .map_err(|e| {
            // A write open of a FIFO without a reader fails (ENXIO), as does
            // one of a directory: name what the path is rather than the errno.
            match std::fs::metadata(path) {
                Ok(meta) => not_regular(&meta, path),
                Err(_) => None,
            }
            .unwrap_or_else(|| crate::Error::io(path, "cannot open", e))
        })?;
    let stamp = FileStamp::of(&file, path)?;
    if access == Access::Read && stamp.len == 0 && holds_bytes(&file) {
        return Err(crate::Error::invalid(format!(
            "{}: its size reads as 0 bytes but it holds data (a /proc or /sys file, \
             whose size the kernel does not know): copy it to a regular file and load that",
            path.display()
        )));
    }
    // With O_NONBLOCK an io_uring read that must wait for storage could fail
    // with EAGAIN instead of waiting.
    rustix::fs::fcntl_getfl(&file)
        .and_then(|flags| rustix::fs::fcntl_setfl(&file, flags - OFlags::NONBLOCK))
        .map_err(|e| crate::Error::io(path, "cannot clear O_NONBLOCK on", e.into()))?;
    Ok((file, stamp))
}

/// Whether a file whose size reads as 0 gives a byte all the same, as the
/// kernel's generated files (/proc, /sys) do.
fn holds_bytes(file: &File) -> bool {
    use std::os::unix::fs::FileExt;
    file.read_at(&mut [0u8; 1], 0).is_ok_and(|n| n > 0)
}

/// The length of `file`, which must be a regular file (`label` names it in
/// errors, with what kind of file it is otherwise).
pub fn regular_file_len(file: &File, label: &Path) -> crate::Result<u64> {
    Ok(FileStamp::of(file, label)?.len)
}

/// A way of reading files; each I/O worker gets its own [`BlockReader`].
pub trait ReadBackend: Send + Sync {
    fn name(&self) -> &'static str;
    fn reader(&self) -> io::Result<Box<dyn BlockReader>>;
}

/// One worker's reader of local files (see
/// [`SourceFile::read_block`](super::SourceFile::read_block)).
pub trait BlockReader: Send {
    /// Fills `buf` from `offset`, stopping early only at end of file.
    /// Returns the number of bytes read. With `IoMode::Direct`, `offset`,
    /// `buf.len()` and the buffer address are multiples of
    /// [`DIRECT_ALIGN`](super::DIRECT_ALIGN).
    fn read_at(
        &mut self,
        file: &FilePair,
        mode: IoMode,
        offset: u64,
        buf: &mut [u8],
    ) -> io::Result<usize>;
}

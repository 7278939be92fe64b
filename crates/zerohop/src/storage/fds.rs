//! A file opened twice: through the page cache, and with O_DIRECT where the
//! file system allows it. Sources (loads) and sinks (saves) both hold one.

use super::IoMode;
use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

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

/// An O_DIRECT descriptor for the file behind `file`, with the same access
/// mode (never more): reopened through `/proc/self/fd`, because O_DIRECT set
/// with `fcntl` would change the caller's own descriptor too. `None` where
/// the file system refuses O_DIRECT.
pub fn reopen_direct(file: &File) -> Option<File> {
    use rustix::fs::OFlags;
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::OpenOptionsExt;
    let mode = rustix::fs::fcntl_getfl(file).ok()? & OFlags::ACCMODE;
    std::fs::OpenOptions::new()
        .read(mode != OFlags::WRONLY)
        .write(mode != OFlags::RDONLY)
        .custom_flags(OFlags::DIRECT.bits() as i32)
        .open(format!("/proc/self/fd/{}", file.as_raw_fd()))
        .ok()
}

/// Opens `path` with `options` and returns it with its length, refusing
/// anything but a regular file. The open never blocks: it is made with
/// O_NONBLOCK (opening a FIFO would otherwise wait for its other end),
/// which is cleared again once the file is known to be regular.
pub(crate) fn open_regular(options: &mut OpenOptions, path: &Path) -> crate::Result<(File, u64)> {
    use rustix::fs::OFlags;
    use std::os::unix::fs::OpenOptionsExt;
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
    let len = regular_file_len(&file, path)?;
    // With O_NONBLOCK an io_uring read that must wait for storage could fail
    // with EAGAIN instead of waiting.
    rustix::fs::fcntl_getfl(&file)
        .and_then(|flags| rustix::fs::fcntl_setfl(&file, flags - OFlags::NONBLOCK))
        .map_err(|e| crate::Error::io(path, "cannot clear O_NONBLOCK on", e.into()))?;
    Ok((file, len))
}

/// The length of `file`, which must be a regular file (`label` names it in
/// errors, with what kind of file it is otherwise).
pub fn regular_file_len(file: &File, label: &Path) -> crate::Result<u64> {
    let meta = file
        .metadata()
        .map_err(|e| crate::Error::io(label, "cannot stat", e))?;
    match not_regular(&meta, label) {
        Some(e) => Err(e),
        None => Ok(meta.len()),
    }
}

/// The error for a file that is not regular, naming what it is; `None` for
/// a regular file.
fn not_regular(meta: &std::fs::Metadata, label: &Path) -> Option<crate::Error> {
    use std::os::unix::fs::FileTypeExt;
    let t = meta.file_type();
    let kind = if t.is_file() {
        return None;
    } else if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO (named pipe)"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else {
        "a file of an unknown kind"
    };
    Some(crate::Error::invalid(format!(
        "{} is {kind}, not a regular file",
        label.display()
    )))
}

//! A file opened twice: through the page cache, and with O_DIRECT where the
//! file system allows it. Sources (loads) and sinks (saves) both hold one.

use super::IoMode;
use std::fs::File;
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
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::OpenOptionsExt;
    // SAFETY: F_GETFL on a descriptor we hold has no memory effects.
    let flags = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GETFL) };
    if flags < 0 {
        return None;
    }
    let mode = flags & libc::O_ACCMODE;
    std::fs::OpenOptions::new()
        .read(mode == libc::O_RDONLY || mode == libc::O_RDWR)
        .write(mode == libc::O_WRONLY || mode == libc::O_RDWR)
        .custom_flags(libc::O_DIRECT)
        .open(format!("/proc/self/fd/{}", file.as_raw_fd()))
        .ok()
}

/// The length of `file`, which must be a regular file (`label` names it in
/// errors).
pub fn regular_file_len(file: &File, label: &Path) -> crate::Result<u64> {
    let meta = file
        .metadata()
        .map_err(|e| crate::Error::io(label, "cannot stat", e))?;
    if !meta.is_file() {
        return Err(crate::Error::invalid(format!(
            "{} is not a regular file",
            label.display()
        )));
    }
    Ok(meta.len())
}

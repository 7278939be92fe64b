//! A file opened twice: through the page cache, and with O_DIRECT where the
//! file system allows it. Sources (loads) and sinks (saves) both hold one.

use super::stamp::FileStamp;
use super::IoMode;
use rustix::fs::OFlags;
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

/// The error for a file that is not regular, naming what it is; `None` for
/// a regular file.
pub(super) fn not_regular(meta: &std::fs::Metadata, label: &Path) -> Option<crate::Error> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::{ReadBackend, SinkFile, SourceFile, WriteBackend};
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};

    /// A fresh file holding `data`, alone in a directory of its own (see
    /// [`remove`]).
    fn test_file(name: &str, data: &[u8]) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("zerohop-fds-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(name);
        std::fs::write(&path, data).unwrap();
        path
    }

    fn remove(test_file: &Path) {
        std::fs::remove_dir_all(test_file.parent().unwrap()).unwrap();
    }

    fn non_blocking(path: &Path, write: bool) -> File {
        OpenOptions::new()
            .read(!write)
            .write(write)
            .custom_flags(OFlags::NONBLOCK.bits() as i32)
            .open(path)
            .unwrap()
    }

    fn flags(file: &File) -> OFlags {
        rustix::fs::fcntl_getfl(file).unwrap()
    }

    fn identity(file: &File) -> (u64, u64) {
        let meta = file.metadata().unwrap();
        (meta.dev(), meta.ino())
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
            assert!(!flags(fd).contains(OFlags::NONBLOCK), "{mode:?}");
            assert_eq!(flags(fd) & OFlags::ACCMODE, OFlags::RDONLY, "{mode:?}");
            assert_eq!(identity(fd), identity(&client), "{mode:?}");
        }
        assert!(
            flags(&client).contains(OFlags::NONBLOCK),
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
        remove(&path);
    }

    #[test]
    fn a_non_blocking_descriptor_is_written_through_a_blocking_one() {
        let path = test_file("nonblocking-sink", b"");
        let client = non_blocking(&path, true);
        let passed = client.try_clone().unwrap();
        let sink = SinkFile::from_descriptors(passed, None, Path::new("label"), 8192).unwrap();
        let fd = sink.local_fds().unwrap().fd_for(IoMode::Buffered);
        assert!(!flags(fd).contains(OFlags::NONBLOCK));
        assert_eq!(flags(fd) & OFlags::ACCMODE, OFlags::WRONLY);
        assert!(flags(&client).contains(OFlags::NONBLOCK));
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
        remove(&path);
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
        remove(&path);
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
        remove(&other);
        if sink.direct_capable() {
            let fds = sink.local_fds().unwrap();
            let (direct, buffered) = (fds.fd_for(IoMode::Direct), fds.fd_for(IoMode::Buffered));
            assert!(flags(direct).contains(OFlags::DIRECT));
            assert_eq!(flags(direct) & OFlags::ACCMODE, OFlags::WRONLY);
            assert_eq!(identity(direct), identity(buffered));
        } else {
            eprintln!("skipped: this file system refuses O_DIRECT");
        }
        remove(&path);
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
        remove(&path);
        // The replacement's directory, empty now, goes too.
        remove(&other);
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
        remove(&empty);
    }
}

//! Helpers for this crate's unit tests.

use rustix::fs::OFlags;
use std::fs::File;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// A fresh file holding `data`, alone in a directory of its own (see
/// [`remove_test_file`]).
pub(crate) fn test_file(name: &str, data: &[u8]) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("zerohop-fds-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, data).unwrap();
    path
}

/// Removes a [`test_file`] with its directory.
pub(crate) fn remove_test_file(test_file: &Path) {
    std::fs::remove_dir_all(test_file.parent().unwrap()).unwrap();
}

/// `path` opened non-blocking (as a client of the agent may pass it), for
/// writing or else for reading.
pub(crate) fn non_blocking(path: &Path, write: bool) -> File {
    std::fs::OpenOptions::new()
        .read(!write)
        .write(write)
        .custom_flags(OFlags::NONBLOCK.bits() as i32)
        .open(path)
        .unwrap()
}

/// The file status flags of `file` (`fcntl(F_GETFL)`).
pub(crate) fn status_flags(file: &File) -> OFlags {
    rustix::fs::fcntl_getfl(file).unwrap()
}

/// The file behind `file`: its device and inode.
pub(crate) fn identity(file: &File) -> (u64, u64) {
    let meta = file.metadata().unwrap();
    (meta.dev(), meta.ino())
}

/// A new file of `len` bytes (sparse), open for reading and writing, its
/// name already removed from the temporary directory: gone when dropped.
pub(crate) fn unlinked_file(tag: &str, len: u64) -> std::fs::File {
    let path = std::env::temp_dir().join(format!(
        "zerohop-{tag}-{}-{:?}",
        std::process::id(),
        std::thread::current().id()
    ));
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)
        .unwrap();
    std::fs::remove_file(&path).unwrap();
    f.set_len(len).unwrap();
    f
}

/// `Rss` of the mapping that holds address `at`, from /proc/self/smaps:
/// how much of it is in this process's page tables (the kernel may have
/// merged the mapping with a neighbour of the same kind).
pub(crate) fn resident_kib(at: usize) -> u64 {
    let rss = smaps_field(at, "Rss:");
    rss.split_whitespace().next().unwrap().parse().unwrap()
}

/// What follows `field` (e.g. `"VmFlags:"`) in the /proc/self/smaps entry
/// of the mapping that holds address `at`.
pub(crate) fn smaps_field(at: usize, field: &str) -> String {
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let holds = |line: &str| {
        let range = line.split_whitespace().next().unwrap_or("");
        let Some((start, end)) = range.split_once('-') else {
            return false;
        };
        match (
            usize::from_str_radix(start, 16),
            usize::from_str_radix(end, 16),
        ) {
            (Ok(start), Ok(end)) => (start..end).contains(&at),
            _ => false,
        }
    };
    let mut lines = smaps.lines().skip_while(|l| !holds(l));
    assert!(lines.next().is_some(), "no mapping holds {at:x}");
    let line = lines
        .find(|l| l.starts_with(field))
        .unwrap_or_else(|| panic!("no {field} in the smaps entry of {at:x}"));
    line[field.len()..].trim().to_string()
}

/// An object in memory, as a remote object: its streams yield a byte per
/// read, as a connection may yield less than asked.
#[derive(Debug)]
pub(crate) struct MemoryObject(pub Vec<u8>);

struct Trickle(std::io::Cursor<Vec<u8>>);

impl std::io::Read for Trickle {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = buf.len().min(1);
        self.0.read(&mut buf[..n])
    }
}

impl crate::storage::RemoteObject for MemoryObject {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<usize> {
        let from = (offset as usize).min(self.0.len());
        let n = buf.len().min(self.0.len() - from);
        buf[..n].copy_from_slice(&self.0[from..from + n]);
        Ok(n)
    }

    fn read_stream(&self, offset: u64, end: u64) -> std::io::Result<Box<dyn std::io::Read + Send>> {
        let part = self.0[offset as usize..end as usize].to_vec();
        Ok(Box::new(Trickle(std::io::Cursor::new(part))))
    }
}

/// Says that a test, or a part of one, cannot run here: where `CI` is set
/// (CI provides what these tests need) this fails; elsewhere it prints a
/// line starting `skipped:` (as the integration tests' `common::skip`).
pub(crate) fn skip(why: &str) {
    assert!(
        std::env::var_os("CI").is_none(),
        "{why}: CI must run this test, not skip it"
    );
    eprintln!("skipped: {why}");
}

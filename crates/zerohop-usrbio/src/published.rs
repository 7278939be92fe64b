//! Iovs other processes can open by id (`hf3fs_iovopen`,
//! `hf3fs_iovopen_device`): a directory of this user's (`ZEROHOP_IOV_DIR`,
//! else `$XDG_RUNTIME_DIR/zerohop-iovs`, else `/tmp/zerohop-iovs-UID`)
//! holds, per published id, a symbolic link to the publishing process's
//! memfd under `/proc/PID/fd/`. Opening the link opens that memfd, so a
//! publication ends with its process, and nothing stays behind to clean.
//!
//! A host iov's memfd is its memory. A device iov's is a small record: the
//! CUDA IPC handle of its allocation, its device, offset and size. Each
//! memfd is named after its id, and an opener checks that name, so a link
//! left by a process that has died never opens another's file.

use rustix::fs::{MemfdFlags, Mode};
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

/// An iov's id as text (file names, memfd names).
pub fn hex(id: &[u8; 16]) -> String {
    zerohop_wire::control::handle_to_hex(id)
}

/// A fresh random id.
pub fn new_id() -> io::Result<[u8; 16]> {
    let mut id = [0u8; 16];
    File::open("/dev/urandom")?.read_exact(&mut id)?;
    Ok(id)
}

/// The name a memfd published under `id` carries.
pub fn memfd_name(id: &[u8; 16]) -> String {
    format!("zerohop-iov-{}", hex(id))
}

fn directory() -> io::Result<PathBuf> {
    let uid = rustix::process::getuid().as_raw();
    let dir = match (
        std::env::var_os("ZEROHOP_IOV_DIR"),
        std::env::var_os("XDG_RUNTIME_DIR"),
    ) {
        (Some(d), _) if !d.is_empty() => PathBuf::from(d),
        (_, Some(d)) if !d.is_empty() => PathBuf::from(d).join("zerohop-iovs"),
        _ => PathBuf::from(format!("/tmp/zerohop-iovs-{uid}")),
    };
    match rustix::fs::mkdir(&dir, Mode::RWXU) {
        Ok(()) | Err(rustix::io::Errno::EXIST) => {}
        Err(e) => return Err(e.into()),
    }
    // Links planted by someone else would hand this process their memory.
    let meta = std::fs::symlink_metadata(&dir)?;
    if !meta.is_dir() || meta.uid() != uid || meta.mode() & 0o022 != 0 {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("{} is not a directory of this user's alone", dir.display()),
        ));
    }
    Ok(dir)
}

/// A publication this process made: its link, removed on unlink or drop.
#[derive(Debug)]
pub struct Publication {
    link: Option<PathBuf>,
}

impl Publication {
    /// Publishes `memfd` (named [`memfd_name`]`(id)`, open for as long as the
    /// publication stands) under `id`; a link whose process has gone is
    /// replaced, a live one is `AlreadyExists`.
    pub fn new(id: &[u8; 16], memfd: &File) -> io::Result<Self> {
        let link = directory()?.join(hex(id));
        let target = format!("/proc/{}/fd/{}", std::process::id(), memfd.as_raw_fd());
        if let Err(e) = std::os::unix::fs::symlink(&target, &link) {
            if e.kind() != io::ErrorKind::AlreadyExists || open(id).is_ok() {
                return Err(e);
            }
            std::fs::remove_file(&link)?;
            std::os::unix::fs::symlink(&target, &link)?;
        }
        Ok(Publication { link: Some(link) })
    }

    pub fn unlink(&mut self) {
        if let Some(link) = self.link.take() {
            let _ = std::fs::remove_file(link);
        }
    }
}

impl Drop for Publication {
    fn drop(&mut self) {
        self.unlink();
    }
}

/// Opens the memfd published under `id`, read-write.
pub fn open(id: &[u8; 16]) -> io::Result<File> {
    let link = directory()?.join(hex(id));
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&link)?;
    let name = std::fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd()))?;
    let expected = format!("/memfd:{}", memfd_name(id));
    let named = name.as_os_str().as_encoded_bytes();
    if !named.starts_with(expected.as_bytes()) {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("iov {} is no longer published", hex(id)),
        ));
    }
    Ok(file)
}

/// What a device iov's record holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceRecord {
    pub device: u32,
    /// The iov's offset in the allocation behind `handle`.
    pub offset: u64,
    pub size: u64,
    pub handle: [u8; 64],
}

const MAGIC: &[u8; 8] = b"zhdviov1";
const RECORD_BYTES: usize = 8 + 4 + 8 + 8 + 64;

impl DeviceRecord {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(RECORD_BYTES);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&self.device.to_le_bytes());
        out.extend_from_slice(&self.offset.to_le_bytes());
        out.extend_from_slice(&self.size.to_le_bytes());
        out.extend_from_slice(&self.handle);
        out
    }

    /// Decodes a record from untrusted bytes.
    pub fn decode(bytes: &[u8]) -> Option<DeviceRecord> {
        if bytes.len() != RECORD_BYTES || &bytes[..8] != MAGIC {
            return None;
        }
        let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
        let record = DeviceRecord {
            device: u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes")),
            offset: u64_at(12),
            size: u64_at(20),
            handle: bytes[28..].try_into().expect("64 bytes"),
        };
        record.offset.checked_add(record.size)?;
        Some(record)
    }

    /// A memfd holding the record, named for `id`.
    pub fn memfd(&self, id: &[u8; 16]) -> io::Result<File> {
        let mut file = File::from(rustix::fs::memfd_create(
            memfd_name(id),
            MemfdFlags::CLOEXEC,
        )?);
        file.write_all(&self.encode())?;
        Ok(file)
    }

    /// The record published under `id`.
    pub fn open(id: &[u8; 16]) -> io::Result<DeviceRecord> {
        let mut bytes = Vec::new();
        open(id)?
            .take(RECORD_BYTES as u64 + 1)
            .read_to_end(&mut bytes)?;
        DeviceRecord::decode(&bytes).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("iov {} is not a device iov", hex(id)),
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_refuse_other_bytes() {
        let r = DeviceRecord {
            device: 3,
            offset: 4096,
            size: 1 << 20,
            handle: [7; 64],
        };
        assert_eq!(DeviceRecord::decode(&r.encode()), Some(r));
        let mut bad = r.encode();
        bad[0] ^= 1;
        assert_eq!(DeviceRecord::decode(&bad), None);
        assert_eq!(DeviceRecord::decode(&r.encode()[1..]), None);
        let wraps = DeviceRecord {
            offset: u64::MAX,
            ..r
        };
        assert_eq!(DeviceRecord::decode(&wraps.encode()), None);
    }

    #[test]
    fn a_publication_opens_while_it_stands_and_not_after() {
        let dir = std::env::temp_dir().join(format!("zerohop-usrbio-pub-{}", std::process::id()));
        // Set for this test binary only; no other test reads it.
        std::env::set_var("ZEROHOP_IOV_DIR", &dir);
        let id = new_id().unwrap();
        let r = DeviceRecord {
            device: 0,
            offset: 0,
            size: 10,
            handle: [1; 64],
        };
        let memfd = r.memfd(&id).unwrap();
        let mut publication = Publication::new(&id, &memfd).unwrap();
        assert_eq!(DeviceRecord::open(&id).unwrap(), r);
        assert!(
            Publication::new(&id, &memfd).is_err(),
            "a live publication is not replaced"
        );
        publication.unlink();
        assert!(open(&id).is_err());
        // A link left by a process that is gone does not open, and is replaced.
        let other = new_id().unwrap();
        let stale = r.memfd(&other).unwrap();
        std::os::unix::fs::symlink(
            format!("/proc/self/fd/{}", stale.as_raw_fd()),
            dir.join(hex(&id)),
        )
        .unwrap();
        assert!(open(&id).is_err(), "the memfd's name is another id's");
        let again = Publication::new(&id, &memfd).unwrap();
        assert_eq!(DeviceRecord::open(&id).unwrap(), r);
        drop(again);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

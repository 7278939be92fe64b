//! Memory shared between a client and the agent: a memfd, sealed against
//! shrinking (so the agent can never touch a page the client truncated away,
//! which would kill it with SIGBUS), mapped by both.

use rustix::fs::{MemfdFlags, SealFlags};
use rustix::mm::{MapFlags, ProtFlags};
use std::fs::File;
use std::io;

/// `f_type` of tmpfs in `statfs` (linux/magic.h).
const TMPFS_MAGIC: u64 = 0x0102_1994;

/// A shared mapping of a memfd, unmapped on drop.
#[derive(Debug)]
pub struct SharedMemory {
    file: File,
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the mapping is plain shared memory; the types that hand out its
// bytes decide how it is accessed across threads.
unsafe impl Send for SharedMemory {}
// SAFETY: as above.
unsafe impl Sync for SharedMemory {}

impl SharedMemory {
    /// Creates `len` bytes of zeroed shared memory, sealed at that size.
    pub fn create(name: &str, len: usize) -> io::Result<Self> {
        if len == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "empty shared memory",
            ));
        }
        let fd = rustix::fs::memfd_create(name, MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)?;
        let file = File::from(fd);
        file.set_len(len as u64)?;
        rustix::fs::fcntl_add_seals(&file, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)?;
        Self::map(file, len)
    }

    /// Maps a memfd received from a peer. Refused unless it is sealed
    /// against shrinking and holds at least `len` bytes.
    pub fn import(file: File, len: usize) -> io::Result<Self> {
        let sealed =
            rustix::fs::fcntl_get_seals(&file).is_ok_and(|s| s.contains(SealFlags::SHRINK));
        if !sealed {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "shared memory must be a memfd sealed with F_SEAL_SHRINK",
            ));
        }
        // Only tmpfs memfds: a hugetlbfs one can still lose pages (SIGBUS
        // when the pool runs dry) despite the seal.
        let on_tmpfs = rustix::fs::fstatfs(&file).is_ok_and(|fs| fs.f_type as u64 == TMPFS_MAGIC);
        if !on_tmpfs {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "shared memory must be a tmpfs memfd",
            ));
        }
        if len == 0 || file.metadata()?.len() < len as u64 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "shared memory is empty or smaller than claimed",
            ));
        }
        Self::map(file, len)
    }

    fn map(file: File, len: usize) -> io::Result<Self> {
        // SAFETY: a fresh shared mapping of `len` bytes of a file at least
        // that long, sealed against shrinking; it aliases no Rust object.
        let ptr = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED,
                &file,
                0,
            )
        }?;
        Ok(SharedMemory {
            file,
            ptr: ptr.cast(),
            len,
        })
    }

    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The memfd, to send to the peer.
    pub fn file(&self) -> &File {
        &self.file
    }
}

impl Drop for SharedMemory {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `map`, which nothing
        // borrows any more (borrows of its bytes cannot outlive `self`).
        let _ = unsafe { rustix::mm::munmap(self.ptr.cast(), self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unsealed_or_short_memory_is_refused() {
        let shm = SharedMemory::create("t", 8192).unwrap();
        let again = SharedMemory::import(shm.file().try_clone().unwrap(), 8192).unwrap();
        assert_eq!(again.len(), 8192);
        assert!(SharedMemory::import(shm.file().try_clone().unwrap(), 8193).is_err());
        let plain = File::open("/proc/self/exe").unwrap();
        assert!(SharedMemory::import(plain, 10).is_err());
    }
}

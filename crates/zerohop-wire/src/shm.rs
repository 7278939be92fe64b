//! Memory shared between a client and the agent: a memfd, sealed against
//! shrinking (so the agent can never touch a page the client truncated away,
//! which would kill it with SIGBUS), mapped by both.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd};

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
        let cname = std::ffi::CString::new(name).map_err(|_| io::ErrorKind::InvalidInput)?;
        // SAFETY: a valid C string; the returned descriptor is owned below.
        let fd = unsafe {
            libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING)
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh descriptor nobody else owns.
        let file = unsafe { File::from_raw_fd(fd) };
        file.set_len(len as u64)?;
        let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
        // SAFETY: plain fcntl on a descriptor we own.
        if unsafe { libc::fcntl(fd, libc::F_ADD_SEALS, seals) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Self::map(file, len)
    }

    /// Maps a memfd received from a peer. Refused unless it is sealed
    /// against shrinking and holds at least `len` bytes.
    pub fn import(file: File, len: usize) -> io::Result<Self> {
        // SAFETY: plain fcntl on a descriptor we own.
        let seals = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_GET_SEALS) };
        if seals < 0 || seals & libc::F_SEAL_SHRINK == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "shared memory must be a memfd sealed with F_SEAL_SHRINK",
            ));
        }
        // Only tmpfs memfds: a hugetlbfs one can still lose pages (SIGBUS
        // when the pool runs dry) despite the seal.
        // SAFETY: a zeroed statfs is valid; fstatfs writes at most its size.
        let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
        // SAFETY: as above, on a descriptor we own.
        if unsafe { libc::fstatfs(file.as_raw_fd(), &mut fs) } != 0
            || fs.f_type != libc::TMPFS_MAGIC
        {
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
        // that long; nothing else in this process aliases it.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
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
        // SAFETY: unmaps exactly the mapping made in `map`.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
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

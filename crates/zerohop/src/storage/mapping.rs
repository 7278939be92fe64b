//! Read-only shared mappings of whole files: what the page-cache DMA route
//! pins, and how page-cache residency is asked (`mincore`).

use rustix::mm::{MapFlags, ProtFlags};
use std::ffi::c_void;
use std::fs::File;
use std::io;

/// A read-only shared mapping of a whole file; unmapped on drop. Its bytes
/// are only ever read by a device's DMA or asked about with `mincore`,
/// never by the CPU (but for the simulated device told to claim DMA, in
/// tests where no file changes): a file truncated while mapped would fault
/// a CPU read (SIGBUS).
#[derive(Debug)]
pub struct FileMapping {
    ptr: *mut c_void,
    len: usize,
}

// SAFETY: the mapping is read-only, and the pointer is only handed to the
// kernel and to devices, never dereferenced here: sharing it across threads
// shares nothing mutable.
unsafe impl Send for FileMapping {}
// SAFETY: as above.
unsafe impl Sync for FileMapping {}

impl FileMapping {
    /// Maps the first `len` bytes of `file` (its length; not 0) read-only.
    pub fn new(file: &File, len: u64) -> io::Result<Self> {
        let len = usize::try_from(len)
            .ok()
            .filter(|&n| n > 0)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "nothing to map"))?;
        // SAFETY: a fresh mapping at an address the kernel picks, so no
        // existing memory is replaced; nothing here creates a reference to it.
        let ptr = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                len,
                ProtFlags::READ,
                MapFlags::SHARED,
                file,
                0,
            )
        }?;
        Ok(FileMapping { ptr, len })
    }

    /// The mapped range for `len` bytes at `start`, clamped to the last
    /// mapped page (reads past it would fault).
    pub fn range(&self, start: u64, len: u64) -> (*const u8, usize) {
        let page = rustix::param::page_size();
        let mapped = self.len.div_ceil(page) * page;
        let start = usize::try_from(start).unwrap_or(usize::MAX).min(mapped);
        let len = usize::try_from(len)
            .unwrap_or(usize::MAX)
            .min(mapped - start);
        // SAFETY: `start <= mapped`, so the pointer stays within (or one past)
        // the mapping's pages.
        (unsafe { self.ptr.cast::<u8>().add(start) }, len)
    }

    /// Fraction of the mapped pages resident in the page cache.
    pub fn resident_fraction(&self) -> io::Result<f64> {
        let pages = self.len.div_ceil(rustix::param::page_size());
        let mut resident = vec![0u8; pages];
        // rustix does not wrap mincore.
        // SAFETY: the range is this live mapping, and `resident` holds one
        // byte per page of it, which is all mincore writes.
        let rc = unsafe { libc::mincore(self.ptr, self.len, resident.as_mut_ptr()) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(resident.iter().filter(|&&b| b & 1 == 1).count() as f64 / pages as f64)
    }
}

impl Drop for FileMapping {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly what `new` mapped; every pin of it has been
        // dropped (pins live only inside a transfer), and no reference into
        // it exists.
        let _ = unsafe { rustix::mm::munmap(self.ptr, self.len) };
    }
}

/// Fraction of the first `len` bytes of `file` resident in the page cache
/// (1.0 for an empty file).
pub fn page_cache_residency(file: &File, len: u64) -> io::Result<f64> {
    if len == 0 {
        return Ok(1.0);
    }
    FileMapping::new(file, len)?.resident_fraction()
}

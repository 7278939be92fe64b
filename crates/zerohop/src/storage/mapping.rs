//! Read-only shared mappings of whole files: what the page-cache DMA route
//! pins and the mapped-copy route copies out of, and how page-cache
//! residency is asked (`mincore`).

use rustix::mm::{MapFlags, ProtFlags};
use std::ffi::c_void;
use std::fs::File;
use std::io;

use super::bus_guard::BusGuard;

/// A read-only shared mapping of a whole file; unmapped on drop. Its bytes
/// are only ever read by a device's DMA or asked about with `mincore`,
/// never by the CPU (but for the simulated device told to claim DMA, in
/// tests where no file changes): a file truncated while mapped would fault
/// a CPU read (SIGBUS). [`GuardedMapping`] is the one the CPU may read.
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

/// A file mapping whose bus errors are absorbed (see `bus_guard`): the CPU
/// may copy out of it, and a copy that met pages a truncation removed
/// fails instead of killing the process.
#[derive(Debug)]
pub struct GuardedMapping {
    // Declared first: dropped (unguarded) before the pages are unmapped.
    guard: BusGuard,
    map: FileMapping,
}

impl GuardedMapping {
    /// Maps the first `len` bytes of `file` (its length; not 0) read-only.
    pub fn new(file: &File, len: u64) -> io::Result<Self> {
        let map = FileMapping::new(file, len)?;
        let guard = BusGuard::new(
            map.ptr.cast(),
            map.len.div_ceil(rustix::param::page_size()) * rustix::param::page_size(),
        )?;
        Ok(GuardedMapping { guard, map })
    }

    /// As [`FileMapping::range`].
    pub fn range(&self, start: u64, len: u64) -> (*const u8, usize) {
        self.map.range(start, len)
    }

    /// Copies `dst.len()` bytes from `offset` of the mapped file into `dst`.
    /// Fails, saying so, if any of them was gone: the file was truncated
    /// while mapped (the bytes in `dst` are then not the file's).
    ///
    /// Another process may write the file meanwhile, as it may during a
    /// `read()`: the bytes are copied as they are, and the load's check of
    /// the file's modification time reports such a change.
    pub fn copy_to(&self, offset: u64, dst: &mut [u8]) -> io::Result<()> {
        let (src, len) = self.map.range(offset, dst.len() as u64);
        if len < dst.len() || offset + dst.len() as u64 > self.map.len as u64 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "read past the end of the mapped file",
            ));
        }
        // SAFETY: `src .. src + len` lies inside the live, guarded mapping
        // (checked above), whose pages stay mapped (a truncated page is
        // replaced by zeros, not unmapped) while `self` lives; `dst` is a
        // distinct, exclusively borrowed buffer of the same length.
        unsafe { std::ptr::copy_nonoverlapping(src, dst.as_mut_ptr(), len) };
        if self.guard.faulted() {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the file was truncated while it was being read",
            ));
        }
        Ok(())
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

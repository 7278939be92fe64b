//! Writing a file through a shared, writable mapping of it: how several
//! workers write one file of a memory file system at once.
//!
//! tmpfs takes the file's lock for every `write()`, so writers of one file
//! wait for each other: 8 GiB into one tmpfs file ran at 2.0 - 3.0 GB/s on
//! the H200 machine whether 1 or 16 threads wrote it, against 28 - 31 GB/s
//! into 16 files (`bench/probe/write_and_pin.c`). Copies into a shared
//! mapping of the file take no such lock.

use super::bus_guard::BusGuard;
use super::FileMapping;
use std::ffi::c_void;
use std::fs::File;
use std::io;

/// A shared, writable mapping of a whole file, whose bus errors are
/// absorbed (see `bus_guard`): a write that meets a page the kernel could
/// not provide (the file system full, the file truncated meanwhile) fails
/// instead of killing the process.
#[derive(Debug)]
pub struct WriteMapping {
    // Unguarded (dropped) before it is unmapped: fields drop in order.
    guard: BusGuard,
    map: FileMapping,
}

impl WriteMapping {
    /// Maps the first `len` bytes of `file` (opened for reading and
    /// writing; its length; not 0) for writing.
    pub fn new(file: &File, len: u64) -> io::Result<Self> {
        let map = FileMapping::new_writable(file, len)?;
        let (ptr, mapped) = map.range(0, u64::MAX);
        let guard = BusGuard::new(ptr, mapped)?;
        Ok(WriteMapping { guard, map })
    }

    /// Copies `bytes` into the file at `offset`. The pages are made
    /// present first, in one call that reports a full file system as an
    /// error (ENOSPC) rather than a bus error; and our page-table entries
    /// for them are dropped after (the file keeps the pages), so tearing
    /// the mapping down at the end costs little and each writer drops what
    /// it wrote, in parallel.
    pub fn write_at(&self, offset: u64, bytes: &[u8]) -> io::Result<()> {
        let (dst, len) = self.map.range(offset, bytes.len() as u64);
        if len < bytes.len() || offset + bytes.len() as u64 > self.map.len() as u64 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a write past the end of the mapped file",
            ));
        }
        let page = rustix::param::page_size();
        let first = dst as usize / page * page;
        let end = (dst as usize + len).next_multiple_of(page);
        // SAFETY: whole pages of this live mapping (the mapping is page
        // aligned and covers whole pages); the advice only faults them in.
        let populated =
            unsafe { libc::madvise(first as *mut c_void, end - first, libc::MADV_POPULATE_WRITE) };
        if populated != 0 {
            let e = io::Error::last_os_error();
            // EFAULT: a page could not be provided (a bus error, had the copy
            // met it). EINVAL: a kernel before 5.14; the copy then faults
            // the pages in itself.
            match e.raw_os_error() {
                Some(libc::EFAULT) => return Err(unwritable()),
                Some(libc::EINVAL) => {}
                _ => return Err(e),
            }
        }
        // SAFETY: `dst .. dst + len` lies inside the live, guarded, writable
        // mapping (checked above), whose pages stay mapped (a vanished page
        // is replaced, not unmapped) while `self` lives; `bytes` is a
        // distinct buffer of the same length. Writers of one file write
        // disjoint ranges (the engine refuses overlapping saves).
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), dst.cast_mut(), len) };
        if self.guard.faulted() {
            return Err(unwritable());
        }
        // Pages at the edges may hold another writer's bytes being copied
        // now: only the whole pages inside the range are dropped.
        self.map.forget_pages(dst, len);
        Ok(())
    }
}

/// A page of a mapped file the kernel could not provide.
fn unwritable() -> io::Error {
    io::Error::new(
        io::ErrorKind::StorageFull,
        "a page of the file could not be provided: the file system is full, \
         or the file was truncated while it was being written",
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::unlinked_file;
    use std::os::unix::fs::FileExt;

    /// Writes from several threads, at unaligned offsets too, land where
    /// they were meant to, and what none wrote stays zeros.
    #[test]
    fn parallel_writes_land_in_the_file() {
        let len = (3 << 20) + 123;
        let f = unlinked_file("write-mapping", len);
        let map = WriteMapping::new(&f, len).unwrap();
        let pieces: Vec<(u64, Vec<u8>)> = (0..6u64)
            .map(|k| {
                let at = k * (512 << 10) + 7;
                let n = if k == 5 { len - at - 100 } else { 300_000 };
                (at, (0..n).map(|i| (i * 7 + k) as u8).collect())
            })
            .collect();
        std::thread::scope(|s| {
            for (at, bytes) in &pieces {
                let map = &map;
                s.spawn(move || map.write_at(*at, bytes).unwrap());
            }
        });
        drop(map);
        let mut expected = vec![0u8; len as usize];
        for (at, bytes) in &pieces {
            expected[*at as usize..*at as usize + bytes.len()].copy_from_slice(bytes);
        }
        let mut back = vec![0u8; len as usize];
        f.read_exact_at(&mut back, 0).unwrap();
        assert!(back == expected, "the file holds other bytes");
    }

    /// A write past the end is refused, and one into a file truncated
    /// under the mapping fails instead of ending the process.
    #[test]
    fn writes_past_the_end_or_into_a_truncated_file_fail() {
        let page = rustix::param::page_size() as u64;
        let f = unlinked_file("write-mapping-truncated", 4 * page);
        let map = WriteMapping::new(&f, 4 * page).unwrap();
        let err = map
            .write_at(3 * page, &vec![1; 2 * page as usize])
            .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
        f.set_len(page).unwrap();
        let err = map.write_at(2 * page, &vec![1; page as usize]).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::StorageFull, "{err}");
    }
}

//! Read-only shared mappings of whole files: what the page-cache DMA route
//! pins and the mapped-copy route copies out of, and how page-cache
//! residency is asked (`mincore`).

use rustix::mm::{MapFlags, ProtFlags};
use std::ffi::c_void;
use std::fs::File;
use std::io;
use std::sync::{mpsc, Mutex};

use super::bus_guard::BusGuard;
use crate::crew::Crew;

/// The least each part of a crew's copy holds: the page-table work and the
/// wake-up of a helper are paid per part (on the reference H200 machine a
/// 256 KiB copy took as long on four threads as on one).
const CREW_PART_BYTES: usize = 256 << 10;

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
        Self::with_protection(file, len, ProtFlags::READ)
    }

    /// Maps the first `len` bytes of `file` (opened for reading and
    /// writing) for writing; only [`super::WriteMapping`] writes through it.
    pub(crate) fn new_writable(file: &File, len: u64) -> io::Result<Self> {
        Self::with_protection(file, len, ProtFlags::READ | ProtFlags::WRITE)
    }

    fn with_protection(file: &File, len: u64, protection: ProtFlags) -> io::Result<Self> {
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
                protection,
                MapFlags::SHARED,
                file,
                0,
            )
        }?;
        Ok(FileMapping { ptr, len })
    }

    /// Bytes mapped (the file's length when mapped).
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
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

    /// Fraction of the pages of `ranges` (byte offset and length, clamped
    /// to the mapping) resident in the page cache; 1.0 where they hold
    /// none. Many pages are sampled ([`RESIDENCY_SAMPLES`] evenly spaced
    /// runs of pages over the ranges): asking for every page of a large
    /// model costs milliseconds on every load, and the answer only picks a
    /// route. A small read asks about its own pages only, not the file's.
    pub fn resident_fraction_of(&self, ranges: &[(u64, u64)]) -> io::Result<f64> {
        let page = rustix::param::page_size();
        let intervals = page_intervals(ranges, page as u64, self.len.div_ceil(page));
        let pages: usize = intervals.iter().map(|(a, b)| b - a).sum();
        if pages == 0 {
            return Ok(1.0);
        }
        let run = RESIDENCY_RUN_PAGES.min(pages);
        let runs = RESIDENCY_SAMPLES.min(pages / run);
        let stride = pages / runs;
        let mut resident = vec![0u8; run];
        let (mut hits, mut asked) = (0, 0);
        let (mut interval, mut before) = (0, 0); // pages of the intervals passed
        for k in 0..runs {
            // The k-th sample, as a page of the intervals laid end to end.
            let at = k * stride;
            while at >= before + intervals[interval].1 - intervals[interval].0 {
                before += intervals[interval].1 - intervals[interval].0;
                interval += 1;
            }
            let (start, end) = intervals[interval];
            let first = start + at - before;
            let n = run.min(end - first);
            // rustix does not wrap mincore.
            // SAFETY: `first + n <= end <=` the mapped pages, inside this
            // live mapping, and `resident` holds at least one byte per page
            // asked, all mincore writes.
            let rc = unsafe {
                libc::mincore(
                    self.ptr.cast::<u8>().add(first * page).cast(),
                    n * page,
                    resident.as_mut_ptr(),
                )
            };
            if rc != 0 {
                return Err(io::Error::last_os_error());
            }
            hits += resident[..n].iter().filter(|&&b| b & 1 == 1).count();
            asked += n;
        }
        Ok(hits as f64 / asked as f64)
    }
}

/// The pages `ranges` (byte offset, length) touch, below `pages`: sorted,
/// disjoint `[first, end)` page intervals, adjacent ones merged.
fn page_intervals(ranges: &[(u64, u64)], page: u64, pages: usize) -> Vec<(usize, usize)> {
    let mut out: Vec<(usize, usize)> = ranges
        .iter()
        .filter(|&&(_, len)| len > 0)
        .map(|&(at, len)| {
            let first = usize::try_from(at / page).unwrap_or(usize::MAX).min(pages);
            let end = usize::try_from(at.saturating_add(len).div_ceil(page))
                .unwrap_or(usize::MAX)
                .min(pages);
            (first, end)
        })
        .filter(|(first, end)| first < end)
        .collect();
    out.sort_unstable();
    let mut merged: Vec<(usize, usize)> = Vec::with_capacity(out.len());
    for (first, end) in out {
        match merged.last_mut() {
            Some(last) if first <= last.1 => last.1 = last.1.max(end),
            _ => merged.push((first, end)),
        }
    }
    merged
}

/// Runs of pages a residency check samples, and pages per run. Each run
/// is one `mincore` call: on the build machine (the reference machine's
/// kernel) 1,024 runs cost 2 - 3 ms of every load of a 4 GiB file (2.5 ms
/// on the H200 at 8 GiB), 128 runs 0.3 ms. 2,048 pages still judge the
/// 0.98 threshold of a partly cached file to about a percent, and a fully
/// cached or uncached file exactly.
const RESIDENCY_SAMPLES: usize = 128;
const RESIDENCY_RUN_PAGES: usize = 16;

/// Bytes of a mapping unmapped per `munmap` call by the unmapping thread.
/// Each call holds the process's memory-map lock for writing while it
/// tears down page tables (about 20 us for 64 MiB whose pages were
/// forgotten, 1 ms where pages are still mapped, on the build machine).
/// Unmapped in one call, an 8 GiB file stalled whatever thread of the
/// caller faulted or allocated next by 3 - 4 ms on the H200 machine, just
/// as `load_file` returned (bench/probe/load_timeline.py).
const UNMAP_PIECE: usize = 64 << 20;
/// The pause between pieces, in which threads waiting for the lock take
/// it: the kernel lets a thread that just released it take it again ahead
/// of waiters, for up to 4 ms.
const UNMAP_PAUSE: std::time::Duration = std::time::Duration::from_micros(50);

impl FileMapping {
    /// Unmaps `UNMAP_PIECE` bytes at a time, pausing between pieces, so
    /// that the caller's other threads are never held up for long.
    fn unmap_in_pieces(mut self) {
        while self.len > UNMAP_PIECE {
            // SAFETY: the first, page-aligned piece of what is still mapped
            // (`UNMAP_PIECE` is a multiple of any page size); `self` then
            // shrinks past it, so nothing is unmapped twice. No pin of the
            // mapping remains (pins live only inside a transfer) and no
            // reference into it exists.
            let _ = unsafe { rustix::mm::munmap(self.ptr, UNMAP_PIECE) };
            // SAFETY: still inside the mapping, which is longer than the piece.
            self.ptr = unsafe { self.ptr.cast::<u8>().add(UNMAP_PIECE).cast() };
            self.len -= UNMAP_PIECE;
            std::thread::sleep(UNMAP_PAUSE);
        }
    }

    /// Drops our page-table entries for the whole pages of `len` bytes at
    /// `ptr` (the page cache keeps the pages). Tearing down the entries of
    /// a large mapping at unmap takes long (about 0.2 s for 8 GiB on the
    /// reference machine) and holds the process's memory-map lock, which
    /// stalls the caller's page faults and allocations meanwhile; done
    /// here, each copying thread drops what it just read, in parallel and
    /// under the lock's shared side. Advice only: errors are ignored.
    pub(crate) fn forget_pages(&self, ptr: *const u8, len: usize) {
        let page = rustix::param::page_size();
        let first = (ptr as usize).next_multiple_of(page);
        let end = (ptr as usize + len) / page * page;
        if end > first {
            // SAFETY: whole pages inside this live mapping, which no
            // reference points into; a concurrent or later access faults
            // them back in from the page cache, unchanged (the mapping is
            // shared: its pages are the file's, and no private copy is lost;
            // dirty pages stay dirty in the file).
            let _ = unsafe {
                rustix::mm::madvise(
                    first as *mut c_void,
                    end - first,
                    rustix::mm::Advice::LinuxDontNeed,
                )
            };
        }
    }
}

impl Drop for FileMapping {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly what is mapped (all that `new` mapped, or
        // what `unmap_in_pieces` left); every pin of it has been dropped
        // (pins live only inside a transfer), and no reference into it
        // exists.
        let _ = unsafe { rustix::mm::munmap(self.ptr, self.len) };
    }
}

/// A file mapping whose bus errors are absorbed (see `bus_guard`): the CPU
/// may copy out of it, and a copy that met pages a truncation removed
/// fails instead of killing the process.
///
/// Dropping it unmaps it on a thread of its own: pages a copy read are
/// dropped from the page tables right after it (`copy_to`), but pages only
/// pinned for DMA are not, and tearing those down takes long.
#[derive(Debug)]
pub struct GuardedMapping {
    /// Both `None` only once dropped.
    guard: Option<BusGuard>,
    map: Option<FileMapping>,
}

impl GuardedMapping {
    /// Maps the first `len` bytes of `file` (its length; not 0) read-only.
    pub fn new(file: &File, len: u64) -> io::Result<Self> {
        let map = FileMapping::new(file, len)?;
        let page = rustix::param::page_size();
        let mapped = map.len.div_ceil(page) * page;
        // Streaming reads: with this advice, dropping our page-table
        // entries (`forget_pages`, unmap) leaves the pages' place on the
        // kernel's LRU lists alone. Without it, the first read of pages
        // written just before (a checkpoint being restored, a model just
        // copied in) moves each one to the active list under a shared lock:
        // 10 - 18 % slower with one thread on the build machine
        // (bench/probe/first_read.py). Advice only: errors are ignored.
        // SAFETY: advice on the mapping just made, which nothing else uses.
        let _ = unsafe { rustix::mm::madvise(map.ptr, mapped, rustix::mm::Advice::Sequential) };
        let guard = BusGuard::new(map.ptr.cast(), mapped)?;
        Ok(GuardedMapping {
            guard: Some(guard),
            map: Some(map),
        })
    }

    fn map(&self) -> &FileMapping {
        self.map.as_ref().expect("a live mapping")
    }

    /// As [`FileMapping::range`].
    pub fn range(&self, start: u64, len: u64) -> (*const u8, usize) {
        self.map().range(start, len)
    }

    /// As [`FileMapping::resident_fraction_of`].
    pub fn resident_fraction_of(&self, ranges: &[(u64, u64)]) -> io::Result<f64> {
        self.map().resident_fraction_of(ranges)
    }

    /// Copies `dst.len()` bytes from `offset` of the mapped file into `dst`.
    /// Fails, saying so, if any of them was gone: the file was truncated
    /// while mapped (the bytes in `dst` are then not the file's).
    ///
    /// Another process may write the file meanwhile, as it may during a
    /// `read()`: the bytes are copied as they are, and the load's check of
    /// the file's modification time reports such a change.
    ///
    /// With `crew`, a copy of at least two `CREW_PART_BYTES` is cut into
    /// parts that its helpers copy beside the caller.
    pub(crate) fn copy_to(
        &self,
        offset: u64,
        dst: &mut [u8],
        crew: Option<&Crew>,
    ) -> io::Result<()> {
        let (src, len) = self.range(offset, dst.len() as u64);
        if len < dst.len() || offset + dst.len() as u64 > self.map().len as u64 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "read past the end of the mapped file",
            ));
        }
        let parts = crew.map_or(1, |c| c.width().min(len / CREW_PART_BYTES).max(1));
        let (src_at, dst_at) = (src as usize, dst.as_mut_ptr() as usize);
        // Parts meet on page boundaries of the mapping, so that each drops
        // every whole page it read.
        let page = rustix::param::page_size();
        let bound = |i: usize| match i {
            0 => 0,
            i if i >= parts => len,
            i => ((src_at + i * (len / parts)).next_multiple_of(page) - src_at).min(len),
        };
        let copy_part = |i: usize| {
            let begin = bound(i);
            let n = bound(i + 1) - begin;
            // SAFETY: `src .. src + len` lies inside the live, guarded
            // mapping (checked above), whose pages stay mapped (a truncated
            // page is replaced by zeros, not unmapped) while `self` lives;
            // `dst` is a distinct, exclusively borrowed buffer of the same
            // length, and parts are disjoint ranges of both.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    (src_at + begin) as *const u8,
                    (dst_at + begin) as *mut u8,
                    n,
                )
            };
            self.map().forget_pages((src_at + begin) as *const u8, n);
        };
        match crew {
            Some(crew) if parts > 1 => crew.run(parts, &copy_part),
            _ => copy_part(0),
        }
        if self.guard.as_ref().is_some_and(BusGuard::faulted) {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the file was truncated while it was being read",
            ));
        }
        Ok(())
    }
}

impl Drop for GuardedMapping {
    fn drop(&mut self) {
        // Unguarded before it is unmapped, so the range is never guarded
        // while something else could be mapped there.
        drop(self.guard.take());
        let Some(map) = self.map.take() else { return };
        static UNMAPPER: Mutex<Option<mpsc::Sender<FileMapping>>> = Mutex::new(None);
        let mut unmapper = UNMAPPER.lock().unwrap_or_else(|p| p.into_inner());
        if unmapper.is_none() {
            let (tx, rx) = mpsc::channel::<FileMapping>();
            let spawned = std::thread::Builder::new()
                .name("zerohop-unmap".into())
                .spawn(move || rx.into_iter().for_each(FileMapping::unmap_in_pieces));
            *unmapper = spawned.ok().map(|_| tx);
        }
        match unmapper.as_ref() {
            // A failed send hands the mapping back, dropped (unmapped) here.
            Some(tx) => drop(tx.send(map)),
            // The thread could not be started: unmapped here.
            None => drop(map),
        }
    }
}

/// Fraction of the pages of `ranges` (byte offset, length) of `file`, a
/// file of `len` bytes, resident in the page cache (1.0 where they hold
/// none).
pub fn page_cache_residency(file: &File, len: u64, ranges: &[(u64, u64)]) -> io::Result<f64> {
    if len == 0 {
        return Ok(1.0);
    }
    FileMapping::new(file, len)?.resident_fraction_of(ranges)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::{resident_kib, smaps_field, unlinked_file};

    #[test]
    fn ranges_become_merged_page_intervals() {
        let ranges = [
            (8192, 1),
            (0, 4097),
            (4096, 10),
            (40_000, 0),
            (50_000, 1 << 40),
        ];
        assert_eq!(page_intervals(&ranges, 4096, 20), vec![(0, 3), (12, 20)]);
        assert!(page_intervals(&[(1 << 20, 5)], 4096, 20).is_empty());
    }
    use std::io::Write;

    /// Sampling sees a file half dropped from the page cache as about half
    /// resident, and small files are asked page by page.
    #[test]
    fn residency_is_sampled_evenly() {
        let path = std::env::temp_dir().join(format!("zerohop-residency-{}", std::process::id()));
        let mut f = std::fs::File::create(&path).unwrap();
        f.write_all(&vec![1u8; 64 << 20]).unwrap();
        f.sync_all().unwrap();
        let f = File::open(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        let whole = [(0, 64 << 20)];
        assert_eq!(page_cache_residency(&f, 64 << 20, &whole).unwrap(), 1.0);
        assert_eq!(page_cache_residency(&f, 5000, &[(0, 5000)]).unwrap(), 1.0);
        rustix::fs::fadvise(
            &f,
            32 << 20,
            std::num::NonZeroU64::new(32 << 20),
            rustix::fs::Advice::DontNeed,
        )
        .unwrap();
        let fraction = page_cache_residency(&f, 64 << 20, &whole).unwrap();
        if fraction == 1.0 {
            crate::test_support::skip("this file system keeps dropped pages (tmpfs?)");
            return;
        }
        assert!((0.45..=0.55).contains(&fraction), "{fraction}");
        // Ranges are asked about alone: the first half, the second, a few
        // pages of each, and scattered small pieces of both.
        let ask = |ranges: &[(u64, u64)]| page_cache_residency(&f, 64 << 20, ranges).unwrap();
        assert_eq!(ask(&[(0, 32 << 20)]), 1.0);
        assert_eq!(ask(&[(32 << 20, 32 << 20)]), 0.0);
        assert_eq!(ask(&[(100, 5000)]), 1.0);
        assert_eq!(ask(&[((48 << 20) + 7, 3)]), 0.0);
        let scattered: Vec<(u64, u64)> = (0..64).map(|i| (i << 20, 4096)).collect();
        assert_eq!(ask(&scattered), 0.5);
        assert_eq!(ask(&[]), 1.0);
    }

    /// Copies out of a guarded mapping deliver the file's bytes, also
    /// where ranges overlap and pages were dropped by an earlier copy, and
    /// leave no more than the edge pages of each copy in our page tables.
    #[test]
    fn copies_deliver_the_file_and_drop_what_they_read() {
        let path = std::env::temp_dir().join(format!("zerohop-guarded-{}", std::process::id()));
        let bytes: Vec<u8> = (0..(4 << 20) + 100u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(&path, &bytes).unwrap();
        let f = File::open(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        let map = GuardedMapping::new(&f, bytes.len() as u64).unwrap();
        let ranges = [
            (0, (1 << 20) + 7),
            ((1 << 20) + 7, 3 << 20),
            (5000, 2 << 20),
            (0, bytes.len()),
        ];
        let crew = Crew::new(3);
        for with_crew in [None, Some(&crew)] {
            for (start, len) in ranges {
                let mut dst = vec![0u8; len];
                map.copy_to(start as u64, &mut dst, with_crew).unwrap();
                assert!(dst == bytes[start..start + len], "bytes at {start}+{len}");
            }
            let resident = resident_kib(map.range(0, 0).0 as usize);
            assert!(
                resident <= 16,
                "{resident} KiB of the mapping still in our page tables (crew: {})",
                with_crew.is_some()
            );
        }
    }

    /// A mapping larger than one unmap piece, of a length that is not a
    /// whole number of pages, is unmapped entirely, piece by piece: no page
    /// of it stays mapped (`mincore` refuses unmapped addresses).
    #[test]
    fn unmapping_in_pieces_unmaps_everything() {
        let len = 2 * UNMAP_PIECE as u64 + 3 * 4096 + 5;
        let f = unlinked_file("unmap", len); // sparse: nothing is written
        let map = FileMapping::new(&f, len).unwrap();
        let base = map.ptr as usize;
        let page = rustix::param::page_size();
        let probes = [0, UNMAP_PIECE, 2 * UNMAP_PIECE, len as usize - 1];
        let mapped = |at: usize| {
            let mut resident = 0u8;
            let addr = (base + at) / page * page;
            // SAFETY: `mincore` only reports on the page at `addr`, mapped
            // or not, into the one byte given.
            unsafe { libc::mincore(addr as *mut c_void, page, &mut resident) == 0 }
        };
        assert!(probes.iter().all(|&at| mapped(at)));
        map.unmap_in_pieces();
        for at in probes {
            assert!(!mapped(at), "byte {at} is still mapped");
        }
    }

    /// Mappings the CPU copies from carry the sequential-read advice
    /// (`sr` in smaps), which spares first reads the LRU activation.
    #[test]
    fn guarded_mappings_are_advised_sequential() {
        let path = std::env::temp_dir().join(format!("zerohop-advised-{}", std::process::id()));
        std::fs::write(&path, vec![7u8; 3 << 20]).unwrap();
        let f = File::open(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        let map = GuardedMapping::new(&f, 3 << 20).unwrap();
        let flags = smaps_field(map.range(0, 0).0 as usize, "VmFlags:");
        assert!(
            flags.split_whitespace().any(|f| f == "sr"),
            "VmFlags: {flags}"
        );
    }

    /// A mapped file truncated under a CPU read: the read finishes, the
    /// guard says it faulted, and the process lives.
    #[test]
    fn a_truncated_mapping_reads_zeros_and_is_reported() {
        let page = rustix::param::page_size();
        let mut file = unlinked_file("bus-guard", 0);
        file.write_all(&vec![7u8; 4 * page]).unwrap();
        let map = FileMapping::new(&file, 4 * page as u64).unwrap();
        let (ptr, len) = map.range(0, 4 * page as u64);
        let guard = BusGuard::new(ptr, len).unwrap();
        let mut out = vec![0u8; len];
        // SAFETY: the mapping is live and guarded.
        unsafe { std::ptr::copy_nonoverlapping(ptr, out.as_mut_ptr(), len) };
        assert!(!guard.faulted());
        assert!(out.iter().all(|&b| b == 7));
        file.set_len(page as u64).unwrap();
        // SAFETY: as above; the pages past the first now fault and are
        // replaced with zeros.
        unsafe { std::ptr::copy_nonoverlapping(ptr, out.as_mut_ptr(), len) };
        assert!(guard.faulted());
        assert!(out[..page].iter().all(|&b| b == 7));
        assert!(out[page..].iter().all(|&b| b == 0));
    }

    /// A copy shared with a crew meets the truncation on helper threads
    /// too, and fails as a copy on one thread does.
    #[test]
    fn a_copy_shared_with_a_crew_reports_a_truncation() {
        let mut file = unlinked_file("crew-truncated", 0);
        file.write_all(&vec![7u8; 2 << 20]).unwrap();
        let map = GuardedMapping::new(&file, 2 << 20).unwrap();
        file.set_len(4096).unwrap();
        let mut dst = vec![1u8; 2 << 20];
        let err = map.copy_to(0, &mut dst, Some(&Crew::new(3))).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
        assert!(dst[..4096].iter().all(|&b| b == 7));
        assert!(dst[4096..].iter().all(|&b| b == 0));
    }

    /// A bus error outside every guarded range still ends the process, as
    /// it would without the handler (checked in a forked child).
    #[test]
    fn other_bus_errors_still_kill() {
        let page = rustix::param::page_size();
        let mut file = unlinked_file("bus-guard", 0);
        file.write_all(&vec![7u8; 2 * page]).unwrap();
        let map = FileMapping::new(&file, 2 * page as u64).unwrap();
        let (ptr, _) = map.range(0, 2 * page as u64);
        crate::storage::bus_guard::install().unwrap();
        file.set_len(0).unwrap();
        // SAFETY: the child only reads the mapping (which faults) and exits;
        // it touches no lock another thread may hold.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            // SAFETY: reading a live mapping; the fault is the point.
            let byte = unsafe { std::ptr::read_volatile(ptr) };
            // SAFETY: _exit is async-signal-safe; reached only if no fault.
            unsafe { libc::_exit(i32::from(byte)) };
        }
        let mut status = 0;
        // SAFETY: waits for the child just forked.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(
            libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGBUS,
            "child status {status:#x}"
        );
    }
}

//! Planning: a transfer is a list of [`Extent`]s; the plan groups them into
//! [`Window`]s, aligned file ranges of at most one staging slot (or one
//! page-cache DMA window), each with the copies that scatter its bytes to
//! device memory, and orders the windows into the pipelines' work.

use crate::device::{DeviceAddr, DeviceBuffer};
use crate::storage::{IoMode, SizedFile, DIRECT_ALIGN};
use crate::{Error, Result};
use std::collections::HashMap;

/// `len` bytes at `file_offset` of file number `file` and the device range
/// at `dst`: its destination on a load, its source on a save.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    pub file: usize,
    pub file_offset: u64,
    pub len: u64,
    pub dst: DeviceAddr,
}

/// One copy out of a window: `len` bytes at `window_offset` go to `dst`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowCopy {
    pub window_offset: u64,
    pub len: u64,
    pub dst: DeviceAddr,
}

/// An aligned file range read in one go, and the copies it feeds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Window {
    pub file: usize,
    /// Aligned start of the read.
    pub start: u64,
    /// Aligned length of the read (the file may end before it).
    pub read_len: u64,
    /// Bytes from `start` the copies need; the read must deliver these.
    pub needed: u64,
    pub copies: Vec<WindowCopy>,
}

impl Window {
    /// Bytes this window delivers to device memory.
    pub fn payload(&self) -> u64 {
        self.copies.iter().map(|c| c.len).sum()
    }

    /// Its copies as the extents they came from, to be cut anew.
    pub fn extents(&self) -> Vec<Extent> {
        self.copies
            .iter()
            .map(|c| Extent {
                file: self.file,
                file_offset: self.start + c.window_offset,
                len: c.len,
                dst: c.dst,
            })
            .collect()
    }
}

/// Gaps up to this size between extents are read through rather than
/// starting a new window: one larger read beats two small ones.
pub(crate) const MAX_GAP: u64 = 256 << 10;

/// A validated transfer: files, extents (each inside its file and its
/// destination buffer), and the buffers that keep destinations alive.
#[derive(Debug, Default)]
pub struct TransferPlan {
    extents: Vec<Extent>,
    /// Destinations by (address, length), kept alive for the transfer.
    buffers: HashMap<(DeviceAddr, usize), DeviceBuffer>,
    bytes: u64,
}

impl TransferPlan {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `len` bytes of `files[file]` at `file_offset` and `dst` at
    /// `dst_offset` (loads copy the first into the second, saves the other
    /// way), checking both ranges.
    pub fn add<F: SizedFile>(
        &mut self,
        files: &[F],
        file: usize,
        file_offset: u64,
        len: u64,
        dst: &DeviceBuffer,
        dst_offset: u64,
    ) -> Result<()> {
        let f = files.get(file).ok_or_else(|| {
            Error::invalid(format!(
                "extent names file #{file}, but only {} are open",
                files.len()
            ))
        })?;
        if file_offset.checked_add(len).is_none_or(|end| end > f.len()) {
            return Err(Error::new(
                crate::ErrorKind::Io,
                format!(
                    "{}: {len} bytes at offset {file_offset} run past the end of the file ({} bytes)",
                    f.path().display(),
                    f.len()
                ),
            ));
        }
        if dst_offset
            .checked_add(len)
            .is_none_or(|end| end > dst.len() as u64)
        {
            return Err(Error::invalid(format!(
                "{len} bytes at offset {dst_offset} exceed the {}-byte destination buffer",
                dst.len()
            )));
        }
        if len > 0 {
            self.extents.push(Extent {
                file,
                file_offset,
                len,
                dst: dst.addr() + dst_offset,
            });
            self.bytes += len;
        }
        self.buffers
            .entry((dst.addr(), dst.len()))
            .or_insert_with(|| dst.clone());
        Ok(())
    }

    /// Refuses a run over fewer files than the plan names: the plan was
    /// checked against the files given to [`TransferPlan::add`], and a
    /// transfer must be given those same files.
    pub fn check_files(&self, count: usize) -> Result<()> {
        match self.extents.iter().map(|e| e.file).max() {
            Some(last) if last >= count => Err(Error::invalid(format!(
                "the plan names file {last}, but the transfer was given {count} file(s): \
                 run it with the files it was planned with"
            ))),
            _ => Ok(()),
        }
    }

    /// The buffers the transfer reads or writes (each once).
    pub(crate) fn buffers(&self) -> impl Iterator<Item = &DeviceBuffer> {
        self.buffers.values()
    }

    /// Refuses plans that write one device byte twice, as a load of these
    /// extents would: two workers would copy into the same bytes at once.
    pub fn check_disjoint_destinations(&self) -> Result<()> {
        let mut ranges: Vec<(DeviceAddr, u64)> =
            self.extents.iter().map(|e| (e.dst, e.len)).collect();
        ranges.sort_unstable();
        for pair in ranges.windows(2) {
            let ((a, a_len), (b, _)) = (pair[0], pair[1]);
            if b < a + a_len {
                return Err(Error::invalid(format!(
                    "two ranges of the load overlap at device address {b:#x}"
                )));
            }
        }
        Ok(())
    }

    /// The destinations' buffers, as (address, length) sorted by address:
    /// one device copy may span several extents only inside one of them
    /// (a buffer lies in one allocation; two may lie side by side).
    pub(crate) fn buffer_ranges(&self) -> Vec<(DeviceAddr, u64)> {
        let mut ranges: Vec<(DeviceAddr, u64)> =
            self.buffers.keys().map(|&(a, n)| (a, n as u64)).collect();
        ranges.sort_unstable();
        ranges
    }

    /// Total bytes the transfer moves.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    pub fn extents(&self) -> &[Extent] {
        &self.extents
    }
}

/// Which of `regions` ((address, length), sorted by address, as
/// [`TransferPlan::buffer_ranges`] gives them) holds all of the `len`
/// bytes at `start`, if one does (of regions that overlap, only the last
/// to begin at or before `start` is asked).
pub fn region_holding(regions: &[(DeviceAddr, u64)], start: DeviceAddr, len: u64) -> Option<usize> {
    let k = regions.partition_point(|r| r.0 <= start).checked_sub(1)?;
    let (base, n) = regions[k];
    let end = start.checked_add(len)?;
    (end <= base.saturating_add(n)).then_some(k)
}

/// The bytes that the mapped-copy windows of `items` deliver.
pub(crate) fn mapped_payload(items: &[WorkItem]) -> u64 {
    items
        .iter()
        .filter(|i| i.route == Route::MappedCopy)
        .map(|i| i.window.payload())
        .sum()
}

/// Splits `extents` (in order) after the first `bytes` bytes, cutting one
/// extent in two where the boundary falls inside it.
pub fn split_extents(extents: &[Extent], bytes: u64) -> (Vec<Extent>, Vec<Extent>) {
    let (mut head, mut tail) = (Vec::new(), Vec::new());
    let mut left = bytes;
    for e in extents {
        if left >= e.len {
            left -= e.len;
            head.push(*e);
        } else if left > 0 {
            head.push(Extent { len: left, ..*e });
            tail.push(Extent {
                file_offset: e.file_offset + left,
                len: e.len - left,
                dst: e.dst + left,
                ..*e
            });
            left = 0;
        } else {
            tail.push(*e);
        }
    }
    (head, tail)
}

/// See [`TransferPlan::windows`]. Windows never overlap: each lies inside
/// one `cap`-aligned chunk of its file, and windows in one chunk are
/// separated by gaps wider than `MAX_GAP` (256 KiB). (Page-cache DMA pins each
/// window's pages, and a page may be pinned only once at a time.)
pub fn windows(extents: &[Extent], cap: u64, align: u64) -> Vec<Window> {
    assert!(
        align.is_power_of_two() && cap >= align && cap.is_multiple_of(align),
        "bad window geometry"
    );
    // Cut extents at chunk boundaries: (file, chunk, file position, len, dst).
    let mut pieces: Vec<(usize, u64, u64, u64, DeviceAddr)> = Vec::with_capacity(extents.len());
    for e in extents {
        let (mut pos, mut dst, mut left) = (e.file_offset, e.dst, e.len);
        while left > 0 {
            let chunk = pos / cap;
            let n = left.min((chunk + 1) * cap - pos);
            pieces.push((e.file, chunk, pos, n, dst));
            pos += n;
            dst += n;
            left -= n;
        }
    }
    pieces.sort_unstable_by_key(|&(file, chunk, pos, _, _)| (file, chunk, pos));
    let mut out: Vec<Window> = Vec::new();
    let mut current: Option<(usize, u64, u64)> = None; // file, chunk, end of data
    for (file, chunk, pos, len, dst) in pieces {
        let joins =
            current.is_some_and(|(f, c, end)| f == file && c == chunk && pos <= end + MAX_GAP);
        if !joins {
            out.push(Window {
                file,
                start: pos / align * align,
                read_len: 0,
                needed: 0,
                copies: Vec::new(),
            });
        }
        let w = out.last_mut().expect("a window exists");
        w.copies.push(WindowCopy {
            window_offset: pos - w.start,
            len,
            dst,
        });
        w.needed = w.needed.max(pos + len - w.start);
        w.read_len = w.needed.div_ceil(align) * align;
        current = Some((file, chunk, w.start + w.needed));
    }
    out
}

/// How one window's bytes reach the device (`staged`, `mapped` and
/// `page-cache DMA` in stats).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Route {
    /// Read into a staging slot (buffered or O_DIRECT), then copied.
    Staged(IoMode),
    /// Copied by the CPU out of the file's (guarded) mapping into a staging
    /// slot, then copied: no system call per window, and no kernel copy.
    MappedCopy,
    /// Copied by the device straight from the file's pinned page-cache pages.
    PageCacheDma,
}

impl Route {
    /// Whether the route reads the file through a mapping.
    pub(crate) fn maps_file(self) -> bool {
        matches!(self, Route::MappedCopy | Route::PageCacheDma)
    }
}

/// Buffered reads into staging slots: the route for hot files that cannot
/// be mapped.
pub(crate) const STAGED: Route = Route::Staged(IoMode::Buffered);

/// A unit of work for a read pipeline worker: a window and its route.
pub(crate) struct WorkItem {
    pub window: Window,
    pub route: Route,
}

/// The largest window of each route.
#[derive(Debug, Clone, Copy)]
pub(crate) struct WindowCaps {
    /// Staged reads: one staging slot.
    pub slot: u64,
    /// Mapped copies: at most a slot; smaller ones stay in the CPU's cache
    /// between the copy into the slot and the device's read of it.
    pub mapped: u64,
    /// Page-cache DMA: the pages pinned at once.
    pub dma: u64,
}

/// The windows of a load, each file's extents cut for its route
/// (`routes[file]`) to its cap in `caps`; staged windows aligned for
/// O_DIRECT, the others to whole pages. In file order.
pub(crate) fn work_items(extents: &[Extent], routes: &[Route], caps: WindowCaps) -> Vec<WorkItem> {
    let page = rustix::param::page_size() as u64;
    let mut items = Vec::new();
    for route in [STAGED, Route::MappedCopy, Route::PageCacheDma] {
        let (cap, align) = match route {
            Route::Staged(_) => (caps.slot, DIRECT_ALIGN),
            Route::MappedCopy => (caps.mapped.min(caps.slot).max(page), page),
            Route::PageCacheDma => (caps.dma.max(page), page),
        };
        let mine: Vec<Extent> = extents
            .iter()
            .filter(|e| std::mem::discriminant(&routes[e.file]) == std::mem::discriminant(&route))
            .copied()
            .collect();
        items.extend(windows(&mine, cap, align).into_iter().map(|w| WorkItem {
            route: routes[w.file],
            window: w,
        }));
    }
    items.sort_by_key(|i| (i.window.file, i.window.start));
    items
}

/// `items` with the mapped-copy windows of their last `tail` payload bytes
/// cut into windows of at most `piece` bytes. A transfer ends once its
/// last copies into the device have run, after every worker's last copy
/// out of a mapping: small windows there leave less on the device's queue
/// at the end (16 workers' 4 MiB slots take 1.2 ms at 55 GB/s, while the
/// CPUs wait), and less difference between the workers' last windows.
pub(crate) fn taper(items: Vec<WorkItem>, tail: u64, piece: u64) -> Vec<WorkItem> {
    let page = rustix::param::page_size() as u64;
    let piece = (piece / page).max(1) * page;
    let mut left = tail;
    let mut out: Vec<WorkItem> = Vec::with_capacity(items.len());
    for item in items.into_iter().rev() {
        if left == 0 || item.route != Route::MappedCopy {
            out.push(item);
            continue;
        }
        left = left.saturating_sub(item.window.payload());
        out.extend(
            windows(&item.window.extents(), piece, page)
                .into_iter()
                .rev()
                .map(|window| WorkItem {
                    window,
                    route: item.route,
                }),
        );
    }
    out.reverse();
    out
}

/// `file`'s windows replaced by one window per `cap`-aligned chunk of its
/// `len` bytes, each with the copies that fall in it: a remote object's
/// parts are written whole (what no copy fills is zeros, or host bytes).
/// Other files' windows are kept.
pub(crate) fn whole_chunks(windows: Vec<Window>, file: usize, len: u64, cap: u64) -> Vec<Window> {
    let (mine, mut out): (Vec<Window>, Vec<Window>) =
        windows.into_iter().partition(|w| w.file == file);
    let mut tiles: Vec<Window> = (0..len.div_ceil(cap))
        .map(|k| {
            let start = k * cap;
            let n = cap.min(len - start);
            Window {
                file,
                start,
                read_len: n,
                needed: n,
                copies: Vec::new(),
            }
        })
        .collect();
    for w in mine {
        // Every window lies inside one chunk (see `windows`).
        let tile = &mut tiles[(w.start / cap) as usize];
        for c in w.copies {
            let window_offset = w.start + c.window_offset - tile.start;
            assert!(
                window_offset + c.len <= tile.needed,
                "a copy past its chunk"
            );
            tile.copies.push(WindowCopy { window_offset, ..c });
        }
    }
    out.extend(tiles);
    out
}

/// Orders windows round-robin across files, so workers write several files
/// at once (writes into one file serialize on some file systems).
pub(crate) fn interleave_files(windows: Vec<Window>) -> Vec<Window> {
    let mut per_file: Vec<std::collections::VecDeque<Window>> = Vec::new();
    for w in windows {
        if per_file.len() <= w.file {
            per_file.resize_with(w.file + 1, Default::default);
        }
        per_file[w.file].push_back(w);
    }
    let mut out = Vec::new();
    while per_file.iter().any(|q| !q.is_empty()) {
        for q in &mut per_file {
            out.extend(q.pop_front());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ext(file: usize, off: u64, len: u64, dst: u64) -> Extent {
        Extent {
            file,
            file_offset: off,
            len,
            dst,
        }
    }

    #[test]
    fn overlapping_destinations_are_refused() {
        let plan = |extents| TransferPlan {
            extents,
            ..TransferPlan::default()
        };
        // Adjacent ranges, in any order, from any files, are fine.
        let ok = plan(vec![ext(1, 0, 100, 0x2064), ext(0, 0, 100, 0x2000)]);
        assert!(ok.check_disjoint_destinations().is_ok());
        let err = plan(vec![ext(0, 0, 100, 0x2000), ext(1, 500, 10, 0x2063)])
            .check_disjoint_destinations()
            .unwrap_err();
        assert_eq!(err.kind(), crate::ErrorKind::InvalidInput);
        assert!(err.to_string().contains("0x2063"), "{err}");
    }

    /// Every byte of every extent is copied exactly once, from the right file
    /// position, and windows respect the cap and alignment.
    fn check(extents: &[Extent], cap: u64, align: u64) -> Vec<Window> {
        let ws = windows(extents, cap, align);
        for (i, a) in ws.iter().enumerate() {
            for b in &ws[i + 1..] {
                let disjoint = a.file != b.file
                    || a.start + a.read_len <= b.start
                    || b.start + b.read_len <= a.start;
                assert!(disjoint, "windows overlap: {a:?} {b:?}");
            }
        }
        let mut covered: Vec<(usize, u64, u64, u64)> = Vec::new(); // file, file pos, len, dst
        for w in &ws {
            assert_eq!(w.start % align, 0);
            assert_eq!(w.read_len % align, 0);
            assert!(w.read_len <= cap && w.needed <= w.read_len);
            for c in &w.copies {
                assert!(c.window_offset + c.len <= w.needed);
                covered.push((w.file, w.start + c.window_offset, c.len, c.dst));
            }
        }
        for e in extents.iter().filter(|e| e.len > 0) {
            // Walk the extent through the copies that reconstruct it in order.
            let (mut pos, mut dst, mut left) = (e.file_offset, e.dst, e.len);
            while left > 0 {
                let i = covered
                    .iter()
                    .position(|&(f, p, _, d)| f == e.file && p == pos && d == dst)
                    .unwrap_or_else(|| panic!("byte {pos} of {e:?} not copied"));
                let (_, _, n, _) = covered.swap_remove(i);
                pos += n;
                dst += n;
                left -= n;
            }
        }
        assert!(covered.is_empty(), "extra copies: {covered:?}");
        ws
    }

    #[test]
    fn one_large_extent_is_cut_into_slot_sized_windows() {
        let ws = check(&[ext(0, 100, 10_000, 1 << 20)], 4096, 512);
        assert_eq!(ws.len(), 3);
        assert_eq!((ws[0].start, ws[0].needed), (0, 4096));
        assert_eq!(ws[2].start + ws[2].needed, 10_100);
    }

    #[test]
    fn adjacent_small_extents_share_a_window() {
        let es: Vec<_> = (0..10)
            .map(|i| ext(0, i * 100, 100, 50_000 + i * 1000))
            .collect();
        let ws = check(&es, 1 << 20, 4096);
        assert_eq!(ws.len(), 1);
        assert_eq!(ws[0].copies.len(), 10);
    }

    #[test]
    fn far_apart_extents_and_files_get_their_own_windows() {
        let ws = check(
            &[
                ext(0, 0, 10, 0),
                ext(0, 10 << 20, 10, 100),
                ext(1, 0, 10, 200),
            ],
            1 << 20,
            4096,
        );
        assert_eq!(ws.len(), 3);
    }

    #[test]
    fn zero_length_and_unaligned_and_overlapping_extents() {
        check(
            &[
                ext(0, 3, 0, 0),
                ext(0, 4097, 5000, 10_000),
                ext(0, 5000, 3, 90_000),
                ext(2, 123_457, 70_001, 200_000),
            ],
            8192,
            4096,
        );
    }

    #[test]
    fn split_cuts_one_extent_at_the_boundary() {
        let es = [
            ext(0, 0, 100, 1000),
            ext(1, 50, 100, 5000),
            ext(0, 500, 10, 9000),
        ];
        let (h, t) = split_extents(&es, 130);
        assert_eq!(h, vec![ext(0, 0, 100, 1000), ext(1, 50, 30, 5000)]);
        assert_eq!(t, vec![ext(1, 80, 70, 5030), ext(0, 500, 10, 9000)]);
        let (h, t) = split_extents(&es, 1000);
        assert_eq!((h.len(), t.len()), (3, 0));
    }

    #[test]
    fn an_extent_inside_an_earlier_one_joins_its_window() {
        // The second extent starts before the first one's last window.
        let ws = check(
            &[ext(0, 1000, 30_000, 0), ext(0, 5000, 100, 90_000)],
            16384,
            4096,
        );
        assert_eq!(ws.len(), 2);
    }

    #[test]
    fn pseudo_random_extent_sets() {
        let mut r = 0x1234_5678_9abc_def1u64;
        let mut next = |m: u64| {
            r ^= r << 13;
            r ^= r >> 7;
            r ^= r << 17;
            r % m
        };
        for _ in 0..200 {
            let n = 1 + next(40);
            let es: Vec<_> = (0..n)
                .map(|i| ext(next(3) as usize, next(1 << 22), next(300_000), i << 24))
                .collect();
            check(&es, 1 << (13 + next(8)), 1 << (9 + next(4)));
        }
    }

    #[test]
    fn taper_cuts_only_the_last_mapped_windows_finer() {
        let page = rustix::param::page_size() as u64;
        let cap = 16 * page;
        let caps = WindowCaps {
            slot: cap,
            mapped: cap,
            dma: cap,
        };
        // 64 pages of one file, mapped: four windows of 16 pages.
        let extents = [ext(0, 0, 64 * page, 0)];
        let items = work_items(&extents, &[Route::MappedCopy], caps);
        assert_eq!(items.len(), 4);
        // The last 20 pages in windows of 4: the last window in four, the
        // one before it too (the tail reaches into it), the first two whole.
        let tapered = taper(items, 20 * page, 4 * page);
        let sizes: Vec<u64> = tapered.iter().map(|i| i.window.needed / page).collect();
        assert_eq!(sizes, [16, 16, 4, 4, 4, 4, 4, 4, 4, 4]);
        // Every byte once, in file order, to the same place.
        let mut at = 0;
        for i in &tapered {
            for c in &i.window.copies {
                assert_eq!((i.window.start + c.window_offset, c.dst), (at, at));
                at += c.len;
            }
        }
        assert_eq!(at, 64 * page);
        let none = work_items(&extents, &[Route::MappedCopy], caps);
        assert_eq!(taper(none, 0, 4 * page).len(), 4, "no tail");
        // Staged windows are kept as they are.
        let staged = work_items(&extents, &[STAGED], caps);
        assert_eq!(taper(staged, 64 * page, 4 * page).len(), 4);
    }
}

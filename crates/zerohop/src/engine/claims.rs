//! How the read pipeline's windows are handed to workers: a claim is a
//! range of work items that one worker takes at once.

use crate::plan::{mapped_payload, Route, Window, WorkItem, MAX_GAP};
use crate::storage::SourceFile;
use std::ops::Range;

/// What workers take at a time:
/// - a remote object's consecutive windows together, to be read from one
///   request (see [`RemoteStream`](crate::storage::RemoteStream)), while
///   they lie at most [`MAX_GAP`] apart and span at most `max_span` bytes,
///   or less where that leaves fewer claims than `streams` (but never less
///   than a window);
/// - with `gather`, consecutive mapped-copy windows of one file whose
///   copies take at most `gather.most` bytes together (`gather.tail_most`
///   in the last `gather.tail` bytes: see `plan::taper`): the worker
///   copies them one after another into one slot (see `read_pipeline`), so
///   that the scattered pieces of a sliced read cost a slot, a fence and
///   few device copies per slot rather than per piece;
/// - any other window alone.
pub(super) fn claims(
    items: &[WorkItem],
    files: &[SourceFile],
    max_span: u64,
    streams: usize,
    gather: Option<Gather>,
) -> Vec<Range<usize>> {
    let remote = |w: &Window| files[w.file].remote().is_some();
    let remote_bytes: u64 = items
        .iter()
        .filter(|i| remote(&i.window))
        .map(|i| i.window.needed)
        .sum();
    let span = (remote_bytes / streams.max(1) as u64).min(max_span);
    let mut out: Vec<Range<usize>> = Vec::new();
    // Bytes the copies of the last claim take, where it gathers, and those
    // of the mapped-copy windows from this one on.
    let mut gathered = 0;
    let mut mapped_left = mapped_payload(items);
    for (i, item) in items.iter().enumerate() {
        let w = &item.window;
        let joins_remote = remote(w)
            && out.last().is_some_and(|c| {
                let (first, prev) = (&items[c.start].window, &items[c.end - 1].window);
                let prev_end = prev.start + prev.needed;
                prev.file == w.file
                    && w.start >= prev_end
                    && w.start - prev_end <= MAX_GAP
                    && w.start + w.needed - first.start <= span
            });
        let gathers = |c: &Range<usize>| {
            let prev = &items[c.end - 1];
            gather.is_some_and(|g| {
                let most = if mapped_left <= g.tail {
                    g.tail_most
                } else {
                    g.most
                };
                item.route == Route::MappedCopy
                    && prev.route == Route::MappedCopy
                    && prev.window.file == w.file
                    && gathered + w.payload() <= most
            })
        };
        match out.last_mut() {
            Some(c) if joins_remote || gathers(c) => {
                c.end = i + 1;
                gathered += w.payload();
            }
            _ => {
                out.push(i..i + 1);
                gathered = w.payload();
            }
        }
        if item.route == Route::MappedCopy {
            mapped_left -= w.payload();
        }
    }
    out
}

/// How [`claims`] gathers mapped-copy windows.
#[derive(Debug, Clone, Copy)]
pub(super) struct Gather {
    /// Bytes of copies one claim takes at most.
    pub most: u64,
    /// The mapped-copy bytes at the end of the transfer that are gathered
    /// into claims of at most `tail_most` bytes.
    pub tail: u64,
    pub tail_most: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{work_items, Extent, Route, WindowCaps, STAGED};
    use crate::test_support::MemoryObject;

    const K: u64 = 1 << 10;

    fn remote(len: u64) -> SourceFile {
        let object = MemoryObject(vec![0; len as usize]);
        SourceFile::remote("s3://b/k", len, Box::new(object))
    }

    fn extent(file: usize, file_offset: u64, len: u64) -> Extent {
        Extent {
            file,
            file_offset,
            len,
            dst: file_offset,
        }
    }

    #[test]
    fn a_remote_objects_consecutive_windows_are_claimed_together() {
        let local = std::env::temp_dir().join(format!("zh-claims-{}", std::process::id()));
        std::fs::write(&local, vec![0u8; 128 * K as usize]).unwrap();
        let files = [remote(1024 * K), SourceFile::open(&local).unwrap()];
        std::fs::remove_file(&local).unwrap();
        // 600 KiB, a gap wider than MAX_GAP, 24 KiB more; the local file.
        let extents = [
            extent(0, 0, 300 * K),
            extent(0, 300 * K, 300 * K),
            extent(0, 1000 * K, 24 * K),
            extent(1, 0, 128 * K),
        ];
        let caps = WindowCaps {
            slot: 64 * K,
            mapped: 64 * K,
            dma: 64 * K,
        };
        let items = work_items(&extents, &[STAGED, STAGED], caps);
        let windows = |c: &Range<usize>| -> Vec<(usize, u64)> {
            items[c.clone()]
                .iter()
                .map(|i| (i.window.file, i.window.start / K))
                .collect()
        };
        // One stream: claims of at most 256 KiB, cut at the gap; the local
        // file's windows alone.
        let got: Vec<Vec<(usize, u64)>> = claims(&items, &files, 256 * K, 1, None)
            .iter()
            .map(windows)
            .collect();
        let remote_runs = [
            &[0, 64, 128, 192][..],
            &[256, 320, 384, 448],
            &[512, 576],
            &[1000],
        ];
        let mut want: Vec<Vec<(usize, u64)>> = remote_runs
            .iter()
            .map(|run| run.iter().map(|&at| (0, at)).collect())
            .collect();
        want.extend([vec![(1, 0)], vec![(1, 64)]]);
        assert_eq!(got, want);
        // Many streams: a window each, so that every stream gets work.
        let many = claims(&items, &files, 256 * K, 64, None);
        assert_eq!(many.len(), items.len());
    }

    #[test]
    fn small_mapped_windows_of_one_file_are_gathered_up_to_the_bytes_given() {
        let dir = std::env::temp_dir().join(format!("zh-gather-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let paths = [dir.join("a"), dir.join("b")];
        for p in &paths {
            std::fs::write(p, vec![0u8; 1024 * K as usize]).unwrap();
        }
        let files = [
            SourceFile::open(&paths[0]).unwrap(),
            SourceFile::open(&paths[1]).unwrap(),
        ];
        std::fs::remove_dir_all(&dir).unwrap();
        // Pieces of 40 KiB, further apart than MAX_GAP: four of file 0,
        // then two of file 1.
        let mut extents: Vec<Extent> = (0..4).map(|i| extent(0, i * 300 * K, 40 * K)).collect();
        extents.extend([extent(1, 0, 40 * K), extent(1, 600 * K, 40 * K)]);
        let caps = WindowCaps {
            slot: 128 * K,
            mapped: 128 * K,
            dma: 128 * K,
        };
        let mapped = [Route::MappedCopy, Route::MappedCopy];
        let items = work_items(&extents, &mapped, caps);
        assert_eq!(items.len(), 6, "each piece is a window of its own");
        let sizes = |c: &[Range<usize>]| -> Vec<usize> { c.iter().map(|c| c.len()).collect() };
        let gather = Gather {
            most: 128 * K,
            tail: 0,
            tail_most: 0,
        };
        // 40 KiB pieces, 128 KiB at most per claim: three, then one, then
        // file 1's two (never one claim across files).
        assert_eq!(
            sizes(&claims(&items, &files, 256 * K, 4, Some(gather))),
            [3, 1, 2]
        );
        assert_eq!(
            sizes(&claims(&items, &files, 256 * K, 4, None)),
            [1; 6],
            "without gathering, each window alone"
        );
        // The last 100 KiB: claims of at most 64 KiB there.
        let tapered = Gather {
            tail: 100 * K,
            tail_most: 64 * K,
            ..gather
        };
        assert_eq!(
            sizes(&claims(&items, &files, 256 * K, 4, Some(tapered))),
            [3, 1, 1, 1]
        );
        // Staged windows are never gathered.
        let staged = work_items(&extents, &[STAGED, STAGED], caps);
        assert_eq!(
            sizes(&claims(&staged, &files, 256 * K, 4, Some(gather))),
            [1; 6]
        );
    }
}

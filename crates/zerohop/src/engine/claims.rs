//! How the read pipeline's windows are handed to workers: a claim is a
//! range of work items that one worker takes at once.

use crate::plan::{Window, WorkItem, MAX_GAP};
use crate::storage::SourceFile;
use std::ops::Range;

/// What workers take at a time: each local window alone; a remote object's
/// consecutive windows together, to be read from one request (see
/// [`RemoteStream`](crate::storage::RemoteStream)), while they lie at most
/// [`MAX_GAP`] apart and span at most `max_span` bytes, or less where that
/// leaves fewer claims than `streams` (but never less than a window).
pub(super) fn claims(
    items: &[WorkItem],
    files: &[SourceFile],
    max_span: u64,
    streams: usize,
) -> Vec<Range<usize>> {
    let remote = |w: &Window| files[w.file].remote().is_some();
    let remote_bytes: u64 = items
        .iter()
        .filter(|i| remote(&i.window))
        .map(|i| i.window.needed)
        .sum();
    let span = (remote_bytes / streams.max(1) as u64).min(max_span);
    let mut out: Vec<Range<usize>> = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let w = &item.window;
        let joins = remote(w)
            && out.last().is_some_and(|c| {
                let (first, prev) = (&items[c.start].window, &items[c.end - 1].window);
                let prev_end = prev.start + prev.needed;
                prev.file == w.file
                    && w.start >= prev_end
                    && w.start - prev_end <= MAX_GAP
                    && w.start + w.needed - first.start <= span
            });
        match out.last_mut() {
            Some(c) if joins => c.end = i + 1,
            _ => out.push(i..i + 1),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{work_items, Extent, WindowCaps, STAGED};
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
        let got: Vec<Vec<(usize, u64)>> = claims(&items, &files, 256 * K, 1)
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
        let many = claims(&items, &files, 256 * K, 64);
        assert_eq!(many.len(), items.len());
    }
}

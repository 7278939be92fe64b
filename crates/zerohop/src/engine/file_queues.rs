//! How a save's windows are handed to its workers: each file's windows in
//! order, each worker on files of its own while they last. A memory file
//! system takes a file's lock for every `write()`, so two workers writing
//! one file wait for each other: with one shared cursor over windows
//! interleaved by file, 16 workers writing 16 tmpfs files met in the same
//! file often enough to write 8 GiB at 17 - 20 GB/s, and at 23.4 with 32
//! files (the H200 machine, `zerohop checkpoint save --shards`), where 16
//! threads each writing a file of its own wrote 26 - 29.

use crate::plan::Window;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Every window's index, queued by file.
pub(super) struct FileQueues {
    /// Per file that has windows, their indices in file order.
    queues: Vec<Vec<usize>>,
    /// Per queue, how many of its windows were handed out (may run past
    /// its length: an exhausted queue).
    taken: Vec<AtomicUsize>,
}

impl FileQueues {
    pub fn new(windows: &[Window]) -> FileQueues {
        let mut by_file: Vec<Vec<usize>> = Vec::new();
        for (i, w) in windows.iter().enumerate() {
            if by_file.len() <= w.file {
                by_file.resize_with(w.file + 1, Vec::new);
            }
            by_file[w.file].push(i);
        }
        by_file.retain(|q| !q.is_empty());
        FileQueues {
            taken: by_file.iter().map(|_| AtomicUsize::new(0)).collect(),
            queues: by_file,
        }
    }

    /// The next window for worker `worker` of `workers`, or `None` when
    /// every window was handed out. A worker takes from its own queues
    /// (`worker`, `worker + workers`, ...; with more workers than files,
    /// file `worker % files`, shared), then from the queue with the most
    /// windows left, to meet as few other workers in one file as it can.
    pub fn next(&self, worker: usize, workers: usize) -> Option<usize> {
        let n = self.queues.len();
        if n == 0 {
            return None;
        }
        let own = (worker % n..n).step_by(workers.max(1));
        for q in own {
            if let Some(i) = self.take(q) {
                return Some(i);
            }
        }
        loop {
            let fullest = (0..n)
                .map(|q| (self.left(q), q))
                .filter(|&(left, _)| left > 0)
                .max()?;
            if let Some(i) = self.take(fullest.1) {
                return Some(i);
            }
        }
    }

    fn left(&self, q: usize) -> usize {
        let taken = self.taken[q].load(Ordering::Relaxed);
        self.queues[q].len().saturating_sub(taken)
    }

    fn take(&self, q: usize) -> Option<usize> {
        if self.left(q) == 0 {
            return None;
        }
        let k = self.taken[q].fetch_add(1, Ordering::Relaxed);
        self.queues[q].get(k).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    fn windows(files: &[usize]) -> Vec<Window> {
        files
            .iter()
            .map(|&file| Window {
                file,
                start: 0,
                read_len: 0,
                needed: 0,
                copies: Vec::new(),
            })
            .collect()
    }

    #[test]
    fn each_worker_keeps_to_its_own_file_while_it_lasts() {
        // Four files of three windows each, interleaved.
        let w = windows(&[0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3]);
        let q = FileQueues::new(&w);
        for worker in 0..4 {
            let got: Vec<usize> = (0..3).map(|_| q.next(worker, 4).unwrap()).collect();
            assert!(got.iter().all(|&i| w[i].file == worker), "{got:?}");
            assert!(
                got.windows(2).all(|p| p[0] < p[1]),
                "in file order: {got:?}"
            );
        }
        assert_eq!(q.next(0, 4), None);
    }

    #[test]
    fn a_worker_done_with_its_files_takes_from_the_fullest() {
        let w = windows(&[0, 1, 1, 1, 2, 2]);
        let q = FileQueues::new(&w);
        assert_eq!(w[q.next(0, 3).unwrap()].file, 0);
        assert_eq!(w[q.next(0, 3).unwrap()].file, 1, "file 1 has the most left");
        assert_eq!(w[q.next(2, 3).unwrap()].file, 2);
    }

    #[test]
    fn more_workers_than_files_share_them_evenly_and_every_window_goes_once() {
        let w = windows(&[0, 1, 0, 1, 0, 1, 0, 1, 0, 1]);
        let q = FileQueues::new(&w);
        let got: Vec<(usize, usize)> = (0..5)
            .map(|worker| (worker, q.next(worker, 5).unwrap()))
            .collect();
        for (worker, i) in &got {
            assert_eq!(w[*i].file, worker % 2);
        }
        let mut seen: BTreeSet<usize> = got.iter().map(|&(_, i)| i).collect();
        while let Some(i) = q.next(3, 5) {
            assert!(seen.insert(i), "window {i} handed out twice");
        }
        assert_eq!(seen.len(), w.len());
    }

    #[test]
    fn many_threads_take_every_window_exactly_once() {
        let files: Vec<usize> = (0..997).map(|i| (i * 7) % 13).collect();
        let w = windows(&files);
        let q = FileQueues::new(&w);
        let taken: Vec<Vec<usize>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..8)
                .map(|worker| {
                    let q = &q;
                    s.spawn(move || std::iter::from_fn(|| q.next(worker, 8)).collect())
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let mut all: Vec<usize> = taken.concat();
        all.sort_unstable();
        assert_eq!(all, (0..w.len()).collect::<Vec<_>>());
    }

    #[test]
    fn no_windows_means_none() {
        assert_eq!(FileQueues::new(&[]).next(0, 4), None);
    }
}

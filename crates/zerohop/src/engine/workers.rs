//! What the read and write pipelines share: progress reports, the check
//! that a window fits its slot, and the runner of their worker threads.

use crate::device::{CopyQueue, Device};
use crate::plan::Window;
use crate::{Error, ErrorKind, Result};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// Reports progress in bytes; called from worker threads.
pub type Progress<'a> = &'a (dyn Fn(u64) + Sync);

/// Checks that `win` fits in a slot of `slot_bytes`. Windows are cut to the
/// slot size when planned, so a larger one is a bug in the engine, not bad
/// input.
pub(super) fn assert_fits(win: &Window, slot_bytes: usize) {
    assert!(
        win.read_len as usize <= slot_bytes,
        "window larger than a slot"
    );
}

/// Copy queues kept between transfers, loads and saves alike. Making a
/// queue (a CUDA stream) for every worker of every transfer, and destroying
/// it after, put 32 driver calls in each one's start and end; the engine
/// makes one per I/O thread up front.
/// A queue is given back only with nothing in flight on it, so one taken
/// from the pool is idle.
pub(super) struct QueuePool {
    idle: Mutex<Vec<Box<dyn CopyQueue>>>,
}

impl QueuePool {
    /// A pool holding `n` new queues of `device`.
    pub fn filled(device: &dyn Device, n: usize) -> Result<Self> {
        let idle = (0..n).map(|_| device.new_queue()).collect::<Result<_>>()?;
        Ok(QueuePool {
            idle: Mutex::new(idle),
        })
    }

    /// An idle queue of `device`: a kept one, else a new one.
    pub fn take(&self, device: &dyn Device) -> Result<Box<dyn CopyQueue>> {
        let kept = self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop();
        match kept {
            Some(q) => Ok(q),
            None => device.new_queue(),
        }
    }

    /// Keeps `queue` for a later transfer. `drained`: every copy queued on it
    /// is known to have completed (all its fences passed); otherwise it is
    /// waited for here, and a queue that cannot be waited for is dropped
    /// (its drop waits for what it can) rather than kept.
    pub fn give_back(&self, queue: Box<dyn CopyQueue>, drained: bool) {
        if drained || queue.record().and_then(|f| f.wait()).is_ok() {
            self.idle
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(queue);
        }
    }
}

/// Runs `work` once per worker, each on its own thread (a sole worker on
/// the calling thread: a thread of its own would cost a small transfer, a
/// `get_slice` of a few rows, more than its copies). The first error
/// raises `abort` (which `work` polls between items) and is returned once
/// every worker has stopped; otherwise every worker's result.
pub(super) fn run_workers<W: Send, T: Send>(
    mut workers: Vec<W>,
    abort: &AtomicBool,
    work: impl Fn(W) -> Result<T> + Sync,
) -> Result<Vec<T>> {
    if workers.len() == 1 {
        let w = workers.pop().expect("one worker");
        return match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| work(w))) {
            Ok(r) => r.map(|t| vec![t]),
            Err(_) => Err(Error::new(ErrorKind::Device, "an I/O worker panicked")),
        };
    }
    let first_error: Mutex<Option<Error>> = Mutex::new(None);
    let mut results = Vec::with_capacity(workers.len());
    std::thread::scope(|scope| {
        let handles: Vec<_> = workers
            .into_iter()
            .map(|w| {
                let (work, first_error) = (&work, &first_error);
                scope.spawn(move || {
                    let r = work(w);
                    if let Err(e) = &r {
                        abort.store(true, Ordering::Relaxed);
                        let mut slot = first_error.lock().unwrap();
                        if slot.is_none() {
                            *slot = Some(Error::new(e.kind(), e.to_string()));
                        }
                    }
                    r
                })
            })
            .collect();
        for h in handles {
            match h.join() {
                Ok(Ok(m)) => results.push(m),
                Ok(Err(_)) => {}
                Err(_) => {
                    first_error.lock().unwrap().get_or_insert_with(|| {
                        Error::new(ErrorKind::Device, "an I/O worker panicked")
                    });
                }
            }
        }
    });
    match first_error.into_inner().unwrap() {
        Some(e) => Err(e),
        None => Ok(results),
    }
}

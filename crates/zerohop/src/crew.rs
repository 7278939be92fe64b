//! A crew of parked helper threads that share one small job with the
//! thread that asks: a copy of a few MiB, cut in parts, as one `get_slice`
//! of a hot file needs. A thread started per job costs more than such a
//! copy gains; a parked one costs a futex wake. On the reference H200
//! machine a 1 MiB copy out of a file's mapping took 175 us on one thread
//! and 82 us on four of them woken so (`bench/probe/small_copy.c`).
//!
//! Threads are started at the first job that needs them, and stopped when
//! the crew is dropped. A job that finds the crew busy (another thread's
//! job) runs all its parts itself.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::thread::JoinHandle;

/// Helper threads that run parts of jobs beside the caller.
pub struct Crew {
    /// Helpers wanted: a job runs in at most this many parts plus one.
    helpers: usize,
    seats: OnceLock<Vec<Seat>>,
    /// Held while a job uses the seats.
    busy: Mutex<()>,
}

/// One helper: its thread and where its next part is put.
struct Seat {
    desk: Arc<Desk>,
    thread: Option<JoinHandle<()>>,
}

#[derive(Default)]
struct Desk {
    order: Mutex<Order>,
    posted: Condvar,
}

#[derive(Default)]
enum Order {
    #[default]
    Idle,
    Run(Part),
    Stop,
}

/// One part of a job, as a helper sees it: which part, of what.
struct Part {
    index: usize,
    job: *const (dyn Fn(usize) + Sync),
    latch: *const Latch,
}

// SAFETY: `job` is `Sync` and `latch` is made of `Sync` parts; both point
// into the frame of the `run` call that posted the part, which does not
// return before every part it posted has counted the latch down.
unsafe impl Send for Part {}

/// Counts a job's parts still running on helpers.
struct Latch {
    left: Mutex<usize>,
    zero: Condvar,
    panicked: AtomicBool,
}

impl Crew {
    /// A crew of up to `helpers` threads beside the caller, started when a
    /// job first needs them.
    pub fn new(helpers: usize) -> Self {
        Crew {
            helpers,
            seats: OnceLock::new(),
            busy: Mutex::new(()),
        }
    }

    /// The most parts a job runs in at once: the helpers and the caller.
    pub fn width(&self) -> usize {
        self.helpers + 1
    }

    /// Runs `job(0)` .. `job(parts - 1)`, part 0 on the calling thread and
    /// the others on helpers where they are free (else on the caller too),
    /// and returns when every part has finished. A part that panics panics
    /// the caller, once all parts are done.
    pub fn run(&self, parts: usize, job: &(dyn Fn(usize) + Sync)) {
        if parts == 0 {
            return;
        }
        let guard = match self.busy.try_lock() {
            Ok(g) if parts > 1 => Some(g),
            _ => None,
        };
        let seats: &[Seat] = match guard {
            Some(_) => self.seats.get_or_init(|| start(self.helpers)),
            None => &[],
        };
        let posted = (parts - 1).min(seats.len());
        let latch = Latch {
            left: Mutex::new(posted),
            zero: Condvar::new(),
            panicked: Default::default(),
        };
        // SAFETY: only the lifetime is erased: this call waits below, before
        // `job` and `latch` go, until every posted part has counted down.
        let erased: *const (dyn Fn(usize) + Sync) = unsafe {
            std::mem::transmute::<&(dyn Fn(usize) + Sync), &'static (dyn Fn(usize) + Sync)>(job)
        };
        for (i, seat) in seats.iter().take(posted).enumerate() {
            *lock(&seat.desk.order) = Order::Run(Part {
                index: i + 1,
                job: erased,
                latch: &latch,
            });
            seat.desk.posted.notify_one();
        }
        let mine = catch_unwind(AssertUnwindSafe(|| {
            job(0);
            (posted + 1..parts).for_each(job);
        }));
        let mut left = lock(&latch.left);
        while *left > 0 {
            left = latch.zero.wait(left).unwrap_or_else(|p| p.into_inner());
        }
        drop(left);
        drop(guard);
        if let Err(p) = mine {
            std::panic::resume_unwind(p);
        }
        if latch.panicked.load(Ordering::Relaxed) {
            panic!("a part of a crew's job panicked");
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Starts up to `helpers` threads; one that cannot be started is left out
/// (its parts run on the caller).
fn start(helpers: usize) -> Vec<Seat> {
    (0..helpers)
        .map_while(|i| {
            let desk = Arc::new(Desk::default());
            let theirs = Arc::clone(&desk);
            let thread = std::thread::Builder::new()
                .name(format!("zerohop-crew-{i}"))
                .spawn(move || serve(&theirs))
                .ok()?;
            Some(Seat {
                desk,
                thread: Some(thread),
            })
        })
        .collect()
}

/// A helper's life: waits for a part, runs it, counts its latch down.
fn serve(desk: &Desk) {
    loop {
        let mut order = lock(&desk.order);
        let part = loop {
            match std::mem::take(&mut *order) {
                Order::Idle => order = desk.posted.wait(order).unwrap_or_else(|p| p.into_inner()),
                Order::Run(part) => break part,
                Order::Stop => return,
            }
        };
        drop(order);
        // SAFETY: the posting `run` call keeps `job` and `latch` alive until
        // this part has counted the latch down (the last use of either).
        let (job, latch) = unsafe { (&*part.job, &*part.latch) };
        if catch_unwind(AssertUnwindSafe(|| job(part.index))).is_err() {
            latch.panicked.store(true, Ordering::Relaxed);
        }
        let mut left = lock(&latch.left);
        *left -= 1;
        if *left == 0 {
            latch.zero.notify_one();
        }
    }
}

impl Drop for Crew {
    fn drop(&mut self) {
        let Some(seats) = self.seats.get_mut() else {
            return;
        };
        for seat in seats.iter() {
            *lock(&seat.desk.order) = Order::Stop;
            seat.desk.posted.notify_one();
        }
        for seat in seats.iter_mut() {
            if let Some(t) = seat.thread.take() {
                let _ = t.join();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    #[test]
    fn every_part_runs_once_whatever_the_width() {
        for helpers in [0, 1, 3] {
            let crew = Crew::new(helpers);
            for parts in 1..7 {
                let runs: Vec<AtomicUsize> = (0..parts).map(|_| AtomicUsize::new(0)).collect();
                crew.run(parts, &|i| {
                    runs[i].fetch_add(1, Ordering::Relaxed);
                });
                assert!(runs.iter().all(|r| r.load(Ordering::Relaxed) == 1));
            }
        }
    }

    #[test]
    fn parts_run_on_helpers_and_jobs_from_many_threads_all_finish() {
        let crew = Crew::new(3);
        let threads = Mutex::new(std::collections::HashSet::new());
        crew.run(4, &|_| {
            // Each part waits a little, so that the others are taken by
            // helpers rather than by the caller after its own.
            std::thread::sleep(std::time::Duration::from_millis(20));
            threads.lock().unwrap().insert(std::thread::current().id());
        });
        assert_eq!(threads.lock().unwrap().len(), 4);
        // Jobs at once: one has the helpers, the others run alone.
        let total = AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..50 {
                        crew.run(4, &|i| {
                            total.fetch_add(i + 1, Ordering::Relaxed);
                        });
                    }
                });
            }
        });
        assert_eq!(total.load(Ordering::Relaxed), 4 * 50 * 10);
    }

    #[test]
    fn a_panicking_part_panics_the_caller_after_the_others_finish() {
        let crew = Crew::new(2);
        let finished = AtomicUsize::new(0);
        let caught = catch_unwind(AssertUnwindSafe(|| {
            crew.run(3, &|i| {
                if i == 2 {
                    panic!("part 2 fails");
                }
                std::thread::sleep(std::time::Duration::from_millis(10));
                finished.fetch_add(1, Ordering::Relaxed);
            })
        }));
        assert!(caught.is_err());
        assert_eq!(finished.load(Ordering::Relaxed), 2);
        // The crew still works after it.
        let runs = AtomicUsize::new(0);
        crew.run(3, &|_| {
            runs.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(runs.load(Ordering::Relaxed), 3);
    }
}

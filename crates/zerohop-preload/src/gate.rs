//! The program's quiet points: where its threads stop while its memory is
//! suspended. A suspend request waits until one of the program's threads
//! reaches a quiet point (its next `cudaDeviceSynchronize`, allocation or
//! free, or an explicit `zerohop_quiet_point()`), parks it there, and lets
//! it go once the memory is back.

use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

pub struct QuietGate {
    state: Mutex<State>,
    changed: Condvar,
}

struct State {
    /// A suspend wants the program to stop.
    wanted: bool,
    /// Program threads parked at a quiet point now.
    parked: usize,
}

impl QuietGate {
    pub const fn new() -> Self {
        QuietGate {
            state: Mutex::new(State {
                wanted: false,
                parked: 0,
            }),
            changed: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Called by the program's threads: parks the caller while a suspend
    /// wants the program stopped; returns at once otherwise.
    pub fn pass(&self) {
        let mut s = self.lock();
        if !s.wanted {
            return;
        }
        s.parked += 1;
        self.changed.notify_all();
        while s.wanted {
            s = self.changed.wait(s).unwrap_or_else(|p| p.into_inner());
        }
        s.parked -= 1;
    }

    /// Asks the program to stop and waits, at most `limit`, until one of
    /// its threads is parked; `false` (and the request withdrawn) if none
    /// came.
    pub fn stop(&self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        let mut s = self.lock();
        s.wanted = true;
        while s.parked == 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                s.wanted = false;
                self.changed.notify_all();
                return false;
            }
            s = self
                .changed
                .wait_timeout(s, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        true
    }

    /// Lets the parked threads go.
    pub fn go(&self) {
        self.lock().wanted = false;
        self.changed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    #[test]
    fn a_thread_parks_at_its_next_quiet_point_until_go() {
        let gate = Arc::new(QuietGate::new());
        gate.pass(); // nothing wanted: returns at once
        let passed = Arc::new(AtomicUsize::new(0));
        let (g, p) = (gate.clone(), passed.clone());
        let program = std::thread::spawn(move || {
            for _ in 0..1000 {
                g.pass();
                p.fetch_add(1, Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(1));
            }
        });
        assert!(gate.stop(Duration::from_secs(10)));
        let at_stop = passed.load(Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(
            passed.load(Ordering::SeqCst),
            at_stop,
            "parked: no progress"
        );
        gate.go();
        program.join().unwrap();
        assert_eq!(passed.load(Ordering::SeqCst), 1000);
    }

    #[test]
    fn a_program_without_quiet_points_times_the_request_out() {
        let gate = QuietGate::new();
        let started = Instant::now();
        assert!(!gate.stop(Duration::from_millis(30)));
        assert!(started.elapsed() >= Duration::from_millis(30));
        gate.pass(); // the request was withdrawn: no parking
    }
}

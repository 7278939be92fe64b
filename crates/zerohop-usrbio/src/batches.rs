//! When prepared I/Os go to the agent, by a ring's `io_depth` and
//! `timeout` (USRBIO's batching rules), apart from the ring itself so the
//! rules are tested alone.

use std::time::{Duration, Instant};

#[derive(Debug, Clone, Copy)]
pub struct Batching {
    /// Above 0: exactly this many at a time; 0: all; below 0: all, with at
    /// most `-io_depth` at the agent at once.
    pub io_depth: i32,
    /// With `io_depth` > 0, how long a partial batch waits for more before
    /// it goes anyway (None: until it is full).
    pub timeout: Option<Duration>,
}

impl Batching {
    /// How many of `pending` I/Os (the oldest prepared at `oldest`) to hand
    /// over now, with `at_agent` at the agent already.
    pub fn release(
        &self,
        pending: usize,
        at_agent: usize,
        oldest: Option<Instant>,
        now: Instant,
    ) -> usize {
        match self.io_depth {
            0 => pending,
            d if d > 0 => {
                let d = d as usize;
                let whole = pending / d * d;
                let waited = match (self.timeout, oldest) {
                    (Some(t), Some(o)) => now.duration_since(o) >= t,
                    _ => false,
                };
                if whole == 0 && waited {
                    pending
                } else {
                    whole
                }
            }
            d => pending.min((d.unsigned_abs() as usize).saturating_sub(at_agent)),
        }
    }

    /// When a partial batch that has waited since `oldest` goes anyway.
    pub fn partial_deadline(&self, oldest: Option<Instant>) -> Option<Instant> {
        (self.io_depth > 0).then_some(())?;
        Some(oldest? + self.timeout?)
    }

    /// Whether pending I/Os can still reach the agent without more being
    /// prepared: all but a partial batch of `io_depth` > 0 with no timeout.
    pub fn pending_can_go(&self) -> bool {
        self.io_depth <= 0 || self.timeout.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn io_depth_decides_each_hand_over() {
        let now = Instant::now();
        let asap = Batching {
            io_depth: 0,
            timeout: None,
        };
        assert_eq!(asap.release(7, 100, Some(now), now), 7);
        let exact = Batching {
            io_depth: 4,
            timeout: None,
        };
        assert_eq!(
            exact.release(3, 0, Some(now), now + Duration::from_secs(9)),
            0
        );
        assert_eq!(exact.release(9, 0, Some(now), now), 8);
        assert!(!exact.pending_can_go());
        assert_eq!(exact.partial_deadline(Some(now)), None);
        let waits = Batching {
            io_depth: 4,
            timeout: Some(Duration::from_millis(5)),
        };
        assert_eq!(waits.release(3, 0, Some(now), now), 0);
        assert_eq!(
            waits.release(3, 0, Some(now), now + Duration::from_millis(5)),
            3
        );
        assert_eq!(
            waits.partial_deadline(Some(now)),
            Some(now + Duration::from_millis(5))
        );
        let capped = Batching {
            io_depth: -2,
            timeout: None,
        };
        assert_eq!(capped.release(5, 0, None, now), 2);
        assert_eq!(capped.release(5, 1, None, now), 1);
        assert_eq!(capped.release(5, 2, None, now), 0);
        assert!(capped.pending_can_go());
    }
}

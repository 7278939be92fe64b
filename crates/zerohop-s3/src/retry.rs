//! How often, and how long apart, failed requests are tried again.

use std::time::Duration;

/// Retries of requests that failed for a passing reason: the server said
/// to slow down (503 SlowDown, 429) or failed (500, 502, 504), or the
/// connection broke. Each wait doubles from `first_delay` up to
/// `max_delay`, with jitter, so that the workers of a load do not retry in
/// step. Defaults: 6 attempts, waits of 0.1 - 2 s, 3.1 s at most in all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in all, the first included (at least 1).
    pub attempts: u32,
    pub first_delay: Duration,
    pub max_delay: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            attempts: 6,
            first_delay: Duration::from_millis(100),
            max_delay: Duration::from_secs(2),
        }
    }
}

impl RetryPolicy {
    /// The wait before retry number `retry` (0 for the first retry): half
    /// the doubled delay, plus up to as much again at random.
    pub fn delay(&self, retry: u32) -> Duration {
        let full = self
            .first_delay
            .saturating_mul(1 << retry.min(16))
            .min(self.max_delay);
        full / 2 + full.mul_f64(0.5 * jitter())
    }

    /// The longest the waits of one request can add up to.
    pub fn max_total_wait(&self) -> Duration {
        (0..self.attempts.saturating_sub(1))
            .map(|r| {
                self.first_delay
                    .saturating_mul(1 << r.min(16))
                    .min(self.max_delay)
            })
            .sum()
    }
}

/// A number in [0, 1), different on every call (std's hasher keys are
/// random per instance: no generator crate needed for jitter).
fn jitter() -> f64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u8(0);
    (h.finish() >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_within_bounds() {
        let p = RetryPolicy::default();
        for retry in 0..10 {
            let full = (p.first_delay * (1 << retry)).min(p.max_delay);
            let d = p.delay(retry);
            assert!(d >= full / 2 && d <= full, "retry {retry}: {d:?}");
        }
        assert_eq!(p.max_total_wait(), Duration::from_millis(3100));
    }
}

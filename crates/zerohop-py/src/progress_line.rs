//! `progress=True`: a one-line progress display on stderr, drawn wherever
//! stderr goes (a terminal, a notebook, a log) because the caller asked for
//! it. Plain `\r` redraws, which notebooks render; the CLI's bars (drawn on
//! terminals only) are `indicatif`'s.

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

pub struct ProgressLine {
    label: String,
    total: u64,
    done: AtomicU64,
    started: Instant,
    last_draw: Mutex<Instant>,
}

impl ProgressLine {
    pub fn new(label: impl Into<String>, total: u64) -> Self {
        let now = Instant::now();
        ProgressLine {
            label: label.into(),
            total,
            done: AtomicU64::new(0),
            started: now,
            last_draw: Mutex::new(now),
        }
    }

    pub fn advance(&self, bytes: u64) {
        let done = self.done.fetch_add(bytes, Ordering::Relaxed) + bytes;
        let Ok(mut last) = self.last_draw.try_lock() else {
            return;
        };
        if last.elapsed() < Duration::from_millis(100) && done < self.total {
            return;
        }
        *last = Instant::now();
        let secs = self.started.elapsed().as_secs_f64().max(1e-9);
        let pct = if self.total > 0 {
            done as f64 * 100.0 / self.total as f64
        } else {
            100.0
        };
        let filled = (pct / 5.0) as usize;
        eprint!(
            "\r{} [{}{}] {:5.1}% {:.2} GB/s ",
            self.label,
            "#".repeat(filled.min(20)),
            " ".repeat(20 - filled.min(20)),
            pct,
            done as f64 / secs / 1e9
        );
        let _ = std::io::stderr().flush();
    }

    pub fn finish(&self) {
        eprint!("\r{}\r", " ".repeat(self.label.len() + 48));
    }
}

//! `progress=` of the Python API: nothing, a line on stderr (`True`), or a
//! callable given `(done_bytes, total_bytes)` at most every 100 ms and once
//! at the end.

use pyo3::prelude::*;
use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use zerohop::Progress;

pub enum Reporter {
    Silent,
    Line(ProgressLine),
    Callback {
        callback: Py<PyAny>,
        total: u64,
        done: AtomicU64,
        /// None until the first call, made at the first progress.
        last_call: Mutex<Option<Instant>>,
        /// The callback's first exception, raised once the work is done
        /// (the transfer is not cut short by it).
        failed: Mutex<Option<PyErr>>,
    },
}

impl Reporter {
    pub fn new(progress: Option<&Bound<'_, PyAny>>, label: &str, total: u64) -> PyResult<Self> {
        let Some(p) = progress else {
            return Ok(Reporter::Silent);
        };
        if p.is_callable() {
            return Ok(Reporter::Callback {
                callback: p.clone().unbind(),
                total,
                done: AtomicU64::new(0),
                last_call: Mutex::new(None),
                failed: Mutex::new(None),
            });
        }
        Ok(if p.is_truthy()? {
            Reporter::Line(ProgressLine::new(label, total))
        } else {
            Reporter::Silent
        })
    }

    /// For the engine: `None` when nothing is reported.
    pub fn advance(&self, bytes: u64) {
        match self {
            Reporter::Silent => {}
            Reporter::Line(line) => line.advance(bytes),
            Reporter::Callback {
                total,
                done,
                last_call,
                ..
            } => {
                let now = done.fetch_add(bytes, Ordering::Relaxed) + bytes;
                let Ok(mut last) = last_call.try_lock() else {
                    return;
                };
                let due = last.is_none_or(|t| t.elapsed() >= Duration::from_millis(100));
                if now < *total && due {
                    *last = Some(Instant::now());
                    self.call(now);
                }
            }
        }
    }

    pub fn is_silent(&self) -> bool {
        matches!(self, Reporter::Silent)
    }

    /// Runs `f` with the engine's view of this reporter.
    pub fn with<T>(&self, f: impl FnOnce(Option<Progress<'_>>) -> T) -> T {
        let report = |n| self.advance(n);
        f((!self.is_silent()).then_some(&report))
    }

    fn call(&self, done: u64) {
        if let Reporter::Callback {
            callback,
            total,
            failed,
            ..
        } = self
        {
            Python::attach(|py| {
                if let Err(e) = callback.call1(py, (done, *total)) {
                    failed.lock().unwrap().get_or_insert(e);
                }
            });
        }
    }

    /// Ends the display; reports completion to a callback and raises its
    /// first exception, if any.
    pub fn finish(self, succeeded: bool) -> PyResult<()> {
        match &self {
            Reporter::Silent => Ok(()),
            Reporter::Line(line) => {
                line.finish();
                Ok(())
            }
            Reporter::Callback { done, failed, .. } => {
                if succeeded {
                    self.call(done.load(Ordering::Relaxed));
                }
                match failed.lock().unwrap().take() {
                    Some(e) => Err(e),
                    None => Ok(()),
                }
            }
        }
    }
}

/// `progress=True`: a one-line progress display on stderr, drawn wherever
/// stderr goes (a terminal, a notebook, a log) because the caller asked for
/// it. Plain `\r` redraws, which notebooks render; the CLI's bars (drawn on
/// terminals only) are `indicatif`'s.
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

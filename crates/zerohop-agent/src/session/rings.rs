//! Serving a session's rings: take what the client submitted, check each
//! entry against the session's registrations, run the valid ones through
//! the engines, and post every completion as the client makes room.

use super::{End, Session};
use crate::execute::{self, Work};
use crate::resources::Buffer;
use log::{debug, warn};
use rustix::io::Errno;
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use zerohop::stats::human_bytes;
use zerohop_wire::ring::{self, CompletionEntry, RingCorrupt, SubmissionEntry, OP_READ};

/// How long a stopping agent waits for a client to make room for its last
/// completions.
const FLUSH_WAIT: Duration = Duration::from_secs(5);

impl Session {
    /// Whether some ring has completions the client has no room for yet.
    pub(super) fn completions_waiting(&self) -> bool {
        self.rings.values().any(|r| !r.waiting.is_empty())
    }

    /// Takes and runs what every ring holds, and posts completions.
    pub(super) fn serve_rings(&mut self) -> Result<(), RingCorrupt> {
        let ids: Vec<u32> = self.rings.keys().copied().collect();
        for id in ids {
            let state = self.rings.get_mut(&id).expect("listed");
            state.flush()?;
            if !state.waiting.is_empty() {
                continue;
            }
            let sqes = state.ring.take_submissions()?;
            if sqes.is_empty() {
                continue;
            }
            let completions = self.execute(&sqes);
            // Counters first: a client that sees its completions then sees
            // them counted.
            self.publish();
            let state = self.rings.get_mut(&id).expect("listed");
            state.waiting.extend(completions);
            state.flush()?;
        }
        Ok(())
    }

    /// Checks one submission against this session's registrations: the
    /// negative errno to complete it with if it breaks a rule. `lens` keeps
    /// each file's length for the batch (checks run before any I/O of the
    /// batch, so they all see the same lengths anyway).
    fn check(&self, sqe: &SubmissionEntry, lens: &mut BTreeMap<u32, u64>) -> Result<(), i64> {
        ring::check_entry(
            sqe,
            |f| self.files.contains_key(&f),
            |b| self.buffers.get(&b).map(Buffer::len),
        )
        .map_err(i64::from)?;
        // Reads must lie inside the file (no short reads).
        if sqe.op == OP_READ && sqe.len > 0 {
            let file_len = *lens
                .entry(sqe.file_id)
                .or_insert_with(|| self.files[&sqe.file_id].len());
            if sqe.file_offset + sqe.len > file_len {
                return Err(-i64::from(Errno::INVAL.raw_os_error()));
            }
        }
        Ok(())
    }

    fn execute(&mut self, sqes: &[SubmissionEntry]) -> Vec<CompletionEntry> {
        let mut results = vec![0i64; sqes.len()];
        let mut works = Vec::new();
        let mut slots = Vec::new();
        let mut lens = BTreeMap::new();
        for (i, sqe) in sqes.iter().enumerate() {
            match self.check(sqe, &mut lens) {
                Err(code) => results[i] = code,
                Ok(()) if sqe.len == 0 => results[i] = 0,
                Ok(()) => {
                    works.push(Work {
                        sqe: *sqe,
                        file: &self.files[&sqe.file_id],
                        buf: &self.buffers[&sqe.buf_id],
                    });
                    slots.push(i);
                }
            }
        }
        let started = Instant::now();
        for (slot, r) in slots.iter().zip(execute::run(&self.shared.engines, &works)) {
            results[*slot] = r;
        }
        let (mut read, mut written) = (0, 0);
        for (sqe, &r) in sqes.iter().zip(&results) {
            if r < 0 {
                self.errors += 1;
                self.shared.errors.fetch_add(1, Ordering::Relaxed);
            } else if sqe.op == OP_READ {
                read += r as u64;
            } else {
                written += r as u64;
            }
        }
        debug!(
            "session {}: {} I/Os, {} read, {} written in {:.3} s",
            self.id,
            sqes.len(),
            human_bytes(read),
            human_bytes(written),
            started.elapsed().as_secs_f64()
        );
        self.ios += sqes.len() as u64;
        self.bytes += read + written;
        self.shared
            .ios
            .fetch_add(sqes.len() as u64, Ordering::Relaxed);
        self.shared.bytes_read.fetch_add(read, Ordering::Relaxed);
        self.shared
            .bytes_written
            .fetch_add(written, Ordering::Relaxed);
        sqes.iter()
            .zip(results)
            .map(|(s, result)| CompletionEntry {
                user_data: s.user_data,
                result,
                reserved: [0; 16],
            })
            .collect()
    }

    /// The agent is stopping: everything already submitted is run and
    /// completed (or, if the client never makes room, logged as lost to it).
    pub(super) fn finish_for_shutdown(&mut self) -> End {
        let deadline = Instant::now() + FLUSH_WAIT;
        loop {
            if let Err(RingCorrupt(why)) = self.serve_rings() {
                return End::Broken(why);
            }
            let left: usize = self.rings.values().map(|r| r.waiting.len()).sum();
            if left == 0 {
                return End::Stopping;
            }
            if Instant::now() > deadline {
                warn!(
                    "session {}: {left} completions could not be posted (the client did not reap)",
                    self.id
                );
                return End::Stopping;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

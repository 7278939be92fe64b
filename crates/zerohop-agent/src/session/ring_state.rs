//! A ring a session serves: the shared-memory ring, and the completions
//! waiting for room in it.

use std::collections::VecDeque;
use std::fs::File;
use zerohop_wire::ring::{CompletionEntry, Ring, RingCorrupt};

pub(super) struct RingState {
    pub(super) ring: Ring,
    /// The client writes it after submitting; watched, never read.
    _submitted: File,
    /// Completions waiting for room in the ring; while any wait, no new
    /// submissions are taken (so a client that never reaps is bounded).
    pub(super) waiting: VecDeque<CompletionEntry>,
}

impl RingState {
    pub(super) fn new(ring: Ring, submitted: File) -> Self {
        RingState {
            ring,
            _submitted: submitted,
            waiting: VecDeque::new(),
        }
    }

    /// Posts waiting completions while the ring has room; wakes the client.
    pub(super) fn flush(&mut self) -> Result<(), RingCorrupt> {
        let room = self.ring.completion_room()? as usize;
        let n = room.min(self.waiting.len());
        for cqe in self.waiting.drain(..n) {
            self.ring.push_completion(&cqe);
        }
        if n > 0 {
            self.ring.publish_completions();
        }
        Ok(())
    }
}

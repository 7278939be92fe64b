//! The submission/completion ring, version 1. One memfd holds, in order:
//!
//! | offset            | what                                                  |
//! |-------------------|-------------------------------------------------------|
//! | 0                 | [`RingHeader`]: magic, version, entry count, indices  |
//! | `HEADER_BYTES`    | `entries` x [`SubmissionEntry`] (64 bytes each)       |
//! | then              | `entries` x [`CompletionEntry`] (32 bytes each)       |
//!
//! `entries` is a power of two up to [`MAX_ENTRIES`]. Indices count up and
//! wrap; an entry's slot is `index % entries`. The client writes submissions
//! and moves `sq_tail`, then writes its eventfd, which the agent watches
//! (edge-triggered: the agent never reads it, so a client cannot make that
//! block); the agent moves `sq_head`, writes completions, moves `cq_tail`
//! and wakes the futex on `cq_tail` (a futex wake never blocks); the client
//! waits on that futex and moves `cq_head`. Each index sits on its own cache
//! line. All shared words are accessed atomically, so a peer scribbling on
//! the memory can give wrong values but never undefined behaviour, and the
//! agent keeps its own copies of the indices it owns.

use crate::shm::SharedMemory;
use rustix::io::Errno;
use rustix::thread::futex;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

pub const MAGIC: u64 = u64::from_le_bytes(*b"ZHRING\0\x01");
pub const MAX_ENTRIES: u32 = 4096;
/// Header size: five cache lines (fields, then one per index).
pub const HEADER_BYTES: usize = 5 * 64;
const SQ_HEAD: usize = 64;
const SQ_TAIL: usize = 128;
const CQ_HEAD: usize = 192;
const CQ_TAIL: usize = 256;

pub const OP_READ: u8 = 1;
pub const OP_WRITE: u8 = 2;

/// The ring's first cache line (the indices follow on their own lines).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingHeader {
    pub magic: u64,
    pub version: u32,
    pub entries: u32,
}

/// One I/O: `len` bytes between `file_offset` of a registered file and
/// `buf_offset` of a registered buffer.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SubmissionEntry {
    /// Returned unchanged in the completion.
    pub user_data: u64,
    pub file_offset: u64,
    pub buf_offset: u64,
    pub len: u64,
    pub file_id: u32,
    pub buf_id: u32,
    /// [`OP_READ`] (file -> buffer) or [`OP_WRITE`] (buffer -> file).
    pub op: u8,
    pub reserved: [u8; 23],
}

/// The outcome of one submission.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CompletionEntry {
    pub user_data: u64,
    /// Bytes moved (the whole length), or a negative errno: `EBADF` unknown
    /// file or buffer id, `EFAULT` outside the buffer, `EINVAL` bad op,
    /// reserved bytes set, or a read past the end of the file, `E2BIG` over
    /// the length limit, `EIO`/`ENOSPC` from storage.
    pub result: i64,
    pub reserved: [u8; 16],
}

const SQE_BYTES: usize = std::mem::size_of::<SubmissionEntry>();
const CQE_BYTES: usize = std::mem::size_of::<CompletionEntry>();
const _: () = assert!(SQE_BYTES == 64 && CQE_BYTES == 32);

/// Bytes of shared memory a ring of `entries` needs.
pub fn ring_bytes(entries: u32) -> usize {
    HEADER_BYTES + entries as usize * (SQE_BYTES + CQE_BYTES)
}

/// Whether `entries` is an allowed ring size.
pub fn valid_entries(entries: u32) -> bool {
    entries.is_power_of_two() && entries <= MAX_ENTRIES
}

impl SubmissionEntry {
    fn to_words(self) -> [u64; 8] {
        let mut w = [0u64; 8];
        w[0] = self.user_data;
        w[1] = self.file_offset;
        w[2] = self.buf_offset;
        w[3] = self.len;
        w[4] = self.file_id as u64 | (self.buf_id as u64) << 32;
        let mut tail = [0u8; 24];
        tail[0] = self.op;
        tail[1..].copy_from_slice(&self.reserved);
        for (i, c) in tail.chunks(8).enumerate() {
            w[5 + i] = u64::from_le_bytes(c.try_into().unwrap());
        }
        w
    }

    /// Decodes the eight words of a submission slot (any bit pattern).
    pub fn from_words(w: [u64; 8]) -> Self {
        let mut tail = [0u8; 24];
        for i in 0..3 {
            tail[i * 8..i * 8 + 8].copy_from_slice(&w[5 + i].to_le_bytes());
        }
        SubmissionEntry {
            user_data: w[0],
            file_offset: w[1],
            buf_offset: w[2],
            len: w[3],
            file_id: w[4] as u32,
            buf_id: (w[4] >> 32) as u32,
            op: tail[0],
            reserved: tail[1..].try_into().unwrap(),
        }
    }
}

impl CompletionEntry {
    fn to_words(self) -> [u64; 4] {
        [
            self.user_data,
            self.result as u64,
            u64::from_le_bytes(self.reserved[..8].try_into().unwrap()),
            u64::from_le_bytes(self.reserved[8..].try_into().unwrap()),
        ]
    }

    fn from_words(w: [u64; 4]) -> Self {
        let mut reserved = [0u8; 16];
        reserved[..8].copy_from_slice(&w[2].to_le_bytes());
        reserved[8..].copy_from_slice(&w[3].to_le_bytes());
        CompletionEntry {
            user_data: w[0],
            result: w[1] as i64,
            reserved,
        }
    }
}

/// Limits the agent puts on one submission.
pub const MAX_IO_BYTES: u64 = 1 << 30;

/// Checks a submission against the session's registrations: `buffer_len`
/// gives a registered buffer's size and `file_known` whether a file id is
/// registered. Returns the negative errno to complete it with, if any.
pub fn check_entry(
    sqe: &SubmissionEntry,
    file_known: impl Fn(u32) -> bool,
    buffer_len: impl Fn(u32) -> Option<u64>,
) -> Result<(), i32> {
    if (sqe.op != OP_READ && sqe.op != OP_WRITE) || sqe.reserved != [0; 23] {
        return Err(-Errno::INVAL.raw_os_error());
    }
    if sqe.len > MAX_IO_BYTES {
        return Err(-Errno::TOOBIG.raw_os_error());
    }
    if !file_known(sqe.file_id) {
        return Err(-Errno::BADF.raw_os_error());
    }
    let Some(buf_len) = buffer_len(sqe.buf_id) else {
        return Err(-Errno::BADF.raw_os_error());
    };
    let inside = sqe
        .buf_offset
        .checked_add(sqe.len)
        .is_some_and(|end| end <= buf_len);
    if !inside || sqe.file_offset.checked_add(sqe.len).is_none() {
        return Err(-Errno::FAULT.raw_os_error());
    }
    Ok(())
}

/// A peer broke the ring's rules; the session using it must end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RingCorrupt(pub String);

/// A ring in shared memory, seen by one side.
pub struct Ring {
    mem: SharedMemory,
    entries: u32,
    /// This side's copies of the indices it moves (never re-read from the
    /// shared memory, which the peer could change).
    own_sq: u32,
    own_cq: u32,
}

impl Ring {
    /// Lays out a new ring in `mem` (the client's side).
    pub fn create(mem: SharedMemory, entries: u32) -> Result<Self, RingCorrupt> {
        let ring = Self::check(mem, entries)?;
        ring.word64(0).store(MAGIC, Ordering::Relaxed);
        ring.word32(8)
            .store(crate::PROTOCOL_VERSION, Ordering::Relaxed);
        ring.word32(12).store(entries, Ordering::Release);
        Ok(ring)
    }

    /// Attaches to a ring a peer laid out (the agent's side); its header
    /// must say what the peer claimed.
    pub fn attach(mem: SharedMemory, entries: u32) -> Result<Self, RingCorrupt> {
        let ring = Self::check(mem, entries)?;
        let header = RingHeader {
            magic: ring.word64(0).load(Ordering::Acquire),
            version: ring.word32(8).load(Ordering::Acquire),
            entries: ring.word32(12).load(Ordering::Acquire),
        };
        let want = RingHeader {
            magic: MAGIC,
            version: crate::PROTOCOL_VERSION,
            entries,
        };
        if header != want {
            return Err(RingCorrupt(format!(
                "ring header {header:?} does not match {want:?}"
            )));
        }
        let mut ring = ring;
        ring.own_sq = ring.word32(SQ_HEAD).load(Ordering::Acquire);
        ring.own_cq = ring.word32(CQ_TAIL).load(Ordering::Acquire);
        Ok(ring)
    }

    fn check(mem: SharedMemory, entries: u32) -> Result<Self, RingCorrupt> {
        if !valid_entries(entries) || mem.len() < ring_bytes(entries) {
            return Err(RingCorrupt(format!(
                "a ring of {entries} entries needs a power of two up to {MAX_ENTRIES} and {} bytes",
                ring_bytes(entries)
            )));
        }
        if !(mem.as_ptr() as usize).is_multiple_of(64) {
            return Err(RingCorrupt("ring memory is not cache-line aligned".into()));
        }
        Ok(Ring {
            mem,
            entries,
            own_sq: 0,
            own_cq: 0,
        })
    }

    pub fn entries(&self) -> u32 {
        self.entries
    }

    pub fn memory(&self) -> &SharedMemory {
        &self.mem
    }

    fn word64(&self, offset: usize) -> &AtomicU64 {
        debug_assert!(offset.is_multiple_of(8) && offset + 8 <= self.mem.len());
        // SAFETY: in bounds (ring_bytes checked at construction, offsets are
        // computed from `entries`) and 8-byte aligned (the mapping is page
        // aligned); atomics make concurrent access by the peer defined.
        unsafe { &*(self.mem.as_ptr().add(offset) as *const AtomicU64) }
    }

    fn word32(&self, offset: usize) -> &AtomicU32 {
        debug_assert!(offset.is_multiple_of(4) && offset + 4 <= self.mem.len());
        // SAFETY: as in `word64`.
        unsafe { &*(self.mem.as_ptr().add(offset) as *const AtomicU32) }
    }

    fn sqe_offset(&self, index: u32) -> usize {
        HEADER_BYTES + (index % self.entries) as usize * SQE_BYTES
    }

    fn cqe_offset(&self, index: u32) -> usize {
        HEADER_BYTES
            + self.entries as usize * SQE_BYTES
            + (index % self.entries) as usize * CQE_BYTES
    }

    // ---- client side -------------------------------------------------

    /// Queues `sqe` if there is room; it reaches the agent at [`Ring::publish`].
    pub fn push_submission(&mut self, sqe: &SubmissionEntry) -> bool {
        let head = self.word32(SQ_HEAD).load(Ordering::Acquire);
        if self.own_sq.wrapping_sub(head) >= self.entries {
            return false;
        }
        let at = self.sqe_offset(self.own_sq);
        for (i, w) in sqe.to_words().into_iter().enumerate() {
            self.word64(at + i * 8).store(w, Ordering::Relaxed);
        }
        self.own_sq = self.own_sq.wrapping_add(1);
        true
    }

    /// Makes queued submissions visible to the agent.
    pub fn publish(&self) {
        self.word32(SQ_TAIL).store(self.own_sq, Ordering::Release);
    }

    /// The next completion, if any.
    pub fn pop_completion(&mut self) -> Option<CompletionEntry> {
        let tail = self.word32(CQ_TAIL).load(Ordering::Acquire);
        if tail == self.own_cq {
            return None;
        }
        let at = self.cqe_offset(self.own_cq);
        let words = std::array::from_fn(|i| self.word64(at + i * 8).load(Ordering::Relaxed));
        self.own_cq = self.own_cq.wrapping_add(1);
        self.word32(CQ_HEAD).store(self.own_cq, Ordering::Release);
        Some(CompletionEntry::from_words(words))
    }

    // ---- agent side --------------------------------------------------

    /// Takes every published submission (copied out, so the peer can no
    /// longer change them). A tail further ahead than the ring holds is
    /// corruption.
    pub fn take_submissions(&mut self) -> Result<Vec<SubmissionEntry>, RingCorrupt> {
        let tail = self.word32(SQ_TAIL).load(Ordering::Acquire);
        let count = tail.wrapping_sub(self.own_sq);
        if count > self.entries {
            return Err(RingCorrupt(format!(
                "submission tail {tail} is {count} entries ahead of head {} in a ring of {}",
                self.own_sq, self.entries
            )));
        }
        let out = (0..count)
            .map(|i| {
                let at = self.sqe_offset(self.own_sq.wrapping_add(i));
                SubmissionEntry::from_words(std::array::from_fn(|w| {
                    self.word64(at + w * 8).load(Ordering::Relaxed)
                }))
            })
            .collect();
        self.own_sq = tail;
        self.word32(SQ_HEAD).store(tail, Ordering::Release);
        Ok(out)
    }

    /// Room for completions now: the client has not consumed the rest.
    pub fn completion_room(&self) -> Result<u32, RingCorrupt> {
        let head = self.word32(CQ_HEAD).load(Ordering::Acquire);
        let used = self.own_cq.wrapping_sub(head);
        if used > self.entries {
            return Err(RingCorrupt(format!(
                "completion head {head} is {used} entries behind tail {} in a ring of {}",
                self.own_cq, self.entries
            )));
        }
        Ok(self.entries - used)
    }

    /// Writes a completion, unseen by the client until
    /// [`Ring::publish_completions`]; the caller checked
    /// [`Ring::completion_room`].
    pub fn push_completion(&mut self, cqe: &CompletionEntry) {
        let at = self.cqe_offset(self.own_cq);
        for (i, w) in cqe.to_words().into_iter().enumerate() {
            self.word64(at + i * 8).store(w, Ordering::Relaxed);
        }
        self.own_cq = self.own_cq.wrapping_add(1);
    }

    /// Makes pushed completions visible to the client (one store of the
    /// shared tail for the lot) and wakes it in
    /// [`Ring::wait_for_completions`].
    pub fn publish_completions(&self) {
        self.word32(CQ_TAIL).store(self.own_cq, Ordering::Release);
        // A wake never blocks; with no waiter it is a no-op.
        let _ = futex::wake(self.word32(CQ_TAIL), futex::Flags::empty(), i32::MAX as u32);
    }

    /// Sleeps until the agent posts a completion this side has not seen,
    /// or `timeout` passes (returns at once if one is already there).
    pub fn wait_for_completions(&self, timeout: std::time::Duration) {
        // Returns at once unless the tail still is the one this side has
        // consumed up to; a timeout or a spurious wake-up is fine (callers
        // look for completions and wait again).
        let _ = futex::wait(
            self.word32(CQ_TAIL),
            futex::Flags::empty(),
            self.own_cq,
            Some(&crate::socket::timespec(timeout)),
        );
    }

    /// Scribbles on an index, as a broken or hostile client would (tests).
    #[doc(hidden)]
    pub fn corrupt_submission_tail(&self, value: u32) {
        self.word32(SQ_TAIL).store(value, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(entries: u32) -> (Ring, Ring) {
        let mem = SharedMemory::create("ring", ring_bytes(entries)).unwrap();
        let peer =
            SharedMemory::import(mem.file().try_clone().unwrap(), ring_bytes(entries)).unwrap();
        let client = Ring::create(mem, entries).unwrap();
        (client, Ring::attach(peer, entries).unwrap())
    }

    #[test]
    fn entries_survive_the_words_encoding() {
        let sqe = SubmissionEntry {
            user_data: u64::MAX - 3,
            file_offset: 1 << 40,
            buf_offset: 7,
            len: 4096,
            file_id: 9,
            buf_id: u32::MAX,
            op: OP_WRITE,
            reserved: [0; 23],
        };
        assert_eq!(SubmissionEntry::from_words(sqe.to_words()), sqe);
        let cqe = CompletionEntry {
            user_data: 5,
            result: -i64::from(Errno::FAULT.raw_os_error()),
            reserved: [0; 16],
        };
        assert_eq!(CompletionEntry::from_words(cqe.to_words()), cqe);
    }

    #[test]
    fn submissions_and_completions_flow_and_wrap() {
        let (mut client, mut agent) = pair(4);
        for round in 0..5u64 {
            for i in 0..4 {
                assert!(client.push_submission(&SubmissionEntry {
                    user_data: round * 10 + i,
                    ..Default::default()
                }));
            }
            assert!(
                !client.push_submission(&SubmissionEntry::default()),
                "ring full"
            );
            client.publish();
            let got = agent.take_submissions().unwrap();
            assert_eq!(
                got.iter().map(|s| s.user_data).collect::<Vec<_>>(),
                (0..4).map(|i| round * 10 + i).collect::<Vec<_>>()
            );
            assert_eq!(agent.completion_room().unwrap(), 4);
            for s in &got {
                agent.push_completion(&CompletionEntry {
                    user_data: s.user_data,
                    result: 1,
                    ..Default::default()
                });
            }
            assert_eq!(agent.completion_room().unwrap(), 0);
            agent.publish_completions();
            for s in &got {
                assert_eq!(client.pop_completion().unwrap().user_data, s.user_data);
            }
            assert!(client.pop_completion().is_none());
        }
    }

    #[test]
    fn a_waiting_client_is_woken_by_published_completions() {
        use std::time::{Duration, Instant};
        let (mut client, mut agent) = pair(4);
        let started = Instant::now();
        client.wait_for_completions(Duration::from_millis(50));
        assert!(started.elapsed() >= Duration::from_millis(40), "timed out");
        let waiter = std::thread::spawn(move || {
            let started = Instant::now();
            client.wait_for_completions(Duration::from_secs(20));
            (started.elapsed(), client.pop_completion())
        });
        std::thread::sleep(Duration::from_millis(50));
        agent.push_completion(&CompletionEntry {
            user_data: 7,
            ..Default::default()
        });
        agent.publish_completions();
        let (waited, got) = waiter.join().unwrap();
        assert!(waited < Duration::from_secs(10), "woken, not timed out");
        assert_eq!(got.unwrap().user_data, 7);
    }

    #[test]
    fn entries_are_checked_against_registrations() {
        let ok = SubmissionEntry {
            op: OP_READ,
            file_id: 1,
            buf_id: 2,
            buf_offset: 10,
            len: 90,
            ..Default::default()
        };
        let check = |s: &SubmissionEntry| check_entry(s, |f| f == 1, |b| (b == 2).then_some(100));
        assert_eq!(check(&ok), Ok(()));
        assert_eq!(
            check(&SubmissionEntry { op: 9, ..ok }),
            Err(-Errno::INVAL.raw_os_error())
        );
        assert_eq!(
            check(&SubmissionEntry {
                reserved: [1; 23],
                ..ok
            }),
            Err(-Errno::INVAL.raw_os_error())
        );
        assert_eq!(
            check(&SubmissionEntry { file_id: 5, ..ok }),
            Err(-Errno::BADF.raw_os_error())
        );
        assert_eq!(
            check(&SubmissionEntry { buf_id: 5, ..ok }),
            Err(-Errno::BADF.raw_os_error())
        );
        assert_eq!(
            check(&SubmissionEntry { len: 91, ..ok }),
            Err(-Errno::FAULT.raw_os_error())
        );
        assert_eq!(
            check(&SubmissionEntry {
                buf_offset: u64::MAX,
                ..ok
            }),
            Err(-Errno::FAULT.raw_os_error())
        );
        assert_eq!(
            check(&SubmissionEntry {
                file_offset: u64::MAX,
                ..ok
            }),
            Err(-Errno::FAULT.raw_os_error())
        );
        assert_eq!(
            check(&SubmissionEntry {
                len: u64::MAX,
                ..ok
            }),
            Err(-Errno::TOOBIG.raw_os_error())
        );
    }

    #[test]
    fn scribbled_indices_and_headers_are_corruption() {
        let (client, mut agent) = pair(8);
        client.corrupt_submission_tail(1000);
        assert!(agent.take_submissions().is_err());
        let mem = SharedMemory::create("bad", ring_bytes(8)).unwrap();
        assert!(Ring::attach(mem, 8).is_err(), "no magic");
        let mem = SharedMemory::create("small", 100).unwrap();
        assert!(Ring::create(mem, 8).is_err());
        let mem = SharedMemory::create("odd", ring_bytes(8)).unwrap();
        assert!(Ring::create(mem, 6).is_err());
    }
}

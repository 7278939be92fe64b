//! The write pipeline, the read pipeline's mirror: each worker owns a share
//! of the staging slots and a copy queue. It queues a window's device-to-host
//! copies into a free slot at once, and writes the slot to its file once the
//! fence behind those copies has passed, so copies and writes overlap (a
//! worker keeps up to its slot count in flight, and workers run in parallel).

use super::workers::{assert_fits, run_workers, Progress, QueuePool};
use crate::device::{CopyQueue, Device, Fence};
use crate::plan::Window;
use crate::staging::StagingShare;
use crate::stats::WorkerProfile;
use crate::storage::{write_mode, FilePair, IoMode, Origin, SinkFile, WriteBackend, WriteMapping};
use crate::{Error, ErrorKind, Result};
use std::collections::VecDeque;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Instant;

/// Sees each window's bytes in its slot before they are written, and says
/// which ranges (relative to the window's start) to write. Incremental
/// checkpoints use it to hash chunks and skip unchanged ones. The ranges
/// must be in order, disjoint, and inside the window's copies.
pub type WriteFilter<'a> = &'a (dyn Fn(usize, u64, &[u8]) -> Result<Vec<Range<u64>>> + Sync);

/// Byte counts one worker wrote, by mode, and where its time went.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Written {
    pub direct: u64,
    pub buffered: u64,
    /// Bytes copied into mappings of the files.
    pub mapped: u64,
    /// Bytes sent to remote objects, in whole parts.
    pub remote: u64,
    /// Bytes the filter chose not to write.
    pub skipped: u64,
    pub profile: WorkerProfile,
}

impl Written {
    fn add(&mut self, o: Written) {
        self.direct += o.direct;
        self.buffered += o.buffered;
        self.mapped += o.mapped;
        self.remote += o.remote;
        self.skipped += o.skipped;
        self.profile.add(o.profile);
    }
}

pub(super) struct WriteJob<'a> {
    pub device: &'a dyn Device,
    /// Where each worker takes its copy queue from, and gives it back.
    pub queues: &'a QueuePool,
    pub files: &'a [SinkFile],
    /// Per file, the mapping its windows are copied into, if any.
    pub maps: Vec<Option<WriteMapping>>,
    pub writer: &'a dyn WriteBackend,
    pub windows: Vec<Window>,
    pub filter: Option<WriteFilter<'a>>,
    pub progress: Option<Progress<'a>>,
}

pub(super) struct WriteWorker<'s> {
    pub slots: StagingShare<'s>,
}

/// A worker with its copy queue, taken on its own thread.
struct Equipped<'s> {
    slots: StagingShare<'s>,
    queue: Box<dyn CopyQueue>,
}

/// Runs `job` on `workers`. Either every window was written (or skipped by
/// the filter) or an error is returned.
pub(super) fn run(job: &WriteJob<'_>, workers: Vec<WriteWorker<'_>>) -> Result<Written> {
    let next = AtomicUsize::new(0);
    let abort = AtomicBool::new(false);
    let mut total = Written::default();
    for w in run_workers(workers, &abort, |w| work(job, &next, &abort, w))? {
        total.add(w);
    }
    Ok(total)
}

/// A window whose copies are queued into `slot`.
struct InFlight {
    fence: Box<dyn Fence>,
    slot: usize,
    window: usize,
}

fn work(
    job: &WriteJob<'_>,
    next: &AtomicUsize,
    abort: &AtomicBool,
    w: WriteWorker<'_>,
) -> Result<Written> {
    let started = Instant::now();
    let mut w = Equipped {
        slots: w.slots,
        queue: job.queues.take(job.device)?,
    };
    let mut out = Written::default();
    let mut free = w.slots.all_free();
    let mut pending: VecDeque<InFlight> = VecDeque::new();
    let mut result = Ok(());
    while result.is_ok() && !abort.load(Ordering::Relaxed) {
        let i = next.fetch_add(1, Ordering::Relaxed);
        let Some(win) = job.windows.get(i) else { break };
        let slot = loop {
            if let Some(slot) = w.slots.take(&mut free, pending.is_empty()) {
                break Some(slot);
            }
            let oldest = pending
                .pop_front()
                .expect("no free slot means one in flight");
            result = finish(job, &mut w, &oldest, &mut out);
            free.push(oldest.slot);
            if result.is_err() {
                break None;
            }
        };
        let Some(slot) = slot else { break };
        result = queue_window(&mut w, slot, win, &mut out.profile).map(|fence| {
            pending.push_back(InFlight {
                fence,
                slot,
                window: i,
            })
        });
        if result.is_err() {
            free.push(slot);
        }
    }
    // Whatever happened, every queued copy is waited for before the slots
    // can be reused; on success the rest is written.
    for f in pending.drain(..) {
        result = if result.is_ok() {
            finish(job, &mut w, &f, &mut out)
        } else {
            wait(&*f.fence, &mut out.profile).and(result)
        };
    }
    out.profile.worker_seconds = started.elapsed().as_secs_f64();
    // After an error a copy may still be queued: the pool waits for it.
    job.queues.give_back(w.queue, result.is_ok());
    result.map(|()| out)
}

/// Queues `win`'s device-to-host copies into `slot` and returns their fence.
fn queue_window(
    w: &mut Equipped<'_>,
    slot: usize,
    win: &Window,
    profile: &mut WorkerProfile,
) -> Result<Box<dyn Fence>> {
    assert_fits(win, w.slots.slot_bytes());
    // The pool may still be pinning the slot (a new engine's first
    // transfer).
    let t = Instant::now();
    w.slots.wait_ready(slot)?;
    profile.staging_wait_seconds += t.elapsed().as_secs_f64();
    let t = Instant::now();
    let base = w.slots.ptr(slot);
    for c in &win.copies {
        // SAFETY: the copy lands inside the slot (window_offset + len <=
        // needed <= slot length), which this worker owns and does not touch
        // until the fence below has passed; the device range was checked
        // against its buffer when the plan was built, and the plan keeps
        // that buffer alive.
        unsafe {
            w.queue
                .copy_to_host(c.dst, base.add(c.window_offset as usize), c.len as usize)?
        };
    }
    let fence = w.queue.record();
    profile.queue_seconds += t.elapsed().as_secs_f64();
    fence
}

fn wait(fence: &dyn Fence, profile: &mut WorkerProfile) -> Result<()> {
    let t = Instant::now();
    let r = fence.wait();
    profile.copy_wait_seconds += t.elapsed().as_secs_f64();
    r
}

/// Waits for a window's copies, then writes what the filter keeps: to a
/// local file, those ranges; to a remote object, the whole part, unless
/// the filter keeps none of it.
fn finish(job: &WriteJob<'_>, w: &mut Equipped<'_>, f: &InFlight, out: &mut Written) -> Result<()> {
    wait(&*f.fence, &mut out.profile)?;
    let win = &job.windows[f.window];
    let file = &job.files[win.file];
    let runs = copied_runs(win);
    // SAFETY: the fence passed, so the copies into the slot are complete and
    // nothing else reads or writes it until this worker frees it.
    let slot = unsafe { std::slice::from_raw_parts_mut(w.slots.ptr(f.slot), win.needed as usize) };
    match &**file {
        Origin::Remote { object, .. } => {
            fill_gaps(slot, &runs);
            file.overlay_host_bytes(win.start, slot);
            let keep = kept_ranges(job, win, slot, &runs, &mut out.profile)?;
            let t = Instant::now();
            // A part is sent whole if the filter keeps any of it; one it
            // keeps none of (copied device bytes, and no header) the object
            // fills itself.
            let filtered_out = keep.is_empty()
                && win.payload() > 0
                && !file.holds_host_bytes_in(win.start, win.needed);
            if filtered_out {
                object
                    .copy_part(win.start, win.needed)
                    .map_err(|e| write_error(file, win.start, win.needed, e))?;
                out.skipped += win.payload();
            } else {
                object
                    .write_part(win.start, slot)
                    .map_err(|e| write_error(file, win.start, win.needed, e))?;
                out.remote += win.payload();
            }
            out.profile.io_seconds += t.elapsed().as_secs_f64();
        }
        Origin::Local(fds) => {
            let keep = kept_ranges(job, win, slot, &runs, &mut out.profile)?;
            let t = Instant::now();
            let mut kept = 0;
            for r in keep {
                kept += r.end - r.start;
                if let Some(map) = &job.maps[win.file] {
                    let at = win.start + r.start;
                    map.write_at(at, &slot[r.start as usize..r.end as usize])
                        .map_err(|e| write_error(file, at, r.end - r.start, e))?;
                    out.mapped += r.end - r.start;
                    continue;
                }
                let (direct, buffered) = write_range(job.writer, file, fds, win.start, r, slot)?;
                out.direct += direct;
                out.buffered += buffered;
            }
            out.profile.io_seconds += t.elapsed().as_secs_f64();
            out.skipped += win.payload() - kept;
        }
    }
    if let Some(p) = job.progress {
        p(win.payload());
    }
    Ok(())
}

/// The ranges of the window (relative to its start) to write: what the
/// job's filter keeps of `bytes`, checked to lie in order inside the
/// copied `runs`; without a filter, the runs.
fn kept_ranges(
    job: &WriteJob<'_>,
    win: &Window,
    bytes: &[u8],
    runs: &[Range<u64>],
    profile: &mut WorkerProfile,
) -> Result<Vec<Range<u64>>> {
    let Some(filter) = job.filter else {
        return Ok(runs.to_vec());
    };
    let t = Instant::now();
    let keep = filter(win.file, win.start, bytes)?;
    profile.check_seconds += t.elapsed().as_secs_f64();
    let inside = |r: &Range<u64>| runs.iter().any(|c| c.start <= r.start && r.end <= c.end);
    let ordered = keep.windows(2).all(|p| p[0].end <= p[1].start);
    if !ordered || !keep.iter().all(inside) {
        return Err(Error::invalid(
            "a write filter named overlapping ranges or bytes outside the window",
        ));
    }
    Ok(keep)
}

/// Zeros the bytes of `part` outside `runs` (in order, disjoint): what no
/// copy filled holds whatever the slot held before.
fn fill_gaps(part: &mut [u8], runs: &[Range<u64>]) {
    let mut at = 0;
    for r in runs
        .iter()
        .chain(std::iter::once(&(part.len() as u64..part.len() as u64)))
    {
        part[at..r.start as usize].fill(0);
        at = r.end as usize;
    }
}

/// The window's copied byte ranges (relative to its start), merged.
fn copied_runs(win: &Window) -> Vec<Range<u64>> {
    let mut runs: Vec<Range<u64>> = Vec::new();
    for c in &win.copies {
        let r = c.window_offset..c.window_offset + c.len;
        match runs.last_mut() {
            Some(last) if last.end == r.start => last.end = r.end,
            _ => runs.push(r),
        }
    }
    runs
}

/// Writes `bytes[r]` at `start + r.start`: the aligned part with O_DIRECT
/// where the file allows it, the rest buffered. Returns (direct, buffered)
/// byte counts.
fn write_range(
    writer: &dyn WriteBackend,
    file: &SinkFile,
    fds: &FilePair,
    start: u64,
    r: Range<u64>,
    bytes: &[u8],
) -> Result<(u64, u64)> {
    let at = start + r.start;
    let len = r.end - r.start;
    let aligned = len / crate::storage::DIRECT_ALIGN * crate::storage::DIRECT_ALIGN;
    let mut split = 0;
    if aligned > 0 && write_mode(file, at, aligned) == IoMode::Direct {
        let buf = &bytes[r.start as usize..(r.start + aligned) as usize];
        match writer.write_at(fds, IoMode::Direct, at, buf) {
            Ok(()) => split = aligned,
            // The file system took O_DIRECT at open but refuses the write.
            Err(e) if e.raw_os_error() == Some(rustix::io::Errno::INVAL.raw_os_error()) => {
                file.refuse_direct()
            }
            Err(e) => return Err(write_error(file, at, aligned, e)),
        }
    }
    if split < len {
        let buf = &bytes[(r.start + split) as usize..r.end as usize];
        writer
            .write_at(fds, IoMode::Buffered, at + split, buf)
            .map_err(|e| write_error(file, at + split, len - split, e))?;
    }
    Ok((split, len - split))
}

pub(super) fn write_error(file: &SinkFile, at: u64, len: u64, e: std::io::Error) -> Error {
    let err = Error::io(
        file.path(),
        &format!("write of {len} bytes at offset {at} failed in"),
        e,
    );
    if err.kind() == ErrorKind::StorageFull {
        return err.context("the file system is full");
    }
    err
}

//! The read pipeline. Each I/O worker owns a share of the staging slots, a
//! copy queue and a reader. For a staged window it reads into a free slot
//! (for a mapped-copy window it copies out of the file's mapping instead) and
//! queues the slot's copies at once; the slot is reused only after the fence
//! recorded behind those copies has passed, so reads and copies overlap. For
//! a page-cache DMA window it pins the window's pages of the file's mapping
//! and lets the device copy straight from them (or stages the window when the
//! pages cannot be pinned). Before a worker returns, every fence it recorded
//! has been waited for: no copy outlives the memory it reads.
//!
//! Workers take claims off a [`Work`]: one transfer's, or a chain's that
//! more reads join while it runs. A worker tells a read that a claim of
//! its has arrived once the claim's last fence has passed (asked without
//! waiting after every claim), and waits for all its copies to arrive
//! before it waits for more reads.

use super::page_cache_dma::populate;
use super::work::{PlannedRead, Work};
use super::workers::{assert_fits, run_workers, Progress, QueuePool};
use crate::crew::Crew;
use crate::device::{CopyQueue, Device, DeviceAddr, Fence, HostPin};
use crate::plan::{region_holding, Route, Window, WindowCopy, WorkItem};
use crate::staging::StagingShare;
use crate::stats::WorkerProfile;
use crate::storage::{BlockReader, GuardedMapping, IoMode, ReadBackend, RemoteStream, SourceFile};
use crate::{Error, ErrorKind, Result};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Byte counts one worker moved, by route, and where its time went.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Moved {
    pub direct: u64,
    pub buffered: u64,
    pub remote: u64,
    pub mapped: u64,
    pub page_cache_dma: u64,
    pub profile: WorkerProfile,
}

impl Moved {
    pub fn add(&mut self, o: Moved) {
        self.direct += o.direct;
        self.buffered += o.buffered;
        self.remote += o.remote;
        self.mapped += o.mapped;
        self.page_cache_dma += o.page_cache_dma;
        self.profile.add(o.profile);
    }
}

/// Sees each staged window's bytes (file number, file offset of the first
/// byte, the bytes) after they were read and before they are copied; an
/// error stops the transfer. Restores use it to verify checksums.
pub type ReadCheck<'a> = &'a (dyn Fn(usize, u64, &[u8]) -> Result<()> + Sync);

/// Pinned page-cache DMA windows a worker keeps in flight.
const MAX_DMA_IN_FLIGHT: usize = 2;

pub(super) struct Job<'a> {
    pub device: &'a dyn Device,
    pub queues: &'a QueuePool,
    /// When the pipeline started (see `WorkerProfile::start_seconds`).
    pub started: Instant,
    pub backend: &'a dyn ReadBackend,
    /// The files every read of `work` reads; those of the mapped-copy and
    /// page-cache DMA routes were mapped when the reads were planned.
    pub files: &'a [SourceFile],
    /// The reads, with what a worker takes at a time: ranges of a read's
    /// items (see [`super::claims::claims`]).
    pub work: &'a Work,
    pub check: Option<ReadCheck<'a>>,
    pub progress: Option<Progress<'a>>,
    /// Helpers that share each mapped copy: for a job of one worker only
    /// (several workers copy in parallel already).
    pub crew: Option<&'a Crew>,
}

struct Shared<'a> {
    job: &'a Job<'a>,
    abort: AtomicBool,
    /// Why pinning a DMA window failed, the first time it did.
    pin_refusal: Mutex<Option<String>>,
}

/// One worker's share of the staging slots.
pub(super) struct Worker<'s> {
    pub slots: StagingShare<'s>,
}

/// One worker's equipment, made on its own thread.
struct Equipment<'s> {
    slots: StagingShare<'s>,
    queue: Box<dyn CopyQueue>,
    /// Made at the first read: windows that are copied out of mappings
    /// need none.
    reader: Option<Box<dyn BlockReader>>,
    /// The current claim's stream, where its windows are a remote object's.
    stream: Option<RemoteStream>,
    /// Fences recorded so far: a claim that recorded one arrives with it.
    fences: usize,
}

/// Copies queued and not yet known to have finished.
struct Pending {
    fence: Box<dyn Fence>,
    held: Held,
    /// The read one of whose claims has arrived when this fence passes.
    arrives: Option<Arc<PlannedRead>>,
}

/// What a pending fence releases when it passes.
enum Held {
    Slot(usize),
    /// Held only for its drop, which unpins the window's pages.
    Pin {
        _pin: Box<dyn HostPin>,
    },
}

/// Runs `job` on `workers` (one thread each) and returns the bytes moved,
/// and why page-cache DMA windows fell back to staging if any did. Either
/// every window arrived or an error is returned: never a partial success.
pub(super) fn run(job: &Job<'_>, workers: Vec<Worker<'_>>) -> Result<(Moved, Option<String>)> {
    let shared = Shared {
        job,
        abort: AtomicBool::new(false),
        pin_refusal: Mutex::new(None),
    };
    job.work.start(workers.len());
    let mut total = Moved::default();
    for m in run_workers(workers, &shared.abort, |w| work(&shared, w))? {
        total.add(m);
    }
    Ok((total, shared.pin_refusal.into_inner().unwrap()))
}

fn work(shared: &Shared<'_>, w: Worker<'_>) -> Result<Moved> {
    let mut w = Equipment {
        slots: w.slots,
        queue: shared.job.queues.take(shared.job.device)?,
        reader: None,
        stream: None,
        fences: 0,
    };
    let mut free = w.slots.all_free();
    let mut pending: VecDeque<Pending> = VecDeque::new();
    let mut moved = Moved::default();
    let started = Instant::now();
    moved.profile.start_seconds = (started - shared.job.started).as_secs_f64();
    let result = run_items(shared, &mut w, &mut free, &mut pending, &mut moved);
    if result.is_err() {
        // Workers waiting for more reads return.
        shared.job.work.stop();
    }
    // Whatever happened, wait for every queued copy before the slots and
    // pinned pages can be reused or released.
    let mut drained = Ok(());
    let waited = Instant::now();
    for p in pending.drain(..) {
        match p.fence.wait() {
            Ok(()) => arrived(shared.job, p.arrives),
            Err(e) => drained = drained.and(Err(e)),
        }
    }
    moved.profile.copy_wait_seconds += waited.elapsed().as_secs_f64();
    moved.profile.worker_seconds = started.elapsed().as_secs_f64();
    // After an error, copies queued without a fence may still run: the pool
    // waits for them before it keeps the queue.
    shared
        .job
        .queues
        .give_back(w.queue, result.is_ok() && drained.is_ok());
    result.and(drained).map(|_| moved)
}

/// Tells `read`, if any, that one of its claims has arrived; the last one
/// tells its owner, once no file has changed.
fn arrived(job: &Job<'_>, read: Option<Arc<PlannedRead>>) {
    if let Some(read) = read {
        read.claim_arrived(|| job.files.iter().try_for_each(SourceFile::check_unchanged));
    }
}

/// Takes claims off the work until it is over or a worker failed.
fn run_items(
    shared: &Shared<'_>,
    w: &mut Equipment<'_>,
    free: &mut Vec<usize>,
    pending: &mut VecDeque<Pending>,
    moved: &mut Moved,
) -> Result<()> {
    let job = shared.job;
    while !shared.abort.load(Ordering::Relaxed) {
        let (read, claim) = match job.work.take() {
            Some(taken) => taken,
            None => {
                // A read waits for its last copies: this worker's arrive
                // before it waits for reads to join.
                while !pending.is_empty() {
                    wait_oldest(job, pending, free, &mut moved.profile)?;
                }
                match job.work.wait_for_more() {
                    Some(taken) => taken,
                    None => break,
                }
            }
        };
        read.wait_for_streams(job.device)?;
        let fences = w.fences;
        run_claim(shared, w, free, pending, moved, &read, &read.items[claim])?;
        if shared.abort.load(Ordering::Relaxed) {
            break; // the claim may be cut short: it never arrives
        }
        match pending.back_mut() {
            Some(last) if w.fences > fences => last.arrives = Some(read),
            _ => arrived(job, Some(read)),
        }
        pass_arrived(job, pending, free)?;
    }
    Ok(())
}

/// Moves one claim's items.
fn run_claim(
    shared: &Shared<'_>,
    w: &mut Equipment<'_>,
    free: &mut Vec<usize>,
    pending: &mut VecDeque<Pending>,
    moved: &mut Moved,
    read: &PlannedRead,
    items: &[WorkItem],
) -> Result<()> {
    let job = shared.job;
    // Without a check, which must see each window's file range in its
    // slot, mapped copies move only the bytes their copies take (where
    // those fit a slot: copies of one window may overlap in the file).
    if items[0].route == Route::MappedCopy
        && job.check.is_none()
        && items.iter().map(|i| i.window.payload()).sum::<u64>() <= w.slots.slot_bytes() as u64
    {
        return stage_gathered(w, free, pending, moved, job, &read.regions, items);
    }
    w.stream = open_stream(job, items)?;
    for item in items {
        if shared.abort.load(Ordering::Relaxed) {
            break;
        }
        run_item(shared, w, free, pending, moved, item)?;
    }
    w.stream = None;
    Ok(())
}

/// Lets go of the oldest pending fences that have passed, without waiting.
fn pass_arrived(
    job: &Job<'_>,
    pending: &mut VecDeque<Pending>,
    free: &mut Vec<usize>,
) -> Result<()> {
    while let Some(p) = pending.front() {
        if !p.fence.passed()? {
            break;
        }
        let p = pending.pop_front().expect("just seen");
        release(job, p, free);
    }
    Ok(())
}

/// What a passed fence held goes back: its slot to `free`, its pin
/// dropped, and its read told of a claim's arrival.
fn release(job: &Job<'_>, p: Pending, free: &mut Vec<usize>) {
    if let Held::Slot(s) = p.held {
        free.push(s);
    }
    arrived(job, p.arrives);
}

/// The stream a claim's windows are read from where they are a remote
/// object's: one request from the first window's start to the last one's
/// end.
fn open_stream(job: &Job<'_>, items: &[WorkItem]) -> Result<Option<RemoteStream>> {
    let (first, last) = (&items[0].window, &items[items.len() - 1].window);
    let file = &job.files[first.file];
    let Some(object) = file.remote() else {
        return Ok(None);
    };
    let end = (last.start + last.needed).min(file.len());
    RemoteStream::open(object.as_ref(), first.start, end)
        .map(Some)
        .map_err(|e| {
            Error::io(
                file.path(),
                &format!(
                    "cannot start a read of {} bytes at offset {} of",
                    end - first.start,
                    first.start
                ),
                e,
            )
        })
}

/// Moves one item's bytes: reads or copies, then queues the device copies.
fn run_item(
    shared: &Shared<'_>,
    w: &mut Equipment<'_>,
    free: &mut Vec<usize>,
    pending: &mut VecDeque<Pending>,
    moved: &mut Moved,
    item: &WorkItem,
) -> Result<()> {
    let job = shared.job;
    let win = &item.window;
    match item.route {
        Route::Staged(mode) => stage(w, free, pending, moved, job, Fill::Read(mode), win)?,
        Route::MappedCopy => stage(w, free, pending, moved, job, Fill::Mapped, win)?,
        Route::PageCacheDma => {
            while pending
                .iter()
                .filter(|p| matches!(p.held, Held::Pin { .. }))
                .count()
                >= MAX_DMA_IN_FLIGHT
            {
                wait_oldest(job, pending, free, &mut moved.profile)?;
            }
            let map = mapping(job, win.file);
            let (ptr, len) = map.range(win.start, win.read_len);
            assert!(len as u64 >= win.needed, "DMA window past the mapping");
            let pinning = Instant::now();
            populate(ptr, len);
            // SAFETY: the mapping outlives the job, and the pin is held on
            // `pending` until the copies' fence has passed. Windows never
            // overlap, so no page is pinned twice.
            let pinned = unsafe { job.device.pin_host(ptr, len) };
            moved.profile.pin_seconds += pinning.elapsed().as_secs_f64();
            match pinned {
                Ok(Some(pin)) => {
                    // SAFETY: the pinned range covers every copy's source
                    // and stays pinned and mapped until the fence passes
                    // (or, on an error, until the queue is idle).
                    let queued = unsafe { queue_copies(w, ptr, &win.copies, &mut moved.profile) };
                    match queued {
                        Ok(fence) => {
                            pending.push_back(Pending {
                                fence,
                                held: Held::Pin { _pin: pin },
                                arrives: None,
                            });
                            moved.page_cache_dma += win.payload();
                        }
                        Err(e) => {
                            // Copies queued before the failure may still
                            // read the pages: the pin outlives them, and
                            // is leaked rather than released under them
                            // where even waiting fails.
                            match w.queue.record().and_then(|f| f.wait()) {
                                Ok(()) => drop(pin),
                                Err(_) => std::mem::forget(pin),
                            }
                            return Err(e);
                        }
                    }
                }
                refused => {
                    let why = match refused {
                        Err(e) => e.to_string(),
                        _ => "this device cannot pin host memory".to_string(),
                    };
                    shared.pin_refusal.lock().unwrap().get_or_insert(why);
                    // The same bytes through staging slots instead.
                    let extents = win.extents();
                    let slot_len = w.slots.slot_bytes() as u64;
                    for sub in
                        crate::plan::windows(&extents, slot_len, crate::storage::DIRECT_ALIGN)
                    {
                        let fill = Fill::Read(IoMode::Buffered);
                        stage(w, free, pending, moved, job, fill, &sub)?;
                    }
                }
            }
        }
    }
    if let Some(p) = job.progress {
        p(win.payload());
    }
    Ok(())
}

/// Waits for the oldest pending fence and releases what it held.
fn wait_oldest(
    job: &Job<'_>,
    pending: &mut VecDeque<Pending>,
    free: &mut Vec<usize>,
    profile: &mut WorkerProfile,
) -> Result<()> {
    let p = pending.pop_front().expect("something is pending");
    let t = Instant::now();
    let waited = p.fence.wait();
    profile.copy_wait_seconds += t.elapsed().as_secs_f64();
    waited?;
    release(job, p, free);
    Ok(())
}

/// The mapping of a file of the mapped-copy or page-cache DMA route.
fn mapping<'j>(job: &Job<'j>, file: usize) -> &'j GuardedMapping {
    job.files[file]
        .mapping()
        .expect("files of the mapped routes were mapped when their reads were planned")
}

/// How a staging slot is filled.
#[derive(Debug, Clone, Copy)]
enum Fill {
    /// A read (buffered or O_DIRECT) from the file.
    Read(IoMode),
    /// A CPU copy out of the file's mapping.
    Mapped,
}

/// Fills a free slot with `win` and queues its copies.
fn stage(
    w: &mut Equipment<'_>,
    free: &mut Vec<usize>,
    pending: &mut VecDeque<Pending>,
    moved: &mut Moved,
    job: &Job<'_>,
    fill: Fill,
    win: &Window,
) -> Result<()> {
    let file = &job.files[win.file];
    let slot = take_slot(job, w, free, pending, moved)?;
    let t = Instant::now();
    let read = match fill {
        Fill::Read(mode) => read_window(w, slot, job.backend, file, mode, win).map(Some),
        Fill::Mapped => copy_window(w, slot, job, win).map(|()| None),
    };
    moved.profile.io_seconds += t.elapsed().as_secs_f64();
    let read = read.and_then(|used| {
        if let Some(check) = job.check {
            let t = Instant::now();
            // SAFETY: the slot holds `win.needed` freshly read bytes and no
            // copy reads or writes it now.
            let bytes =
                unsafe { std::slice::from_raw_parts(w.slots.ptr(slot), win.needed as usize) };
            check(win.file, win.start, bytes)?;
            moved.profile.check_seconds += t.elapsed().as_secs_f64();
        }
        Ok(used)
    });
    let used = match read {
        Ok(used) => used,
        Err(e) => {
            free.push(slot);
            return Err(e);
        }
    };
    let base = w.slots.ptr(slot);
    // SAFETY: the slot holds `win.needed` freshly read bytes, and it stays
    // untouched until the fence below has been waited for (it is on
    // `pending` and not in `free`).
    let fence = unsafe { queue_copies(w, base, &win.copies, &mut moved.profile)? };
    pending.push_back(Pending {
        fence,
        held: Held::Slot(slot),
        arrives: None,
    });
    match used {
        Some(_) if file.local_fds().is_none() => moved.remote += win.payload(),
        Some(IoMode::Direct) => moved.direct += win.payload(),
        Some(IoMode::Buffered) => moved.buffered += win.payload(),
        None => moved.mapped += win.payload(),
    }
    Ok(())
}

/// A free slot, ready for use: the oldest pending copies are waited for
/// until one is.
fn take_slot(
    job: &Job<'_>,
    w: &mut Equipment<'_>,
    free: &mut Vec<usize>,
    pending: &mut VecDeque<Pending>,
    moved: &mut Moved,
) -> Result<usize> {
    let slot = loop {
        if let Some(slot) = w.slots.take(free, pending.is_empty()) {
            break slot;
        }
        wait_oldest(job, pending, free, &mut moved.profile)?;
    };
    // The pool may still be making the slot ready (a new engine's first
    // transfer), which may write its pages: neither the CPU nor a copy
    // uses it before.
    let t = Instant::now();
    let ready = w.slots.wait_ready(slot);
    moved.profile.staging_wait_seconds += t.elapsed().as_secs_f64();
    match ready {
        Ok(()) => Ok(slot),
        Err(e) => {
            free.push(slot);
            Err(e)
        }
    }
}

/// Moves a claim of mapped-copy windows (gathered: see `claims`): the
/// bytes of their copies, one after another in one slot, queued as the
/// fewest device copies behind one fence.
fn stage_gathered(
    w: &mut Equipment<'_>,
    free: &mut Vec<usize>,
    pending: &mut VecDeque<Pending>,
    moved: &mut Moved,
    job: &Job<'_>,
    regions: &[(DeviceAddr, u64)],
    items: &[WorkItem],
) -> Result<()> {
    let slot = take_slot(job, w, free, pending, moved)?;
    let t = Instant::now();
    let gathered = gather_copies(w, slot, job, regions, items);
    moved.profile.io_seconds += t.elapsed().as_secs_f64();
    let copies = match gathered {
        Ok(copies) => copies,
        Err(e) => {
            free.push(slot);
            return Err(e);
        }
    };
    // SAFETY: the slot holds every copy's bytes, at its `window_offset`,
    // and stays untouched until the fence below has been waited for.
    let base = w.slots.ptr(slot);
    let fence = unsafe { queue_copies(w, base, &copies, &mut moved.profile)? };
    pending.push_back(Pending {
        fence,
        held: Held::Slot(slot),
        arrives: None,
    });
    for item in items {
        moved.mapped += item.window.payload();
        if let Some(p) = job.progress {
            p(item.window.payload());
        }
    }
    Ok(())
}

/// Copies the bytes of every copy of `items` out of their file's mapping
/// into `slot`, back to back, and returns the device copies out of the
/// slot: pieces that follow each other on the device too are one.
fn gather_copies(
    w: &mut Equipment<'_>,
    slot: usize,
    job: &Job<'_>,
    regions: &[(DeviceAddr, u64)],
    items: &[WorkItem],
) -> Result<Vec<WindowCopy>> {
    let (base, room) = (w.slots.ptr(slot), w.slots.slot_bytes() as u64);
    let mut out: Vec<WindowCopy> = Vec::new();
    let mut at = 0;
    for win in items.iter().map(|i| &i.window) {
        let map = mapping(job, win.file);
        for c in &win.copies {
            assert!(at + c.len <= room, "gathered copies larger than a slot");
            // SAFETY: this worker owns the slot exclusively and no copy
            // reads it now (its last fence has passed); `at .. at + c.len`
            // lies inside it (asserted) and is borrowed once.
            let buf =
                unsafe { std::slice::from_raw_parts_mut(base.add(at as usize), c.len as usize) };
            let offset = win.start + c.window_offset;
            map.copy_to(offset, buf, job.crew)
                .map_err(|e| mapped_copy_failed(&job.files[win.file], offset, c.len, e))?;
            // The last device copy ends at `at` in the slot: it takes this
            // one on where the two meet on the device too, in one buffer.
            match out.last_mut() {
                Some(p)
                    if p.dst + p.len == c.dst
                        && region_holding(regions, p.dst, p.len + c.len).is_some() =>
                {
                    p.len += c.len
                }
                _ => out.push(WindowCopy {
                    window_offset: at,
                    len: c.len,
                    dst: c.dst,
                }),
            }
            at += c.len;
        }
    }
    Ok(out)
}

/// Copies the bytes `win` needs out of its file's mapping into `slot`.
fn copy_window(w: &mut Equipment<'_>, slot: usize, job: &Job<'_>, win: &Window) -> Result<()> {
    assert_fits(win, w.slots.slot_bytes());
    let file = &job.files[win.file];
    let map = mapping(job, win.file);
    // SAFETY: this worker owns the slot exclusively and no copy reads it now
    // (its last fence has passed), so a unique mutable view is sound.
    let buf = unsafe { std::slice::from_raw_parts_mut(w.slots.ptr(slot), win.needed as usize) };
    map.copy_to(win.start, buf, job.crew)
        .map_err(|e| mapped_copy_failed(file, win.start, win.needed, e))
}

/// The error of a copy of `len` bytes at `offset` out of `file`'s mapping:
/// how the file changed, where its stamp shows it.
fn mapped_copy_failed(file: &SourceFile, offset: u64, len: u64, e: std::io::Error) -> Error {
    file.check_unchanged().err().unwrap_or_else(|| {
        Error::io(
            file.path(),
            &format!("copy of {len} bytes at offset {offset} out of the mapping failed in"),
            e,
        )
    })
}

/// Reads `win` into `slot`: from the claim's stream for a remote object,
/// else with the worker's reader, falling back to buffered I/O when the file
/// system refuses an O_DIRECT read. Returns the mode that was used.
fn read_window(
    w: &mut Equipment<'_>,
    slot: usize,
    backend: &dyn ReadBackend,
    file: &SourceFile,
    mode: IoMode,
    win: &Window,
) -> Result<IoMode> {
    assert_fits(win, w.slots.slot_bytes());
    // SAFETY: this worker owns the slot exclusively and no copy reads it now
    // (its last fence has passed), so a unique mutable view is sound.
    let buf = unsafe { std::slice::from_raw_parts_mut(w.slots.ptr(slot), win.read_len as usize) };
    if let Some(stream) = &mut w.stream {
        // A remote object's window: just the bytes its copies need.
        let got = stream
            .read_at(win.start, &mut buf[..win.needed as usize])
            .map_err(|e| read_failed(file, win, e))?;
        short_read(file, win, got)?;
        return Ok(IoMode::Buffered);
    }
    let reader = match &mut w.reader {
        Some(r) => r,
        None => w.reader.insert(backend.reader().map_err(|e| {
            Error::with_source(
                ErrorKind::Io,
                format!("cannot start a {} reader", backend.name()),
                e,
            )
        })?),
    };
    let mut mode = if mode == IoMode::Direct && file.direct_capable() {
        IoMode::Direct
    } else {
        IoMode::Buffered
    };
    let got = loop {
        match file.read_block(reader.as_mut(), mode, win.start, buf) {
            Ok(n) => break n,
            Err(e)
                if mode == IoMode::Direct
                    && e.raw_os_error() == Some(rustix::io::Errno::INVAL.raw_os_error()) =>
            {
                file.refuse_direct();
                mode = IoMode::Buffered;
            }
            Err(e) => return Err(read_failed(file, win, e)),
        }
    };
    short_read(file, win, got)?;
    Ok(mode)
}

fn read_failed(file: &SourceFile, win: &Window, e: std::io::Error) -> Error {
    Error::io(
        file.path(),
        &format!(
            "read of {} bytes at offset {} failed in",
            win.read_len, win.start
        ),
        e,
    )
}

/// An error where a read of `win` got fewer bytes than the window needs.
fn short_read(file: &SourceFile, win: &Window, got: usize) -> Result<()> {
    if (got as u64) < win.needed {
        // Say how the file changed, where it did.
        file.check_unchanged()?;
        return Err(Error::new(
            ErrorKind::Io,
            format!(
                "{}: file ended at byte {} but {} bytes are needed (truncated while loading?)",
                file.path().display(),
                win.start + got as u64,
                win.start + win.needed
            ),
        ));
    }
    Ok(())
}

/// Queues a window's copies on the worker's queue and returns the fence
/// behind them.
///
/// # Safety
/// `base + c.window_offset .. + c.len` must be readable for every copy and
/// stay unchanged until the returned fence has passed.
unsafe fn queue_copies(
    w: &mut Equipment<'_>,
    base: *const u8,
    copies: &[WindowCopy],
    profile: &mut WorkerProfile,
) -> Result<Box<dyn Fence>> {
    let t = Instant::now();
    for c in copies {
        // SAFETY: forwarded from this function's contract; destinations were
        // bounds-checked when the plan was built.
        unsafe {
            w.queue
                .copy_to_device(base.add(c.window_offset as usize), c.dst, c.len as usize)?
        };
    }
    let fence = w.queue.record()?;
    w.fences += 1;
    profile.queue_seconds += t.elapsed().as_secs_f64();
    Ok(fence)
}

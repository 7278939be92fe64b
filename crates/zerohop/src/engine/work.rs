//! What a run of the read pipeline takes its claims from: one transfer's
//! windows, or a chain of reads that more reads may join while it runs.
//! Each read knows how many of its claims have not yet arrived (their
//! copies' fences not yet passed) and is told once all have.

use crate::device::{wait_for_buffer_streams, Device};
use crate::plan::{TransferPlan, WorkItem};
use crate::stats::TransferStats;
use crate::storage::SourceFile;
use crate::{Error, ErrorKind, Result};
use std::collections::VecDeque;
use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::Instant;

/// What a chained read's owner is told once it is over: its stats, or why
/// it failed.
pub type OnArrival = Box<dyn FnOnce(Result<TransferStats>) + Send>;

/// A read planned for the pipeline: its windows and the claims workers
/// take of them.
pub struct PlannedRead {
    pub(super) items: Vec<WorkItem>,
    pub(super) claims: Vec<Range<usize>>,
    /// The destinations' buffers, sorted (see `TransferPlan::buffer_ranges`).
    pub(super) regions: Vec<(u64, u64)>,
    /// A chained read's files, and its own plan, which keeps its
    /// destinations' buffers alive until it is over (a transfer's are its
    /// caller's).
    pub(super) files: Option<Arc<Vec<SourceFile>>>,
    plan: Option<TransferPlan>,
    /// The stats told on arrival, but for their times.
    stats: TransferStats,
    /// Claims whose copies have not all passed their fences.
    left: AtomicUsize,
    /// Whether the streams of the destinations' buffers were waited for
    /// (by the first worker to reach the read), or why that failed.
    streams_waited: OnceLock<std::result::Result<(), (ErrorKind, String)>>,
    started: Instant,
    cpu_before: f64,
    on_arrival: Mutex<Option<OnArrival>>,
}

impl PlannedRead {
    /// A transfer's read, whose caller waited for its destinations'
    /// streams and learns its outcome from the pipeline's run.
    pub(super) fn whole(
        items: Vec<WorkItem>,
        claims: Vec<Range<usize>>,
        regions: Vec<(u64, u64)>,
    ) -> Self {
        let read = Self::new(items, claims, regions, None, TransferStats::default(), None);
        let _ = read.streams_waited.set(Ok(()));
        read
    }

    /// A read of a chain: it keeps `plan` until it is over, and tells
    /// `on_arrival` its outcome.
    pub(super) fn chained(
        items: Vec<WorkItem>,
        claims: Vec<Range<usize>>,
        files: Arc<Vec<SourceFile>>,
        plan: TransferPlan,
        stats: TransferStats,
        on_arrival: OnArrival,
    ) -> Box<Self> {
        let regions = plan.buffer_ranges();
        let mut read = Self::new(items, claims, regions, Some(plan), stats, Some(on_arrival));
        read.files = Some(files);
        Box::new(read)
    }

    fn new(
        items: Vec<WorkItem>,
        claims: Vec<Range<usize>>,
        regions: Vec<(u64, u64)>,
        plan: Option<TransferPlan>,
        stats: TransferStats,
        on_arrival: Option<OnArrival>,
    ) -> Self {
        PlannedRead {
            left: AtomicUsize::new(claims.len()),
            items,
            claims,
            regions,
            files: None,
            plan,
            stats,
            streams_waited: OnceLock::new(),
            started: Instant::now(),
            cpu_before: crate::stats::cpu_seconds(),
            on_arrival: Mutex::new(on_arrival),
        }
    }

    /// Waits, once for all workers, until the work queued on the
    /// destinations' streams is done: nothing may copy into them before.
    pub(super) fn wait_for_streams(&self, device: &dyn Device) -> Result<()> {
        let waited = self.streams_waited.get_or_init(|| {
            let buffers = self.plan.iter().flat_map(TransferPlan::buffers);
            wait_for_buffer_streams(device, buffers).map_err(|e| (e.kind(), e.to_string()))
        });
        waited
            .as_ref()
            .map(|_| ())
            .map_err(|(kind, why)| Error::new(*kind, why.clone()))
    }

    /// Notes that one claim's copies have passed their fences; once all
    /// have, the owner is told, after `check` (that no file changed).
    pub(super) fn claim_arrived(&self, check: impl FnOnce() -> Result<()>) {
        if self.left.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.tell(check);
        }
    }

    /// Tells the owner the read's outcome, if it has one not yet told.
    fn tell(&self, outcome: impl FnOnce() -> Result<()>) {
        let told = self
            .on_arrival
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(tell) = told {
            tell(outcome().map(|()| {
                let mut stats = self.stats.clone();
                stats.finish(self.started, self.cpu_before);
                stats
            }));
        }
    }
}

/// The reads of one pipeline run, in order, and the workers waiting for
/// more.
pub(super) struct Work {
    state: Mutex<WorkState>,
    added: Condvar,
}

struct WorkState {
    /// Reads with claims not yet taken, the first being taken.
    queued: VecDeque<Arc<PlannedRead>>,
    /// The next claim of `queued[0]`.
    next: usize,
    /// Every read of the run, to tell those left when it fails.
    all: Vec<Arc<PlannedRead>>,
    /// Workers waiting for a read to join, and how many the run has.
    idle: usize,
    workers: usize,
    /// No read may join: the work was whole from the start, or the run is
    /// over (every worker was idle with nothing queued, or one failed).
    closed: bool,
}

/// A claim taken: the read it belongs to and its range of the read's items.
pub(super) type Claim = (Arc<PlannedRead>, Range<usize>);

impl Work {
    /// One transfer's read, which no other joins.
    pub(super) fn whole(read: PlannedRead) -> Self {
        let work = Self::open();
        work.add(Box::new(read))
            .ok()
            .expect("a new work takes a read");
        work.lock().closed = true;
        work
    }

    /// Work that reads may join until its run is over.
    pub(super) fn open() -> Self {
        Work {
            state: Mutex::new(WorkState {
                queued: VecDeque::new(),
                next: 0,
                all: Vec::new(),
                idle: 0,
                workers: 0,
                closed: false,
            }),
            added: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, WorkState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Adds `read` behind the others, or gives it back where the run is
    /// over. A read of no claims has arrived at once.
    pub(super) fn add(&self, read: Box<PlannedRead>) -> std::result::Result<(), Box<PlannedRead>> {
        let mut s = self.lock();
        if s.closed {
            return Err(read);
        }
        if read.claims.is_empty() {
            read.tell(|| Ok(()));
            return Ok(());
        }
        let read: Arc<PlannedRead> = Arc::from(read);
        s.all.push(read.clone());
        s.queued.push_back(read);
        self.added.notify_all();
        Ok(())
    }

    /// Starts a run of `workers` workers.
    pub(super) fn start(&self, workers: usize) {
        self.lock().workers = workers;
    }

    /// The next claim, without waiting; None when none is queued now.
    pub(super) fn take(&self) -> Option<Claim> {
        Self::take_locked(&mut self.lock())
    }

    fn take_locked(s: &mut WorkState) -> Option<Claim> {
        while let Some(read) = s.queued.front() {
            if let Some(claim) = read.claims.get(s.next) {
                let taken = (read.clone(), claim.clone());
                s.next += 1;
                return Some(taken);
            }
            s.queued.pop_front();
            s.next = 0;
        }
        None
    }

    /// Waits for a read to join, and takes its first claim; None once the
    /// run is over: every worker waits with nothing queued, or it was
    /// stopped. A worker asks only once its copies have all arrived.
    pub(super) fn wait_for_more(&self) -> Option<Claim> {
        let mut s = self.lock();
        loop {
            if let Some(claim) = Self::take_locked(&mut s) {
                return Some(claim);
            }
            if s.closed {
                return None;
            }
            if s.idle + 1 == s.workers {
                s.closed = true;
                self.added.notify_all();
                return None;
            }
            s.idle += 1;
            s = self.added.wait(s).unwrap_or_else(PoisonError::into_inner);
            s.idle -= 1;
        }
    }

    /// Ends the run: no read joins any more, and waiting workers return.
    pub(super) fn stop(&self) {
        self.lock().closed = true;
        self.added.notify_all();
    }

    /// Tells every read not yet told that the run failed with `e`.
    pub(super) fn fail_all(&self, e: &Error) {
        let all = std::mem::take(&mut self.lock().all);
        for read in all {
            read.tell(|| Err(Error::new(e.kind(), e.to_string())));
        }
    }
}

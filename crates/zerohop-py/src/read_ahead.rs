//! Reads queued one after another on threads that never hold the GIL:
//! `safe_open`'s read-ahead windows. A window read from a Python thread
//! waited for the GIL to start and to return while the program took
//! tensors in Python, and the engine idled meanwhile (1 - 12 ms between
//! windows on a 2-core host). Into a device, a read queued while the one
//! before it is under way joins it in one pipeline run (a `ReadChain`).

use crate::engines::{engine, Place};
use crate::errors::to_py;
use crate::transfers::{plan_pieces, read_pieces, to_json, ReadThread, Sources};
use pyo3::prelude::*;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError, Weak};
use zerohop::{Error, ErrorKind, OnArrival, ReadChain, Result};

/// A read's outcome: its stats as JSON or its error, once it is over.
#[derive(Default)]
struct Outcome {
    state: Mutex<State>,
    over: Condvar,
}

#[derive(Default)]
enum State {
    #[default]
    Running,
    /// Over; the outcome until `wait` takes it.
    Over(Option<Result<String>>),
}

impl Outcome {
    fn wait_over(&self) -> MutexGuard<'_, State> {
        let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        self.over
            .wait_while(state, |s| matches!(s, State::Running))
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn finish(&self, outcome: Result<String>) {
        *self.state.lock().unwrap_or_else(PoisonError::into_inner) = State::Over(Some(outcome));
        self.over.notify_all();
    }
}

/// A read started by `read_queued`.
#[pyclass(frozen)]
pub struct QueuedRead {
    outcome: Arc<Outcome>,
    /// The chain it is read in, on a device (not host memory): reads
    /// queued behind it join that chain while it runs. Only the chain's
    /// thread holds it (and its files), so that they go when it ends.
    chain: Option<(Place, Weak<ReadChain>)>,
}

#[pymethods]
impl QueuedRead {
    /// Waits, without the GIL, until the read is over. Returns its stats
    /// as JSON or raises its error; None once an earlier call did.
    fn wait(&self, py: Python<'_>) -> PyResult<Option<String>> {
        let taken = py.detach(|| match &mut *self.outcome.wait_over() {
            State::Over(outcome) => outcome.take(),
            State::Running => unreachable!("waited until over"),
        });
        taken.transpose().map_err(to_py)
    }
}

/// Starts reading `pieces` of `sources` into memory of `device`, as `read`
/// does, once the read `after` is over (whatever its outcome). Into a
/// device, a read queued while `after`'s chain of reads runs joins it: the
/// engine goes on to it with no transfer's start and end in between.
/// `keep` owns every destination (the pieces' and the regions' memory): the
/// read holds it until it is over, and the caller uses none of it until
/// `wait` returns.
#[pyfunction]
#[pyo3(signature = (device, sources, pieces, stream, regions, keep, after=None))]
#[allow(clippy::too_many_arguments)]
pub fn read_queued(
    py: Python<'_>,
    device: &str,
    sources: Py<Sources>,
    pieces: Vec<(usize, u64, u64, u64)>,
    stream: Option<u64>,
    regions: Option<Vec<(u64, u64)>>,
    keep: Py<PyAny>,
    after: Option<Py<QueuedRead>>,
) -> PyResult<QueuedRead> {
    let place = Place::parse(device)?;
    let engine = py.detach(|| engine(place))?;
    let outcome = Arc::new(Outcome::default());
    let after = after.as_ref().map(Py::get);
    let before = after.map(|read| read.outcome.clone());
    let files = sources.get().files.clone();
    let thread = sources.get().threads.enter();
    if place == Place::Host {
        let mine = outcome.clone();
        spawn(before, thread, move || {
            // SAFETY: `keep` owns the destinations, live host memory, and
            // holds them until this closure ends; the caller touches none
            // of it until `wait` returns.
            let read = catch_unwind(AssertUnwindSafe(|| unsafe {
                read_pieces(&engine, place, &files, &pieces, stream, regions, None)
            }));
            let read = read
                .unwrap_or_else(|_| Err(Error::new(ErrorKind::Io, "a read-ahead read panicked")));
            mine.finish(read.map(|stats| to_json(&stats)));
            // Dropped without the GIL: Python releases it when it next
            // runs zerohop's code.
            drop(keep);
        })?;
        return Ok(QueuedRead {
            outcome,
            chain: None,
        });
    }
    let mine = outcome.clone();
    let on_arrival: OnArrival = Box::new(move |read| {
        mine.finish(read.map(|stats| to_json(&stats)));
        drop(keep);
    });
    let planned = py.detach(|| {
        // SAFETY: `keep` owns the destinations, live memory of `device`, and
        // holds them until the read is over (`on_arrival` owns it); the
        // caller touches none of it until `wait` returns.
        let plan = unsafe { plan_pieces(&engine, &files, &pieces, stream, regions) }?;
        engine.plan_chained(&files, plan, on_arrival)
    });
    let read = match planned {
        Ok(read) => read,
        Err(e) => {
            // The read's error, raised by `wait` as a failed read's is.
            outcome.finish(Err(e));
            return Ok(QueuedRead {
                outcome,
                chain: None,
            });
        }
    };
    let running = after
        .and_then(|a| a.chain.as_ref())
        .filter(|(p, _)| *p == place)
        .and_then(|(_, chain)| chain.upgrade())
        .filter(|chain| Arc::ptr_eq(chain.files(), &files));
    let read = match running {
        Some(chain) => match chain.join(read) {
            Ok(()) => {
                return Ok(QueuedRead {
                    outcome,
                    chain: Some((place, Arc::downgrade(&chain))),
                })
            }
            Err(read) => read,
        },
        None => read,
    };
    // A chain of its own, run once the read before it is over.
    let chain = Arc::new(ReadChain::new(files));
    if chain.join(read).is_err() {
        unreachable!("a new chain takes a read");
    }
    let joined = Arc::downgrade(&chain);
    spawn(before, thread, move || engine.run_chain(&chain))?;
    Ok(QueuedRead {
        outcome,
        chain: Some((place, joined)),
    })
}

/// Runs `read` on a thread of its own once `before` is over; `thread`
/// counts it among the threads reading its files until `read` and all it
/// holds are dropped.
fn spawn(
    before: Option<Arc<Outcome>>,
    thread: ReadThread,
    read: impl FnOnce() + Send + 'static,
) -> PyResult<()> {
    std::thread::Builder::new()
        .name("zerohop-read-ahead".into())
        .spawn(move || {
            let _counted = thread;
            if let Some(before) = before {
                drop(before.wait_over());
            }
            read();
        })
        .map(drop)
        .map_err(|e| {
            to_py(Error::new(
                ErrorKind::Io,
                format!("starting a read-ahead thread: {e}"),
            ))
        })
}

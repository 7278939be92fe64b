//! Reads queued one after another, each on a thread of its own that never
//! holds the GIL: `safe_open`'s read-ahead windows. A window read from a
//! Python thread waited for the GIL to start and to return while the
//! program took tensors in Python, and the engine idled meanwhile (1 - 12
//! ms between windows on a 2-core host).

use crate::engines::{engine, Place};
use crate::errors::to_py;
use crate::transfers::{read_pieces, to_json, Sources};
use pyo3::prelude::*;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use zerohop::{Error, ErrorKind, Result};

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
/// does, on a thread of its own once the read `after` is over (whatever
/// its outcome). `keep` owns every destination (the pieces' and the
/// regions' memory): the thread holds it until the read is over, and the
/// caller uses none of it until `wait` returns.
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
    let before = after.map(|read| read.get().outcome.clone());
    let outcome = Arc::new(Outcome::default());
    let mine = outcome.clone();
    std::thread::Builder::new()
        .name("zerohop-read-ahead".into())
        .spawn(move || {
            if let Some(before) = before {
                drop(before.wait_over());
            }
            let read = catch_unwind(AssertUnwindSafe(|| {
                // SAFETY: `keep` owns the destinations, live memory of
                // `device`, and holds them until this thread ends; the
                // caller touches none of it until `wait` returns.
                unsafe {
                    read_pieces(
                        &engine,
                        place,
                        &sources.get().files,
                        &pieces,
                        stream,
                        regions,
                        None,
                    )
                }
            }));
            let outcome = read
                .unwrap_or_else(|_| Err(Error::new(ErrorKind::Io, "a read-ahead read panicked")))
                .map(|stats| to_json(&stats));
            mine.finish(outcome);
            // Dropped without the GIL: Python releases them when it next
            // runs zerohop's code.
            drop((keep, sources));
        })
        .map_err(|e| {
            to_py(Error::new(
                ErrorKind::Io,
                format!("starting a read-ahead thread: {e}"),
            ))
        })?;
    Ok(QueuedRead { outcome })
}

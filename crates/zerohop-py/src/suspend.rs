//! Suspendable device memory (`zerohop.suspend` / `zerohop.resume`): one
//! heap per device for the process, and the two C functions PyTorch's
//! pluggable allocator calls to take memory from it
//! (`zerohop.suspendable()` loads this very library for them, so they
//! share the heaps with the Python calls).

use crate::engines::{engine, per_place, PerPlace, Place};
use crate::errors::to_py;
use crate::progress::Reporter;
use crate::transfers::finish;
use pyo3::prelude::*;
use std::ffi::c_void;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use zerohop_suspend::control::{self, ControlServer, QuietPoint};
use zerohop_suspend::SuspendableHeap;

/// The heap of `place`, made on first use.
fn heap(place: Place) -> PyResult<Arc<SuspendableHeap>> {
    static HEAPS: PerPlace<SuspendableHeap> = OnceLock::new();
    per_place(&HEAPS, place, || Ok(SuspendableHeap::new(engine(place)?)))
}

/// `size` bytes of `device`'s suspendable memory; its address.
#[pyfunction]
pub fn heap_alloc(py: Python<'_>, device: &str, size: usize) -> PyResult<u64> {
    let h = heap(Place::parse(device)?)?;
    py.detach(|| h.alloc(size)).map_err(to_py)
}

/// Frees the allocation at `addr`.
#[pyfunction]
pub fn heap_free(py: Python<'_>, device: &str, addr: u64) -> PyResult<()> {
    let h = heap(Place::parse(device)?)?;
    py.detach(|| h.free(addr)).map_err(to_py)
}

/// A heap's allocations (address, bytes), the bytes of device memory
/// behind them now, and where it is suspended to (None while it runs).
type HeapState = (Vec<(u64, usize)>, u64, Option<PathBuf>);

/// The state of `device`'s heap.
#[pyfunction]
pub fn heap_state(device: &str) -> PyResult<HeapState> {
    let h = heap(Place::parse(device)?)?;
    Ok((h.allocations(), h.backed_bytes(), h.suspended_to()))
}

/// Suspends the heap of `device` to a new checkpoint at `dir`
/// (incrementally against `parent`). Returns the save's stats as JSON, the
/// seconds until durable, the bytes written and the bytes released.
#[pyfunction]
#[pyo3(signature = (device, dir, parent=None, progress=None))]
pub fn heap_suspend(
    py: Python<'_>,
    device: &str,
    dir: PathBuf,
    parent: Option<PathBuf>,
    progress: Option<Bound<'_, PyAny>>,
) -> PyResult<(String, f64, u64, u64)> {
    let h = heap(Place::parse(device)?)?;
    let total = h.allocations().iter().map(|a| a.1 as u64).sum();
    let reporter = Reporter::new(progress.as_ref(), "suspending", total)?;
    let suspended = py.detach(|| {
        // SAFETY: the Python half waits for the device's work first, and
        // its contract (zerohop.suspend's docstring) is that nothing uses
        // the heap's tensors until a resume returns.
        reporter.with(|p| unsafe { h.suspend(&dir, parent.as_deref(), p) })
    });
    let figures = suspended.as_ref().map_or((0.0, 0, 0), |s| {
        (s.saved.seconds, s.saved.written_bytes, s.released_bytes)
    });
    let stats = finish(reporter, suspended.map(|s| s.saved.stats))?;
    Ok((stats, figures.0, figures.1, figures.2))
}

/// Resumes the heap of `device` from the checkpoint at `dir`: the
/// restore's stats as JSON, and the seconds spent backing the memory first.
#[pyfunction]
#[pyo3(signature = (device, dir, progress=None))]
pub fn heap_resume(
    py: Python<'_>,
    device: &str,
    dir: PathBuf,
    progress: Option<Bound<'_, PyAny>>,
) -> PyResult<(String, f64)> {
    let h = heap(Place::parse(device)?)?;
    let total = h.allocations().iter().map(|a| a.1 as u64).sum();
    let reporter = Reporter::new(progress.as_ref(), "resuming", total)?;
    // SAFETY: as in `heap_suspend`: nothing touches the memory meanwhile.
    let resumed = py.detach(|| reporter.with(|p| unsafe { h.resume(&dir, p) }));
    let backing_seconds = resumed.as_ref().map_or(0.0, |r| r.backing_seconds);
    Ok((finish(reporter, resumed.map(|r| r.stats))?, backing_seconds))
}

/// Where process `pid` serves suspend requests.
#[pyfunction]
pub fn suspend_socket_path(pid: u32) -> PathBuf {
    zerohop_wire::suspend::socket_path(pid)
}

/// Serves `zerohop suspend/resume PID DIR` for `device`'s heap at `path`
/// until the returned object is closed or dropped; `pause()` and
/// `unpause()` are the process's (see `zerohop.serve_suspend`).
#[pyfunction]
pub fn serve_suspend(
    device: &str,
    path: PathBuf,
    pause: Py<PyAny>,
    unpause: Py<PyAny>,
) -> PyResult<SuspendServer> {
    let h = heap(Place::parse(device)?)?;
    let quiet = QuietPoint {
        pause: Box::new(move || {
            Python::attach(|py| pause.call0(py).map(drop))
                .map_err(|e| zerohop::Error::invalid(format!("the process's pause failed: {e}")))
        }),
        unpause: Box::new(move || {
            Python::attach(|py| {
                if let Err(e) = unpause.call0(py) {
                    e.write_unraisable(py, None);
                }
            })
        }),
    };
    // SAFETY: the Python half's `pause` returns once the process leaves
    // the heap's memory alone (the docstring of `zerohop.serve_suspend`
    // makes that the caller's promise), and it stays so until `unpause`.
    let server = unsafe { control::serve(h, &path, quiet) }?;
    Ok(SuspendServer(Mutex::new(Some(server))))
}

/// A running `serve_suspend`; `close()` stops it.
#[pyclass(module = "zerohop._native")]
pub struct SuspendServer(Mutex<Option<ControlServer>>);

#[pymethods]
impl SuspendServer {
    /// The socket it serves at.
    #[getter]
    fn path(&self) -> Option<PathBuf> {
        let server = self.0.lock().unwrap_or_else(|p| p.into_inner());
        server.as_ref().map(|s| s.path().to_path_buf())
    }

    /// Stops serving (waits for a request being answered).
    fn close(&self, py: Python<'_>) {
        let server = self.0.lock().unwrap_or_else(|p| p.into_inner()).take();
        py.detach(|| drop(server));
    }
}

/// PyTorch's pluggable allocator's `malloc`: `size` bytes of GPU `device`'s
/// suspendable memory, or null (which PyTorch reports as out of memory).
#[no_mangle]
pub extern "C" fn zerohop_suspendable_alloc(
    size: isize,
    device: i32,
    _stream: *mut c_void,
) -> *mut c_void {
    let alloc = || -> Option<u64> {
        let place = Place::Cuda(usize::try_from(device).ok()?);
        heap(place).ok()?.alloc(usize::try_from(size).ok()?).ok()
    };
    // Nothing may unwind into PyTorch's C++.
    match std::panic::catch_unwind(alloc) {
        Ok(Some(addr)) => addr as *mut c_void,
        _ => std::ptr::null_mut(),
    }
}

/// PyTorch's pluggable allocator's `free`, for memory
/// `zerohop_suspendable_alloc` gave (PyTorch frees only memory no kernel
/// still uses).
#[no_mangle]
pub extern "C" fn zerohop_suspendable_free(
    ptr: *mut c_void,
    _size: isize,
    device: i32,
    _stream: *mut c_void,
) {
    let free = || {
        let place = Place::Cuda(usize::try_from(device).ok()?);
        heap(place).ok()?.free(ptr as u64).ok()
    };
    let _ = std::panic::catch_unwind(free);
}

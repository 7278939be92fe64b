//! Loads and saves of plain files and safetensors files.

use crate::engines::{engine, Place};
use crate::errors::to_py;
use crate::progress::Reporter;
use pyo3::prelude::*;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use zerohop::machine::MachineInfo;
use zerohop::plan::{region_holding, TransferPlan};
use zerohop::safetensors::{read_header, save_safetensors as save_file, Dtype, TensorToSave};
use zerohop::storage::{SinkFile, SourceFile};
use zerohop::{Engine, Error, Progress, Result, TransferStats};

/// A tensor as the Python half describes it: name, safetensors dtype,
/// shape, address, bytes.
pub type TensorSpec = (String, String, Vec<u64>, u64, u64);

/// A safetensors file's metadata and tensors.
type HeaderInfo = (Option<BTreeMap<String, String>>, Vec<TensorSpec>);

/// What this machine offers (`zerohop info --json`), as JSON.
#[pyfunction]
#[pyo3(signature = (path=None))]
pub fn info(py: Python<'_>, path: Option<PathBuf>) -> PyResult<String> {
    let info = py.detach(|| MachineInfo::gather(path.as_deref()));
    Ok(serde_json::to_string(&info).expect("machine info serializes"))
}

/// A safetensors file's metadata (None when it has none) and its tensors
/// as (name, dtype, shape, begin, end), offsets absolute in the file.
#[pyfunction]
pub fn safetensors_header(py: Python<'_>, path: PathBuf) -> PyResult<HeaderInfo> {
    let header = py
        .detach(|| {
            zerohop_names::open_sources(std::slice::from_ref(&path))
                .and_then(|f| read_header(&f[0]))
        })
        .map_err(to_py)?;
    let start = header.data_start;
    let tensors = header
        .tensors
        .into_iter()
        .map(|t| {
            (
                t.name,
                t.dtype.name().to_string(),
                t.shape,
                start + t.begin,
                start + t.end,
            )
        })
        .collect();
    let metadata = Some(header.metadata).filter(|m| !m.is_empty());
    Ok((metadata, tensors))
}

/// `names` with each object store prefix (`s3://bucket/dir/`) or pattern
/// (`s3://bucket/dir/*.safetensors`) replaced by the objects it names.
#[pyfunction]
pub fn expand_names(py: Python<'_>, names: Vec<String>) -> PyResult<Vec<String>> {
    py.detach(|| zerohop_names::expand(&names, ".safetensors"))
        .map_err(to_py)
}

/// Whether `name` lives in an object store (`s3://...`) rather than on a
/// local path: the one answer every front end asks for.
#[pyfunction]
pub fn is_object(name: PathBuf) -> bool {
    zerohop::location::is_object(name)
}

/// An object's (length, ETag): what tells that it was replaced.
#[pyfunction]
pub fn object_stamp(py: Python<'_>, url: String) -> PyResult<(u64, String)> {
    let info = py.detach(|| zerohop_s3::head(&url)).map_err(to_py)?;
    Ok((info.len, info.etag))
}

/// Files or objects opened once for many reads (`safe_open` keeps one):
/// each read skips opening them again, and a file is mapped once.
#[pyclass(frozen)]
pub struct Sources {
    /// Shared with the reads chained over them (see `read_ahead`).
    pub(crate) files: Arc<Vec<SourceFile>>,
    /// The threads of those reads, which hold `files` until they end.
    pub(crate) threads: Arc<ReadThreads>,
}

#[pymethods]
impl Sources {
    #[new]
    fn new(py: Python<'_>, paths: Vec<PathBuf>) -> PyResult<Self> {
        let files = py
            .detach(|| zerohop_names::open_sources(&paths))
            .map_err(to_py)?;
        Ok(Sources {
            files: Arc::new(files),
            threads: Arc::default(),
        })
    }

    /// Waits, without the GIL, until no thread of a read of these files
    /// is left: then the files' descriptors and mappings go with this
    /// object (`safe_open` closing). A read thread tells its reader the
    /// outcome before it lets go of the files.
    fn wait_for_threads(&self, py: Python<'_>) {
        py.detach(|| self.threads.wait_for_none());
    }
}

/// How many threads are reading some `Sources`' files.
#[derive(Default)]
pub(crate) struct ReadThreads {
    running: Mutex<usize>,
    ended: Condvar,
}

impl ReadThreads {
    /// Counts a thread in until the returned value is dropped.
    pub(crate) fn enter(self: &Arc<Self>) -> ReadThread {
        *self.running.lock().unwrap_or_else(PoisonError::into_inner) += 1;
        ReadThread(self.clone())
    }

    fn wait_for_none(&self) {
        let running = self.running.lock().unwrap_or_else(PoisonError::into_inner);
        drop(
            self.ended
                .wait_while(running, |n| *n > 0)
                .unwrap_or_else(PoisonError::into_inner),
        );
    }
}

/// A thread counted in [`ReadThreads`]; counted out when dropped.
pub(crate) struct ReadThread(Arc<ReadThreads>);

impl Drop for ReadThread {
    fn drop(&mut self) {
        *self
            .0
            .running
            .lock()
            .unwrap_or_else(PoisonError::into_inner) -= 1;
        self.0.ended.notify_all();
    }
}

/// What `read` reads from: files it opens, or ones opened before.
#[derive(FromPyObject)]
pub enum SourcesArg<'py> {
    Opened(Bound<'py, Sources>),
    Paths(Vec<PathBuf>),
}

/// Reads `pieces`, each (file index, file offset, bytes, address), from
/// `sources` (paths, or `Sources`) into memory of `device`. Returns the
/// transfer's stats as JSON, or None with `stats=False` (callers that
/// drop them: a small `get_slice` would spend microseconds on the text).
#[pyfunction]
#[pyo3(signature = (device, sources, pieces, stream=None, progress=None, stats=true, regions=None))]
#[allow(clippy::too_many_arguments)]
pub fn read(
    py: Python<'_>,
    device: &str,
    sources: SourcesArg<'_>,
    pieces: Vec<(usize, u64, u64, u64)>,
    stream: Option<u64>,
    progress: Option<Bound<'_, PyAny>>,
    stats: bool,
    regions: Option<Vec<(u64, u64)>>,
) -> PyResult<Option<String>> {
    let place = Place::parse(device)?;
    let engine = py.detach(|| engine(place))?;
    let total = pieces.iter().map(|p| p.2).sum();
    let reporter = Reporter::new(progress.as_ref(), "loading", total)?;
    let (opened, paths) = match &sources {
        SourcesArg::Opened(s) => (Some(s.get()), None),
        SourcesArg::Paths(p) => (None, Some(p)),
    };
    let outcome = py.detach(|| {
        let fresh;
        let files: &[SourceFile] = match (opened, paths) {
            (Some(s), _) => &s.files,
            (None, paths) => {
                fresh = zerohop_names::open_sources(paths.map_or(&[][..], Vec::as_slice))?;
                &fresh
            }
        };
        // SAFETY: the Python half passes live buffers of `device` that it
        // keeps alive for this call.
        reporter.with(|progress| unsafe {
            read_pieces(&engine, place, files, &pieces, stream, regions, progress)
        })
    });
    let moved = finished(reporter, outcome)?;
    Ok(stats.then(|| to_json(&moved)))
}

/// Reads `pieces` (file index, file offset, bytes, address) of `files`
/// into memory of `place`; a piece inside one of `regions` (an allocation
/// of the caller's) goes into it, so that one device copy may cover
/// several pieces.
///
/// # Safety
///
/// Every piece's range, and every region, is live memory of `place` (of
/// `stream`'s device) that nothing else uses until this returns.
pub unsafe fn read_pieces(
    engine: &Engine,
    place: Place,
    files: &[SourceFile],
    pieces: &[(usize, u64, u64, u64)],
    stream: Option<u64>,
    regions: Option<Vec<(u64, u64)>>,
    progress: Option<Progress<'_>>,
) -> Result<TransferStats> {
    if place == Place::Host {
        check_file_indices(files, pieces)?;
        return read_to_host(engine, files, pieces, progress);
    }
    // SAFETY: forwarded from this function's contract.
    let plan = unsafe { plan_pieces(engine, files, pieces, stream, regions) }?;
    engine.transfer(files, &plan, progress)
}

/// The plan of a read of `pieces` (file index, file offset, bytes,
/// address) of `files` into memory of `engine`'s device; a piece inside one
/// of `regions` goes into it. The plan keeps the destinations' buffers (on
/// the simulated device, registrations) alive.
///
/// # Safety
///
/// Every piece's range, and every region, is live memory of the engine's
/// device (of `stream`'s device) that nothing else uses until a transfer of
/// the plan is over.
pub unsafe fn plan_pieces(
    engine: &Engine,
    files: &[SourceFile],
    pieces: &[(usize, u64, u64, u64)],
    stream: Option<u64>,
    regions: Option<Vec<(u64, u64)>>,
) -> Result<TransferPlan> {
    check_file_indices(files, pieces)?;
    let mut plan = TransferPlan::new();
    let mut regions = regions.unwrap_or_default();
    regions.sort_unstable();
    let mut region_buffers = vec![None; regions.len()];
    for &(file, offset, len, addr) in pieces.iter().filter(|p| p.2 > 0) {
        match region_holding(&regions, addr, len) {
            Some(k) => {
                let (base, n) = regions[k];
                if region_buffers[k].is_none() {
                    // SAFETY: the caller's regions are live memory of the
                    // engine's device.
                    region_buffers[k] =
                        Some(unsafe { engine.device().borrow(base, n as usize, stream) }?);
                }
                let buf = region_buffers[k].as_ref().expect("just made");
                plan.add(files, file, offset, len, buf, addr - base)?;
            }
            None => {
                // SAFETY: the caller's pieces are live memory of the
                // engine's device.
                let buf = unsafe { engine.device().borrow(addr, len as usize, stream) }?;
                plan.add(files, file, offset, len, &buf, 0)?;
            }
        }
    }
    Ok(plan)
}

/// Refuses pieces of files that are not there.
fn check_file_indices(files: &[SourceFile], pieces: &[(usize, u64, u64, u64)]) -> Result<()> {
    match pieces.iter().find(|p| p.0 >= files.len()) {
        Some(p) => Err(Error::invalid(format!("file index {} out of range", p.0))),
        None => Ok(()),
    }
}

/// Host destinations are read into in place, no staging and no device.
fn read_to_host(
    engine: &Engine,
    files: &[SourceFile],
    pieces: &[(usize, u64, u64, u64)],
    progress: Option<Progress<'_>>,
) -> Result<TransferStats> {
    let mut ranges: Vec<(u64, u64)> = pieces.iter().map(|p| (p.3, p.2)).collect();
    ranges.sort_unstable();
    if ranges.windows(2).any(|w| w[0].0 + w[0].1 > w[1].0) {
        return Err(Error::invalid("destination buffers overlap"));
    }
    let reads = pieces
        .iter()
        .filter(|p| p.2 > 0)
        .map(|&(file, offset, len, addr)| {
            // SAFETY: the Python half passes live host buffers that it keeps
            // alive for this call; they were just checked to be disjoint.
            let dst = unsafe { std::slice::from_raw_parts_mut(addr as *mut u8, len as usize) };
            (&files[file], offset, dst)
        })
        .collect();
    let stats = engine.read_many_to_host(reads)?;
    if let Some(p) = progress {
        p(stats.bytes);
    }
    Ok(stats)
}

/// Writes `len` bytes at `addr` of `device` into `path` at `offset` (the
/// file is created if missing and never truncated); durable on return.
#[pyfunction]
#[pyo3(signature = (device, path, offset, addr, len, stream=None, progress=None))]
#[allow(clippy::too_many_arguments)]
pub fn write(
    py: Python<'_>,
    device: &str,
    path: PathBuf,
    offset: u64,
    addr: u64,
    len: u64,
    stream: Option<u64>,
    progress: Option<Bound<'_, PyAny>>,
) -> PyResult<String> {
    let engine = py.detach(|| engine(Place::parse(device)?))?;
    let reporter = Reporter::new(progress.as_ref(), "writing", len)?;
    let stats = py.detach(|| {
        let end = offset
            .checked_add(len)
            .ok_or_else(|| Error::invalid("offset + length overflows"))?;
        let files = [SinkFile::open_for_update(&path, end)?];
        let mut plan = TransferPlan::new();
        // SAFETY: as in `read`.
        let buf = unsafe { engine.device().borrow(addr, len as usize, stream) }?;
        if len > 0 {
            plan.add(&files, 0, offset, len, &buf, 0)?;
        }
        reporter.with(|progress| engine.write(&files, &plan, None, progress))
    });
    finish(reporter, stats)
}

/// Saves tensors of `device` as one safetensors file, atomically and
/// durably.
#[pyfunction]
#[pyo3(signature = (device, path, tensors, metadata=None, stream=None, progress=None))]
pub fn save_safetensors(
    py: Python<'_>,
    device: &str,
    path: PathBuf,
    tensors: Vec<TensorSpec>,
    metadata: Option<BTreeMap<String, String>>,
    stream: Option<u64>,
    progress: Option<Bound<'_, PyAny>>,
) -> PyResult<String> {
    let engine = py.detach(|| engine(Place::parse(device)?))?;
    let total = tensors.iter().map(|t| t.4).sum();
    let reporter = Reporter::new(progress.as_ref(), "saving", total)?;
    let stats = py.detach(|| {
        let tensors = tensors
            .into_iter()
            .map(|(name, dtype, shape, addr, len)| {
                Ok(TensorToSave {
                    dtype: parse_dtype(&name, &dtype)?,
                    // SAFETY: as in `read`.
                    data: unsafe { engine.device().borrow(addr, len as usize, stream) }?,
                    name,
                    shape,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        reporter.with(|progress| {
            save_file(
                &engine,
                &path,
                &tensors,
                &metadata.unwrap_or_default(),
                progress,
            )
        })
    });
    finish(reporter, stats)
}

pub fn parse_dtype(name: &str, dtype: &str) -> Result<Dtype> {
    Dtype::parse(dtype)
        .ok_or_else(|| Error::invalid(format!("tensor {name:?}: unknown dtype {dtype:?}")))
}

/// Ends the progress display and turns the outcome into stats JSON or the
/// Python exception.
pub fn finish(reporter: Reporter, outcome: Result<TransferStats>) -> PyResult<String> {
    finished(reporter, outcome).map(|stats| to_json(&stats))
}

/// Ends the progress display and turns the outcome into the stats or the
/// Python exception.
fn finished(reporter: Reporter, outcome: Result<TransferStats>) -> PyResult<TransferStats> {
    let done = reporter.finish(outcome.is_ok());
    let stats = outcome.map_err(to_py)?;
    done?;
    Ok(stats)
}

pub fn to_json(stats: &TransferStats) -> String {
    serde_json::to_string(stats).expect("stats serialize")
}

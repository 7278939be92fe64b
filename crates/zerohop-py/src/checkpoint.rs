//! Checkpoints of tensors: save, list, restore in place, verify.

use crate::engines::{engine, Place};
use crate::errors::to_py;
use crate::progress::Reporter;
use crate::transfers::{finish, parse_dtype};
use pyo3::prelude::*;
use std::collections::BTreeMap;
use std::path::PathBuf;
use zerohop::{DeviceBuffer, Error, Result};
use zerohop_checkpoint::{self as ckpt, Manifest, Region, SaveOptions};

/// An entry as the Python half describes it: name, dtype and shape (both
/// None for raw bytes), address, bytes.
type EntrySpec = (String, Option<String>, Option<Vec<u64>>, u64, u64);

/// A saved entry: name, dtype and shape (None for raw bytes), bytes.
type EntryInfo = (String, Option<String>, Option<Vec<u64>>, u64);

/// Saves entries of `device` as a new checkpoint at `dir`, incrementally
/// against `parent` if given. Returns the save's stats as JSON, with the
/// seconds until durable and the bytes actually written.
#[pyfunction]
#[pyo3(signature = (device, dir, entries, parent=None, metadata=None, stream=None, progress=None))]
#[allow(clippy::too_many_arguments)]
pub fn checkpoint_save(
    py: Python<'_>,
    device: &str,
    dir: PathBuf,
    entries: Vec<EntrySpec>,
    parent: Option<PathBuf>,
    metadata: Option<BTreeMap<String, String>>,
    stream: Option<u64>,
    progress: Option<Bound<'_, PyAny>>,
) -> PyResult<(String, f64, u64)> {
    let engine = py.detach(|| engine(Place::parse(device)?))?;
    let total = entries.iter().map(|e| e.4).sum();
    let reporter = Reporter::new(progress.as_ref(), "saving", total)?;
    let saved = py.detach(|| {
        let regions = entries
            .into_iter()
            .map(|(name, dtype, shape, addr, len)| {
                // SAFETY: the Python half passes live buffers of `device`
                // that it keeps alive for this call.
                let data = unsafe { engine.device().borrow(addr, len as usize, stream) }?;
                match (dtype, shape) {
                    (Some(d), Some(s)) => {
                        Ok(Region::tensor(&name, parse_dtype(&name, &d)?, s, data))
                    }
                    (None, None) => Ok(Region::raw(name, data)),
                    _ => Err(Error::invalid(format!(
                        "entry {name:?}: a dtype needs a shape"
                    ))),
                }
            })
            .collect::<Result<Vec<_>>>()?;
        let opts = SaveOptions {
            parent,
            metadata: metadata.unwrap_or_default(),
            ..SaveOptions::default()
        };
        reporter.with(|progress| ckpt::save(&engine, &regions, &dir, &opts, progress))
    });
    let (seconds, written) = saved
        .as_ref()
        .map_or((0.0, 0), |s| (s.seconds, s.written_bytes));
    let stats = finish(reporter, saved.map(|s| s.stats))?;
    Ok((stats, seconds, written))
}

/// The checkpoint's metadata and entries as (name, dtype, shape, bytes).
#[pyfunction]
pub fn checkpoint_entries(
    py: Python<'_>,
    dir: PathBuf,
) -> PyResult<(BTreeMap<String, String>, Vec<EntryInfo>)> {
    let m = py.detach(|| Manifest::read(&dir)).map_err(to_py)?;
    let entries = m
        .entries
        .into_iter()
        .map(|e| (e.name, e.dtype, e.shape, e.bytes))
        .collect();
    Ok((m.metadata, entries))
}

/// Restores the checkpoint at `dir` in place into `targets` of `device`,
/// each (entry name, address, bytes); every chunk's checksum is checked.
#[pyfunction]
#[pyo3(signature = (device, dir, targets, stream=None, progress=None))]
pub fn checkpoint_restore(
    py: Python<'_>,
    device: &str,
    dir: PathBuf,
    targets: Vec<(String, u64, u64)>,
    stream: Option<u64>,
    progress: Option<Bound<'_, PyAny>>,
) -> PyResult<String> {
    let engine = py.detach(|| engine(Place::parse(device)?))?;
    let total = targets.iter().map(|t| t.2).sum();
    let reporter = Reporter::new(progress.as_ref(), "restoring", total)?;
    let stats = py.detach(|| {
        let buffers = targets
            .iter()
            .map(|(name, addr, len)| {
                // SAFETY: as in `checkpoint_save`.
                let b = unsafe { engine.device().borrow(*addr, *len as usize, stream) }?;
                Ok((name.as_str(), b))
            })
            .collect::<Result<Vec<(&str, DeviceBuffer)>>>()?;
        reporter.with(|progress| ckpt::restore_into(&engine, &dir, &buffers, progress))
    });
    finish(reporter, stats)
}

/// Checks every checksum of the checkpoint at `dir` without a GPU; returns
/// (chunks, bytes) checked.
#[pyfunction]
#[pyo3(signature = (dir, progress=None))]
pub fn checkpoint_verify(
    py: Python<'_>,
    dir: PathBuf,
    progress: Option<Bound<'_, PyAny>>,
) -> PyResult<(usize, u64)> {
    let total = Manifest::read(&dir).map_err(to_py)?.bytes();
    let reporter = Reporter::new(progress.as_ref(), "verifying", total)?;
    let verified = py.detach(|| {
        reporter.with(|progress| ckpt::verify(&dir, zerohop::machine::available_cpus(), progress))
    });
    let ok = verified.is_ok();
    reporter.finish(ok)?;
    let v = verified.map_err(to_py)?;
    Ok((v.chunks, v.bytes))
}

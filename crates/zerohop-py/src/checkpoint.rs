//! Checkpoints of tensors: save, list, open and restore in place, verify.

use crate::engines::{engine, upload_engine, Place};
use crate::errors::to_py;
use crate::progress::Reporter;
use crate::transfers::{finish, parse_dtype};
use pyo3::prelude::*;
use std::collections::BTreeMap;
use zerohop::staging::StagingConfig;
use zerohop::{DeviceBuffer, Error, Result};
use zerohop_checkpoint::{self as ckpt, Location, Manifest, Region, SaveOptions};
use zerohop_names::{checkpoint_at, checkpoints_in};

/// An entry as the Python half describes it: name, dtype and shape (both
/// None for raw bytes), address, bytes.
type EntrySpec = (String, Option<String>, Option<Vec<u64>>, u64, u64);

/// A saved entry: name, dtype and shape (None for raw bytes), bytes.
type EntryInfo = (String, Option<String>, Option<Vec<u64>>, u64);

/// Saves entries of `device` as the new checkpoint `at` (a directory or
/// `s3://bucket/[prefix/]NAME`), incrementally against `parent` if given.
/// Returns the save's stats as JSON, the seconds until durable, the bytes
/// actually written, and where the time around the transfer went (JSON).
#[pyfunction]
#[pyo3(signature = (device, at, entries, parent=None, metadata=None, stream=None, progress=None))]
#[allow(clippy::too_many_arguments)]
pub fn checkpoint_save(
    py: Python<'_>,
    device: &str,
    at: String,
    entries: Vec<EntrySpec>,
    parent: Option<String>,
    metadata: Option<BTreeMap<String, String>>,
    stream: Option<u64>,
    progress: Option<Bound<'_, PyAny>>,
) -> PyResult<(String, f64, u64, String)> {
    let place = Place::parse(device)?;
    let engine = if zerohop::location::is_object(&at) {
        py.detach(|| upload_engine(place))?
    } else {
        py.detach(|| engine(place))?
    };
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
        let slot = engine.config().staging.slot_bytes as u64;
        let at = checkpoint_at(&at, slot)?;
        let opts = SaveOptions {
            parent: parent.map(|p| checkpoint_at(&p, slot)).transpose()?,
            metadata: metadata.unwrap_or_default(),
            ..SaveOptions::default()
        };
        reporter.with(|progress| ckpt::save(&engine, &regions, &at, &opts, progress))
    });
    let (seconds, written, phases) = saved.as_ref().map_or((0.0, 0, String::new()), |s| {
        let phases = serde_json::to_string(&s.phases).expect("phases serialize");
        (s.seconds, s.written_bytes, phases)
    });
    let stats = finish(reporter, saved.map(|s| s.stats))?;
    Ok((stats, seconds, written, phases))
}

/// A checkpoint whose manifest is read and decoded once, for a load that
/// looks at its entries before it restores them.
#[pyclass(frozen)]
pub struct OpenedCheckpoint {
    at: Location,
    manifest: Manifest,
}

/// Reads the manifest of the checkpoint `at`.
#[pyfunction]
pub fn checkpoint_open(py: Python<'_>, at: String) -> PyResult<OpenedCheckpoint> {
    py.detach(|| {
        let at = to_read(&at)?;
        let manifest = at.manifest()?;
        Ok(OpenedCheckpoint { at, manifest })
    })
    .map_err(to_py)
}

#[pymethods]
impl OpenedCheckpoint {
    /// The checkpoint's metadata.
    fn metadata(&self) -> BTreeMap<String, String> {
        self.manifest.metadata.clone()
    }

    /// Its entries as (name, dtype, shape, bytes).
    fn entries(&self) -> Vec<EntryInfo> {
        self.manifest
            .entries
            .iter()
            .map(|e| (e.name.clone(), e.dtype.clone(), e.shape.clone(), e.bytes))
            .collect()
    }

    /// Its entries' names in the order their bytes lie in the data files:
    /// tensors allocated in this order side by side are filled by one copy.
    fn file_order(&self) -> Vec<String> {
        let mut order: Vec<_> = self.manifest.entries.iter().collect();
        order.sort_by_key(|e| (e.file, e.offset));
        order.into_iter().map(|e| e.name.clone()).collect()
    }

    /// Restores it in place into `targets` of `device`, each (entry name,
    /// address, bytes); every chunk's checksum is checked. `regions`
    /// (address, bytes) are allocations that hold several targets each: a
    /// copy may fill targets that follow each other in one of them.
    #[pyo3(signature = (device, targets, stream=None, progress=None, regions=None))]
    fn restore(
        &self,
        py: Python<'_>,
        device: &str,
        targets: Vec<(String, u64, u64)>,
        stream: Option<u64>,
        progress: Option<Bound<'_, PyAny>>,
        regions: Option<Vec<(u64, u64)>>,
    ) -> PyResult<String> {
        let engine = py.detach(|| engine(Place::parse(device)?))?;
        let total = targets.iter().map(|t| t.2).sum();
        let reporter = Reporter::new(progress.as_ref(), "restoring", total)?;
        let stats = py.detach(|| {
            let borrow = |addr: u64, len: u64| {
                // SAFETY: as in `checkpoint_save`; the regions, too, are
                // live memory of `device` that the caller keeps alive.
                unsafe { engine.device().borrow(addr, len as usize, stream) }
            };
            let buffers = targets
                .iter()
                .map(|(name, addr, len)| Ok((name.as_str(), borrow(*addr, *len)?)))
                .collect::<Result<Vec<(&str, DeviceBuffer)>>>()?;
            let blocks = regions
                .unwrap_or_default()
                .into_iter()
                .map(|(addr, len)| borrow(addr, len))
                .collect::<Result<Vec<DeviceBuffer>>>()?;
            reporter.with(|progress| {
                ckpt::restore_manifest_into(
                    &engine,
                    &self.at,
                    &self.manifest,
                    &buffers,
                    &blocks,
                    progress,
                )
            })
        });
        finish(reporter, stats)
    }
}

/// Checks every checksum of the checkpoint `at` without a GPU; returns
/// (chunks, bytes) checked.
#[pyfunction]
#[pyo3(signature = (at, progress=None))]
pub fn checkpoint_verify(
    py: Python<'_>,
    at: String,
    progress: Option<Bound<'_, PyAny>>,
) -> PyResult<(usize, u64)> {
    let at = py.detach(|| to_read(&at)).map_err(to_py)?;
    let total = py.detach(|| at.manifest()).map_err(to_py)?.bytes();
    let reporter = Reporter::new(progress.as_ref(), "verifying", total)?;
    let verified = py.detach(|| {
        reporter.with(|progress| ckpt::verify(&at, zerohop::machine::available_cpus(), progress))
    });
    let ok = verified.is_ok();
    reporter.finish(ok)?;
    let v = verified.map_err(to_py)?;
    Ok((v.chunks, v.bytes))
}

/// A listed checkpoint: name, parent, entries, bytes.
type Listed = (String, Option<String>, usize, u64);

/// The checkpoints in `store` (a directory or `s3://bucket/[prefix/]`),
/// sorted.
#[pyfunction]
pub fn checkpoint_list(py: Python<'_>, store: String) -> PyResult<Vec<Listed>> {
    py.detach(|| {
        let store = checkpoints_in(&store, StagingConfig::default().slot_bytes as u64)?;
        let listed = ckpt::list_checkpoints(&store)?;
        Ok(listed
            .into_iter()
            .map(|(name, m)| (name, m.parent.clone(), m.entries.len(), m.bytes()))
            .collect())
    })
    .map_err(to_py)
}

/// Removes the checkpoint `at`, refused while another needs its chunks.
#[pyfunction]
pub fn checkpoint_remove(py: Python<'_>, at: String) -> PyResult<()> {
    py.detach(|| ckpt::remove(&to_read(&at)?)).map_err(to_py)
}

/// The checkpoint `at` names, to read or remove (no part size matters).
fn to_read(at: &str) -> Result<Location> {
    checkpoint_at(at, StagingConfig::default().slot_bytes as u64)
}

/// XXH3-64 of each (address, bytes) buffer of `device`, as a checkpoint
/// manifest writes it, once the work queued on `stream` is done: a GPU
/// hashes its own memory with its kernel, host memory is hashed in place,
/// and a device without a kernel (the simulated one) is read back.
#[pyfunction]
#[pyo3(signature = (device, buffers, stream=None))]
pub fn checksums(
    py: Python<'_>,
    device: &str,
    buffers: Vec<(u64, u64)>,
    stream: Option<u64>,
) -> PyResult<Vec<String>> {
    let place = Place::parse(device)?;
    let engine = py.detach(|| engine(place))?;
    let sums = py.detach(|| -> Result<Vec<String>> {
        // Empty buffers need no address (and a device may refuse them).
        let mut sums = vec![ckpt::chunk_checksum(&[]); buffers.len()];
        let full: Vec<usize> = (0..buffers.len()).filter(|&i| buffers[i].1 > 0).collect();
        let nonempty: Vec<(u64, u64)> = full.iter().map(|&i| buffers[i]).collect();
        for (i, sum) in full
            .into_iter()
            .zip(checksums_of(&engine, place, &nonempty, stream)?)
        {
            sums[i] = sum;
        }
        Ok(sums)
    });
    sums.map_err(to_py)
}

/// The checksums of non-empty `buffers` of `place`.
fn checksums_of(
    engine: &zerohop::Engine,
    place: Place,
    buffers: &[(u64, u64)],
    stream: Option<u64>,
) -> Result<Vec<String>> {
    if place == Place::Host {
        // A buffer per thread at a time: one XXH3 runs on one core.
        let threads = zerohop::machine::available_cpus().clamp(1, buffers.len().max(1));
        let per = buffers.len().div_ceil(threads).max(1);
        let mut sums = vec![String::new(); buffers.len()];
        std::thread::scope(|s| {
            for (out, part) in sums.chunks_mut(per).zip(buffers.chunks(per)) {
                s.spawn(move || {
                    for (sum, &(addr, len)) in out.iter_mut().zip(part) {
                        // SAFETY: the Python half passes live host buffers
                        // that it keeps alive, and unwritten, for this call.
                        let bytes =
                            unsafe { std::slice::from_raw_parts(addr as *const u8, len as usize) };
                        *sum = ckpt::chunk_checksum(bytes);
                    }
                });
            }
        });
        return Ok(sums);
    }
    let borrowed = buffers
        .iter()
        .map(|&(addr, len)| {
            // SAFETY: as in `checkpoint_save`.
            unsafe { engine.device().borrow(addr, len as usize, stream) }
        })
        .collect::<Result<Vec<DeviceBuffer>>>()?;
    if let Some(hasher) = engine.device().checksums() {
        hasher.ready()?;
        let chunks: Vec<Vec<DeviceBuffer>> = borrowed.into_iter().map(|b| vec![b]).collect();
        return Ok(hasher
            .xxh3_64(&chunks)?
            .into_iter()
            .map(ckpt::checksum_hex)
            .collect());
    }
    borrowed
        .iter()
        .map(|b| {
            let mut bytes = vec![0u8; b.len()];
            engine.device().read_back(b, 0, &mut bytes)?;
            Ok(ckpt::chunk_checksum(&bytes))
        })
        .collect()
}

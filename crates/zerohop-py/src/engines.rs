//! One engine per device, made on first use and kept for the process: the
//! staging pool is pinned once, and loads reuse it.

use crate::errors::to_py;
use pyo3::prelude::*;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use zerohop::device::{open_gpu, HostDevice};
use zerohop::staging::StagingConfig;
use zerohop::{DeviceName, Engine, EngineConfig};

/// Where the memory of a call lives, as the Python half names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Place {
    /// A CUDA GPU.
    Cuda(usize),
    /// Host memory, moved by the host device (checkpoints and saves of CPU
    /// tensors go through the same pipeline as GPU memory).
    Host,
    /// Host memory standing in for a GPU, with randomly delayed copies:
    /// for tests of the pipeline without a GPU.
    Sim,
}

impl Place {
    /// Parses a device name (see [`zerohop::device::DEVICE_HELP`]).
    pub fn parse(spec: &str) -> PyResult<Place> {
        let name = spec.parse::<DeviceName>().and_then(DeviceName::resolve);
        Ok(match name.map_err(to_py)? {
            DeviceName::Cuda(n) => Place::Cuda(n),
            DeviceName::Host | DeviceName::Auto => Place::Host,
            DeviceName::Sim => Place::Sim,
        })
    }
}

/// A device name in the words every zerohop interface takes
/// ([`zerohop::device::DEVICE_HELP`]), as the Python half names memory:
/// `cuda:N`, `cpu` (host memory; `host` is taken too) or `sim`; `auto` is
/// resolved to the first GPU, else `cpu`.
#[pyfunction]
pub fn device_name(spec: &str) -> PyResult<String> {
    Ok(match Place::parse(spec)? {
        Place::Cuda(n) => format!("cuda:{n}"),
        Place::Host => "cpu".into(),
        Place::Sim => "sim".into(),
    })
}

/// Makes the engine of `device` now, with its pinned staging memory (which
/// the first transfer otherwise pins). Returns the engine's device, as
/// `info` describes it.
#[pyfunction]
pub fn prepare(py: Python<'_>, device: &str) -> PyResult<String> {
    let place = Place::parse(device)?;
    py.detach(|| {
        let e = engine(place)?;
        e.allocate_staging().map_err(to_py)?;
        // After the engine, which a first load waits for: the growth
        // waits for an RCU grace period (a call's opens waited 14 - 26 ms
        // for one on an H100 machine), and a load of one file opens too
        // few to need it. At import it has a thread of its own, and this
        // returns at once. Best effort: where it fails, the first opens
        // grow the table.
        let _ = zerohop::storage::grow_descriptor_table();
        Ok(e.device().describe())
    })
}

/// Grows the process's descriptor table ahead of the files a checkpoint
/// opens (see `zerohop::storage::grow_descriptor_table`): called on a
/// background thread at import. Best effort: where it fails, the first
/// opens grow the table.
#[pyfunction]
pub fn grow_descriptor_table(py: Python<'_>) {
    let _ = py.detach(zerohop::storage::grow_descriptor_table);
}

/// What the process keeps one of per device, made on first use.
pub type PerPlace<T> = OnceLock<Mutex<HashMap<Place, Arc<T>>>>;

/// `cache`'s value for `place`, made by `make` the first time.
pub fn per_place<T>(
    cache: &PerPlace<T>,
    place: Place,
    make: impl FnOnce() -> PyResult<T>,
) -> PyResult<Arc<T>> {
    let mut made = cache
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    if let Some(v) = made.get(&place) {
        return Ok(v.clone());
    }
    let v = Arc::new(make()?);
    made.insert(place, v.clone());
    Ok(v)
}

/// The engine for `place`, made on first use.
pub fn engine(place: Place) -> PyResult<Arc<Engine>> {
    static ENGINES: PerPlace<Engine> = OnceLock::new();
    per_place(&ENGINES, place, || make_engine(place, |c| c))
}

/// The engine for `place` that writes to object stores (its slots are
/// parts S3 accepts), made on first use.
pub fn upload_engine(place: Place) -> PyResult<Arc<Engine>> {
    static ENGINES: PerPlace<Engine> = OnceLock::new();
    per_place(&ENGINES, place, || {
        make_engine(place, zerohop_s3::config_for_uploads)
    })
}

fn make_engine(place: Place, adjust: fn(EngineConfig) -> EngineConfig) -> PyResult<Engine> {
    match place {
        Place::Cuda(n) => {
            let device = open_gpu(n).map_err(to_py)?;
            Engine::new(Arc::new(device), adjust(EngineConfig::keeping_hot_choice()))
        }
        Place::Host => Engine::new(Arc::new(HostDevice::new()), adjust(host_config())),
        Place::Sim => Engine::new(sim_device()?, adjust(host_config())),
    }
    .map_err(to_py)
}

/// The simulated device, with short copy delays so the tests stay quick.
#[cfg(feature = "sim")]
fn sim_device() -> PyResult<Arc<dyn zerohop::Device>> {
    use zerohop::testing::{SimConfig, SimDevice};
    Ok(Arc::new(SimDevice::new(SimConfig {
        max_copy_delay: std::time::Duration::from_micros(300),
        ..SimConfig::default()
    })))
}

/// Built without the `sim` feature (as released wheels are).
#[cfg(not(feature = "sim"))]
fn sim_device() -> PyResult<Arc<dyn zerohop::Device>> {
    Err(to_py(zerohop::Error::invalid(
        "device=\"sim\", the simulated device, is for tests and not in this build: \
         build the package with the `sim` feature (scripts/test.sh does), or use device=\"cpu\"",
    )))
}

fn host_config() -> EngineConfig {
    EngineConfig {
        staging: StagingConfig::host_memory(),
        ..EngineConfig::default()
    }
}

//! One engine per device, made on first use and kept for the process: the
//! staging pool is pinned once, and loads reuse it.

use crate::errors::to_py;
use pyo3::PyResult;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use zerohop::device::{CudaDevice, SimConfig, SimDevice};
use zerohop::staging::StagingConfig;
use zerohop::{Engine, EngineConfig, Error};

/// Where the memory of a call lives, as the Python half names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Place {
    /// A CUDA GPU.
    Cuda(usize),
    /// Host memory, moved by the simulated device (checkpoints and saves
    /// of CPU tensors go through the same pipeline as GPU memory).
    Host,
    /// Host memory standing in for a GPU, with randomly delayed copies:
    /// for tests of the pipeline without a GPU.
    Sim,
}

impl Place {
    pub fn parse(spec: &str) -> PyResult<Place> {
        match spec {
            "cpu" => Ok(Place::Host),
            "sim" => Ok(Place::Sim),
            s => match s.strip_prefix("cuda:").map(str::parse::<usize>) {
                Some(Ok(n)) => Ok(Place::Cuda(n)),
                _ => Err(to_py(Error::invalid(format!(
                    "unknown device {s:?}: expected cpu, cuda:N or sim"
                )))),
            },
        }
    }
}

/// The engine for `place`, made on first use.
pub fn engine(place: Place) -> PyResult<Arc<Engine>> {
    static ENGINES: OnceLock<Mutex<HashMap<Place, Arc<Engine>>>> = OnceLock::new();
    let mut engines = ENGINES
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    if let Some(e) = engines.get(&place) {
        return Ok(e.clone());
    }
    let made = match place {
        Place::Cuda(n) => {
            // The hot-route measurement is shared with the CLI's.
            let config = EngineConfig {
                hot_choice_file: zerohop::hot_choice::default_file(),
                ..EngineConfig::default()
            };
            let device = CudaDevice::open(n).map_err(to_py)?;
            Engine::new(Arc::new(device), config)
        }
        Place::Host | Place::Sim => {
            let delay = if place == Place::Sim {
                Duration::from_micros(300)
            } else {
                Duration::ZERO
            };
            let device = SimDevice::new(SimConfig {
                max_copy_delay: delay,
                ..SimConfig::default()
            });
            let config = EngineConfig {
                staging: StagingConfig::host_memory(),
                ..EngineConfig::default()
            };
            Engine::new(Arc::new(device), config)
        }
    }
    .map_err(to_py)?;
    let made = Arc::new(made);
    engines.insert(place, made.clone());
    Ok(made)
}

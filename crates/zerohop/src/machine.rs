//! What this machine offers zerohop, and why: the facts behind `zerohop
//! info` and the Python package's `zerohop.info()`.

use crate::device::{cuda_driver_summary, CudaDevice, Device};
use crate::probe::{self, GdsSupport};
use crate::staging::StagingConfig;
use crate::EngineConfig;
use serde::Serialize;
use std::path::Path;

#[derive(Debug, Serialize)]
pub struct MachineInfo {
    /// The CUDA driver's version, or why there is none.
    pub driver: Result<String, String>,
    pub gpus: Vec<Gpu>,
    pub gds: GdsSupport,
    pub io_uring: Result<(), String>,
    pub o_direct: Option<PathCheck>,
    pub staging: StagingConfig,
    pub io_threads: usize,
    pub cpus: usize,
}

#[derive(Debug, Serialize)]
pub struct Gpu {
    pub description: String,
}

/// Whether a path's file system accepts O_DIRECT.
#[derive(Debug, Serialize)]
pub struct PathCheck {
    pub path: String,
    pub result: Result<(), String>,
}

impl MachineInfo {
    /// Probes the driver, GPUs, GDS, io_uring, and O_DIRECT on `path`.
    pub fn gather(path: Option<&Path>) -> MachineInfo {
        let (driver, gpus) = match cuda_driver_summary() {
            Ok((version, count)) => {
                let gpus = (0..count)
                    .map(|i| Gpu {
                        description: CudaDevice::open(i)
                            .map(|d| d.describe())
                            .unwrap_or_else(|e| format!("cuda:{i}: {e}")),
                    })
                    .collect();
                (Ok(version), gpus)
            }
            Err(e) => (Err(e.to_string()), Vec::new()),
        };
        let config = EngineConfig::default();
        MachineInfo {
            driver,
            gpus,
            gds: probe::gds_support(),
            io_uring: probe::io_uring_available(),
            o_direct: path.map(|p| PathCheck {
                path: p.display().to_string(),
                result: probe::o_direct_supported(p),
            }),
            staging: config.staging,
            io_threads: config.io_threads,
            cpus: probe::cpus(),
        }
    }
}

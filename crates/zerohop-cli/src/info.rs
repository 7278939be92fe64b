//! `zerohop info`: what this machine supports and why.

use crate::common::gib;
use serde::Serialize;
use std::path::Path;
use zerohop::device::{cuda_driver_summary, CudaDevice};
use zerohop::probe::{self, GdsSupport};
use zerohop::staging::StagingConfig;
use zerohop::{Device, EngineConfig, Result};

#[derive(Serialize)]
struct Info {
    driver: std::result::Result<String, String>,
    gpus: Vec<Gpu>,
    gds: GdsSupport,
    io_uring: std::result::Result<(), String>,
    o_direct: Option<PathCheck>,
    staging: StagingConfig,
    io_threads: usize,
    cpus: usize,
}

#[derive(Serialize)]
struct Gpu {
    description: String,
}

#[derive(Serialize)]
struct PathCheck {
    path: String,
    result: std::result::Result<(), String>,
}

pub fn run(path: Option<&Path>, json: bool) -> Result<()> {
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
    let info = Info {
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
    };
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&info).expect("info serializes")
        );
        return Ok(());
    }
    match &info.driver {
        Ok(v) => println!("driver    CUDA {v}, {} GPU(s)", info.gpus.len()),
        Err(e) => println!("driver    none: {e} (loads go to host memory)"),
    }
    for g in &info.gpus {
        println!("gpu       {}", g.description);
    }
    println!("gds       {}", info.gds.reason);
    match &info.io_uring {
        Ok(()) => println!("io_uring  available"),
        Err(e) => println!("io_uring  unavailable ({e}): reads use pread threads"),
    }
    if let Some(c) = &info.o_direct {
        match &c.result {
            Ok(()) => println!("o_direct  {}: accepted", c.path),
            Err(e) => println!(
                "o_direct  {}: refused ({e}); reads go through the page cache",
                c.path
            ),
        }
    }
    println!(
        "staging   {} pinned per device in {} slots of {}; {} I/O threads ({} CPUs)",
        gib(info.staging.total_bytes as u64),
        info.staging.slot_count(),
        gib(info.staging.slot_bytes as u64),
        info.io_threads,
        info.cpus
    );
    Ok(())
}

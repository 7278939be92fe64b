//! `zerohop info`: what this machine supports and why.

use crate::size::human_size;
use std::path::Path;
use zerohop::machine::MachineInfo;
use zerohop::{Error, Result};

pub fn run(path: Option<&Path>, json: bool) -> Result<()> {
    if let Some(p) = path {
        std::fs::metadata(p).map_err(|e| Error::io(p, "cannot check", e))?;
    }
    let info = MachineInfo::gather(path);
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
        human_size(info.staging.total_bytes as u64),
        info.staging.slot_count(),
        human_size(info.staging.slot_bytes as u64),
        info.io_threads,
        info.cpus
    );
    Ok(())
}

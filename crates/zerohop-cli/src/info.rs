//! `zerohop info`: what this machine supports and why.

use std::path::Path;
use zerohop::machine::MachineInfo;
use zerohop::{Error, Result};
use zerohop_cmd::size::human_bytes;

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
    match (&info.driver.version, &info.driver.why_not) {
        (Some(v), _) => println!("driver    CUDA {v}, {} GPU(s)", info.gpus.len()),
        (_, e) => println!(
            "driver    none: {} (loads go to host memory)",
            e.as_deref().unwrap_or_default()
        ),
    }
    for g in &info.gpus {
        println!("gpu       {}", g.description);
    }
    println!("gds       {}", info.gds.reason);
    match &info.io_uring.why_not {
        None => println!("io_uring  available"),
        Some(e) => println!("io_uring  unavailable ({e}): reads use pread threads"),
    }
    match (
        &info.process_checkpoint.version,
        &info.process_checkpoint.why_not,
    ) {
        (Some(v), _) => println!(
            "process   the driver's process checkpoint ({v} API): zerohop checkpoint-process"
        ),
        (_, e) => println!(
            "process   no driver process checkpoint: {}",
            e.as_deref().unwrap_or_default()
        ),
    }
    match (&info.criu.version, &info.criu.why_not) {
        (Some(v), None) => println!("criu      CRIU {v}: criu check passes"),
        (Some(v), Some(e)) => println!("criu      CRIU {v}, not usable: {e}"),
        (None, e) => println!("criu      {}", e.as_deref().unwrap_or("not available")),
    }
    if let Some(c) = &info.o_direct {
        match &c.o_direct.why_not {
            None => println!("o_direct  {}: accepted", c.path),
            Some(e) => println!(
                "o_direct  {}: refused ({e}); reads go through the page cache",
                c.path
            ),
        }
    }
    println!(
        "staging   {} per device ({}) in {} slots of {}; {} I/O threads ({} CPUs)",
        human_bytes(info.staging.total_bytes as u64),
        if info.gpus.is_empty() {
            "host memory, not pinned: no GPU"
        } else {
            "pinned on a GPU"
        },
        info.staging.slot_count(),
        human_bytes(info.staging.slot_bytes as u64),
        info.io_threads,
        info.cpus
    );
    Ok(())
}

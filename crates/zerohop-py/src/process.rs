//! Whole processes to a directory and back (`zerohop.freeze` / `thaw`),
//! for tooling that manages other processes: CRIU and the driver do the
//! work on the process named, not on this one.

use crate::errors::to_py;
use pyo3::prelude::*;
use std::path::PathBuf;
use std::time::Duration;
use zerohop_process::{CriuFlags, FreezeOptions};

/// Freezes process `pid` into the new directory `dir`; its manifest
/// (`FREEZE.json`) as JSON.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
pub fn freeze(
    py: Python<'_>,
    pid: u32,
    dir: PathBuf,
    leave_running: bool,
    parent: Option<PathBuf>,
    shell_job: bool,
    tcp_established: bool,
    file_locks: bool,
    ext_unix_sk: bool,
    criu_args: Vec<String>,
    lock_timeout: f64,
) -> PyResult<String> {
    let lock_timeout = Duration::try_from_secs_f64(lock_timeout).map_err(|_| {
        pyo3::exceptions::PyValueError::new_err(format!(
            "lock_timeout is {lock_timeout}: give seconds, 0 or more"
        ))
    })?;
    let options = FreezeOptions {
        leave_running,
        parent,
        criu: CriuFlags {
            shell_job,
            tcp_established,
            file_locks,
            ext_unix_sk,
            extra: criu_args,
        },
        lock_timeout,
    };
    let report = py
        .detach(|| zerohop_process::freeze(pid, &dir, &options))
        .map_err(to_py)?;
    Ok(serde_json::to_string(&report).expect("a manifest serializes"))
}

/// Thaws the freeze in `dir`; what the thaw did as JSON.
#[pyfunction]
pub fn thaw(py: Python<'_>, dir: PathBuf, criu_args: Vec<String>) -> PyResult<String> {
    let report = py
        .detach(|| zerohop_process::thaw(&dir, &criu_args))
        .map_err(to_py)?;
    Ok(serde_json::to_string(&report).expect("a thaw report serializes"))
}

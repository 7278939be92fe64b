//! A CUDA process's GPU state to storage and back: the driver's process
//! checkpoint (`cuCheckpointProcess*`) with zerohop as its transport. The
//! process's suspendable GPU memory goes to storage through zerohop first,
//! so the driver's own checkpoint, which stages GPU memory in the
//! process's host RAM, is left with little more than the contexts and
//! modules; the restore runs the other way round.
//!
//! A directory holds `gpu-memory/` (the suspend's checkpoint) and
//! `PROCESS.json`, written last: what was done, and that the rest of the
//! process's GPU state sits in its host memory until a restore (or a CRIU
//! dump).

use crate::proc_fs::{expect_exists, resident_bytes};
use crate::suspend_client::{absolute, ask_suspend, serves_suspend};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use zerohop::storage::atomic::{create_dir_durable, write_new};
use zerohop::{Error, ErrorKind, Result};
use zerohop_cuda::{ProcessCheckpoint, ProcessState};
use zerohop_wire::suspend::SuspendRequest;

const RECORD: &str = "PROCESS.json";
const MEMORY: &str = "gpu-memory";

/// A finished checkpoint of a process's GPU state (`PROCESS.json`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuCheckpoint {
    pub pid: u32,
    /// Whether `gpu-memory/` holds the process's suspendable memory.
    pub zerohop_suspend: bool,
    /// The bytes zerohop wrote there.
    #[serde(default)]
    pub zerohop_bytes: u64,
    pub suspend_seconds: f64,
    pub driver_seconds: f64,
    /// What the process's resident host memory grew by in the driver's
    /// checkpoint: what the driver staged there.
    pub driver_host_bytes: i64,
}

/// What a restore did.
#[derive(Debug, Clone)]
pub struct GpuRestore {
    pub driver_seconds: f64,
    /// The bytes zerohop restored and verified, where it had suspended
    /// any.
    pub zerohop_bytes: Option<u64>,
    pub seconds: f64,
}

/// Checkpoints process `pid`'s GPU state into `dir`, a new directory:
/// zerohop's suspend of the memory it serves (referencing `parent`'s
/// unchanged chunks, an earlier such directory), then the driver's
/// checkpoint of the rest. The process's CUDA calls wait until
/// [`restore`]. On failure the process is left running as it was.
pub fn checkpoint(
    pid: u32,
    dir: &Path,
    parent: Option<&Path>,
    lock_timeout: Duration,
) -> Result<GpuCheckpoint> {
    expect_exists(pid)?;
    let api = ProcessCheckpoint::get()?;
    expect_state(api, pid, ProcessState::Running, "checkpoint")?;
    if dir.exists() {
        return Err(Error::new(
            ErrorKind::AlreadyExists,
            format!(
                "{} already exists: a process checkpoint goes to a new directory",
                dir.display()
            ),
        ));
    }
    create_dir_durable(dir)?;
    let memory = dir.join(MEMORY);
    let resume = SuspendRequest::Resume {
        dir: absolute(&memory)?,
    };
    let start = Instant::now();
    let zerohop_suspend = serves_suspend(pid);
    let mut zerohop_bytes = 0;
    if zerohop_suspend {
        let request = SuspendRequest::Suspend {
            dir: absolute(&memory)?,
            parent: parent.map(|p| absolute(&p.join(MEMORY))).transpose()?,
        };
        zerohop_bytes = ask_suspend(pid, &request)
            .inspect_err(|_| {
                // No checkpoint was committed (one that was, the process
                // may be suspended to): nothing to keep.
                if !memory.exists() {
                    let _ = std::fs::remove_dir_all(dir);
                }
            })?
            .1;
    }
    let suspend_seconds = start.elapsed().as_secs_f64();
    let record = match driver_checkpoint(api, pid, lock_timeout) {
        Ok((driver_seconds, driver_host_bytes)) => GpuCheckpoint {
            pid,
            zerohop_suspend,
            zerohop_bytes,
            suspend_seconds,
            driver_seconds,
            driver_host_bytes,
        },
        Err(e) => {
            // Leave the process as it was: running, its memory back.
            match zerohop_suspend.then(|| ask_suspend(pid, &resume)) {
                Some(Err(r)) => {
                    return Err(e.context(format!(
                        "and the process could not be resumed ({r}): its memory stays in {}",
                        memory.display()
                    )))
                }
                _ => {
                    let _ = std::fs::remove_dir_all(dir);
                }
            }
            return Err(e);
        }
    };
    write_record(dir, &record).inspect_err(|_| {
        // Without its record the checkpoint cannot be restored: undo it.
        if api.restore(pid).and_then(|()| api.unlock(pid)).is_ok() && zerohop_suspend {
            let _ = ask_suspend(pid, &resume);
        }
    })?;
    Ok(record)
}

/// The driver's lock and checkpoint of `pid`: its seconds and what the
/// process's resident host memory grew by (what the driver staged there).
/// Unlocked again if the checkpoint fails.
fn driver_checkpoint(api: &ProcessCheckpoint, pid: u32, timeout: Duration) -> Result<(f64, i64)> {
    let rss_before = resident_bytes(pid)?;
    let started = Instant::now();
    let done = api.lock(pid, timeout).and_then(|()| {
        api.checkpoint(pid).inspect_err(|_| {
            let _ = api.unlock(pid);
        })
    });
    done.map_err(|e| {
        Error::from(e).context(format!("the driver could not checkpoint process {pid}"))
    })?;
    let grown = resident_bytes(pid).map_or(0, |r| r as i64 - rss_before as i64);
    Ok((started.elapsed().as_secs_f64(), grown))
}

/// Restores process `pid`'s GPU state from `dir`, which [`checkpoint`]
/// wrote: the driver's part, then zerohop's memory, verified.
pub fn restore(pid: u32, dir: &Path) -> Result<GpuRestore> {
    expect_exists(pid)?;
    let record = read_record(dir)?;
    let api = ProcessCheckpoint::get()?;
    if record.pid != pid {
        return Err(Error::invalid(format!(
            "{} is process {}'s checkpoint, not process {pid}'s",
            dir.display(),
            record.pid
        )));
    }
    expect_state(api, pid, ProcessState::Checkpointed, "restore")?;
    let start = Instant::now();
    api.restore(pid)?;
    api.unlock(pid)?;
    let driver_seconds = start.elapsed().as_secs_f64();
    let mut zerohop_bytes = None;
    if record.zerohop_suspend {
        let memory = dir.join(MEMORY);
        let request = SuspendRequest::Resume {
            dir: absolute(&memory)?,
        };
        let (_, bytes) = ask_suspend(pid, &request).map_err(|e| {
            e.context(format!(
                "the driver restored process {pid}, but its zerohop memory is still suspended (retry with `zerohop resume {pid} {}`)",
                memory.display()
            ))
        })?;
        zerohop_bytes = Some(bytes);
    }
    Ok(GpuRestore {
        driver_seconds,
        zerohop_bytes,
        seconds: start.elapsed().as_secs_f64(),
    })
}

fn expect_state(api: &ProcessCheckpoint, pid: u32, want: ProcessState, what: &str) -> Result<()> {
    let state = api.state(pid).map_err(|e| {
        Error::from(e).context(format!(
            "process {pid} is not a CUDA process the driver can {what}"
        ))
    })?;
    if state != want {
        return Err(Error::invalid(format!(
            "cannot {what} process {pid}: the driver reports it {state:?}, not {want:?}"
        )));
    }
    Ok(())
}

fn write_record(dir: &Path, record: &GpuCheckpoint) -> Result<()> {
    let json = serde_json::to_vec_pretty(record).expect("a record serializes");
    write_new(&dir.join(RECORD), &json)
}

/// The record of a finished checkpoint in `dir`.
pub fn read_record(dir: &Path) -> Result<GpuCheckpoint> {
    let path: PathBuf = dir.join(RECORD);
    let bytes = std::fs::read(&path).map_err(|e| {
        Error::io(&path, "cannot read", e).context(format!(
            "{} holds no finished process checkpoint",
            dir.display()
        ))
    })?;
    serde_json::from_slice(&bytes)
        .map_err(|e| Error::with_source(ErrorKind::Format, format!("{}", path.display()), e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_record_round_trips_and_refuses_unknown_fields() {
        let dir =
            std::env::temp_dir().join(format!("zerohop-process-record-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let record = GpuCheckpoint {
            pid: 7,
            zerohop_suspend: true,
            zerohop_bytes: 1 << 30,
            suspend_seconds: 0.5,
            driver_seconds: 0.25,
            driver_host_bytes: -4096,
        };
        write_record(&dir, &record).unwrap();
        let back = read_record(&dir).unwrap();
        assert_eq!(
            (
                back.pid,
                back.zerohop_suspend,
                back.zerohop_bytes,
                back.driver_host_bytes
            ),
            (7, true, 1 << 30, -4096)
        );
        // Written once: a second record is refused, the first kept.
        assert_eq!(
            write_record(&dir, &record).unwrap_err().kind(),
            ErrorKind::AlreadyExists
        );
        std::fs::write(dir.join(RECORD), br#"{"pid": 7, "extra": 1}"#).unwrap();
        assert_eq!(read_record(&dir).unwrap_err().kind(), ErrorKind::Format);
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(read_record(&dir)
            .unwrap_err()
            .to_string()
            .contains("no finished process checkpoint"));
    }
}

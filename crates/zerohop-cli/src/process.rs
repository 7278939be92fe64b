//! `zerohop checkpoint-process PID DIR` and `zerohop restore-process PID
//! DIR`: the driver's process checkpoint with zerohop as its transport. The
//! process's suspendable GPU memory goes to storage through zerohop first
//! (`zerohop suspend`), so the driver's own checkpoint, which stages GPU
//! memory in the process's host RAM, is left with little more than the
//! contexts and modules; the restore runs the other way round.
//!
//! DIR holds `gpu-memory/` (the suspend's checkpoint) and `PROCESS.json`,
//! written last: what was done, and that the rest of the process's GPU
//! state sits in its host memory until a restore (or a CRIU dump).

use crate::suspend::{absolute, ask_suspend, serves_suspend};
use clap::Args;
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use zerohop::storage::atomic::{commit_new, create_dir_durable, temp_sibling};
use zerohop::{Error, ErrorKind, Result};
use zerohop_cmd::size::human_bytes;
use zerohop_cuda::{ProcessCheckpoint, ProcessState};
use zerohop_wire::suspend::SuspendRequest;

const RECORD: &str = "PROCESS.json";
const MEMORY: &str = "gpu-memory";

#[derive(Args, Debug)]
pub struct CheckpointProcessArgs {
    /// The CUDA process.
    pub pid: u32,
    /// A new directory for the checkpoint.
    pub dir: PathBuf,
    /// An earlier checkpoint-process directory of the same process: its
    /// unchanged GPU memory is referenced, not written again (default:
    /// none, all of it is written).
    #[arg(long)]
    pub parent: Option<PathBuf>,
    /// How long the driver may wait for the process's CUDA calls in flight
    /// before giving up (seconds).
    #[arg(long, default_value_t = 30)]
    pub lock_timeout: u64,
}

#[derive(Args, Debug)]
pub struct RestoreProcessArgs {
    /// The process checkpointed by `zerohop checkpoint-process`.
    pub pid: u32,
    /// Its checkpoint directory.
    pub dir: PathBuf,
}

/// `PROCESS.json`.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct ProcessRecord {
    pid: u32,
    /// Whether `gpu-memory/` holds the process's suspendable memory.
    zerohop_suspend: bool,
    suspend_seconds: f64,
    driver_seconds: f64,
    /// What the process's resident host memory grew by in the driver's
    /// checkpoint: what the driver staged there.
    driver_host_bytes: i64,
}

pub fn checkpoint(args: &CheckpointProcessArgs) -> Result<()> {
    let pid = args.pid;
    existing(pid)?;
    let api = ProcessCheckpoint::get()?;
    expect_state(api, pid, ProcessState::Running, "checkpoint")?;
    if args.dir.exists() {
        return Err(Error::new(
            ErrorKind::AlreadyExists,
            format!(
                "{} already exists: a process checkpoint goes to a new directory",
                args.dir.display()
            ),
        ));
    }
    create_dir_durable(&args.dir)?;
    let memory = args.dir.join(MEMORY);
    let resume = SuspendRequest::Resume {
        dir: absolute(&memory)?,
    };
    let start = Instant::now();
    let zerohop_suspend = serves_suspend(pid);
    if zerohop_suspend {
        let request = SuspendRequest::Suspend {
            dir: absolute(&memory)?,
            parent: args
                .parent
                .as_deref()
                .map(|p| absolute(&p.join(MEMORY)))
                .transpose()?,
        };
        let (_, bytes) = ask_suspend(pid, &request).inspect_err(|_| {
            // No checkpoint was committed (one that was, the process may
            // be suspended to): nothing to keep.
            if !memory.exists() {
                let _ = std::fs::remove_dir_all(&args.dir);
            }
        })?;
        eprintln!(
            "zerohop: {} of GPU memory written to {} in {:.2} s",
            human_bytes(bytes),
            memory.display(),
            start.elapsed().as_secs_f64()
        );
    } else {
        eprintln!(
            "zerohop: process {pid} serves no suspend requests (zerohop.serve_suspend): the driver stages all of its GPU memory in its host RAM"
        );
    }
    let suspend_seconds = start.elapsed().as_secs_f64();
    let timeout = Duration::from_secs(args.lock_timeout);
    let record = match driver_checkpoint(api, pid, timeout) {
        Ok(driver) => ProcessRecord {
            pid,
            zerohop_suspend,
            suspend_seconds,
            ..driver
        },
        Err(e) => {
            // Leave the process as it was: running, its memory back.
            match zerohop_suspend.then(|| ask_suspend(pid, &resume)) {
                Some(Err(r)) => eprintln!(
                    "zerohop: and the process could not be resumed ({r}): its memory stays in {}",
                    memory.display()
                ),
                _ => {
                    let _ = std::fs::remove_dir_all(&args.dir);
                }
            }
            return Err(e);
        }
    };
    write_record(&args.dir, &record).inspect_err(|_| {
        // Without its record the checkpoint cannot be restored: undo it.
        if api.restore(pid).and_then(|()| api.unlock(pid)).is_ok() && zerohop_suspend {
            let _ = ask_suspend(pid, &resume);
        }
    })?;
    println!(
        "checkpointed process {pid} to {} in {:.2} s (zerohop {:.2} s, driver {:.2} s); the driver staged {} in its host memory",
        args.dir.display(),
        start.elapsed().as_secs_f64(),
        suspend_seconds,
        record.driver_seconds,
        human_bytes(record.driver_host_bytes.max(0) as u64),
    );
    Ok(())
}

/// The driver's lock and checkpoint of `pid`: its seconds and what the
/// process's resident host memory grew by (what the driver staged there).
/// Unlocked again if the checkpoint fails.
fn driver_checkpoint(
    api: &ProcessCheckpoint,
    pid: u32,
    timeout: Duration,
) -> Result<ProcessRecord> {
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
    Ok(ProcessRecord {
        pid,
        zerohop_suspend: false,
        suspend_seconds: 0.0,
        driver_seconds: started.elapsed().as_secs_f64(),
        driver_host_bytes: resident_bytes(pid).map_or(0, |r| r as i64 - rss_before as i64),
    })
}

pub fn restore(args: &RestoreProcessArgs) -> Result<()> {
    let pid = args.pid;
    existing(pid)?;
    let record = read_record(&args.dir)?;
    let api = ProcessCheckpoint::get()?;
    if record.pid != pid {
        return Err(Error::invalid(format!(
            "{} is process {}'s checkpoint, not process {pid}'s",
            args.dir.display(),
            record.pid
        )));
    }
    expect_state(api, pid, ProcessState::Checkpointed, "restore")?;
    let start = Instant::now();
    api.restore(pid)?;
    api.unlock(pid)?;
    let driver_seconds = start.elapsed().as_secs_f64();
    if record.zerohop_suspend {
        let request = SuspendRequest::Resume {
            dir: absolute(&args.dir.join(MEMORY))?,
        };
        ask_suspend(pid, &request).map_err(|e| {
            e.context(format!(
                "the driver restored process {pid}, but its zerohop memory is still suspended (retry with `zerohop resume {pid} {}`)",
                args.dir.join(MEMORY).display()
            ))
        })?;
    }
    println!(
        "restored process {pid} from {} in {:.2} s (driver {driver_seconds:.2} s{})",
        args.dir.display(),
        start.elapsed().as_secs_f64(),
        if record.zerohop_suspend {
            ", then zerohop, verified"
        } else {
            ""
        },
    );
    Ok(())
}

fn existing(pid: u32) -> Result<()> {
    match Path::new(&format!("/proc/{pid}")).exists() {
        true => Ok(()),
        false => Err(Error::new(ErrorKind::NotFound, format!("no process {pid}"))),
    }
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

/// The process's resident host memory (`VmRSS`).
fn resident_bytes(pid: u32) -> Result<u64> {
    let path = PathBuf::from(format!("/proc/{pid}/status"));
    let status = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, "cannot read", e))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(|kib| kib * 1024)
        .ok_or_else(|| Error::new(ErrorKind::Format, format!("no VmRSS in {}", path.display())))
}

fn write_record(dir: &Path, record: &ProcessRecord) -> Result<()> {
    let target = dir.join(RECORD);
    let tmp = temp_sibling(&target)?;
    let io = |e| Error::io(&tmp, "cannot write", e);
    let mut f = std::fs::File::create(&tmp).map_err(io)?;
    let json = serde_json::to_vec_pretty(record).expect("a record serializes");
    f.write_all(&json).and_then(|()| f.sync_all()).map_err(io)?;
    commit_new(&tmp, &target)
}

fn read_record(dir: &Path) -> Result<ProcessRecord> {
    let path = dir.join(RECORD);
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
        let record = ProcessRecord {
            pid: 7,
            zerohop_suspend: true,
            suspend_seconds: 0.5,
            driver_seconds: 0.25,
            driver_host_bytes: -4096,
        };
        write_record(&dir, &record).unwrap();
        let back = read_record(&dir).unwrap();
        assert_eq!(
            (back.pid, back.zerohop_suspend, back.driver_host_bytes),
            (7, true, -4096)
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

    #[test]
    fn our_own_resident_memory_is_read() {
        assert!(resident_bytes(std::process::id()).unwrap() > 0);
        assert!(resident_bytes(u32::MAX).is_err());
    }
}

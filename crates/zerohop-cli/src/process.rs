//! `zerohop checkpoint-process PID DIR` and `zerohop restore-process PID
//! DIR`: the driver's process checkpoint with zerohop as its transport
//! (`zerohop_process::gpu_state`).

use clap::Args;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use zerohop::Result;
use zerohop_cmd::size::human_bytes;
use zerohop_process::gpu_state;

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

pub fn checkpoint(args: &CheckpointProcessArgs) -> Result<()> {
    let start = Instant::now();
    let timeout = Duration::from_secs(args.lock_timeout);
    let record = gpu_state::checkpoint(args.pid, &args.dir, args.parent.as_deref(), timeout)?;
    let how = match record.zerohop_suspend {
        true => format!("zerohop {} in {:.2} s", human_bytes(record.zerohop_bytes), record.suspend_seconds),
        false => "no zerohop memory: the process serves no suspend requests (zerohop.serve_suspend), so the driver stages all of it".into(),
    };
    println!(
        "checkpointed process {} to {} in {:.2} s ({how}; driver {:.2} s); the driver staged {} in its host memory",
        args.pid,
        args.dir.display(),
        start.elapsed().as_secs_f64(),
        record.driver_seconds,
        human_bytes(record.driver_host_bytes.max(0) as u64),
    );
    Ok(())
}

pub fn restore(args: &RestoreProcessArgs) -> Result<()> {
    let done = gpu_state::restore(args.pid, &args.dir)?;
    println!(
        "restored process {} from {} in {:.2} s (driver {:.2} s{})",
        args.pid,
        args.dir.display(),
        done.seconds,
        done.driver_seconds,
        match done.zerohop_bytes {
            Some(b) => format!(", then zerohop {}, verified", human_bytes(b)),
            None => String::new(),
        },
    );
    Ok(())
}

//! `zerohop suspend PID DIR` and `zerohop resume PID DIR`: ask a process
//! that serves its suspendable GPU memory (Python: `zerohop.serve_suspend`)
//! to write it to storage and hand it back, or to take it back.

use clap::Args;
use std::path::PathBuf;
use zerohop::Result;
use zerohop_cmd::size::human_bytes;
use zerohop_process::suspend_client::{absolute, ask_suspend, heap_status};
use zerohop_wire::suspend::SuspendRequest;

#[derive(Args, Debug)]
pub struct SuspendArgs {
    /// The process to suspend (it must serve requests: zerohop.serve_suspend).
    pub pid: u32,
    /// A new checkpoint directory for its memory.
    pub dir: PathBuf,
    /// An earlier suspend's checkpoint: unchanged chunks are referenced,
    /// not written again (default: none).
    #[arg(long)]
    pub parent: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub struct ResumeArgs {
    /// The suspended process.
    pub pid: u32,
    /// The checkpoint its suspend wrote.
    pub dir: PathBuf,
}

pub fn suspend(args: &SuspendArgs) -> Result<()> {
    let request = SuspendRequest::Suspend {
        dir: absolute(&args.dir)?,
        parent: args.parent.as_deref().map(absolute).transpose()?,
    };
    let (seconds, bytes) = ask_suspend(args.pid, &request)?;
    let status = heap_status(args.pid)?;
    println!(
        "suspended process {} to {} in {seconds:.2} s: {} written, {} of device memory released",
        args.pid,
        args.dir.display(),
        human_bytes(bytes),
        human_bytes(status.0.saturating_sub(status.1)),
    );
    Ok(())
}

pub fn resume(args: &ResumeArgs) -> Result<()> {
    let request = SuspendRequest::Resume {
        dir: absolute(&args.dir)?,
    };
    let (seconds, bytes) = ask_suspend(args.pid, &request)?;
    println!(
        "resumed process {} from {} in {seconds:.2} s: {} restored and verified",
        args.pid,
        args.dir.display(),
        human_bytes(bytes)
    );
    Ok(())
}

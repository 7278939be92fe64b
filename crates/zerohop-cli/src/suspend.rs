//! `zerohop suspend PID DIR` and `zerohop resume PID DIR`: ask a process
//! that serves its suspendable GPU memory (Python: `zerohop.serve_suspend`)
//! to write it to storage and hand it back, or to take it back.

use clap::Args;
use std::path::{Path, PathBuf};
use zerohop::{Error, ErrorKind, Result};
use zerohop_cmd::size::human_bytes;
use zerohop_wire::control::{encode, recv, send};
use zerohop_wire::socket::connect;
use zerohop_wire::suspend::{decode_suspend_reply, socket_path, SuspendReply, SuspendRequest};

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
    let status = status(args.pid)?;
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

/// The process's heap: bytes allocated, bytes of device memory behind them.
fn status(pid: u32) -> Result<(u64, u64)> {
    match ask(pid, &SuspendRequest::Status)? {
        SuspendReply::Status(s) => Ok((s.bytes, s.backed_bytes)),
        other => Err(unexpected(&other)),
    }
}

/// Whether process `pid` serves suspend requests.
pub(crate) fn serves_suspend(pid: u32) -> bool {
    matches!(
        ask(pid, &SuspendRequest::Status),
        Ok(SuspendReply::Status(_))
    )
}

/// Asks process `pid` to suspend or resume: the seconds it took and the
/// bytes written or restored.
pub(crate) fn ask_suspend(pid: u32, request: &SuspendRequest) -> Result<(f64, u64)> {
    match ask(pid, request)? {
        SuspendReply::Done { seconds, bytes } => Ok((seconds, bytes)),
        SuspendReply::Error { message } => Err(Error::new(ErrorKind::InvalidInput, message)),
        other => Err(unexpected(&other)),
    }
}

fn unexpected(reply: &SuspendReply) -> Error {
    Error::new(ErrorKind::Io, format!("unexpected reply {reply:?}"))
}

/// The process resolves paths from its own working directory.
pub(crate) fn absolute(p: &Path) -> Result<String> {
    let p = std::path::absolute(p)
        .map_err(|e| Error::with_source(ErrorKind::InvalidInput, format!("{}", p.display()), e))?;
    p.to_str()
        .map(str::to_string)
        .ok_or_else(|| Error::invalid(format!("{} is not valid UTF-8", p.display())))
}

/// Sends `request` to process `pid` and waits for its reply (a suspend
/// waits for the process's pause and the whole save).
fn ask(pid: u32, request: &SuspendRequest) -> Result<SuspendReply> {
    let path = socket_path(pid);
    let socket = connect(&path).map_err(|e| {
        Error::with_source(
            ErrorKind::NotFound,
            format!(
                "process {pid} serves no suspend requests at {} (is it running, with zerohop.serve_suspend?)",
                path.display()
            ),
            e,
        )
    })?;
    let io = |e: std::io::Error| {
        Error::with_source(ErrorKind::Io, format!("talking to process {pid}"), e)
    };
    send(&socket, &encode(request), &[]).map_err(io)?;
    match recv(&socket).map_err(io)? {
        Some((bytes, _)) => decode_suspend_reply(&bytes).map_err(|e| Error::new(ErrorKind::Io, e)),
        None => Err(Error::new(
            ErrorKind::Io,
            format!("process {pid} closed the connection without an answer"),
        )),
    }
}

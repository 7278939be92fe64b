//! Requests to a process that serves its suspendable GPU memory (Python:
//! `zerohop.serve_suspend`; any CUDA program: the preloaded library),
//! over its Unix socket.

use std::path::Path;
use zerohop::{Error, ErrorKind, Result};
use zerohop_wire::control::{encode, recv, send};
use zerohop_wire::socket::connect;
use zerohop_wire::suspend::{decode_suspend_reply, socket_path, SuspendReply, SuspendRequest};

/// Whether process `pid` serves suspend requests.
pub fn serves_suspend(pid: u32) -> bool {
    matches!(
        ask(pid, &SuspendRequest::Status),
        Ok(SuspendReply::Status(_))
    )
}

/// Asks process `pid` to suspend or resume: the seconds it took and the
/// bytes written or restored.
pub fn ask_suspend(pid: u32, request: &SuspendRequest) -> Result<(f64, u64)> {
    match ask(pid, request)? {
        SuspendReply::Done { seconds, bytes } => Ok((seconds, bytes)),
        SuspendReply::Error { message } => Err(Error::new(ErrorKind::InvalidInput, message)),
        other => Err(unexpected(&other)),
    }
}

/// The process's heap: bytes allocated, bytes of device memory behind them.
pub fn heap_status(pid: u32) -> Result<(u64, u64)> {
    match ask(pid, &SuspendRequest::Status)? {
        SuspendReply::Status(s) => Ok((s.bytes, s.backed_bytes)),
        other => Err(unexpected(&other)),
    }
}

fn unexpected(reply: &SuspendReply) -> Error {
    Error::new(ErrorKind::Io, format!("unexpected reply {reply:?}"))
}

/// `p` as the other process must be told it: absolute, since it resolves
/// paths from its own working directory.
pub fn absolute(p: &Path) -> Result<String> {
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

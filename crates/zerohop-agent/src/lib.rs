//! The zerohop I/O agent: a daemon that reads and writes files for other
//! processes, into and out of their own memory, host or GPU.
//!
//! A client connects to the agent's Unix socket and registers, with control
//! messages ([`zerohop_wire::control`]): files, by passing descriptors it
//! opened itself (the agent never opens a path for a client, so a client
//! reaches only what it could reach); buffers, as sealed memfds (host
//! memory) or as CUDA IPC handles plus the buffer's offset in its allocation
//! (GPU memory); and rings ([`zerohop_wire::ring`]) in shared memory. It
//! then submits I/O through a ring and waits on a futex; the agent runs
//! each batch through the engine's pipeline and posts completions.
//!
//! Each client has its own session thread. Nothing a client sends is
//! trusted; when its connection closes, for any reason, everything it
//! registered is released. SIGTERM or SIGINT stops the agent: no new
//! clients, every submitted I/O completed, then exit.
#![deny(unsafe_op_in_unsafe_fn)]

mod engines;
mod execute;
mod logger;
mod resources;
mod session;
mod shared;
mod wakeups;

pub use logger::init_logging;

use log::{error, info, warn};
use rustix::io::Errno;
use std::io;
use std::os::fd::{FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use zerohop_wire::socket;

/// How to run the agent.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    pub socket: PathBuf,
    /// Let the socket's group connect too (default: the owner only).
    pub group_access: bool,
    /// The GPU whose memory clients may register, as a device name (see
    /// [`zerohop::device::DEVICE_HELP`]; `host`: none).
    pub device: String,
    pub max_clients: usize,
    /// Directories served (USRBIO's mount points): if any, a client may
    /// register only files that lie under one of them. Made canonical at
    /// start.
    pub served: Vec<PathBuf>,
}

impl Default for AgentConfig {
    fn default() -> Self {
        AgentConfig {
            socket: default_socket_path(),
            group_access: false,
            device: "auto".into(),
            max_clients: 1024,
            served: Vec::new(),
        }
    }
}

pub use zerohop_wire::socket::default_path as default_socket_path;

/// Runs the agent in the foreground until SIGTERM or SIGINT.
pub fn run(config: &AgentConfig) -> zerohop::Result<()> {
    let signals = block_stop_signals().map_err(|e| {
        zerohop::Error::with_source(zerohop::ErrorKind::Io, "cannot set up signal handling", e)
    })?;
    let served = config
        .served
        .iter()
        .map(|d| match std::fs::canonicalize(d) {
            Ok(c) if c.is_dir() => Ok(c),
            Ok(_) => Err(zerohop::Error::invalid(format!(
                "--serve {}: not a directory",
                d.display()
            ))),
            Err(e) => Err(zerohop::Error::io(d, "cannot serve", e)),
        })
        .collect::<zerohop::Result<Vec<_>>>()?;
    // Bound before the engines start any thread (`listen` sets the umask).
    let listener = bind(&config.socket, config.group_access)?;
    let engines = engines::Engines::open(&config.device).inspect_err(|_| {
        let _ = std::fs::remove_file(&config.socket);
    })?;
    let shared = Arc::new(
        shared::Shared::new(engines, served)
            .map_err(|e| zerohop::Error::io(&config.socket, "cannot start", e))?,
    );
    info!(
        "agent pid {} serving {} on {} ({}), files {}",
        std::process::id(),
        shared.engines.describe(),
        config.socket.display(),
        if config.group_access {
            "owner and group"
        } else {
            "owner only"
        },
        if shared.served.is_empty() {
            "anywhere".to_string()
        } else {
            format!(
                "under {}",
                shared
                    .served
                    .iter()
                    .map(|d| d.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        }
    );
    let mut sessions: Vec<std::thread::JoinHandle<()>> = Vec::new();
    let mut next_session = 1u64;
    loop {
        let ready = socket::wait_readable(&[&listener, &signals], Some(Duration::from_secs(1)))
            .map_err(|e| zerohop::Error::io(&config.socket, "cannot wait on", e))?;
        sessions.retain(|h| !h.is_finished());
        if ready[1] {
            info!(
                "stop signal: finishing submitted I/O of {} session(s)",
                sessions.len()
            );
            break;
        }
        if !ready[0] {
            continue;
        }
        let conn = match socket::accept(&listener) {
            Ok(c) => c,
            Err(e) => {
                warn!("accept failed: {e}");
                continue;
            }
        };
        if sessions.len() >= config.max_clients {
            warn!(
                "refusing a client: {} sessions is the limit",
                config.max_clients
            );
            continue; // dropping `conn` closes it
        }
        let session = session::Session::new(next_session, conn, shared.clone());
        next_session += 1;
        shared.sessions_total.fetch_add(1, Ordering::Relaxed);
        match std::thread::Builder::new()
            .name(format!("session-{}", next_session - 1))
            .spawn(move || session.serve())
        {
            Ok(h) => sessions.push(h),
            Err(e) => error!("cannot start a session thread: {e}"),
        }
    }
    shared.stop();
    for h in sessions {
        let _ = h.join();
    }
    let _ = std::fs::remove_file(&config.socket);
    info!("agent stopped");
    Ok(())
}

/// Binds the socket, replacing a stale one (no agent answering there) but
/// never a live agent's.
fn bind(path: &Path, group_access: bool) -> zerohop::Result<OwnedFd> {
    if path.exists() {
        match socket::connect(path) {
            // Only a socket nobody listens on is stale.
            Err(e) if e.raw_os_error() == Some(Errno::CONNREFUSED.raw_os_error()) => {
                std::fs::remove_file(path)
                    .map_err(|e| zerohop::Error::io(path, "cannot remove the stale socket", e))?
            }
            _ => {
                return Err(zerohop::Error::new(
                    zerohop::ErrorKind::AlreadyExists,
                    format!("an agent is already serving {}", path.display()),
                ))
            }
        }
    }
    let mode = if group_access { 0o660 } else { 0o600 };
    socket::listen(path, mode).map_err(|e| zerohop::Error::io(path, "cannot listen on", e))
}

/// Blocks SIGTERM and SIGINT in every thread (threads started later inherit
/// the mask) and returns a signalfd that reads them. Through libc: rustix
/// has no signalfd.
fn block_stop_signals() -> io::Result<OwnedFd> {
    // SAFETY: sigset operations on a local set; pthread_sigmask and
    // signalfd take valid pointers to it, and the descriptor signalfd
    // returns is fresh, owned by nobody else.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
        let rc = libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        if rc != 0 {
            return Err(io::Error::from_raw_os_error(rc));
        }
        let fd = libc::signalfd(-1, &set, libc::SFD_CLOEXEC);
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(OwnedFd::from_raw_fd(fd))
    }
}

/// Asks the agent at `socket_path` for its status.
pub fn query_status(socket_path: &Path) -> io::Result<zerohop_wire::control::AgentStatus> {
    use zerohop_wire::control::{self, Reply, Request};
    let conn = socket::connect(socket_path)?;
    control::send(&conn, &control::encode(&Request::Status), &[])?;
    let (bytes, _) = control::recv(&conn)?.ok_or(io::ErrorKind::UnexpectedEof)?;
    match control::decode_reply(&bytes)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?
    {
        Reply::Status(s) => Ok(s),
        other => Err(io::Error::other(format!("unexpected reply {other:?}"))),
    }
}

//! Serving suspend and resume requests from outside the process
//! (`zerohop suspend PID DIR`): a thread listens on
//! [`socket_path`](zerohop_wire::suspend::socket_path) (owner only), takes
//! one request per connection from the same user, and answers it.
//!
//! The process decides when its memory may go: `pause` runs before a
//! suspend and returns once nothing uses the heap's memory (say, after the
//! current step, holding the lock the process's loop takes); `unpause`
//! runs once a resume succeeded.

use crate::SuspendableHeap;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use zerohop::Result;
use zerohop_wire::control::{encode, recv, send};
use zerohop_wire::socket::{accept, listen, peer, wait_readable};
use zerohop_wire::suspend::{decode_suspend_request, HeapStatus, SuspendReply, SuspendRequest};

/// What the process runs around a suspend.
pub struct QuietPoint {
    /// Returns once nothing touches the heap's memory, and keeps it so
    /// until `unpause`.
    pub pause: Box<dyn Fn() -> Result<()> + Send + Sync>,
    /// Lets the process use its memory again.
    pub unpause: Box<dyn Fn() + Send + Sync>,
}

/// The serving thread; stopped, and its socket removed, on drop.
pub struct ControlServer {
    path: PathBuf,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl ControlServer {
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for ControlServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

/// How often the serving thread looks whether it should stop.
const STOP_CHECK: Duration = Duration::from_millis(100);
/// How long a connected client has to send its request.
const REQUEST_WAIT: Duration = Duration::from_secs(10);

/// Serves `heap` at `path` (a stale socket there is replaced; any other
/// file there is an error).
///
/// # Safety
/// Once `quiet.pause` has returned, nothing may touch the heap's memory
/// until `quiet.unpause` is called: requests suspend and resume it then.
pub unsafe fn serve(
    heap: Arc<SuspendableHeap>,
    path: &Path,
    quiet: QuietPoint,
) -> io::Result<ControlServer> {
    use std::os::unix::fs::FileTypeExt;
    if std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_socket()) {
        std::fs::remove_file(path)?;
    }
    let listener = listen(path, 0o600)?;
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    let thread = std::thread::Builder::new()
        .name("zerohop-suspend".into())
        .spawn(move || {
            while !flag.load(Ordering::Relaxed) {
                if !matches!(
                    wait_readable(&[&listener], Some(STOP_CHECK)).as_deref(),
                    Ok([true])
                ) {
                    continue;
                }
                if let Ok(client) = accept(&listener) {
                    // SAFETY: forwarded contract of `serve`.
                    unsafe { answer(&heap, &client, &quiet) };
                }
            }
        })?;
    Ok(ControlServer {
        path: path.to_path_buf(),
        stop,
        thread: Some(thread),
    })
}

/// Answers the one request of `client` (refused unless from our user).
///
/// # Safety
/// As for [`serve`].
unsafe fn answer(heap: &SuspendableHeap, client: &OwnedFd, quiet: &QuietPoint) {
    let me = rustix::process::getuid().as_raw();
    let reply = match peer(client) {
        Some((_, uid)) if uid == me => match read_request(client) {
            // SAFETY: forwarded contract.
            Ok(request) => unsafe { run(heap, request, quiet) },
            Err(message) => SuspendReply::Error { message },
        },
        _ => SuspendReply::Error {
            message: "only the process's own user may suspend it".into(),
        },
    };
    let _ = send(client, &encode(&reply), &[]);
}

fn read_request(client: &impl AsFd) -> std::result::Result<SuspendRequest, String> {
    if !matches!(
        wait_readable(&[client], Some(REQUEST_WAIT)).as_deref(),
        Ok([true])
    ) {
        return Err(format!("no request within {} s", REQUEST_WAIT.as_secs()));
    }
    match recv(client) {
        Ok(Some((bytes, _))) => decode_suspend_request(&bytes),
        Ok(None) => Err("the connection closed before a request".into()),
        Err(e) => Err(format!("reading the request: {e}")),
    }
}

/// # Safety
/// As for [`serve`].
unsafe fn run(heap: &SuspendableHeap, request: SuspendRequest, quiet: &QuietPoint) -> SuspendReply {
    let started = Instant::now();
    let outcome = match request {
        SuspendRequest::Status => return SuspendReply::Status(status(heap)),
        SuspendRequest::Suspend { dir, parent } => (quiet.pause)().and_then(|()| {
            // SAFETY: the process is paused: nothing touches the memory.
            let s =
                unsafe { heap.suspend(Path::new(&dir), parent.as_deref().map(Path::new), None) };
            if s.is_err() && heap.suspended_to().is_none() {
                (quiet.unpause)(); // nothing was released: carry on
            }
            s.map(|s| s.saved.written_bytes)
        }),
        SuspendRequest::Resume { dir } => {
            // SAFETY: still paused since the suspend.
            let r = unsafe { heap.resume(Path::new(&dir), None) };
            if r.is_ok() {
                (quiet.unpause)();
            }
            r.map(|r| r.stats.bytes)
        }
    };
    match outcome {
        Ok(bytes) => SuspendReply::Done {
            seconds: started.elapsed().as_secs_f64(),
            bytes,
        },
        Err(e) => SuspendReply::Error {
            message: e.to_string(),
        },
    }
}

fn status(heap: &SuspendableHeap) -> HeapStatus {
    let allocations = heap.allocations();
    HeapStatus {
        pid: std::process::id(),
        allocations: allocations.len() as u64,
        bytes: allocations.iter().map(|a| a.1 as u64).sum(),
        backed_bytes: heap.backed_bytes(),
        suspended_to: heap.suspended_to().map(|p| p.display().to_string()),
    }
}

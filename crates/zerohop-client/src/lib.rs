//! A client of the zerohop agent (`zerohop agent`): register files and
//! buffers (host memory, or GPU memory by IPC handle), submit reads and
//! writes through a shared-memory ring, and wait for their completions.
//!
//! ```no_run
//! use zerohop_client::{Client, Submission};
//! let client = Client::connect(&zerohop_client::default_socket_path())?;
//! let file = client.register_file(&std::fs::File::open("model.safetensors")?)?;
//! let buf = client.create_host_buffer(64 << 20)?;
//! let mut ring = client.create_ring(64)?;
//! ring.prepare(Submission::read(file, 0, &buf, 0, 64 << 20, 1))?;
//! ring.submit()?;
//! let done = ring.wait(1, Some(std::time::Duration::from_secs(10)))?;
//! assert_eq!(done[0].result, 64 << 20);
//! # Ok::<(), std::io::Error>(())
//! ```
#![deny(unsafe_op_in_unsafe_fn)]

mod capi;

pub use capi::guard;

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use zerohop_wire::control::{self, AgentStatus, Reply, Request};
use zerohop_wire::ring::{self, CompletionEntry, Ring, SubmissionEntry, OP_READ, OP_WRITE};
pub use zerohop_wire::shm::SharedMemory;
use zerohop_wire::socket;

pub use zerohop_wire::ring::CompletionEntry as Completion;

pub use zerohop_wire::socket::default_path as default_socket_path;

/// A session with the agent. Its registrations last until they are
/// deregistered or the client is dropped (or the process dies).
pub struct Client {
    socket: Mutex<OwnedFd>,
}

/// A registered buffer of host memory this process can read and write.
pub struct HostBuffer {
    id: u32,
    mem: SharedMemory,
}

impl HostBuffer {
    pub fn id(&self) -> u32 {
        self.id
    }

    pub fn as_ptr(&self) -> *mut u8 {
        self.mem.as_ptr()
    }

    pub fn len(&self) -> usize {
        self.mem.len()
    }

    pub fn is_empty(&self) -> bool {
        self.mem.is_empty()
    }

    /// The memfd holding the buffer (another process may map it too).
    pub fn file(&self) -> &File {
        self.mem.file()
    }

    /// The buffer's bytes.
    ///
    /// # Safety
    /// No I/O on this buffer is in flight (the agent writes it during reads
    /// and reads it during writes) while the slice is used.
    pub unsafe fn as_slice(&self) -> &[u8] {
        // SAFETY: the mapping lives as long as `self`; the caller keeps the
        // agent off it.
        unsafe { std::slice::from_raw_parts(self.mem.as_ptr(), self.mem.len()) }
    }

    /// As [`HostBuffer::as_slice`], to fill before writes.
    ///
    /// # Safety
    /// As [`HostBuffer::as_slice`].
    pub unsafe fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: the mapping lives as long as `self`, borrowed exclusively;
        // the caller keeps the agent off it.
        unsafe { std::slice::from_raw_parts_mut(self.mem.as_ptr(), self.mem.len()) }
    }
}

fn agent_error(code: i32, message: String) -> io::Error {
    let kind = io::Error::from_raw_os_error(code).kind();
    io::Error::new(kind, format!("agent: {message}"))
}

impl Client {
    /// Connects and says hello. The agent must run as this user or root
    /// (or as the user id in `ZEROHOP_AGENT_UID`): the client hands it
    /// descriptors and GPU memory, so a socket someone else planted at the
    /// path is refused.
    pub fn connect(path: &Path) -> io::Result<Client> {
        let conn = socket::connect(path)?;
        let trusted = std::env::var("ZEROHOP_AGENT_UID")
            .ok()
            .and_then(|u| u.parse::<u32>().ok());
        let me = rustix::process::getuid().as_raw();
        match socket::peer(&conn) {
            Some((_, uid)) if uid == me || uid == 0 || Some(uid) == trusted => {}
            other => {
                return Err(io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    format!(
                        "{} is served by user {:?}, not this user or root (set ZEROHOP_AGENT_UID to trust it)",
                        path.display(),
                        other.map(|p| p.1)
                    ),
                ))
            }
        }
        let client = Client {
            socket: Mutex::new(conn),
        };
        client.call(
            &Request::Hello {
                version: zerohop_wire::PROTOCOL_VERSION,
                pid: std::process::id(),
            },
            &[],
        )?;
        Ok(client)
    }

    fn call(&self, request: &Request, fds: &[BorrowedFd<'_>]) -> io::Result<Option<u32>> {
        match self.exchange(request, fds)? {
            Reply::Ok { id } => Ok(id),
            Reply::Error { code, message } => Err(agent_error(code, message)),
            other => Err(io::Error::other(format!("unexpected reply {other:?}"))),
        }
    }

    fn exchange(&self, request: &Request, fds: &[BorrowedFd<'_>]) -> io::Result<Reply> {
        let socket = self.lock();
        control::send(&*socket, &control::encode(request), fds)?;
        let (bytes, _) = control::recv(&*socket)?.ok_or(io::ErrorKind::UnexpectedEof)?;
        control::decode_reply(&bytes).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
    }

    fn id(&self, request: &Request, fds: &[BorrowedFd<'_>]) -> io::Result<u32> {
        self.call(request, fds)?
            .ok_or_else(|| io::Error::other("the agent answered without an id"))
    }

    /// Registers a file this process opened (read-only for reads; writable
    /// for writes); the agent uses the descriptor, never the path.
    pub fn register_file(&self, file: impl AsFd) -> io::Result<u32> {
        self.id(&Request::RegisterFile, &[file.as_fd()])
    }

    pub fn deregister_file(&self, id: u32) -> io::Result<()> {
        self.call(&Request::DeregisterFile { id }, &[]).map(drop)
    }

    /// A new buffer of `len` bytes of shared host memory.
    pub fn create_host_buffer(&self, len: usize) -> io::Result<HostBuffer> {
        self.register_host_memory(SharedMemory::create("zerohop-buffer", len)?)
    }

    /// Registers shared memory this process made or mapped itself (e.g.
    /// another process's [`HostBuffer::file`], through
    /// [`SharedMemory::import`]).
    pub fn register_host_memory(&self, mem: SharedMemory) -> io::Result<HostBuffer> {
        let id = self.id(
            &Request::RegisterHostBuffer {
                len: mem.len() as u64,
            },
            &[mem.file().as_fd()],
        )?;
        Ok(HostBuffer { id, mem })
    }

    /// A buffer of host memory that the agent treats as GPU memory of its
    /// simulated device (for tests of the device route without a GPU).
    pub fn create_simulated_device_buffer(&self, len: usize) -> io::Result<HostBuffer> {
        let mem = SharedMemory::create("zerohop-sim-buffer", len)?;
        let id = self.id(
            &Request::RegisterSimulatedDeviceBuffer { len: len as u64 },
            &[mem.file().as_fd()],
        )?;
        Ok(HostBuffer { id, mem })
    }

    /// Registers `len` bytes of this process's GPU memory at `ptr` on
    /// `device` (e.g. a tensor's `data_ptr()`, anywhere inside an
    /// allocation): by IPC handle for `cuMemAlloc` memory, else by file
    /// descriptor for VMM memory (`cuMemCreate` with the POSIX descriptor
    /// handle type, as PyTorch's expandable segments can be). The caller
    /// keeps the memory allocated while registered, and finishes its own GPU
    /// work on it before submitting I/O.
    pub fn register_device_buffer(&self, device: u32, ptr: u64, len: u64) -> io::Result<u32> {
        let fail = |e: zerohop_cuda::CudaError| io::Error::other(e.to_string());
        let ctx = zerohop_cuda::Context::new(device as usize).map_err(fail)?;
        let inside = |offset: u64, allocation_len: u64| {
            if offset
                .checked_add(len)
                .is_none_or(|end| end > allocation_len)
            {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "the buffer runs past the end of its allocation",
                ));
            }
            Ok(())
        };
        match zerohop_cuda::export_ipc(&ctx, ptr) {
            Ok(export) => {
                inside(export.offset, export.allocation_len)?;
                self.register_cuda_ipc(device, &export.handle, export.offset, len)
            }
            Err(ipc) => {
                let export = zerohop_cuda::export_vmm(&ctx, ptr).map_err(|vmm| {
                    io::Error::other(format!(
                        "neither an IPC handle ({ipc}) nor a VMM descriptor ({vmm})"
                    ))
                })?;
                inside(export.offset, export.allocation_len)?;
                let request = Request::RegisterCudaVmm {
                    device,
                    allocation_len: export.allocation_len,
                    offset: export.offset,
                    len,
                };
                self.id(&request, &[export.fd.as_fd()])
            }
        }
    }

    /// Registers `len` bytes at `offset` of the allocation behind a CUDA
    /// IPC `handle` (exported by this or another process, which keeps the
    /// allocation while registered).
    pub fn register_cuda_ipc(
        &self,
        device: u32,
        handle: &[u8; 64],
        offset: u64,
        len: u64,
    ) -> io::Result<u32> {
        let request = Request::RegisterCudaIpc {
            device,
            handle: control::handle_to_hex(handle),
            offset,
            len,
        };
        self.id(&request, &[])
    }

    pub fn deregister_buffer(&self, id: u32) -> io::Result<()> {
        self.call(&Request::DeregisterBuffer { id }, &[]).map(drop)
    }

    /// A new ring of `entries` (a power of two up to 4096).
    pub fn create_ring(&self, entries: u32) -> io::Result<IoRing> {
        if !ring::valid_entries(entries) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "ring entries: a power of two up to 4096",
            ));
        }
        let mem = SharedMemory::create("zerohop-ring", ring::ring_bytes(entries))?;
        let ring = Ring::create(mem, entries).map_err(|e| io::Error::other(e.0))?;
        let submitted = socket::eventfd()?;
        let id = self.id(
            &Request::RegisterRing { entries },
            &[ring.memory().file().as_fd(), submitted.as_fd()],
        )?;
        let agent = self.lock().try_clone()?;
        Ok(IoRing {
            id,
            ring,
            submitted,
            agent,
            in_flight: 0,
        })
    }

    /// Deregisters a ring (dropping an [`IoRing`] alone keeps the agent's
    /// side until the client closes).
    pub fn deregister_ring(&self, id: u32) -> io::Result<()> {
        self.call(&Request::DeregisterRing { id }, &[]).map(drop)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, OwnedFd> {
        self.socket.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The agent's counters.
    pub fn status(&self) -> io::Result<AgentStatus> {
        match self.exchange(&Request::Status, &[])? {
            Reply::Status(s) => Ok(s),
            Reply::Error { code, message } => Err(agent_error(code, message)),
            other => Err(io::Error::other(format!("unexpected reply {other:?}"))),
        }
    }
}

/// One I/O to prepare.
#[derive(Debug, Clone, Copy)]
pub struct Submission(SubmissionEntry);

impl Submission {
    /// Read `len` bytes at `file_offset` of `file` into `buf` at `buf_offset`.
    pub fn read(
        file: u32,
        file_offset: u64,
        buf: &HostBuffer,
        buf_offset: u64,
        len: u64,
        user_data: u64,
    ) -> Self {
        Self::raw(
            OP_READ,
            file,
            file_offset,
            buf.id,
            buf_offset,
            len,
            user_data,
        )
    }

    /// Write `len` bytes of `buf` at `buf_offset` to `file` at `file_offset`.
    pub fn write(
        file: u32,
        file_offset: u64,
        buf: &HostBuffer,
        buf_offset: u64,
        len: u64,
        user_data: u64,
    ) -> Self {
        Self::raw(
            OP_WRITE,
            file,
            file_offset,
            buf.id,
            buf_offset,
            len,
            user_data,
        )
    }

    /// Any entry, by buffer id (device buffers have only an id).
    pub fn raw(
        op: u8,
        file: u32,
        file_offset: u64,
        buf: u32,
        buf_offset: u64,
        len: u64,
        user_data: u64,
    ) -> Self {
        Submission(SubmissionEntry {
            user_data,
            file_offset,
            buf_offset,
            len,
            file_id: file,
            buf_id: buf,
            op,
            reserved: [0; 23],
        })
    }
}

/// A submission/completion ring shared with the agent.
pub struct IoRing {
    id: u32,
    ring: Ring,
    submitted: File,
    /// The session's socket: a hang-up means the agent is gone.
    agent: OwnedFd,
    in_flight: usize,
}

impl IoRing {
    pub fn id(&self) -> u32 {
        self.id
    }

    /// Queues one I/O; it goes to the agent at [`IoRing::submit`]. Fails
    /// with `WouldBlock` when the ring is full (submit, then wait).
    pub fn prepare(&mut self, s: Submission) -> io::Result<()> {
        if self.in_flight >= self.ring.entries() as usize || !self.ring.push_submission(&s.0) {
            return Err(io::Error::new(
                io::ErrorKind::WouldBlock,
                "the ring is full: submit and wait first",
            ));
        }
        self.in_flight += 1;
        Ok(())
    }

    /// Hands every prepared I/O to the agent with one wake-up.
    pub fn submit(&mut self) -> io::Result<()> {
        self.ring.publish();
        socket::signal(&self.submitted);
        Ok(())
    }

    /// Waits until at least `min` completions are available (or `timeout`
    /// passes: then fewer), and returns all that are.
    pub fn wait(
        &mut self,
        min: usize,
        timeout: Option<Duration>,
    ) -> io::Result<Vec<CompletionEntry>> {
        self.wait_up_to(min, usize::MAX, timeout)
    }

    /// As [`IoRing::wait`], returning at most `max` (the rest stay queued).
    pub fn wait_up_to(
        &mut self,
        min: usize,
        max: usize,
        timeout: Option<Duration>,
    ) -> io::Result<Vec<CompletionEntry>> {
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut out = Vec::new();
        loop {
            self.reap(&mut out, max);
            if out.len() >= min.min(max) {
                return Ok(out);
            }
            // An agent that leaves posts its last completions first, so
            // once it is gone, one more reap finds all of them.
            if socket::hung_up(&self.agent) {
                self.reap(&mut out, max);
                if out.len() >= min.min(max) {
                    return Ok(out);
                }
                return Err(io::Error::new(
                    io::ErrorKind::ConnectionAborted,
                    "the agent closed the session (it stopped, or this client broke a rule)",
                ));
            }
            let wait = match deadline {
                Some(d) => match d.checked_duration_since(Instant::now()) {
                    Some(left) => left.clamp(Duration::from_millis(1), Duration::from_millis(100)),
                    None => return Ok(out),
                },
                None => Duration::from_millis(100),
            };
            self.ring.wait_for_completions(wait);
        }
    }

    /// Moves posted completions into `out`, up to `max` in all.
    fn reap(&mut self, out: &mut Vec<CompletionEntry>, max: usize) {
        while out.len() < max {
            let Some(c) = self.ring.pop_completion() else {
                break;
            };
            out.push(c);
            self.in_flight = self.in_flight.saturating_sub(1);
        }
    }

    /// I/Os prepared and not yet completed.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Writes `value` over the submission tail, as a broken client would
    /// (tests of the agent's defences).
    #[doc(hidden)]
    pub fn corrupt_tail(&self, value: u32) {
        self.ring.corrupt_submission_tail(value);
        socket::signal(&self.submitted);
    }
}

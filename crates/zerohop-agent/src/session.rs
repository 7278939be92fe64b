//! One client's session: its registrations, its rings, and the loop that
//! serves both. Everything the client sends is checked; a broken rule in a
//! ring ends this session only. Whatever way the session ends (goodbye,
//! crash of the client, corrupt ring, agent shutdown), dropping it releases
//! everything the client registered.

use crate::execute::{self, Work};
use crate::resources::{Buffer, Memory, RegisteredFile};
use crate::shared::Shared;
use log::{debug, info, warn};
use std::collections::{BTreeMap, VecDeque};
use std::fs::File;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};
use zerohop_wire::control::{self, ClientStatus, Reply, Request};
use zerohop_wire::ring::{self, CompletionEntry, Ring, RingCorrupt, OP_READ};
use zerohop_wire::shm::SharedMemory;
use zerohop_wire::socket;

use crate::wakeups::Wakeups;

/// Limits per session.
const MAX_FILES: usize = 4096;
const MAX_BUFFERS: usize = 4096;
const MAX_RINGS: usize = 64;
/// What woke a session.
const SOCKET: u64 = 0;
const STOP: u64 = 1;
const RING: u64 = 2;

/// How long a stopping agent waits for a client to make room for its last
/// completions.
const FLUSH_WAIT: Duration = Duration::from_secs(5);

struct RingState {
    ring: Ring,
    /// The client writes it after submitting; watched, never read.
    _submitted: File,
    /// Completions waiting for room in the ring; while any wait, no new
    /// submissions are taken (so a client that never reaps is bounded).
    waiting: VecDeque<CompletionEntry>,
}

pub struct Session {
    id: u64,
    pid: u32,
    socket: OwnedFd,
    shared: Arc<Shared>,
    files: BTreeMap<u32, RegisteredFile>,
    buffers: BTreeMap<u32, Buffer>,
    rings: BTreeMap<u32, RingState>,
    wakeups: Option<Wakeups>,
    next_id: u32,
    /// Set by a valid hello; until then the connection may only ask for
    /// status, and is not listed as a client.
    greeted: bool,
    bytes: u64,
    ios: u64,
    errors: u64,
}

/// Why a session ended.
enum End {
    Goodbye,
    Stopping,
    Broken(String),
}

impl Session {
    pub fn new(id: u64, socket: OwnedFd, shared: Arc<Shared>) -> Self {
        let pid = socket::peer(&socket).map_or(0, |(pid, _)| pid);
        Session {
            id,
            pid,
            socket,
            shared,
            files: BTreeMap::new(),
            buffers: BTreeMap::new(),
            rings: BTreeMap::new(),
            wakeups: None,
            next_id: 1,
            greeted: false,
            bytes: 0,
            ios: 0,
            errors: 0,
        }
    }

    /// Serves the client until it leaves, breaks a rule, or the agent stops.
    /// Everything it registered is released before it leaves the status.
    pub fn serve(mut self) {
        debug!("session {}: pid {} connected", self.id, self.pid);
        // Leaves the status even if this thread panics.
        let _listed = Listed(self.id, self.shared.clone());
        let end = self.run();
        match &end {
            End::Goodbye => info!(
                "session {}: client pid {} left; releasing its registrations",
                self.id, self.pid
            ),
            End::Stopping => info!("session {}: agent stopping; released", self.id),
            End::Broken(why) => warn!(
                "session {}: ended: {why}; releasing its registrations",
                self.id
            ),
        }
        // Closes IPC mappings, unmaps memfds, closes every descriptor;
        // then `_listed` takes the client off the status.
        drop(self);
    }

    fn run(&mut self) -> End {
        let wakeups = Wakeups::new().and_then(|w| {
            w.watch(&self.socket, SOCKET, false)?;
            w.watch(&self.shared.shutdown, STOP, false)?;
            Ok(w)
        });
        match wakeups {
            Ok(w) => self.wakeups = Some(w),
            Err(e) => return End::Broken(format!("cannot wait for the client: {e}")),
        }
        loop {
            let stopping = self.shared.stopping.load(Ordering::SeqCst);
            let waiting = self.rings.values().any(|r| !r.waiting.is_empty());
            let timeout = if waiting || stopping {
                Duration::from_millis(1)
            } else {
                Duration::from_secs(1)
            };
            let ready = match self.wakeups.as_ref().expect("set above").wait(timeout) {
                Ok(r) => r,
                Err(e) => return End::Broken(format!("epoll failed: {e}")),
            };
            if ready.contains(&SOCKET) {
                match control::recv(&self.socket) {
                    Ok(None) => return End::Goodbye,
                    Ok(Some((bytes, fds))) => {
                        let reply = self.handle(&bytes, fds);
                        // Never blocks: a client that stops reading its
                        // replies loses its session instead.
                        if let Err(e) = control::send_nowait(&self.socket, &control::encode(&reply))
                        {
                            return End::Broken(format!("cannot reply: {e}"));
                        }
                    }
                    Err(e) => return End::Broken(format!("control message refused: {e}")),
                }
            }
            if let Err(RingCorrupt(why)) = self.serve_rings() {
                return End::Broken(why);
            }
            if stopping {
                return self.finish_for_shutdown();
            }
        }
    }

    /// Takes and runs what every ring holds, and posts completions.
    fn serve_rings(&mut self) -> Result<(), RingCorrupt> {
        let ids: Vec<u32> = self.rings.keys().copied().collect();
        for id in ids {
            let state = self.rings.get_mut(&id).expect("listed");
            flush(state)?;
            if !state.waiting.is_empty() {
                continue;
            }
            let sqes = state.ring.take_submissions()?;
            if sqes.is_empty() {
                continue;
            }
            let completions = self.execute(&sqes);
            // Counters first: a client that sees its completions then sees
            // them counted.
            self.publish();
            let state = self.rings.get_mut(&id).expect("listed");
            state.waiting.extend(completions);
            flush(state)?;
        }
        Ok(())
    }

    fn execute(&mut self, sqes: &[ring::SubmissionEntry]) -> Vec<CompletionEntry> {
        let mut results = vec![0i64; sqes.len()];
        let mut works = Vec::new();
        let mut slots = Vec::new();
        // Each file's length, asked once per batch (checks run before any
        // I/O of the batch, so they all see the same lengths anyway).
        let mut lens: BTreeMap<u32, u64> = BTreeMap::new();
        for (i, sqe) in sqes.iter().enumerate() {
            let checked = ring::check_entry(
                sqe,
                |f| self.files.contains_key(&f),
                |b| self.buffers.get(&b).map(Buffer::len),
            );
            match checked {
                Err(code) => results[i] = code as i64,
                Ok(()) if sqe.len == 0 => results[i] = 0,
                // Reads must lie inside the file (no short reads).
                Ok(())
                    if sqe.op == OP_READ
                        && sqe.file_offset + sqe.len
                            > *lens
                                .entry(sqe.file_id)
                                .or_insert_with(|| self.files[&sqe.file_id].len()) =>
                {
                    results[i] = -libc::EINVAL as i64
                }
                Ok(()) => {
                    works.push(Work {
                        sqe: *sqe,
                        file: &self.files[&sqe.file_id],
                        buf: &self.buffers[&sqe.buf_id],
                    });
                    slots.push(i);
                }
            }
        }
        let started = Instant::now();
        for (slot, r) in slots.iter().zip(execute::run(&self.shared.engines, &works)) {
            results[*slot] = r;
        }
        let (mut read, mut written) = (0, 0);
        for (sqe, &r) in sqes.iter().zip(&results) {
            if r < 0 {
                self.errors += 1;
                self.shared.errors.fetch_add(1, Ordering::Relaxed);
            } else if sqe.op == OP_READ {
                read += r as u64;
            } else {
                written += r as u64;
            }
        }
        debug!(
            "session {}: {} I/Os, {read} bytes read, {written} written in {:.3} s",
            self.id,
            sqes.len(),
            started.elapsed().as_secs_f64()
        );
        self.ios += sqes.len() as u64;
        self.bytes += read + written;
        self.shared
            .ios
            .fetch_add(sqes.len() as u64, Ordering::Relaxed);
        self.shared.bytes_read.fetch_add(read, Ordering::Relaxed);
        self.shared
            .bytes_written
            .fetch_add(written, Ordering::Relaxed);
        sqes.iter()
            .zip(results)
            .map(|(s, result)| CompletionEntry {
                user_data: s.user_data,
                result,
                reserved: [0; 16],
            })
            .collect()
    }

    /// The agent is stopping: everything already submitted is run and
    /// completed (or, if the client never makes room, logged as lost to it).
    fn finish_for_shutdown(&mut self) -> End {
        let deadline = Instant::now() + FLUSH_WAIT;
        loop {
            if let Err(RingCorrupt(why)) = self.serve_rings() {
                return End::Broken(why);
            }
            let left: usize = self.rings.values().map(|r| r.waiting.len()).sum();
            if left == 0 {
                return End::Stopping;
            }
            if Instant::now() > deadline {
                warn!(
                    "session {}: {left} completions could not be posted (the client did not reap)",
                    self.id
                );
                return End::Stopping;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    fn handle(&mut self, bytes: &[u8], fds: Vec<File>) -> Reply {
        let request = match control::decode_request(bytes) {
            Ok(r) => r,
            Err(e) => return error(libc::EINVAL, e),
        };
        debug!(
            "session {}: {request:?} with {} descriptor(s)",
            self.id,
            fds.len()
        );
        let expected_fds = match request {
            Request::RegisterFile
            | Request::RegisterHostBuffer { .. }
            | Request::RegisterSimulatedDeviceBuffer { .. }
            | Request::RegisterCudaVmm { .. } => 1,
            Request::RegisterRing { .. } => 2,
            _ => 0,
        };
        if fds.len() != expected_fds {
            return error(
                libc::EINVAL,
                format!("expected {expected_fds} descriptor(s), got {}", fds.len()),
            );
        }
        let mut fds = fds.into_iter();
        let outcome = match request {
            Request::Hello { version, .. } if version != zerohop_wire::PROTOCOL_VERSION => Err((
                libc::EPROTO,
                format!(
                    "protocol version {version}; this agent speaks {}",
                    zerohop_wire::PROTOCOL_VERSION
                ),
            )),
            Request::Hello { .. } => {
                info!("session {}: client pid {} says hello", self.id, self.pid);
                self.greeted = true;
                Ok(None)
            }
            Request::Status => return Reply::Status(self.shared.status()),
            _ if !self.greeted => Err((libc::EPROTO, "say hello first".to_string())),
            Request::RegisterFile => self.add_file(fds.next().expect("counted")),
            Request::DeregisterFile { id } => remove(&mut self.files, id),
            Request::RegisterHostBuffer { len } => {
                let fd = fds.next().expect("counted");
                self.add_buffer(|e| Buffer::shared(e, fd, len, Memory::Host))
            }
            Request::RegisterSimulatedDeviceBuffer { len } => {
                let fd = fds.next().expect("counted");
                self.add_buffer(|e| Buffer::shared(e, fd, len, Memory::SimulatedDevice))
            }
            Request::RegisterCudaIpc {
                device,
                handle,
                offset,
                len,
            } => match control::handle_from_hex(&handle) {
                Some(h) => self.add_buffer(|e| Buffer::cuda_ipc(e, device, &h, offset, len)),
                None => Err((libc::EINVAL, "malformed IPC handle".to_string())),
            },
            Request::RegisterCudaVmm {
                device,
                allocation_len,
                offset,
                len,
            } => {
                let fd = fds.next().expect("counted");
                self.add_buffer(|e| Buffer::cuda_vmm(e, device, &fd, allocation_len, offset, len))
            }
            Request::DeregisterBuffer { id } => remove(&mut self.buffers, id),
            Request::RegisterRing { entries } => {
                let (memfd, submitted) = (fds.next(), fds.next());
                self.add_ring(
                    entries,
                    memfd.expect("counted"),
                    submitted.expect("counted"),
                )
            }
            Request::DeregisterRing { id } => remove(&mut self.rings, id),
        };
        self.publish();
        match outcome {
            Ok(id) => Reply::Ok { id },
            Err((code, message)) => error(code, message),
        }
    }

    fn take_id(&mut self) -> u32 {
        let id = self.next_id;
        self.next_id = self.next_id.wrapping_add(1).max(1);
        id
    }

    fn add_file(&mut self, file: File) -> Outcome {
        if self.files.len() >= MAX_FILES {
            return Err((
                libc::EMFILE,
                format!("at most {MAX_FILES} files per session"),
            ));
        }
        let id = self.take_id();
        let label = format!("client {} file {id}", self.pid);
        let f = RegisteredFile::new(file, label).map_err(refused)?;
        self.files.insert(id, f);
        Ok(Some(id))
    }

    fn add_buffer(
        &mut self,
        make: impl FnOnce(&crate::engines::Engines) -> zerohop::Result<Buffer>,
    ) -> Outcome {
        if self.buffers.len() >= MAX_BUFFERS {
            return Err((
                libc::EMFILE,
                format!("at most {MAX_BUFFERS} buffers per session"),
            ));
        }
        let b = make(&self.shared.engines).map_err(refused)?;
        let id = self.take_id();
        self.buffers.insert(id, b);
        Ok(Some(id))
    }

    fn add_ring(&mut self, entries: u32, memfd: File, submitted: File) -> Outcome {
        if self.rings.len() >= MAX_RINGS {
            return Err((
                libc::EMFILE,
                format!("at most {MAX_RINGS} rings per session"),
            ));
        }
        if !ring::valid_entries(entries) {
            return Err((
                libc::EINVAL,
                format!(
                    "{entries} entries: a power of two up to {} is needed",
                    ring::MAX_ENTRIES
                ),
            ));
        }
        if !is_eventfd(&submitted) {
            return Err((libc::EINVAL, "the ring's wake-up must be an eventfd".into()));
        }
        let mem = SharedMemory::import(memfd, ring::ring_bytes(entries))
            .map_err(|e| (libc::EINVAL, e.to_string()))?;
        let ring = Ring::attach(mem, entries).map_err(|RingCorrupt(why)| (libc::EINVAL, why))?;
        if let Some(w) = &self.wakeups {
            w.watch(&submitted, RING, true).map_err(|e| {
                (
                    libc::EINVAL,
                    format!("cannot watch the ring's eventfd: {e}"),
                )
            })?;
        }
        let id = self.take_id();
        self.rings.insert(
            id,
            RingState {
                ring,
                _submitted: submitted,
                waiting: VecDeque::new(),
            },
        );
        Ok(Some(id))
    }

    fn publish(&self) {
        if !self.greeted {
            return;
        }
        let host_buffers = self
            .buffers
            .values()
            .filter(|b| b.memory == Memory::Host)
            .count();
        self.shared.update_client(ClientStatus {
            session: self.id,
            pid: self.pid,
            files: self.files.len(),
            host_buffers,
            device_buffers: self.buffers.len() - host_buffers,
            rings: self.rings.len(),
            bytes: self.bytes,
            ios: self.ios,
            errors: self.errors,
        });
    }
}

type Outcome = Result<Option<u32>, (i32, String)>;

/// Removes a session from the status when dropped.
struct Listed(u64, Arc<Shared>);

impl Drop for Listed {
    fn drop(&mut self) {
        self.1.remove_client(self.0);
    }
}

fn error(code: i32, message: impl Into<String>) -> Reply {
    Reply::Error {
        code,
        message: message.into(),
    }
}

fn refused(e: zerohop::Error) -> (i32, String) {
    (libc::EINVAL, e.to_string())
}

fn remove<T>(map: &mut BTreeMap<u32, T>, id: u32) -> Outcome {
    map.remove(&id)
        .map(|_| None)
        .ok_or((libc::EBADF, format!("no registration {id}")))
}

/// Posts waiting completions while the ring has room; wakes the client.
fn flush(state: &mut RingState) -> Result<(), RingCorrupt> {
    let room = state.ring.completion_room()? as usize;
    let n = room.min(state.waiting.len());
    for cqe in state.waiting.drain(..n) {
        state.ring.push_completion(&cqe);
    }
    if n > 0 {
        state.ring.publish_completions();
    }
    Ok(())
}

fn is_eventfd(f: &File) -> bool {
    std::fs::read_link(format!("/proc/self/fd/{}", f.as_raw_fd()))
        .is_ok_and(|p| p.to_string_lossy() == "anon_inode:[eventfd]")
}

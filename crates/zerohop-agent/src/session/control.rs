//! The control protocol of a session: one request on the socket, checked
//! (hello first, the right descriptors), answered with one reply; and the
//! registrations it makes and removes: files, buffers and rings, each
//! under a limit per session.

use super::ring_state::RingState;
use super::{End, Session, RING};
use crate::engines::Engines;
use crate::resources::{Buffer, Memory, RegisteredFile};
use log::{debug, info};
use rustix::io::Errno;
use std::collections::BTreeMap;
use std::fs::File;
use std::os::fd::AsRawFd;
use zerohop_wire::control::{self, Reply, Request};
use zerohop_wire::ring::{self, Ring, RingCorrupt};
use zerohop_wire::shm::SharedMemory;

/// Limits per session.
const MAX_FILES: usize = 4096;
const MAX_BUFFERS: usize = 4096;
const MAX_RINGS: usize = 64;

/// A registration's id, or the errno and message to refuse it with.
type Outcome = Result<Option<u32>, (Errno, String)>;

impl Session {
    /// Receives one control message and replies; how the session ends, if
    /// it does.
    pub(super) fn answer_one(&mut self) -> Option<End> {
        match control::recv(&self.socket) {
            Ok(None) => Some(End::Goodbye),
            Ok(Some((bytes, fds))) => {
                let reply = self.handle(&bytes, fds);
                // Never blocks: a client that stops reading its replies
                // loses its session instead.
                control::send_nowait(&self.socket, &control::encode(&reply))
                    .err()
                    .map(|e| End::Broken(format!("cannot reply: {e}")))
            }
            Err(e) => Some(End::Broken(format!("control message refused: {e}"))),
        }
    }

    fn handle(&mut self, bytes: &[u8], fds: Vec<File>) -> Reply {
        let request = match control::decode_request(bytes) {
            Ok(r) => r,
            Err(e) => return error(Errno::INVAL, e),
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
                Errno::INVAL,
                format!("expected {expected_fds} descriptor(s), got {}", fds.len()),
            );
        }
        let mut fds = fds.into_iter();
        let outcome = match request {
            Request::Hello { version, .. } if version != zerohop_wire::PROTOCOL_VERSION => Err((
                Errno::PROTO,
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
            _ if !self.greeted => Err((Errno::PROTO, "say hello first".to_string())),
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
                None => Err((Errno::INVAL, "malformed IPC handle".to_string())),
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
                Errno::MFILE,
                format!("at most {MAX_FILES} files per session"),
            ));
        }
        if !self.shared.served.is_empty() {
            // The path the kernel keeps for the open file: where it was
            // opened, with symbolic links resolved.
            let path = std::fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd()));
            if !path.is_ok_and(|p| self.shared.serves(&p)) {
                return Err((
                    Errno::ACCESS,
                    "the file is not under a directory this agent serves".to_string(),
                ));
            }
        }
        let id = self.take_id();
        let label = format!("client {} file {id}", self.pid);
        let f = RegisteredFile::new(file, label).map_err(refused)?;
        self.files.insert(id, f);
        Ok(Some(id))
    }

    fn add_buffer(&mut self, make: impl FnOnce(&Engines) -> zerohop::Result<Buffer>) -> Outcome {
        if self.buffers.len() >= MAX_BUFFERS {
            return Err((
                Errno::MFILE,
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
                Errno::MFILE,
                format!("at most {MAX_RINGS} rings per session"),
            ));
        }
        if !ring::valid_entries(entries) {
            return Err((
                Errno::INVAL,
                format!(
                    "{entries} entries: a power of two up to {} is needed",
                    ring::MAX_ENTRIES
                ),
            ));
        }
        if !is_eventfd(&submitted) {
            return Err((Errno::INVAL, "the ring's wake-up must be an eventfd".into()));
        }
        let mem = SharedMemory::import(memfd, ring::ring_bytes(entries))
            .map_err(|e| (Errno::INVAL, e.to_string()))?;
        let ring = Ring::attach(mem, entries).map_err(|RingCorrupt(why)| (Errno::INVAL, why))?;
        if let Some(w) = &self.wakeups {
            w.watch(&submitted, RING, true).map_err(|e| {
                (
                    Errno::INVAL,
                    format!("cannot watch the ring's eventfd: {e}"),
                )
            })?;
        }
        let id = self.take_id();
        self.rings.insert(id, RingState::new(ring, submitted));
        Ok(Some(id))
    }
}

fn error(code: Errno, message: impl Into<String>) -> Reply {
    Reply::Error {
        code: code.raw_os_error(),
        message: message.into(),
    }
}

fn refused(e: zerohop::Error) -> (Errno, String) {
    (Errno::INVAL, e.to_string())
}

fn remove<T>(map: &mut BTreeMap<u32, T>, id: u32) -> Outcome {
    map.remove(&id)
        .map(|_| None)
        .ok_or((Errno::BADF, format!("no registration {id}")))
}

fn is_eventfd(f: &File) -> bool {
    std::fs::read_link(format!("/proc/self/fd/{}", f.as_raw_fd()))
        .is_ok_and(|p| p.to_string_lossy() == "anon_inode:[eventfd]")
}

//! One client's session: what it registered, and the loop that serves its
//! control messages ([`control`]) and its rings ([`rings`]). Everything the
//! client sends is checked; a broken rule in a ring ends this session only.
//! Whatever way the session ends (goodbye, crash of the client, corrupt
//! ring, agent shutdown), dropping it releases everything the client
//! registered.

mod control;
mod ring_state;
mod rings;

use crate::resources::{Buffer, Memory, RegisteredFile};
use crate::shared::Shared;
use crate::wakeups::Wakeups;
use log::{debug, info, warn};
use ring_state::RingState;
use std::collections::BTreeMap;
use std::os::fd::OwnedFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use zerohop_wire::control::ClientStatus;
use zerohop_wire::ring::RingCorrupt;
use zerohop_wire::socket;

/// What woke a session.
const SOCKET: u64 = 0;
const STOP: u64 = 1;
const RING: u64 = 2;

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
            let timeout = if self.completions_waiting() || stopping {
                Duration::from_millis(1)
            } else {
                Duration::from_secs(1)
            };
            let ready = match self.wakeups.as_ref().expect("set above").wait(timeout) {
                Ok(r) => r,
                Err(e) => return End::Broken(format!("epoll failed: {e}")),
            };
            if ready.contains(&SOCKET) {
                if let Some(end) = self.answer_one() {
                    return end;
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

    /// Publishes this session's registrations and counters in the status.
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

/// Removes a session from the status when dropped.
struct Listed(u64, Arc<Shared>);

impl Drop for Listed {
    fn drop(&mut self) {
        self.1.remove_client(self.0);
    }
}

//! State every session thread shares: the engines, the shutdown signal, and
//! the counters `zerohop agent status` shows.

use crate::engines::Engines;
use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use zerohop_wire::control::{AgentStatus, ClientStatus};

pub struct Shared {
    pub engines: Engines,
    /// Canonical directories whose files clients may register (empty: any).
    pub served: Vec<PathBuf>,
    /// Becomes readable (and stays so) when the agent is asked to stop.
    pub shutdown: File,
    pub stopping: AtomicBool,
    pub sessions_total: AtomicU64,
    pub bytes_read: AtomicU64,
    pub bytes_written: AtomicU64,
    pub ios: AtomicU64,
    pub errors: AtomicU64,
    clients: Mutex<BTreeMap<u64, ClientStatus>>,
}

impl Shared {
    pub fn new(engines: Engines, served: Vec<PathBuf>) -> std::io::Result<Self> {
        Ok(Shared {
            engines,
            served,
            shutdown: zerohop_wire::socket::eventfd()?,
            stopping: AtomicBool::new(false),
            sessions_total: AtomicU64::new(0),
            bytes_read: AtomicU64::new(0),
            bytes_written: AtomicU64::new(0),
            ios: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            clients: Mutex::default(),
        })
    }

    /// Whether a file at `path` (canonical, as the kernel names an open
    /// file) may be registered.
    pub fn serves(&self, path: &Path) -> bool {
        self.served.is_empty() || self.served.iter().any(|d| path.starts_with(d))
    }

    pub fn stop(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        zerohop_wire::socket::signal(&self.shutdown);
    }

    pub fn update_client(&self, status: ClientStatus) {
        self.clients
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(status.session, status);
    }

    pub fn remove_client(&self, session: u64) {
        self.clients
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&session);
    }

    pub fn status(&self) -> AgentStatus {
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        AgentStatus {
            pid: std::process::id(),
            device: self.engines.describe(),
            served: self
                .served
                .iter()
                .map(|d| d.display().to_string())
                .collect(),
            clients: self
                .clients
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .values()
                .cloned()
                .collect(),
            sessions_total: load(&self.sessions_total),
            bytes_read: load(&self.bytes_read),
            bytes_written: load(&self.bytes_written),
            ios: load(&self.ios),
            errors: load(&self.errors),
        }
    }
}

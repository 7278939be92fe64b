//! What a session thread sleeps on: its client's socket, the agent's stop
//! signal, and its rings' submission eventfds. The eventfds are watched
//! edge-triggered and never read: they belong to the client, who could make
//! a read or write on them block.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

pub struct Wakeups {
    epoll: OwnedFd,
}

impl Wakeups {
    pub fn new() -> io::Result<Self> {
        // SAFETY: plain epoll creation; the descriptor is owned below.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh descriptor nobody else owns.
        Ok(Wakeups {
            epoll: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    /// Watches `fd` for input, reporting `token`; `edge`: once per new
    /// write rather than while readable.
    pub fn watch(&self, fd: &impl AsRawFd, token: u64, edge: bool) -> io::Result<()> {
        let mut ev = libc::epoll_event {
            events: (libc::EPOLLIN | if edge { libc::EPOLLET } else { 0 }) as u32,
            u64: token,
        };
        // SAFETY: registers a descriptor we hold; `ev` is a valid event.
        let rc = unsafe {
            libc::epoll_ctl(
                self.epoll.as_raw_fd(),
                libc::EPOLL_CTL_ADD,
                fd.as_raw_fd(),
                &mut ev,
            )
        };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// The tokens of what became ready within `timeout_ms`.
    pub fn wait(&self, timeout_ms: i32) -> io::Result<Vec<u64>> {
        let mut events = [libc::epoll_event { events: 0, u64: 0 }; 32];
        // SAFETY: `events` is a live array of its length.
        let n = unsafe {
            libc::epoll_wait(
                self.epoll.as_raw_fd(),
                events.as_mut_ptr(),
                events.len() as i32,
                timeout_ms,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            return if e.kind() == io::ErrorKind::Interrupted {
                Ok(Vec::new())
            } else {
                Err(e)
            };
        }
        Ok(events[..n as usize].iter().map(|e| e.u64).collect())
    }
}

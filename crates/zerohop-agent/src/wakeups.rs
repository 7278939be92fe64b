//! What a session thread sleeps on: its client's socket, the agent's stop
//! signal, and its rings' submission eventfds. The eventfds are watched
//! edge-triggered and never read: they belong to the client, who could make
//! a read or write on them block.

use rustix::event::epoll::{self, CreateFlags, Event, EventData, EventFlags};
use rustix::io::Errno;
use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, OwnedFd};
use std::time::Duration;

pub struct Wakeups {
    epoll: OwnedFd,
}

impl Wakeups {
    pub fn new() -> io::Result<Self> {
        Ok(Wakeups {
            epoll: epoll::create(CreateFlags::CLOEXEC)?,
        })
    }

    /// Watches `fd` for input, reporting `token`; `edge`: once per new
    /// write rather than while readable.
    pub fn watch(&self, fd: &impl AsFd, token: u64, edge: bool) -> io::Result<()> {
        let mut flags = EventFlags::IN;
        if edge {
            flags |= EventFlags::ET;
        }
        Ok(epoll::add(
            &self.epoll,
            fd,
            EventData::new_u64(token),
            flags,
        )?)
    }

    /// The tokens of what became ready within `timeout`.
    pub fn wait(&self, timeout: Duration) -> io::Result<Vec<u64>> {
        let mut events = [MaybeUninit::<Event>::uninit(); 32];
        let timeout = zerohop_wire::socket::timespec(timeout);
        match epoll::wait(&self.epoll, &mut events, Some(&timeout)) {
            Ok((ready, _)) => Ok(ready.iter().map(|e| e.data.u64()).collect()),
            Err(Errno::INTR) => Ok(Vec::new()),
            Err(e) => Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edge_triggered_watches_report_each_new_write_once() {
        let w = Wakeups::new().unwrap();
        let (level, edge) = (
            zerohop_wire::socket::eventfd().unwrap(),
            zerohop_wire::socket::eventfd().unwrap(),
        );
        w.watch(&level, 1, false).unwrap();
        w.watch(&edge, 2, true).unwrap();
        assert!(w.wait(Duration::ZERO).unwrap().is_empty());
        zerohop_wire::socket::signal(&level);
        zerohop_wire::socket::signal(&edge);
        let mut first = w.wait(Duration::from_secs(5)).unwrap();
        first.sort();
        assert_eq!(first, [1, 2]);
        // Neither was read: the level watch fires again, the edge one not.
        assert_eq!(w.wait(Duration::ZERO).unwrap(), [1]);
        zerohop_wire::socket::signal(&edge);
        let again = w.wait(Duration::ZERO).unwrap();
        assert!(again.contains(&2));
    }
}

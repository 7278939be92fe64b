//! The agent's Unix socket: `SOCK_SEQPACKET`, so each control message is one
//! datagram and a closed peer reads as end of file.

use rustix::event::{eventfd as new_eventfd, poll, EventfdFlags, PollFd, PollFlags, Timespec};
use rustix::fs::Mode;
use rustix::net::{self, AddressFamily, SocketAddrUnix, SocketFlags, SocketType};
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::Path;
use std::time::Duration;

/// Where the agent listens unless told otherwise:
/// `$XDG_RUNTIME_DIR/zerohop.sock`, else `/tmp/zerohop-UID.sock`.
pub fn default_path() -> std::path::PathBuf {
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(dir) if !dir.is_empty() => Path::new(&dir).join("zerohop.sock"),
        _ => format!("/tmp/zerohop-{}.sock", rustix::process::getuid().as_raw()).into(),
    }
}

/// The longest socket path (`sun_path` less its NUL).
const MAX_PATH_BYTES: usize = 107;

fn address(path: &Path) -> io::Result<SocketAddrUnix> {
    use std::os::unix::ffi::OsStrExt;
    let bytes = path.as_os_str().as_bytes();
    if bytes.len() > MAX_PATH_BYTES || bytes.contains(&0) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "socket path {} is too long or has a NUL byte",
                path.display()
            ),
        ));
    }
    Ok(SocketAddrUnix::new(path)?)
}

fn seqpacket() -> io::Result<OwnedFd> {
    Ok(net::socket_with(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC,
        None,
    )?)
}

/// Binds and listens at `path` with permission bits `mode` (0o600: owner
/// only; 0o660: the group too), set by the umask at bind time so the socket
/// is never reachable with wider ones.
pub fn listen(path: &Path, mode: u32) -> io::Result<OwnedFd> {
    let addr = address(path)?;
    let fd = seqpacket()?;
    // The umask is process-wide: it is restored right after bind, and the
    // agent binds before starting threads.
    let old = rustix::process::umask(Mode::from_bits_truncate(!mode & 0o777));
    let bound = net::bind(&fd, &addr);
    rustix::process::umask(old);
    bound?;
    net::listen(&fd, 128)?;
    Ok(fd)
}

/// Accepts one connection.
pub fn accept(listener: &OwnedFd) -> io::Result<OwnedFd> {
    Ok(net::accept_with(listener, SocketFlags::CLOEXEC)?)
}

/// Connects to the agent at `path`.
pub fn connect(path: &Path) -> io::Result<OwnedFd> {
    let addr = address(path)?;
    let fd = seqpacket()?;
    net::connect(&fd, &addr)?;
    Ok(fd)
}

/// The peer's process and user ids (`SO_PEERCRED`). The pid is 0 when the
/// peer lives in a pid namespace this process cannot see (a client in a
/// container talking through a bind-mounted socket).
pub fn peer(socket: &impl AsFd) -> Option<(u32, u32)> {
    // Read by hand: rustix's `socket_peercred` puts the pid in a non-zero
    // `Pid`, and the kernel's 0 for an invisible peer would be undefined
    // behaviour there.
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` is a writable `ucred` of `len` bytes that outlives the
    // call; the kernel writes at most `len` bytes and updates `len`.
    let rc = unsafe {
        libc::getsockopt(
            socket.as_fd().as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if rc != 0 || len as usize != std::mem::size_of::<libc::ucred>() {
        return None;
    }
    Some((cred.pid as u32, cred.uid))
}

/// A new eventfd (a ring's submission wake-up).
pub fn eventfd() -> io::Result<std::fs::File> {
    let fd = new_eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)?;
    Ok(fd.into())
}

/// Adds one to an eventfd's counter (wakes its poller).
pub fn signal(efd: &impl AsFd) {
    // A full counter (EAGAIN) already means "woken".
    let _ = rustix::io::write(efd, &1u64.to_ne_bytes());
}

/// Waits until one of `fds` is readable or `timeout` passes (`None`: no
/// limit); returns which are readable.
pub fn wait_readable(fds: &[&dyn AsFd], timeout: Option<Duration>) -> io::Result<Vec<bool>> {
    let mut polls: Vec<PollFd<'_>> = fds
        .iter()
        .map(|f| PollFd::from_borrowed_fd(f.as_fd(), PollFlags::IN))
        .collect();
    let timeout = timeout.map(timespec);
    match poll(&mut polls, timeout.as_ref()) {
        Ok(_) => Ok(polls.iter().map(|p| !p.revents().is_empty()).collect()),
        Err(rustix::io::Errno::INTR) => Ok(vec![false; fds.len()]),
        Err(e) => Err(e.into()),
    }
}

/// Whether the peer of `socket` hung up (checked without waiting).
pub fn hung_up(socket: &impl AsFd) -> bool {
    let mut p = [PollFd::new(socket, PollFlags::RDHUP)];
    let hangup = PollFlags::RDHUP | PollFlags::HUP | PollFlags::ERR;
    matches!(poll(&mut p, Some(&Timespec::default())), Ok(n) if n > 0)
        && p[0].revents().intersects(hangup)
}

/// A duration as a kernel timeout (one too long to express waits "forever").
pub fn timespec(d: Duration) -> Timespec {
    Timespec::try_from(d).unwrap_or(Timespec {
        tv_sec: i64::MAX,
        tv_nsec: 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_connect_accept_and_peer() {
        let dir = std::env::temp_dir().join(format!("zerohop-wire-sock-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("s");
        let listener = listen(&path, 0o600).unwrap();
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let client = connect(&path).unwrap();
        let ready = wait_readable(&[&listener], Some(Duration::from_secs(5))).unwrap();
        assert_eq!(ready, vec![true]);
        let server = accept(&listener).unwrap();
        let me = rustix::process::getuid().as_raw();
        assert_eq!(peer(&server), Some((std::process::id(), me)));
        assert!(!hung_up(&server));
        drop(client);
        assert!(hung_up(&server));
        let long = dir.join("x".repeat(200));
        assert_eq!(
            connect(&long).unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn an_eventfd_signal_makes_it_readable() {
        let efd = eventfd().unwrap();
        let idle = wait_readable(&[&efd], Some(Duration::ZERO)).unwrap();
        assert_eq!(idle, vec![false]);
        signal(&efd);
        assert_eq!(wait_readable(&[&efd], None).unwrap(), vec![true]);
    }
}

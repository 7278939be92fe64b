//! The agent's Unix socket: `SOCK_SEQPACKET`, so each control message is one
//! datagram and a closed peer reads as end of file.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;

/// Where the agent listens unless told otherwise:
/// `$XDG_RUNTIME_DIR/zerohop.sock`, else `/tmp/zerohop-UID.sock`.
pub fn default_path() -> std::path::PathBuf {
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(dir) if !dir.is_empty() => Path::new(&dir).join("zerohop.sock"),
        // SAFETY: getuid cannot fail.
        _ => format!("/tmp/zerohop-{}.sock", unsafe { libc::getuid() }).into(),
    }
}

fn address(path: &Path) -> io::Result<(libc::sockaddr_un, libc::socklen_t)> {
    use std::os::unix::ffi::OsStrExt;
    // SAFETY: a zeroed sockaddr_un is valid.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = path.as_os_str().as_bytes();
    if bytes.len() >= addr.sun_path.len() || bytes.contains(&0) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "socket path {} is too long or has a NUL byte",
                path.display()
            ),
        ));
    }
    for (d, s) in addr.sun_path.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    let len = std::mem::size_of::<libc::sa_family_t>() + bytes.len() + 1;
    Ok((addr, len as libc::socklen_t))
}

fn seqpacket() -> io::Result<OwnedFd> {
    // SAFETY: plain socket creation; the descriptor is owned below.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Binds and listens at `path` with permission bits `mode` (0o600: owner
/// only; 0o660: the group too), set by the umask at bind time so the socket
/// is never reachable with wider ones.
pub fn listen(path: &Path, mode: u32) -> io::Result<OwnedFd> {
    let (addr, len) = address(path)?;
    let fd = seqpacket()?;
    // SAFETY: umask only changes this process's file-creation mask; it is
    // restored right after bind (the agent binds before starting threads).
    let old = unsafe { libc::umask(!mode & 0o777) };
    // SAFETY: `addr` is a valid sockaddr_un of `len` bytes.
    let rc = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&addr as *const libc::sockaddr_un).cast(),
            len,
        )
    };
    // SAFETY: as above.
    unsafe { libc::umask(old) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: listen on a bound socket we own.
    if unsafe { libc::listen(fd.as_raw_fd(), 128) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

/// Accepts one connection.
pub fn accept(listener: &OwnedFd) -> io::Result<OwnedFd> {
    // SAFETY: accept4 with no address out-parameters.
    let fd = unsafe {
        libc::accept4(
            listener.as_raw_fd(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            libc::SOCK_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Connects to the agent at `path`.
pub fn connect(path: &Path) -> io::Result<OwnedFd> {
    let (addr, len) = address(path)?;
    let fd = seqpacket()?;
    // SAFETY: `addr` is a valid sockaddr_un of `len` bytes.
    let rc = unsafe {
        libc::connect(
            fd.as_raw_fd(),
            (&addr as *const libc::sockaddr_un).cast(),
            len,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

/// The peer's process and user ids (`SO_PEERCRED`).
pub fn peer(socket: &OwnedFd) -> Option<(u32, u32)> {
    // SAFETY: a zeroed ucred is valid; getsockopt writes at most its size.
    let mut cred: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: as above.
    let rc = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    (rc == 0).then_some((cred.pid as u32, cred.uid))
}

/// A new eventfd (a ring's submission wake-up).
pub fn eventfd() -> io::Result<std::fs::File> {
    // SAFETY: plain eventfd creation; the descriptor is owned below.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor nobody else owns.
    Ok(unsafe { std::fs::File::from_raw_fd(fd) })
}

/// Adds one to an eventfd's counter (wakes its poller).
pub fn signal(efd: &impl AsRawFd) {
    let one = 1u64.to_ne_bytes();
    // SAFETY: writes 8 bytes from a live buffer. A full counter (EAGAIN)
    // already means "woken".
    unsafe { libc::write(efd.as_raw_fd(), one.as_ptr().cast(), 8) };
}

/// Waits until one of `fds` is readable or `timeout_ms` passes (-1: no
/// limit); returns which are readable.
pub fn wait_readable(fds: &[&dyn AsRawFd], timeout_ms: i32) -> io::Result<Vec<bool>> {
    let mut polls: Vec<libc::pollfd> = fds
        .iter()
        .map(|f| libc::pollfd {
            fd: f.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    // SAFETY: `polls` is a live array of its length.
    let rc = unsafe { libc::poll(polls.as_mut_ptr(), polls.len() as libc::nfds_t, timeout_ms) };
    if rc < 0 {
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::Interrupted {
            return Ok(vec![false; fds.len()]);
        }
        return Err(e);
    }
    Ok(polls.iter().map(|p| p.revents != 0).collect())
}

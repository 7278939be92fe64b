//! Control messages on the agent's socket (`SOCK_SEQPACKET`: one datagram per
//! message, descriptors attached with `SCM_RIGHTS`). Each message is JSON of
//! at most [`MAX_MESSAGE_BYTES`] with at most [`MAX_FDS`] descriptors.

use serde::{Deserialize, Serialize};
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, RawFd};

pub const MAX_MESSAGE_BYTES: usize = 64 << 10;
pub const MAX_FDS: usize = 4;

/// What a client asks. Descriptors travel with the message that needs them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    /// First message of a session.
    Hello {
        version: u32,
        pid: u32,
    },
    /// One descriptor: a file the client opened itself.
    RegisterFile,
    DeregisterFile {
        id: u32,
    },
    /// One descriptor: a sealed memfd of at least `len` bytes.
    RegisterHostBuffer {
        len: u64,
    },
    /// GPU memory of the client: the IPC handle (128 hex digits) of the
    /// allocation holding the buffer, and the buffer's offset and length in
    /// that allocation.
    RegisterCudaIpc {
        device: u32,
        handle: String,
        offset: u64,
        len: u64,
    },
    /// One descriptor: a VMM allocation (`cuMemCreate`, exported as a POSIX
    /// file descriptor) of `allocation_len` bytes; the buffer is `len` bytes
    /// at `offset` in it.
    RegisterCudaVmm {
        device: u32,
        allocation_len: u64,
        offset: u64,
        len: u64,
    },
    /// One descriptor: a sealed memfd standing in for GPU memory on the
    /// agent's simulated device (tests without a GPU).
    RegisterSimulatedDeviceBuffer {
        len: u64,
    },
    DeregisterBuffer {
        id: u32,
    },
    /// Two descriptors: the ring's sealed memfd, and the eventfd the client
    /// writes after submitting (completions wake the client by futex).
    RegisterRing {
        entries: u32,
    },
    DeregisterRing {
        id: u32,
    },
    /// The agent's counters (any client may ask).
    Status,
}

/// The agent's answer to one request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Reply {
    Ok { id: Option<u32> },
    Status(AgentStatus),
    Error { code: i32, message: String },
}

/// What `zerohop agent status` shows.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentStatus {
    pub pid: u32,
    pub device: String,
    pub clients: Vec<ClientStatus>,
    pub sessions_total: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
    pub ios: u64,
    pub errors: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientStatus {
    pub session: u64,
    pub pid: u32,
    pub files: usize,
    pub host_buffers: usize,
    pub device_buffers: usize,
    pub rings: usize,
    pub bytes: u64,
    pub ios: u64,
    pub errors: u64,
}

/// Decodes a request from untrusted bytes.
pub fn decode_request(bytes: &[u8]) -> Result<Request, String> {
    if bytes.len() > MAX_MESSAGE_BYTES {
        return Err(format!(
            "message of {} bytes is over the limit",
            bytes.len()
        ));
    }
    serde_json::from_slice(bytes).map_err(|e| format!("malformed request: {e}"))
}

pub fn decode_reply(bytes: &[u8]) -> Result<Reply, String> {
    serde_json::from_slice(bytes).map_err(|e| format!("malformed reply: {e}"))
}

pub fn encode<T: Serialize>(message: &T) -> Vec<u8> {
    serde_json::to_vec(message).expect("control messages serialize")
}

/// Hex digits of an IPC handle, and back.
pub fn handle_to_hex(handle: &[u8; 64]) -> String {
    handle.iter().map(|b| format!("{b:02x}")).collect()
}

pub fn handle_from_hex(hex: &str) -> Option<[u8; 64]> {
    if hex.len() != 128 || !hex.is_ascii() {
        return None;
    }
    let mut out = [0u8; 64];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

/// Sends one message with `fds` attached.
pub fn send(socket: &impl AsRawFd, bytes: &[u8], fds: &[RawFd]) -> io::Result<()> {
    send_flags(socket, bytes, fds, 0)
}

/// Sends one message without waiting: `WouldBlock` when the peer's queue
/// is full (the agent's replies: a client that stops reading cannot stall
/// its session thread).
pub fn send_nowait(socket: &impl AsRawFd, bytes: &[u8]) -> io::Result<()> {
    send_flags(socket, bytes, &[], libc::MSG_DONTWAIT)
}

fn send_flags(socket: &impl AsRawFd, bytes: &[u8], fds: &[RawFd], flags: i32) -> io::Result<()> {
    assert!(fds.len() <= MAX_FDS);
    let mut iov = libc::iovec {
        iov_base: bytes.as_ptr() as *mut _,
        iov_len: bytes.len(),
    };
    let mut control = [0u64; 8]; // room for MAX_FDS descriptors, aligned
                                 // SAFETY: a zeroed msghdr is a valid empty one.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if !fds.is_empty() {
        let payload = std::mem::size_of_val(fds) as u32;
        // SAFETY: CMSG_SPACE is a pure size computation.
        msg.msg_controllen = unsafe { libc::CMSG_SPACE(payload) } as usize;
        msg.msg_control = control.as_mut_ptr().cast();
        // SAFETY: the control buffer holds CMSG_SPACE(payload) bytes (64 is
        // more than CMSG_SPACE of four descriptors), so the first header
        // and its data fit.
        unsafe {
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = libc::CMSG_LEN(payload) as usize;
            std::ptr::copy_nonoverlapping(fds.as_ptr(), libc::CMSG_DATA(cmsg).cast(), fds.len());
        }
    }
    loop {
        // SAFETY: `msg` points at live buffers for the duration of the call.
        let n = unsafe { libc::sendmsg(socket.as_raw_fd(), &msg, libc::MSG_NOSIGNAL | flags) };
        if n >= 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Receives one message and the descriptors attached to it (owned: closed
/// when dropped). `Ok(None)` when the peer closed the connection. A message
/// cut short, or with too many descriptors, is an error (its descriptors
/// are closed).
pub fn recv(socket: &impl AsRawFd) -> io::Result<Option<(Vec<u8>, Vec<File>)>> {
    let mut buf = vec![0u8; MAX_MESSAGE_BYTES];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let mut control = [0u64; 8];
    // SAFETY: a zeroed msghdr is a valid empty one.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&control);
    let n = loop {
        // SAFETY: `msg` points at live buffers for the duration of the call;
        // received descriptors are close-on-exec.
        let n = unsafe { libc::recvmsg(socket.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if n >= 0 {
            break n;
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    };
    let mut files = Vec::new();
    // SAFETY: walks the control messages the kernel wrote into `control`,
    // taking ownership of each received descriptor exactly once.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(cmsg) as *const RawFd;
                let count =
                    ((*cmsg).cmsg_len - libc::CMSG_LEN(0) as usize) / std::mem::size_of::<RawFd>();
                for i in 0..count {
                    files.push(File::from_raw_fd(data.add(i).read_unaligned()));
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
    }
    if n == 0 && files.is_empty() {
        return Ok(None);
    }
    if msg.msg_flags & (libc::MSG_TRUNC | libc::MSG_CTRUNC) != 0 || files.len() > MAX_FDS {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "message or descriptors cut short (over the limits)",
        ));
    }
    buf.truncate(n as usize);
    Ok(Some((buf, files)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Seek, Write};
    use std::os::unix::net::UnixDatagram;

    #[test]
    fn requests_round_trip_and_garbage_is_refused() {
        let reqs = [
            Request::Hello { version: 1, pid: 3 },
            Request::RegisterCudaIpc {
                device: 0,
                handle: "ab".repeat(64),
                offset: 512,
                len: 4096,
            },
            Request::RegisterRing { entries: 64 },
            Request::Status,
        ];
        for r in reqs {
            assert_eq!(decode_request(&encode(&r)).unwrap(), r);
        }
        assert!(decode_request(b"{\"register_ring\":{\"entries\":1,\"x\":2}}").is_err());
        assert!(decode_request(b"\xff\x00").is_err());
        assert!(decode_request(&vec![b' '; MAX_MESSAGE_BYTES + 1]).is_err());
        let h = [7u8; 64];
        assert_eq!(handle_from_hex(&handle_to_hex(&h)), Some(h));
        assert_eq!(handle_from_hex("zz"), None);
        assert_eq!(handle_from_hex(&"é".repeat(64)), None);
    }

    #[test]
    fn descriptors_travel_with_messages() {
        let (a, b) = UnixDatagram::pair().unwrap();
        let mut f = tempfile();
        f.write_all(b"shared").unwrap();
        send(&a, b"hello", &[f.as_raw_fd(), f.as_raw_fd()]).unwrap();
        let (bytes, mut files) = recv(&b).unwrap().unwrap();
        assert_eq!(bytes, b"hello");
        assert_eq!(files.len(), 2);
        let mut s = String::new();
        files[0].rewind().unwrap();
        files[0].read_to_string(&mut s).unwrap();
        assert_eq!(s, "shared");
        send(&a, b"plain", &[]).unwrap();
        assert_eq!(recv(&b).unwrap().unwrap().1.len(), 0);
    }

    fn tempfile() -> File {
        let path = std::env::temp_dir().join(format!("zerohop-wire-{}", std::process::id()));
        let f = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        std::fs::remove_file(&path).unwrap();
        f
    }
}

//! Control messages on the agent's socket (`SOCK_SEQPACKET`: one datagram per
//! message, descriptors attached with `SCM_RIGHTS`). Each message is JSON of
//! at most [`MAX_MESSAGE_BYTES`] with at most [`MAX_FDS`] descriptors.

use rustix::io::Errno;
use rustix::net::{
    self, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};
use serde::{Deserialize, Serialize};
use std::fs::File;
use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd};

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
    /// The directories the agent serves (canonical paths), where files
    /// are registered only from under them; empty: any file.
    #[serde(default)]
    pub served: Vec<String>,
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
    decode_limited(bytes, "request")
}

/// Decodes a message of at most [`MAX_MESSAGE_BYTES`] (`what` names it in
/// the error).
pub(crate) fn decode_limited<T: serde::de::DeserializeOwned>(
    bytes: &[u8],
    what: &str,
) -> Result<T, String> {
    if bytes.len() > MAX_MESSAGE_BYTES {
        return Err(format!(
            "message of {} bytes is over the limit",
            bytes.len()
        ));
    }
    serde_json::from_slice(bytes).map_err(|e| format!("malformed {what}: {e}"))
}

pub fn decode_reply(bytes: &[u8]) -> Result<Reply, String> {
    serde_json::from_slice(bytes).map_err(|e| format!("malformed reply: {e}"))
}

pub fn encode<T: Serialize>(message: &T) -> Vec<u8> {
    serde_json::to_vec(message).expect("control messages serialize")
}

/// Hex digits of an IPC handle, and back.
pub fn handle_to_hex(handle: &[u8]) -> String {
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
pub fn send(socket: &impl AsFd, bytes: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    send_flags(socket, bytes, fds, SendFlags::empty())
}

/// Sends one message without waiting: `WouldBlock` when the peer's queue
/// is full (the agent's replies: a client that stops reading cannot stall
/// its session thread).
pub fn send_nowait(socket: &impl AsFd, bytes: &[u8]) -> io::Result<()> {
    send_flags(socket, bytes, &[], SendFlags::DONTWAIT)
}

fn send_flags(
    socket: &impl AsFd,
    bytes: &[u8],
    fds: &[BorrowedFd<'_>],
    flags: SendFlags,
) -> io::Result<()> {
    if fds.len() > MAX_FDS {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} descriptors: at most {MAX_FDS} per message", fds.len()),
        ));
    }
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() {
        // The buffer is sized for MAX_FDS, checked above; should that ever
        // change, fail rather than send the message without its descriptors.
        if !control.push(SendAncillaryMessage::ScmRights(fds)) {
            return Err(io::Error::other(format!(
                "no room to attach {} descriptors to the message",
                fds.len()
            )));
        }
    }
    let iov = [IoSlice::new(bytes)];
    loop {
        match net::sendmsg(socket, &iov, &mut control, SendFlags::NOSIGNAL | flags) {
            Ok(_) => return Ok(()),
            Err(Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// Receives one message and the descriptors attached to it (owned: closed
/// when dropped). `Ok(None)` when the peer closed the connection. A message
/// cut short, or with too many descriptors, is an error (its descriptors
/// are closed).
pub fn recv(socket: &impl AsFd) -> io::Result<Option<(Vec<u8>, Vec<File>)>> {
    let mut buf = vec![0u8; MAX_MESSAGE_BYTES];
    // Room for one descriptor more than allowed, so that too many arrive
    // (and are refused by count) rather than being cut off silently.
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS + 1))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let received = loop {
        let mut iov = [IoSliceMut::new(&mut buf)];
        match net::recvmsg(socket, &mut iov, &mut control, RecvFlags::CMSG_CLOEXEC) {
            Ok(r) => break r,
            Err(Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    };
    let mut files = Vec::new();
    for message in control.drain() {
        if let RecvAncillaryMessage::ScmRights(fds) = message {
            files.extend(fds.map(File::from));
        }
    }
    if received.bytes == 0 && files.is_empty() {
        return Ok(None);
    }
    let cut = ReturnFlags::TRUNC | ReturnFlags::CTRUNC;
    if received.flags.intersects(cut) || files.len() > MAX_FDS {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "message or descriptors cut short (over the limits)",
        ));
    }
    buf.truncate(received.bytes);
    Ok(Some((buf, files)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Seek, Write};
    use std::os::fd::AsFd;
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
        send(&a, b"hello", &[f.as_fd(), f.as_fd()]).unwrap();
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

    #[test]
    fn too_many_descriptors_are_refused_on_both_ends() {
        let (a, b) = UnixDatagram::pair().unwrap();
        let f = tempfile();
        let five = [f.as_fd(); MAX_FDS + 1];
        let sent = send(&a, b"x", &five).unwrap_err();
        assert_eq!(sent.kind(), io::ErrorKind::InvalidInput);
        // A peer that does not use `send` can still attach them.
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS + 1))];
        let mut control = SendAncillaryBuffer::new(&mut space);
        assert!(control.push(SendAncillaryMessage::ScmRights(&five)));
        net::sendmsg(&a, &[IoSlice::new(b"x")], &mut control, SendFlags::empty()).unwrap();
        let got = recv(&b).unwrap_err();
        assert_eq!(got.kind(), io::ErrorKind::InvalidData);
        // The session goes on.
        send(&a, b"next", &[]).unwrap();
        assert_eq!(recv(&b).unwrap().unwrap().0, b"next");
    }

    /// A fresh unlinked file; tests run on threads at once, so each call
    /// makes a name of its own.
    fn tempfile() -> File {
        static MADE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("zerohop-wire-{}-{n}", std::process::id()));
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

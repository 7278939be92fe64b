//! Device memory as transfers name it: an address range of one device
//! ([`DeviceBuffer`]), owned or borrowed from a framework.

use crate::{Error, Result};
use std::any::Any;
use std::fmt;
use std::sync::Arc;

/// An address in a device's memory space.
pub type DeviceAddr = u64;

/// Which device a [`DeviceBuffer`] or transfer belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DeviceKind {
    /// A CUDA GPU by ordinal.
    Cuda(usize),
    /// Host memory standing in for a GPU (the host device, or the
    /// simulated one).
    Host,
}

impl fmt::Display for DeviceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceKind::Cuda(n) => write!(f, "cuda:{n}"),
            DeviceKind::Host => f.write_str("host"),
        }
    }
}

/// A range of device memory: owned (freed when the last clone drops) or
/// borrowed from a framework by pointer and length, optionally with the
/// framework's stream that orders work on it.
#[derive(Clone)]
pub struct DeviceBuffer {
    addr: DeviceAddr,
    len: usize,
    device: DeviceKind,
    owner: Option<Arc<dyn Any + Send + Sync>>,
    /// The owner's stream: transfers wait for work queued on it first.
    stream: Option<u64>,
}

impl fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceBuffer")
            .field("addr", &format_args!("{:#x}", self.addr))
            .field("len", &self.len)
            .field("device", &self.device)
            .field("owned", &self.owner.is_some())
            .field("stream", &self.stream)
            .finish()
    }
}

impl DeviceBuffer {
    pub(crate) fn owned(
        addr: DeviceAddr,
        len: usize,
        device: DeviceKind,
        owner: Arc<dyn Any + Send + Sync>,
    ) -> Self {
        DeviceBuffer {
            addr,
            len,
            device,
            owner: Some(owner),
            stream: None,
        }
    }

    /// Wraps memory that someone else owns (e.g. a PyTorch tensor's storage).
    ///
    /// # Safety
    /// `addr..addr+len` must be memory of `device` that stays allocated, and
    /// that nothing else reads or writes, while any transfer into it runs.
    pub unsafe fn borrowed(addr: DeviceAddr, len: usize, device: DeviceKind) -> Self {
        DeviceBuffer {
            addr,
            len,
            device,
            owner: None,
            stream: None,
        }
    }

    /// Wraps memory a framework owns whose use is ordered by one of its
    /// streams (e.g. a tensor just allocated by PyTorch's caching allocator,
    /// whose memory earlier kernels on that stream may still be using).
    /// Every transfer touching it first waits for the work queued on
    /// `stream`; when the transfer returns, its bytes are in place, so work
    /// queued on `stream` afterwards sees them.
    ///
    /// # Safety
    /// As [`DeviceBuffer::borrowed`], and `stream` must be a live stream of
    /// `device` (0 for the legacy default stream) while the buffer is used.
    pub unsafe fn borrowed_on_stream(
        addr: DeviceAddr,
        len: usize,
        device: DeviceKind,
        stream: u64,
    ) -> Self {
        DeviceBuffer {
            addr,
            len,
            device,
            owner: None,
            stream: Some(stream),
        }
    }

    /// The owner's stream, for buffers made with
    /// [`DeviceBuffer::borrowed_on_stream`] (or
    /// [`Device::borrow`](super::Device::borrow) with one).
    pub fn stream(&self) -> Option<u64> {
        self.stream
    }

    pub fn addr(&self) -> DeviceAddr {
        self.addr
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn device(&self) -> DeviceKind {
        self.device
    }

    /// This buffer, with transfers waiting for `stream` first (see
    /// [`DeviceBuffer::borrowed_on_stream`]).
    ///
    /// # Safety
    /// `stream` must be a live stream of the buffer's device (0 for the
    /// legacy default stream) while the buffer is used: transfers hand it
    /// to the device's `wait_for_stream`.
    pub(crate) unsafe fn on_stream(mut self, stream: Option<u64>) -> Self {
        self.stream = stream;
        self
    }

    /// A sub-range of this buffer sharing its ownership.
    pub fn slice(&self, offset: usize, len: usize) -> Result<DeviceBuffer> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(DeviceBuffer {
                addr: self.addr + offset as u64,
                len,
                device: self.device,
                owner: self.owner.clone(),
                stream: self.stream,
            }),
            _ => Err(crate::Error::invalid(format!(
                "slice of {len} bytes at {offset} exceeds the {}-byte buffer",
                self.len
            ))),
        }
    }
}

/// The end of a range of `len` bytes at `addr` offered to `Device::borrow`,
/// refusing a null start or an end past the address space.
pub(crate) fn borrow_end(addr: DeviceAddr, len: usize) -> Result<DeviceAddr> {
    addr.checked_add(len as u64)
        .filter(|_| addr != 0)
        .ok_or_else(|| {
            Error::invalid(format!(
                "cannot borrow {len} bytes at {addr:#x}: out of range"
            ))
        })
}

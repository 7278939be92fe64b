//! Python bindings of the agent's client (`zerohop.agent`): a session, its
//! shared host buffers, and rings. The Python half wraps these in friendlier
//! classes.

use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::prelude::*;
use std::os::fd::BorrowedFd;
use std::path::PathBuf;
use std::time::Duration;
use zerohop_client::{Client, HostBuffer, IoRing, Submission};

fn os_error(e: std::io::Error) -> PyErr {
    match e.raw_os_error() {
        Some(code) => PyOSError::new_err((code, e.to_string())),
        None => PyOSError::new_err(e.to_string()),
    }
}

/// A session with a running `zerohop agent`.
#[pyclass(module = "zerohop._native", name = "AgentClient")]
pub struct AgentClient {
    client: Client,
}

#[pymethods]
impl AgentClient {
    #[new]
    #[pyo3(signature = (socket=None))]
    fn new(py: Python<'_>, socket: Option<PathBuf>) -> PyResult<Self> {
        let path = socket.unwrap_or_else(zerohop_client::default_socket_path);
        let client = py.detach(|| Client::connect(&path)).map_err(os_error)?;
        Ok(AgentClient { client })
    }

    /// Registers an open descriptor of this process; returns its id.
    fn register_file(&self, fd: i32) -> PyResult<u32> {
        if fd < 0 {
            return Err(os_error(std::io::Error::from_raw_os_error(libc::EBADF)));
        }
        // SAFETY: `fd` is not negative and is borrowed for this call only,
        // never closed here; one that is not open makes the send fail with
        // EBADF.
        let fd = unsafe { BorrowedFd::borrow_raw(fd) };
        self.client.register_file(fd).map_err(os_error)
    }

    fn deregister_file(&self, id: u32) -> PyResult<()> {
        self.client.deregister_file(id).map_err(os_error)
    }

    /// A new buffer of shared host memory.
    fn create_host_buffer(&self, size: usize) -> PyResult<AgentHostBuffer> {
        let buf = self.client.create_host_buffer(size).map_err(os_error)?;
        Ok(AgentHostBuffer { buf })
    }

    /// Registers `size` bytes of GPU memory at `ptr` on `device` (by IPC
    /// handle, or by descriptor for VMM memory); returns the buffer id.
    fn register_device_buffer(
        &self,
        py: Python<'_>,
        device: u32,
        ptr: u64,
        size: u64,
    ) -> PyResult<u32> {
        py.detach(|| self.client.register_device_buffer(device, ptr, size))
            .map_err(os_error)
    }

    fn deregister_buffer(&self, id: u32) -> PyResult<()> {
        self.client.deregister_buffer(id).map_err(os_error)
    }

    fn create_ring(&self, entries: u32) -> PyResult<AgentRing> {
        let ring = self.client.create_ring(entries).map_err(os_error)?;
        Ok(AgentRing { ring })
    }

    /// The agent's counters, as JSON.
    fn status(&self) -> PyResult<String> {
        let st = self.client.status().map_err(os_error)?;
        Ok(serde_json::to_string(&st).expect("status serializes"))
    }
}

/// Host memory shared with the agent; unmapped when this is freed.
#[pyclass(module = "zerohop._native", name = "AgentHostBuffer")]
pub struct AgentHostBuffer {
    buf: HostBuffer,
}

#[pymethods]
impl AgentHostBuffer {
    #[getter]
    fn id(&self) -> u32 {
        self.buf.id()
    }

    #[getter]
    fn address(&self) -> usize {
        self.buf.as_ptr() as usize
    }

    #[getter]
    fn size(&self) -> usize {
        self.buf.len()
    }
}

/// A submission/completion ring.
#[pyclass(module = "zerohop._native", name = "AgentRing")]
pub struct AgentRing {
    ring: IoRing,
}

#[pymethods]
impl AgentRing {
    /// Queues one I/O (op: 1 read, 2 write); False when the ring is full.
    #[allow(clippy::too_many_arguments)]
    fn prepare(
        &mut self,
        op: u8,
        file: u32,
        file_offset: u64,
        buffer: u32,
        buffer_offset: u64,
        length: u64,
        user_data: u64,
    ) -> PyResult<bool> {
        let s = Submission::raw(
            op,
            file,
            file_offset,
            buffer,
            buffer_offset,
            length,
            user_data,
        );
        match self.ring.prepare(s) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Ok(false),
            Err(e) => Err(os_error(e)),
        }
    }

    fn submit(&mut self) -> PyResult<()> {
        self.ring.submit().map_err(os_error)
    }

    /// Waits (GIL released) for at least `min` completions or `timeout`
    /// seconds; returns [(user_data, result)], result = bytes or -errno.
    #[pyo3(signature = (min=1, timeout=None))]
    fn wait(
        &mut self,
        py: Python<'_>,
        min: usize,
        timeout: Option<f64>,
    ) -> PyResult<Vec<(u64, i64)>> {
        let timeout = match timeout {
            Some(t) if !(t >= 0.0 && t.is_finite()) => {
                return Err(PyValueError::new_err(
                    "timeout must be a non-negative number",
                ))
            }
            t => t.map(Duration::from_secs_f64),
        };
        let ring = &mut self.ring;
        let done = py.detach(|| ring.wait(min, timeout)).map_err(os_error)?;
        Ok(done.into_iter().map(|c| (c.user_data, c.result)).collect())
    }

    #[getter]
    fn in_flight(&self) -> usize {
        self.ring.in_flight()
    }
}

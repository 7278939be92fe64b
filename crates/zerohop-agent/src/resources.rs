//! What a client registers: files (its own descriptors) and buffers (host
//! memfds, or GPU memory by IPC handle), each released when dropped.

use crate::engines::{CudaEngine, Engines};
use std::fs::File;
use std::path::PathBuf;
use zerohop::stats::human_bytes;
use zerohop::storage::{blocking, regular_file_len, reopen_direct, SinkFile, SourceFile};
use zerohop::{DeviceBuffer, Error, Result};
use zerohop_cuda::{IpcMapping, VmmMapping};
use zerohop_wire::shm::SharedMemory;

/// A file the client opened and passed; the agent never opens its path.
pub struct RegisteredFile {
    file: File,
    direct: Option<File>,
    label: PathBuf,
}

impl RegisteredFile {
    pub fn new(file: File, label: String) -> Result<Self> {
        let label = PathBuf::from(label);
        // An O_PATH descriptor grants no I/O; reopening it (for O_DIRECT)
        // would read with the agent's rights instead of the client's.
        let flags = rustix::fs::fcntl_getfl(&file);
        if flags.is_err() || flags.is_ok_and(|f| f.contains(rustix::fs::OFlags::PATH)) {
            return Err(Error::invalid(format!(
                "{}: an O_PATH descriptor cannot be read or written",
                label.display()
            )));
        }
        regular_file_len(&file, &label)?;
        // A non-blocking descriptor is replaced once here, not at every
        // batch that reads or writes it.
        let file = blocking(file, &label)?;
        Ok(RegisteredFile {
            direct: reopen_direct(&file),
            file,
            label,
        })
    }

    /// The file's current length (it may change: the client can write it).
    pub fn len(&self) -> u64 {
        self.file.metadata().map_or(0, |m| m.len())
    }

    fn clones(&self) -> Result<(File, Option<File>)> {
        let dup = |f: &File| {
            f.try_clone()
                .map_err(|e| Error::io(&self.label, "cannot duplicate", e))
        };
        Ok((dup(&self.file)?, self.direct.as_ref().map(dup).transpose()?))
    }

    pub fn source(&self) -> Result<SourceFile> {
        let (f, d) = self.clones()?;
        SourceFile::from_descriptors(f, d, &self.label)
    }

    pub fn sink(&self, min_len: u64) -> Result<SinkFile> {
        let (f, d) = self.clones()?;
        SinkFile::from_descriptors(f, d, &self.label, min_len)
    }
}

/// Where a buffer's memory is, which decides the engine and route.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Memory {
    /// A memfd, moved through the host engine (the host device, whose
    /// copies write the client's memory through raw pointers only: the
    /// client may touch it at the same time).
    Host,
    /// A memfd standing in for GPU memory (tests of the device route): the
    /// same engine; listed as device memory in the status.
    SimulatedDevice,
    /// GPU memory of the client, mapped by IPC handle.
    Cuda,
}

pub struct Buffer {
    pub memory: Memory,
    /// The engine's view of the memory. Declared first: dropped (and, on
    /// a device that registers borrowed memory, unregistered) before the
    /// mapping below.
    pub data: DeviceBuffer,
    _shared: Option<SharedMemory>,
    _mapping: Option<DeviceMapping>,
}

/// Another process's GPU memory mapped into the agent.
enum DeviceMapping {
    Ipc(IpcMapping),
    Vmm(VmmMapping),
}

impl Buffer {
    pub fn len(&self) -> u64 {
        self.data.len() as u64
    }

    /// A memfd-backed buffer (host memory, or simulated device memory).
    pub fn shared(engines: &Engines, memfd: File, len: u64, memory: Memory) -> Result<Self> {
        let shm = SharedMemory::import(memfd, usize::try_from(len).unwrap_or(usize::MAX)).map_err(
            |e| Error::with_source(zerohop::ErrorKind::InvalidInput, "buffer memfd refused", e),
        )?;
        // SAFETY: the mapping lives in `_shared`, which outlives `data`
        // (field order); the client may write it concurrently, which can
        // give wrong bytes but never touches memory outside the mapping.
        let data = unsafe {
            engines
                .host
                .device()
                .borrow(shm.as_ptr() as u64, shm.len(), None)
        }?;
        Ok(Buffer {
            memory,
            data,
            _shared: Some(shm),
            _mapping: None,
        })
    }

    /// GPU memory of the client: `offset..offset+len` of the allocation
    /// behind an IPC handle.
    pub fn cuda_ipc(
        engines: &Engines,
        device: u32,
        handle: &[u8; 64],
        offset: u64,
        len: u64,
    ) -> Result<Self> {
        let cuda = served(engines, device)?;
        let mapping = IpcMapping::open(cuda.device.context(), handle)?;
        Self::device(cuda, DeviceMapping::Ipc(mapping), offset, len)
    }

    /// GPU memory of the client: `offset..offset+len` of a VMM allocation
    /// of `allocation_len` bytes exported as a file descriptor.
    pub fn cuda_vmm(
        engines: &Engines,
        device: u32,
        fd: &File,
        allocation_len: u64,
        offset: u64,
        len: u64,
    ) -> Result<Self> {
        let cuda = served(engines, device)?;
        let size =
            usize::try_from(allocation_len).map_err(|_| Error::invalid("allocation too large"))?;
        let mapping = VmmMapping::import(cuda.device.context(), fd, size)?;
        Self::device(cuda, DeviceMapping::Vmm(mapping), offset, len)
    }

    fn device(cuda: &CudaEngine, mapping: DeviceMapping, offset: u64, len: u64) -> Result<Self> {
        let (base, size) = match &mapping {
            DeviceMapping::Ipc(m) => (m.base(), m.len()),
            DeviceMapping::Vmm(m) => (m.base(), m.len()),
        };
        if offset.checked_add(len).is_none_or(|end| end > size as u64) {
            return Err(Error::invalid(format!(
                "{} ({len} bytes) at offset {offset} lies outside the {} allocation \
                 ({size} bytes)",
                human_bytes(len),
                human_bytes(size as u64)
            )));
        }
        // SAFETY: the range lies inside the mapped allocation (just checked),
        // which `_mapping` keeps mapped until after `data` is dropped.
        let data = unsafe {
            DeviceBuffer::borrowed(base + offset, len as usize, cuda.engine.device().kind())
        };
        Ok(Buffer {
            memory: Memory::Cuda,
            data,
            _shared: None,
            _mapping: Some(mapping),
        })
    }
}

/// The engine of `device`, if this agent serves it.
fn served(engines: &Engines, device: u32) -> Result<&CudaEngine> {
    engines
        .cuda
        .as_ref()
        .filter(|c| c.device.context().ordinal() == device as usize)
        .ok_or_else(|| {
            Error::invalid(format!(
                "this agent does not serve cuda:{device} ({})",
                engines.describe()
            ))
        })
}

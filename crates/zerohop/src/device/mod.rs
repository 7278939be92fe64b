//! The memory side: a [`Device`] owns device memory, pinned staging memory
//! and copy queues. Two production implementations share this interface:
//! CUDA, and host memory standing in for device memory ([`HostDevice`]).
//! The simulated device that makes ordering bugs visible in CI lives in
//! `zerohop::testing` (cargo feature `testing`).

mod buffer;
mod cuda;
mod host;
mod name;
mod reserved;

pub(crate) use buffer::borrow_end;
pub use buffer::{DeviceAddr, DeviceBuffer, DeviceKind};
pub use cuda::{cuda_driver_summary, CudaDevice};
pub use host::HostDevice;
#[cfg(feature = "testing")]
pub(crate) use host::HostMemory;
pub use name::{open_device, open_gpu, DeviceName, DEVICE_HELP};
pub use reserved::{HostReservation, ReservedMemory};

use crate::{Error, Result};
use std::collections::BTreeSet;

/// Blocks until the work queued on `buffers`' framework streams has
/// finished, each stream waited for once, so nothing touches memory a
/// framework's kernels still use. A buffer of another device is an error
/// (its copies would address another device's memory: on the host device,
/// a crash), raised before any copy.
pub(crate) fn wait_for_buffer_streams<'a>(
    device: &dyn Device,
    buffers: impl IntoIterator<Item = &'a DeviceBuffer>,
) -> Result<()> {
    let mut streams = BTreeSet::new();
    for b in buffers {
        if b.device() != device.kind() {
            return Err(Error::invalid(format!(
                "a buffer of {} cannot be used on {}",
                b.device(),
                device.kind()
            )));
        }
        streams.extend(b.stream());
    }
    for s in streams {
        // SAFETY: a buffer carries a stream only through the unsafe
        // `DeviceBuffer::borrowed_on_stream` or `DeviceBuffer::on_stream`
        // (which `Device::borrow` uses), whose callers vouch that it is a
        // live stream of the buffer's device, checked above to be `device`.
        unsafe { device.wait_for_stream(s)? };
    }
    Ok(())
}

/// Host memory the device can copy from asynchronously (pinned for CUDA).
pub trait StagingMemory: Send + Sync {
    fn as_mut_ptr(&mut self) -> *mut u8;
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Blocks until `offset..offset+len` may be used: the memory of
    /// [`Device::alloc_staging_pool`] may still be being made present and
    /// pinned when it is handed out, which may write its pages. Until
    /// this returns for a range, neither the CPU nor a copy uses it.
    fn wait_ready(&self, offset: usize, len: usize) -> Result<()> {
        let _ = (offset, len);
        Ok(())
    }

    /// Whether `offset..offset+len` may be used now, without waiting (see
    /// [`StagingMemory::wait_ready`]).
    fn is_ready(&self, offset: usize, len: usize) -> bool {
        let _ = (offset, len);
        true
    }

    /// Whether making the memory ready failed: what is not ready yet never
    /// will be (`wait_ready` returns the error), so its owner allocates
    /// anew rather than keep it.
    fn has_failed(&self) -> bool {
        false
    }
}

/// A completion marker for copies queued before it.
pub trait Fence: Send {
    /// Blocks until every copy queued before this fence has finished.
    fn wait(&self) -> Result<()>;

    /// Whether every copy queued before this fence has finished, without
    /// waiting; a failed copy is an error, as from `wait`. Asked only on
    /// the thread that recorded the fence.
    fn passed(&self) -> Result<bool>;
}

/// An ordered queue of asynchronous copies (a CUDA stream). Dropping a
/// queue waits for every copy queued on it, fenced or not, so no copy can
/// outlive the worker that queued it (after an error or a panic included).
pub trait CopyQueue: Send {
    /// Queues a copy of `len` bytes from host `src` to device `dst`.
    ///
    /// # Safety
    /// `src..src+len` must stay readable and unchanged, and `dst..dst+len`
    /// must lie in a live buffer of this device that nothing else touches,
    /// until a fence recorded after this call has been waited for.
    unsafe fn copy_to_device(&self, src: *const u8, dst: DeviceAddr, len: usize) -> Result<()>;

    /// Queues a copy of `len` bytes from device `src` to host `dst`.
    ///
    /// # Safety
    /// `src..src+len` must lie in a live buffer of this device that nothing
    /// writes, and `dst..dst+len` must be staging memory that nothing else
    /// reads or writes, until a fence recorded after this call has been
    /// waited for.
    unsafe fn copy_to_host(&self, src: DeviceAddr, dst: *mut u8, len: usize) -> Result<()>;

    /// A fence after everything queued so far.
    fn record(&self) -> Result<Box<dyn Fence>>;
}

/// Host memory pinned for direct device access until dropped.
pub trait HostPin: Send + Sync {}

/// A GPU, or host memory standing in for one.
pub trait Device: Send + Sync {
    fn kind(&self) -> DeviceKind;

    /// One line for logs and `info`: e.g. "cuda:0 NVIDIA H200 (139 GiB)".
    fn describe(&self) -> String;

    /// Allocates device memory.
    fn alloc(&self, len: usize) -> Result<DeviceBuffer>;

    /// Allocates host memory for staging, ready for copies on return.
    fn alloc_staging(&self, len: usize) -> Result<Box<dyn StagingMemory>>;

    /// Allocates a staging pool's memory: as [`Device::alloc_staging`], but
    /// a device may go on pinning it after this returns (see
    /// [`StagingMemory::wait_ready`]), so that a transfer's first copies
    /// wait for their own slots, not for the whole pool.
    fn alloc_staging_pool(&self, len: usize) -> Result<Box<dyn StagingMemory>> {
        self.alloc_staging(len)
    }

    fn new_queue(&self) -> Result<Box<dyn CopyQueue>>;

    /// Whether this device's copies from host memory are done by DMA
    /// hardware (a GPU's copy engines), not by the CPU. Only then may copies
    /// read a file's page-cache pages in place: a CPU copy from the mapping
    /// of a file truncated meanwhile would kill the process with SIGBUS,
    /// while a GPU copies from pages it pinned and reports an error.
    fn copies_by_dma(&self) -> bool;

    /// Whether `alloc_staging` gives pinned (page-locked) memory that the
    /// device copies by DMA, as a GPU's does; what stats report.
    fn pins_staging(&self) -> bool;

    /// Pins existing host memory (e.g. a read-only file mapping) so copies
    /// can read it directly. `None` when this device cannot do that.
    ///
    /// # Safety
    /// The range must stay mapped until the returned pin is dropped, and the
    /// pin must outlive every copy that reads the range.
    unsafe fn pin_host(&self, ptr: *const u8, len: usize) -> Result<Option<Box<dyn HostPin>>>;

    /// Blocks until the work queued so far on a framework's stream (see
    /// [`DeviceBuffer::borrowed_on_stream`]) has finished.
    ///
    /// # Safety
    /// `stream` must be a live stream of this device (0: the default stream).
    unsafe fn wait_for_stream(&self, stream: u64) -> Result<()>;

    /// Wraps `addr..addr+len`, memory a framework allocated on this device
    /// (a tensor's storage), for transfers; with `stream`, transfers first
    /// wait for the work queued on it (see
    /// [`DeviceBuffer::borrowed_on_stream`]).
    ///
    /// # Safety
    /// As [`DeviceBuffer::borrowed_on_stream`]: the range is memory of this
    /// device that stays allocated, and that nothing else touches, while
    /// the buffer is used in transfers; `stream` is a live stream of it.
    unsafe fn borrow(
        &self,
        addr: DeviceAddr,
        len: usize,
        stream: Option<u64>,
    ) -> Result<DeviceBuffer>;

    /// Checksums computed where the memory is; `None` where this device
    /// cannot (callers hash the bytes on the host as they pass through
    /// staging).
    fn checksums(&self) -> Option<&dyn DeviceChecksums> {
        None
    }

    /// Reserves at least `len` bytes of this device's addresses, whose
    /// memory can be released and re-created at the same addresses
    /// (unbacked at first); `None` where this device cannot.
    fn reserve(&self, len: usize) -> Result<Option<Box<dyn ReservedMemory>>> {
        let _ = len;
        Ok(None)
    }

    /// The per-thread stack size this device's kernels get, for which it
    /// keeps memory aside whether or not a kernel needs it (CUDA: the
    /// limit times every thread the device can run at once, 264 MiB of an
    /// H200); `None` where there is no such reserve.
    fn thread_stack_bytes(&self) -> Result<Option<usize>> {
        Ok(None)
    }

    /// Sets that stack size, and with it the reserve; 0 keeps only what
    /// kernels are compiled to need (the driver gives a launch that). A
    /// no-op where there is no reserve.
    fn set_thread_stack_bytes(&self, bytes: usize) -> Result<()> {
        let _ = bytes;
        Ok(())
    }

    /// Copies device memory back to the host, synchronously (for `--verify`).
    fn read_back(&self, src: &DeviceBuffer, offset: usize, dst: &mut [u8]) -> Result<()>;

    /// Copies host bytes into device memory, synchronously (tests, benchmark
    /// fills, small host-side data).
    fn write_from_host(&self, dst: &DeviceBuffer, offset: usize, src: &[u8]) -> Result<()>;
}

/// Hashes chunks of a device's memory where the memory is, without the
/// host reading them: a capability some devices have (a kernel on a GPU),
/// kept apart from [`Device`]'s copies because only checkpoints need it.
pub trait DeviceChecksums: Send + Sync {
    /// Makes hashing ready (a GPU loads its kernel on the first call); an
    /// error says why this device cannot hash after all.
    fn ready(&self) -> Result<()>;

    /// XXH3-64 (seed 0) of each chunk, a chunk being its buffers' bytes one
    /// after another, once the work queued on the buffers' streams is done
    /// (a GPU hashes only chunks of more than 240 bytes with its kernel,
    /// reading shorter ones back to hash them on the host). Buffers that
    /// are not this device's memory are an error.
    fn xxh3_64(&self, chunks: &[Vec<DeviceBuffer>]) -> Result<Vec<u64>>;
}

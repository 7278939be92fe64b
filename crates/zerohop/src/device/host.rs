//! Host memory standing in for device memory, for machines without a GPU
//! and for the agent's and Python's host buffers: the same pipeline, with
//! copies done at once by `memcpy`.

use super::{
    CopyQueue, Device, DeviceAddr, DeviceBuffer, DeviceKind, Fence, HostPin, HostReservation,
    ReservedMemory, StagingMemory,
};
use crate::{Error, ErrorKind, Result};
use std::alloc::Layout;
use std::sync::Arc;

/// Host memory as a device: allocations are zeroed, page-aligned host
/// memory (staging reads use O_DIRECT), and each copy is done by the call
/// that queues it.
#[derive(Debug, Default)]
pub struct HostDevice;

impl HostDevice {
    pub fn new() -> Self {
        HostDevice
    }

    /// `buf[offset..offset + len]`'s address, if `buf` is host memory.
    fn host_range(buf: &DeviceBuffer, offset: usize, len: usize) -> Result<DeviceAddr> {
        if buf.device() != DeviceKind::Host {
            return Err(Error::invalid(format!(
                "a buffer of {} is not host memory",
                buf.device()
            )));
        }
        Ok(buf.slice(offset, len)?.addr())
    }
}

impl Device for HostDevice {
    fn kind(&self) -> DeviceKind {
        DeviceKind::Host
    }

    fn describe(&self) -> String {
        "host memory (no GPU used)".into()
    }

    fn alloc(&self, len: usize) -> Result<DeviceBuffer> {
        let mem = HostMemory::zeroed(len)?;
        Ok(DeviceBuffer::owned(
            mem.addr(),
            len,
            DeviceKind::Host,
            Arc::new(mem),
        ))
    }

    fn alloc_staging(&self, len: usize) -> Result<Box<dyn StagingMemory>> {
        Ok(Box::new(HostMemory::zeroed(len)?))
    }

    fn new_queue(&self) -> Result<Box<dyn CopyQueue>> {
        Ok(Box::new(MemcpyQueue))
    }

    fn copies_by_dma(&self) -> bool {
        false
    }

    fn reserve(&self, len: usize) -> Result<Option<Box<dyn ReservedMemory>>> {
        Ok(Some(Box::new(HostReservation::new(len)?)))
    }

    fn pins_staging(&self) -> bool {
        false
    }

    unsafe fn pin_host(&self, _ptr: *const u8, _len: usize) -> Result<Option<Box<dyn HostPin>>> {
        // Nothing to pin for CPU copies, and nothing to offer: a CPU copy
        // from a file mapping must never run (see `copies_by_dma`), so a
        // caller that asks anyway falls back to staging.
        Ok(None)
    }

    unsafe fn wait_for_stream(&self, _stream: u64) -> Result<()> {
        // Host memory has no streams: nothing is queued on one.
        Ok(())
    }

    unsafe fn borrow(
        &self,
        addr: DeviceAddr,
        len: usize,
        stream: Option<u64>,
    ) -> Result<DeviceBuffer> {
        if len > 0 {
            super::borrow_end(addr, len)?;
        }
        // SAFETY: forwarded contract of `Device::borrow`: the caller's
        // memory stays allocated and untouched while the buffer is used,
        // and `stream` (never waited for here) is live.
        Ok(unsafe { DeviceBuffer::borrowed(addr, len, DeviceKind::Host).on_stream(stream) })
    }

    fn read_back(&self, src: &DeviceBuffer, offset: usize, dst: &mut [u8]) -> Result<()> {
        let addr = Self::host_range(src, offset, dst.len())?;
        // SAFETY: a checked slice of a host buffer: owned ones are live while
        // `src` holds their allocation, borrowed ones as their creators
        // vouched; `dst` is a separate Rust slice.
        unsafe { std::ptr::copy_nonoverlapping(addr as *const u8, dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    fn write_from_host(&self, dst: &DeviceBuffer, offset: usize, src: &[u8]) -> Result<()> {
        let addr = Self::host_range(dst, offset, src.len())?;
        // SAFETY: as in `read_back`, the other way round.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), addr as *mut u8, src.len()) };
        Ok(())
    }
}

/// Zeroed, page-aligned host memory, freed on drop. A page or more is an
/// anonymous mapping, which the kernel zeroes page by page on first touch,
/// so a large buffer is not written twice (once with zeros, then with the
/// data); smaller ones come from the heap, sparing a mapping each.
pub(crate) struct HostMemory {
    ptr: *mut u8,
    len: usize,
    /// `None` for a mapping of `len` bytes.
    heap: Option<Layout>,
}

// SAFETY: plain owned memory with no thread affinity; it is unmapped or
// freed only by `Drop`, which whoever shares the pointer with copies runs
// after they have finished (the `CopyQueue` contract).
unsafe impl Send for HostMemory {}
// SAFETY: a `&HostMemory` exposes only the address and length; the bytes are
// reached only through raw pointers under the `CopyQueue` and
// `StagingMemory` contracts, which exclude concurrent conflicting access.
unsafe impl Sync for HostMemory {}

impl HostMemory {
    pub(crate) fn zeroed(len: usize) -> Result<Self> {
        let page = rustix::param::page_size();
        if len < page {
            let layout = Layout::from_size_align(len.max(1), page)
                .map_err(|_| Error::invalid(format!("cannot allocate {len} bytes")))?;
            // SAFETY: the layout has non-zero size.
            let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
            if ptr.is_null() {
                return Err(out_of_memory(len));
            }
            return Ok(HostMemory {
                ptr,
                len,
                heap: Some(layout),
            });
        }
        // SAFETY: a new private anonymous mapping (no address hint) aliases
        // no existing memory; it is owned by the value returned and
        // unmapped only in `Drop`.
        let ptr = unsafe {
            rustix::mm::mmap_anonymous(
                std::ptr::null_mut(),
                len,
                rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
                rustix::mm::MapFlags::PRIVATE,
            )
        }
        .map_err(|_| out_of_memory(len))?;
        Ok(HostMemory {
            ptr: ptr.cast(),
            len,
            heap: None,
        })
    }

    pub(crate) fn addr(&self) -> DeviceAddr {
        self.ptr as DeviceAddr
    }
}

fn out_of_memory(len: usize) -> Error {
    Error::new(
        ErrorKind::OutOfMemory,
        format!("host allocation of {len} bytes failed"),
    )
}

impl Drop for HostMemory {
    fn drop(&mut self) {
        match self.heap {
            // SAFETY: allocated with this layout in `zeroed`.
            Some(layout) => unsafe { std::alloc::dealloc(self.ptr, layout) },
            None => {
                // SAFETY: the mapping of `len` bytes made in `zeroed`, which
                // nothing uses once its owner drops it.
                let unmapped = unsafe { rustix::mm::munmap(self.ptr.cast(), self.len) };
                debug_assert!(unmapped.is_ok(), "munmap failed: {unmapped:?}");
            }
        }
    }
}

impl StagingMemory for HostMemory {
    fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr
    }
    fn len(&self) -> usize {
        self.len
    }
}

/// Copies as they are queued: by the time a fence is recorded, every copy
/// queued before it has finished.
struct MemcpyQueue;

impl CopyQueue for MemcpyQueue {
    unsafe fn copy_to_device(&self, src: *const u8, dst: DeviceAddr, len: usize) -> Result<()> {
        // SAFETY: forwarded contract of `CopyQueue::copy_to_device`: both
        // ranges are live, and the device range is touched by nothing else.
        unsafe { std::ptr::copy_nonoverlapping(src, dst as *mut u8, len) };
        Ok(())
    }

    unsafe fn copy_to_host(&self, src: DeviceAddr, dst: *mut u8, len: usize) -> Result<()> {
        // SAFETY: forwarded contract of `CopyQueue::copy_to_host`.
        unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst, len) };
        Ok(())
    }

    fn record(&self) -> Result<Box<dyn Fence>> {
        Ok(Box::new(Passed))
    }
}

/// A fence whose copies have all finished.
struct Passed;

impl Fence for Passed {
    fn wait(&self) -> Result<()> {
        Ok(())
    }

    fn passed(&self) -> Result<bool> {
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_land_before_the_fence() {
        let dev = HostDevice::new();
        let buf = dev.alloc(10_000).unwrap();
        let mut staging = dev.alloc_staging(4096).unwrap();
        assert_eq!(staging.as_mut_ptr() as usize % 4096, 0);
        let src: Vec<u8> = (0..4096u32).map(|i| i as u8).collect();
        let q = dev.new_queue().unwrap();
        // SAFETY: `src` and `buf` are live and untouched until the fence.
        unsafe { q.copy_to_device(src.as_ptr(), buf.addr() + 100, src.len()) }.unwrap();
        q.record().unwrap().wait().unwrap();
        let mut back = vec![0u8; 4096];
        dev.read_back(&buf, 100, &mut back).unwrap();
        assert_eq!(back, src);
        // SAFETY: `staging` is ours and `buf` live.
        unsafe { q.copy_to_host(buf.addr() + 100, staging.as_mut_ptr(), 4096) }.unwrap();
        q.record().unwrap().wait().unwrap();
        // SAFETY: the copy above initialised 4096 bytes of staging.
        let staged = unsafe { std::slice::from_raw_parts(staging.as_mut_ptr(), 4096) };
        assert_eq!(staged, &src[..]);
    }

    #[test]
    fn memory_is_zeroed_and_page_aligned_at_any_size() {
        let page = rustix::param::page_size();
        for len in [0, 1, page - 1, page, 3 * page + 5] {
            let mut mem = HostMemory::zeroed(len).unwrap();
            assert_eq!(mem.addr() as usize % page, 0, "{len} bytes");
            assert_eq!(mem.heap.is_none(), len >= page, "{len} bytes");
            // SAFETY: `mem` owns `len` initialised (zeroed) bytes.
            let bytes = unsafe { std::slice::from_raw_parts_mut(mem.as_mut_ptr(), len) };
            assert!(bytes.iter().all(|&b| b == 0), "{len} bytes");
            bytes.fill(0xab);
        }
    }

    #[test]
    fn bad_ranges_are_errors() {
        let dev = HostDevice::new();
        let buf = dev.alloc(16).unwrap();
        assert_eq!(
            dev.write_from_host(&buf, 10, &[0; 7]).unwrap_err().kind(),
            ErrorKind::InvalidInput
        );
        // SAFETY: never used for a transfer.
        let gpu = unsafe { DeviceBuffer::borrowed(0x1000, 16, DeviceKind::Cuda(0)) };
        assert!(dev.read_back(&gpu, 0, &mut [0; 4]).is_err());
        // SAFETY: refused before any use.
        let null = unsafe { dev.borrow(0, 8, None) };
        assert_eq!(null.unwrap_err().kind(), ErrorKind::InvalidInput);
        // SAFETY: refused before any use.
        let wraps = unsafe { dev.borrow(u64::MAX - 2, 8, None) };
        assert_eq!(wraps.unwrap_err().kind(), ErrorKind::InvalidInput);
    }
}

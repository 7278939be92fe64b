use crate::error::{check, CudaError, CudaErrorKind};
use crate::{Context, Result};
use cudarc::driver::sys;
use std::sync::Arc;

/// A device address (`CUdeviceptr`).
pub type DevicePtr = u64;

/// Device memory owned by zerohop: freed on drop.
#[derive(Debug)]
pub struct DeviceAllocation {
    ctx: Arc<Context>,
    ptr: DevicePtr,
    len: usize,
}

impl DeviceAllocation {
    /// Allocates `len` bytes of device memory (at least one byte is asked
    /// for, so a zero-length allocation still has a valid address).
    pub fn new(ctx: &Arc<Context>, len: usize) -> Result<Self> {
        ctx.bind()?;
        let mut ptr = 0;
        // SAFETY: writes one device pointer; a context is current.
        check(
            unsafe { sys::cuMemAlloc_v2(&mut ptr, len.max(1)) },
            "cuMemAlloc",
        )
        .map_err(|e| out_of_memory_detail(e, ctx, len))?;
        Ok(DeviceAllocation {
            ctx: ctx.clone(),
            ptr,
            len,
        })
    }

    pub fn ptr(&self) -> DevicePtr {
        self.ptr
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    /// Synchronous copy of `dst.len()` bytes from `offset` into host memory.
    pub fn read(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        self.check_range(offset, dst.len())?;
        self.ctx.bind()?;
        // SAFETY: the range lies inside this allocation (checked) and `dst` is
        // a live exclusive host slice of the same length.
        check(
            unsafe {
                sys::cuMemcpyDtoH_v2(dst.as_mut_ptr().cast(), self.ptr + offset as u64, dst.len())
            },
            "cuMemcpyDtoH",
        )
    }

    /// Sets every byte to `value` (used to poison memory before a load).
    pub fn fill(&self, value: u8) -> Result<()> {
        self.ctx.bind()?;
        // SAFETY: the whole allocation is ours to write.
        check(
            unsafe { sys::cuMemsetD8_v2(self.ptr, value, self.len) },
            "cuMemsetD8",
        )?;
        self.ctx.synchronize()
    }

    fn check_range(&self, offset: usize, len: usize) -> Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(CudaError::new(
                CudaErrorKind::OutOfRange,
                "range check",
                format!(
                    "{len} bytes at offset {offset} exceed the {}-byte allocation",
                    self.len
                ),
            )),
        }
    }
}

fn out_of_memory_detail(e: CudaError, ctx: &Context, len: usize) -> CudaError {
    if *e.kind() != CudaErrorKind::OutOfMemory {
        return e;
    }
    let free = ctx.memory_info().map(|(f, _)| f).unwrap_or(0);
    CudaError::new(
        CudaErrorKind::OutOfMemory,
        "cuMemAlloc",
        format!(
            "out of GPU memory on cuda:{}: asked for {len} bytes, {free} free",
            ctx.ordinal()
        ),
    )
}

impl Drop for DeviceAllocation {
    fn drop(&mut self) {
        if self.ctx.bind().is_ok() {
            // SAFETY: `ptr` came from cuMemAlloc and is freed exactly once.
            unsafe { sys::cuMemFree_v2(self.ptr) };
        }
    }
}

/// Page-locked host memory allocated by the driver, usable for async copies.
#[derive(Debug)]
pub struct PinnedBuffer {
    ctx: Arc<Context>,
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the buffer is plain memory owned by this value; access goes through
// `&self`/`&mut self` borrows like a `Vec<u8>`.
unsafe impl Send for PinnedBuffer {}
// SAFETY: as above: shared access only reads.
unsafe impl Sync for PinnedBuffer {}

impl PinnedBuffer {
    /// Allocates `len` bytes of pinned, portable host memory (page aligned).
    pub fn new(ctx: &Arc<Context>, len: usize) -> Result<Self> {
        ctx.bind()?;
        let mut ptr = std::ptr::null_mut();
        // SAFETY: writes one host pointer; PORTABLE makes it pinned for every context.
        check(
            unsafe { sys::cuMemHostAlloc(&mut ptr, len.max(1), sys::CU_MEMHOSTALLOC_PORTABLE) },
            "cuMemHostAlloc",
        )?;
        Ok(PinnedBuffer {
            ctx: ctx.clone(),
            ptr: ptr.cast(),
            len,
        })
    }

    pub fn as_ptr(&self) -> *const u8 {
        self.ptr
    }

    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for PinnedBuffer {
    fn drop(&mut self) {
        if self.ctx.bind().is_ok() {
            // SAFETY: `ptr` came from cuMemHostAlloc and is freed exactly once.
            unsafe { sys::cuMemFreeHost(self.ptr.cast()) };
        }
    }
}

/// Existing host memory page-locked for DMA until this is dropped.
#[derive(Debug)]
pub struct HostRegistration {
    ctx: Arc<Context>,
    ptr: *mut u8,
    len: usize,
}

// SAFETY: holds only the address of the registered range; unregistering from
// another thread is allowed by the driver.
unsafe impl Send for HostRegistration {}
// SAFETY: `&HostRegistration` exposes only lengths; nothing is mutated.
unsafe impl Sync for HostRegistration {}

impl HostRegistration {
    /// Page-locks `len` bytes at `ptr` so the GPU can read them directly.
    /// `read_only` allows registering read-only mappings (e.g. a file's
    /// page-cache pages mapped `PROT_READ`).
    ///
    /// # Safety
    /// The range must stay mapped until this value is dropped, and every
    /// copy that reads it must have completed before then.
    pub unsafe fn new(
        ctx: &Arc<Context>,
        ptr: *const u8,
        len: usize,
        read_only: bool,
    ) -> Result<Self> {
        ctx.bind()?;
        let mut flags = sys::CU_MEMHOSTREGISTER_PORTABLE;
        if read_only {
            flags |= sys::CU_MEMHOSTREGISTER_READ_ONLY;
        }
        // SAFETY: the caller keeps the range mapped while registered.
        check(
            unsafe { sys::cuMemHostRegister_v2(ptr as *mut _, len, flags) },
            "cuMemHostRegister",
        )?;
        Ok(HostRegistration {
            ctx: ctx.clone(),
            ptr: ptr as *mut u8,
            len,
        })
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for HostRegistration {
    fn drop(&mut self) {
        if self.ctx.bind().is_ok() {
            // SAFETY: balances the successful register in `new`.
            unsafe { sys::cuMemHostUnregister(self.ptr.cast()) };
        }
    }
}

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

/// Page-locked host memory, usable for async copies: an anonymous mapping
/// of this process, populated, then registered with the driver in one call.
///
/// On the H200 machine (`bench/probe/write_and_pin.c`), `cuMemHostAlloc`
/// pinned 128 MiB in 63 - 100 ms whether asked from one thread or sixteen;
/// huge pages populated and registered 4 MiB at a time, in 27 - 33 ms; one
/// registration of 128 MiB of present pages took 2.6 - 7 ms. The driver
/// serializes registrations and charges each a fixed cost: pin few, large
/// buffers.
#[derive(Debug)]
pub struct PinnedBuffer {
    ctx: Arc<Context>,
    ptr: *mut u8,
    /// Bytes mapped (at least one page) and registered.
    mapped: usize,
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
        let mapped = len.max(1).next_multiple_of(page_size());
        let ptr = map_populated(mapped)?.cast::<libc::c_void>();
        // SAFETY: the range is mapped until `Drop` unregisters it first.
        let registered = check(
            unsafe { sys::cuMemHostRegister_v2(ptr, mapped, sys::CU_MEMHOSTREGISTER_PORTABLE) },
            "cuMemHostRegister",
        );
        if let Err(e) = registered {
            // SAFETY: unmaps exactly the mapping made above, which nothing
            // else refers to.
            unsafe { libc::munmap(ptr, mapped) };
            return Err(e);
        }
        Ok(PinnedBuffer {
            ctx: ctx.clone(),
            ptr: ptr.cast(),
            mapped,
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
        // Unregistered only where the context can still be bound: a mapping
        // still registered is never unmapped (the driver may be using it).
        if self.ctx.bind().is_ok() {
            // SAFETY: balances the successful register in `new`, then
            // unmaps that mapping once: nothing refers to it any more.
            unsafe {
                sys::cuMemHostUnregister(self.ptr.cast());
                libc::munmap(self.ptr.cast(), self.mapped);
            }
        }
    }
}

/// A fresh anonymous mapping of `mapped` bytes (a whole number of pages)
/// for pinned memory, made present ([`populate`]) before it is registered.
fn map_populated(mapped: usize) -> Result<*mut u8> {
    let ptr = map_anonymous(mapped)?;
    populate(ptr as usize, mapped);
    Ok(ptr)
}

/// A fresh anonymous mapping of `mapped` bytes (a whole number of pages)
/// for pinned memory, on huge pages where the kernel has them for the
/// asking (fewer pages to fault in and pin: 128 MiB in 27 - 33 ms instead
/// of 45 - 62). Not inherited by a forked child, as the driver's own
/// allocations are not: the kernel would otherwise copy every pinned page
/// into each child at the fork (a subprocess, a data loader's worker).
pub(crate) fn map_anonymous(mapped: usize) -> Result<*mut u8> {
    // SAFETY: a fresh anonymous mapping at an address the kernel picks:
    // no existing memory is touched.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            mapped,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if ptr == libc::MAP_FAILED {
        return Err(host_memory_error(mapped));
    }
    // SAFETY: advice on the mapping just made, which nothing else uses.
    unsafe {
        libc::madvise(ptr, mapped, libc::MADV_HUGEPAGE);
        libc::madvise(ptr, mapped, libc::MADV_DONTFORK);
    }
    Ok(ptr.cast())
}

/// Makes `start..start+len`, part of a fresh private mapping (of whole
/// pages) that nothing reads or writes yet, present: a zero written to
/// each page, so the kernel provides it (zeroed) in a fault.
///
/// Why faults and not `MADV_POPULATE_WRITE`: the advice holds the whole
/// process's memory-map lock, which every `mmap` of another thread (a
/// framework allocating device memory) waits for. On the H200 machine
/// 8 x 1 GiB `cuMemAlloc`s took 1 ms alone and 20 - 27 ms while a pool of
/// 128 MiB was populated that way (on 8 threads, 25 - 29 ms), and 1.2 - 1.9
/// ms while it was made present by faults (4.5 - 5.5 ms): a fault takes only
/// its mapping's lock (Linux 6.4 on; `write_and_pin --pin-only`).
pub(crate) fn populate(start: usize, len: usize) {
    let page = page_size();
    for at in (start..start + len).step_by(page) {
        // SAFETY: `at` lies inside the caller's mapping, writable and not
        // yet used by anyone: writing the zero its fresh page holds
        // changes nothing, and no other access races with it.
        unsafe { std::ptr::write_volatile(at as *mut u8, 0) };
    }
}

pub(crate) fn page_size() -> usize {
    // SAFETY: sysconf reads a constant of the system.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(page).unwrap_or(4096).max(4096)
}

/// The error of a host allocation the kernel refused.
fn host_memory_error(len: usize) -> CudaError {
    CudaError::new(
        CudaErrorKind::OutOfMemory,
        "mmap",
        format!(
            "cannot map {len} bytes of host memory for pinned staging: {}",
            std::io::Error::last_os_error()
        ),
    )
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

//! Device memory from the virtual memory management API (`cuMemCreate`:
//! what PyTorch's expandable segments use, and which IPC handles cannot
//! share), shared between processes as a POSIX file descriptor.

use crate::error::check;
use crate::{allocation_range, Context, DevicePtr, Result};
use cudarc::driver::sys;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;

type Handle = sys::CUmemGenericAllocationHandle;

fn properties(ctx: &Context) -> sys::CUmemAllocationProp {
    // SAFETY: an all-zero CUmemAllocationProp is valid (null metadata
    // pointer, no flags); the fields that matter are set below.
    let mut prop: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
    prop.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.requestedHandleTypes =
        sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    prop.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = ctx.ordinal() as i32;
    prop
}

/// Physical memory `handle` (of `size` bytes) mapped read-write at a fresh
/// virtual range of this context's device; unmapped, freed and released on
/// drop.
#[derive(Debug)]
struct Mapped {
    ctx: Arc<Context>,
    handle: Handle,
    base: DevicePtr,
    size: usize,
}

impl Mapped {
    /// Takes ownership of `handle` (released on error too).
    fn new(ctx: &Arc<Context>, handle: Handle, size: usize) -> Result<Self> {
        let mut m = Mapped {
            ctx: ctx.clone(),
            handle,
            base: 0,
            size: 0,
        };
        m.base = reserve(size)?;
        if let Err(e) = map_at(ctx, m.base, size, handle) {
            // SAFETY: frees the reservation made above (nothing mapped).
            unsafe { sys::cuMemAddressFree(m.base, size) };
            m.base = 0;
            return Err(e);
        }
        m.size = size;
        Ok(m)
    }
}

/// `len` rounded up to the device's allocation granularity (at least one
/// granule).
fn granular(ctx: &Context, len: usize) -> Result<usize> {
    let prop = properties(ctx);
    let mut granularity = 0;
    // SAFETY: writes one size; `prop` is a valid description.
    check(
        unsafe {
            sys::cuMemGetAllocationGranularity(
                &mut granularity,
                &prop,
                sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
            )
        },
        "cuMemGetAllocationGranularity",
    )?;
    Ok(len.max(1).div_ceil(granularity.max(1)) * granularity.max(1))
}

/// New physical memory of `size` bytes (a multiple of the granularity).
fn create(ctx: &Context, size: usize) -> Result<Handle> {
    let mut handle = 0;
    // SAFETY: writes one handle; the description is valid.
    check(
        unsafe { sys::cuMemCreate(&mut handle, size, &properties(ctx), 0) },
        "cuMemCreate",
    )?;
    Ok(handle)
}

/// Reserves `size` bytes of device address space.
fn reserve(size: usize) -> Result<DevicePtr> {
    let mut base = 0;
    // SAFETY: reserves address space; writes one address.
    check(
        unsafe { sys::cuMemAddressReserve(&mut base, size, 0, 0, 0) },
        "cuMemAddressReserve",
    )?;
    Ok(base)
}

/// Maps all of `handle` (`size` bytes) at the reserved `base`, readable
/// and writable by this context's device; unmapped again on an error.
fn map_at(ctx: &Context, base: DevicePtr, size: usize, handle: Handle) -> Result<()> {
    // SAFETY: maps the whole allocation at a reserved, unmapped range.
    check(
        unsafe { sys::cuMemMap(base, size, 0, handle, 0) },
        "cuMemMap",
    )?;
    let access = sys::CUmemAccessDesc {
        location: properties(ctx).location,
        flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
    };
    // SAFETY: the range is mapped; one access descriptor.
    let granted = check(
        unsafe { sys::cuMemSetAccess(base, size, &access, 1) },
        "cuMemSetAccess",
    );
    if granted.is_err() {
        // SAFETY: undoes the mapping just made, which nothing has used.
        unsafe { sys::cuMemUnmap(base, size) };
    }
    granted
}

impl Drop for Mapped {
    fn drop(&mut self) {
        if self.ctx.bind().is_err() {
            return;
        }
        // SAFETY: undoes exactly what `new` did, in reverse; every copy
        // into the range finished before its owner dropped it.
        unsafe {
            if self.size > 0 {
                sys::cuMemUnmap(self.base, self.size);
                sys::cuMemAddressFree(self.base, self.size);
            }
            sys::cuMemRelease(self.handle);
        }
    }
}

/// Device memory from `cuMemCreate`, exportable by file descriptor.
#[derive(Debug)]
pub struct VmmAllocation(Mapped);

impl VmmAllocation {
    /// At least `len` bytes (rounded up to the allocation granularity).
    pub fn new(ctx: &Arc<Context>, len: usize) -> Result<Self> {
        ctx.bind()?;
        let size = granular(ctx, len)?;
        let handle = create(ctx, size)?;
        Ok(VmmAllocation(Mapped::new(ctx, handle, size)?))
    }

    pub fn ptr(&self) -> DevicePtr {
        self.0.base
    }

    pub fn len(&self) -> usize {
        self.0.size
    }

    pub fn is_empty(&self) -> bool {
        self.0.size == 0
    }
}

/// A VMM buffer exported for another process: the allocation's descriptor,
/// the buffer's offset in it, and the allocation's size.
#[derive(Debug)]
pub struct VmmExport {
    pub fd: OwnedFd,
    pub offset: u64,
    pub allocation_len: u64,
}

/// Exports the VMM allocation backing `ptr` (made with the POSIX file
/// descriptor handle type, as [`VmmAllocation`] does).
pub fn export_vmm(ctx: &Arc<Context>, ptr: DevicePtr) -> Result<VmmExport> {
    let (base, size) = allocation_range(ctx, ptr)?;
    let mut handle: Handle = 0;
    // SAFETY: writes one handle for the allocation mapped at `ptr`.
    check(
        unsafe { sys::cuMemRetainAllocationHandle(&mut handle, ptr as *mut _) },
        "cuMemRetainAllocationHandle",
    )?;
    let mut fd: i32 = -1;
    // SAFETY: writes one descriptor (an int) for a retained handle.
    let exported = check(
        unsafe {
            sys::cuMemExportToShareableHandle(
                (&mut fd as *mut i32).cast(),
                handle,
                sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                0,
            )
        },
        "cuMemExportToShareableHandle",
    );
    // SAFETY: balances the retain above (the mapping keeps its own reference).
    unsafe { sys::cuMemRelease(handle) };
    exported?;
    Ok(VmmExport {
        // SAFETY: a fresh descriptor the driver made for us.
        fd: unsafe { OwnedFd::from_raw_fd(fd) },
        offset: ptr - base,
        allocation_len: size as u64,
    })
}

/// Another process's VMM allocation, imported by descriptor and mapped into
/// this context until dropped.
#[derive(Debug)]
pub struct VmmMapping(Mapped);

impl VmmMapping {
    /// Imports the allocation behind `fd` and maps `size` bytes of it:
    /// the exporter's allocation size, which the driver checks (mapping
    /// more than the allocation holds fails).
    pub fn import(ctx: &Arc<Context>, fd: &impl AsRawFd, size: usize) -> Result<Self> {
        ctx.bind()?;
        let mut handle: Handle = 0;
        // SAFETY: the driver reads the descriptor number passed in the
        // pointer argument (its documented convention) and writes a handle.
        check(
            unsafe {
                sys::cuMemImportFromShareableHandle(
                    &mut handle,
                    fd.as_raw_fd() as isize as *mut _,
                    sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                )
            },
            "cuMemImportFromShareableHandle",
        )?;
        Ok(VmmMapping(Mapped::new(ctx, handle, size)?))
    }

    pub fn base(&self) -> DevicePtr {
        self.0.base
    }

    pub fn len(&self) -> usize {
        self.0.size
    }

    pub fn is_empty(&self) -> bool {
        self.0.size == 0
    }
}

/// Device addresses reserved once, whose memory can be released and
/// created again at the same addresses (see `zerohop::device::ReservedMemory`).
#[derive(Debug)]
pub struct Reservation {
    ctx: Arc<Context>,
    base: DevicePtr,
    size: usize,
    /// The physical memory mapped at the range, while backed.
    backing: Option<Handle>,
}

impl Reservation {
    /// At least `len` bytes of addresses (rounded up to the granularity),
    /// with no memory behind them yet.
    pub fn new(ctx: &Arc<Context>, len: usize) -> Result<Self> {
        ctx.bind()?;
        let size = granular(ctx, len)?;
        Ok(Reservation {
            ctx: ctx.clone(),
            base: reserve(size)?,
            size,
            backing: None,
        })
    }

    pub fn ptr(&self) -> DevicePtr {
        self.base
    }

    pub fn len(&self) -> usize {
        self.size
    }

    pub fn is_empty(&self) -> bool {
        self.size == 0
    }

    pub fn is_backed(&self) -> bool {
        self.backing.is_some()
    }

    /// Creates memory and maps it at the range (nothing when backed);
    /// out of device memory, the range stays unbacked.
    pub fn back(&mut self) -> Result<()> {
        if self.backing.is_none() {
            self.ctx.bind()?;
            let handle = create(&self.ctx, self.size)?;
            if let Err(e) = map_at(&self.ctx, self.base, self.size, handle) {
                // SAFETY: the handle was never mapped.
                unsafe { sys::cuMemRelease(handle) };
                return Err(e);
            }
            self.backing = Some(handle);
        }
        Ok(())
    }

    /// Unmaps and frees the memory, keeping the addresses reserved.
    pub fn release(&mut self) -> Result<()> {
        if let Some(handle) = self.backing {
            self.ctx.bind()?;
            // SAFETY: unmaps what `back` mapped; the caller finished every
            // use of the range first.
            check(
                unsafe { sys::cuMemUnmap(self.base, self.size) },
                "cuMemUnmap",
            )?;
            // SAFETY: the handle is no longer mapped anywhere.
            check(unsafe { sys::cuMemRelease(handle) }, "cuMemRelease")?;
            self.backing = None;
        }
        Ok(())
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if self.release().is_ok() && self.ctx.bind().is_ok() {
            // SAFETY: frees the reservation this value made; nothing is
            // mapped in it any more.
            unsafe { sys::cuMemAddressFree(self.base, self.size) };
        }
    }
}

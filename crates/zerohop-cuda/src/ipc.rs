//! Sharing device memory between processes: a client exports the allocation
//! holding its buffer as an IPC handle, with the buffer's offset inside it
//! (tensors from a caching allocator start anywhere in a larger block); the
//! agent maps that allocation into its own context until it lets go.

use crate::error::check;
use crate::{Context, DevicePtr, Result};
use cudarc::driver::sys;
use std::sync::Arc;

/// The bytes of a `CUipcMemHandle`, as sent between processes.
pub type IpcHandleBytes = [u8; 64];

/// The allocation holding `ptr`: its base address and size.
pub fn allocation_range(ctx: &Arc<Context>, ptr: DevicePtr) -> Result<(DevicePtr, usize)> {
    ctx.bind()?;
    let (mut base, mut size) = (0, 0);
    // SAFETY: writes one address and one size; any `ptr` value is accepted
    // (an unknown one is an error, not undefined behaviour).
    check(
        unsafe { sys::cuMemGetAddressRange_v2(&mut base, &mut size, ptr) },
        "cuMemGetAddressRange",
    )?;
    Ok((base, size))
}

/// An exported device buffer: the handle of its allocation, the buffer's
/// offset inside that allocation, and the allocation's size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpcExport {
    pub handle: IpcHandleBytes,
    pub offset: u64,
    pub allocation_len: u64,
}

/// Exports the allocation holding `ptr` (memory from `cuMemAlloc`, as
/// PyTorch's and most allocators use) for another process to map.
pub fn export_ipc(ctx: &Arc<Context>, ptr: DevicePtr) -> Result<IpcExport> {
    let (base, size) = allocation_range(ctx, ptr)?;
    let mut raw = sys::CUipcMemHandle { reserved: [0; 64] };
    // SAFETY: writes one handle; `base` is the start of a live allocation
    // of the bound context (cuMemGetAddressRange just said so).
    check(
        unsafe { sys::cuIpcGetMemHandle(&mut raw, base) },
        "cuIpcGetMemHandle",
    )?;
    Ok(IpcExport {
        handle: raw.reserved.map(|b| b as u8),
        offset: ptr - base,
        allocation_len: size as u64,
    })
}

/// Another process's allocation mapped into this process; unmapped on drop.
/// The mapping stays valid while the exporting process keeps the allocation
/// (if it frees it, the driver keeps the memory until this is dropped).
#[derive(Debug)]
pub struct IpcMapping {
    ctx: Arc<Context>,
    base: DevicePtr,
    len: usize,
}

impl IpcMapping {
    /// Maps the allocation behind `handle` (from [`export_ipc`] in another
    /// process) into `ctx`.
    pub fn open(ctx: &Arc<Context>, handle: &IpcHandleBytes) -> Result<Self> {
        ctx.bind()?;
        let raw = sys::CUipcMemHandle {
            reserved: handle.map(|b| b as std::ffi::c_char),
        };
        let mut base = 0;
        // SAFETY: writes one address; the driver validates the handle bytes.
        check(
            unsafe {
                sys::cuIpcOpenMemHandle_v2(
                    &mut base,
                    raw,
                    sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32,
                )
            },
            "cuIpcOpenMemHandle",
        )?;
        // Owned from here, so an error below still closes the mapping.
        let mut mapping = IpcMapping {
            ctx: ctx.clone(),
            base,
            len: 0,
        };
        mapping.len = allocation_range(ctx, base)?.1;
        Ok(mapping)
    }

    pub fn base(&self) -> DevicePtr {
        self.base
    }

    /// The size of the whole mapped allocation.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for IpcMapping {
    fn drop(&mut self) {
        if self.ctx.bind().is_ok() {
            // SAFETY: balances the successful open; copies into the mapping
            // are finished before its owner drops it.
            unsafe { sys::cuIpcCloseMemHandle(self.base) };
        }
    }
}

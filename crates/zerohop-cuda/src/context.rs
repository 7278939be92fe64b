use crate::error::check;
use crate::{Driver, Result};
use cudarc::driver::sys;
use std::sync::Arc;

/// The primary context of one device, retained for as long as this lives.
///
/// Shared by `Arc`; every wrapper binds it before its driver calls, because
/// the driver's "current context" is per thread.
#[derive(Debug)]
pub struct Context {
    ordinal: usize,
    device: sys::CUdevice,
    raw: sys::CUcontext,
}

// SAFETY: a primary context handle may be used from any thread; the driver
// serialises what needs it. We never hand out the raw pointer mutably.
unsafe impl Send for Context {}
// SAFETY: as above; all methods take `&self` and only pass the handle on.
unsafe impl Sync for Context {}

impl Context {
    /// Retains the primary context of device `ordinal`.
    pub fn new(ordinal: usize) -> Result<Arc<Context>> {
        let driver = Driver::get()?;
        let device = driver.device(ordinal)?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: `device` is valid; writes one handle.
        check(
            unsafe { sys::cuDevicePrimaryCtxRetain(&mut raw, device) },
            "cuDevicePrimaryCtxRetain",
        )?;
        let ctx = Context {
            ordinal,
            device,
            raw,
        };
        ctx.bind()?;
        Ok(Arc::new(ctx))
    }

    /// Device ordinal of this context.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// The (major, minor) compute capability of this context's device.
    pub fn compute_capability(&self) -> Result<(i32, i32)> {
        crate::driver::compute_capability(self.device)
    }

    /// Makes this the calling thread's current context. Cheap (a
    /// thread-local write in the driver), so every wrapper calls it rather
    /// than caching which context a thread has.
    pub fn bind(&self) -> Result<()> {
        // SAFETY: `raw` is a retained primary context, alive while `self` is.
        check(unsafe { sys::cuCtxSetCurrent(self.raw) }, "cuCtxSetCurrent")
    }

    /// Free and total device memory, in bytes.
    pub fn memory_info(&self) -> Result<(u64, u64)> {
        self.bind()?;
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: writes two integers; a context is current.
        check(
            unsafe { sys::cuMemGetInfo_v2(&mut free, &mut total) },
            "cuMemGetInfo",
        )?;
        Ok((free as u64, total as u64))
    }

    /// The per-thread stack size kernels get, in bytes. The context keeps
    /// that much device memory aside for every thread the device can run
    /// at once, whether or not a kernel needs it: 264 MiB of an H200 at the
    /// default of 1 KiB (`bench/probe/context_memory.py`).
    pub fn thread_stack_bytes(&self) -> Result<usize> {
        self.bind()?;
        let mut bytes = 0usize;
        // SAFETY: writes one integer; a context is current.
        check(
            unsafe { sys::cuCtxGetLimit(&mut bytes, sys::CUlimit::CU_LIMIT_STACK_SIZE) },
            "cuCtxGetLimit(CU_LIMIT_STACK_SIZE)",
        )?;
        Ok(bytes)
    }

    /// Sets the per-thread stack size, and with it the memory kept aside
    /// (see [`thread_stack_bytes`](Self::thread_stack_bytes)). The driver
    /// still gives a kernel the stack it was compiled to need: 0 keeps only
    /// what launches ask for.
    pub fn set_thread_stack_bytes(&self, bytes: usize) -> Result<()> {
        self.bind()?;
        // SAFETY: plain values; a context is current.
        check(
            unsafe { sys::cuCtxSetLimit(sys::CUlimit::CU_LIMIT_STACK_SIZE, bytes) },
            "cuCtxSetLimit(CU_LIMIT_STACK_SIZE)",
        )
    }

    /// Waits for all work in this context.
    pub fn synchronize(&self) -> Result<()> {
        self.bind()?;
        // SAFETY: no arguments; a context is current.
        check(unsafe { sys::cuCtxSynchronize() }, "cuCtxSynchronize")
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: balances the retain in `new`; every wrapper that uses the
        // context holds an `Arc` to it, so none outlives this.
        unsafe { sys::cuDevicePrimaryCtxRelease_v2(self.device) };
    }
}

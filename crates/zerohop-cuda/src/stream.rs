use crate::error::check;
use crate::memory::DevicePtr;
use crate::{Context, Result};
use cudarc::driver::sys;
use std::sync::Arc;

/// A non-blocking CUDA stream.
#[derive(Debug)]
pub struct Stream {
    ctx: Arc<Context>,
    pub(crate) raw: sys::CUstream,
}

// SAFETY: stream handles may be used from any thread; the driver orders work
// submitted to one stream.
unsafe impl Send for Stream {}
// SAFETY: as above.
unsafe impl Sync for Stream {}

/// Blocks until all work queued so far on a stream someone else owns (a
/// framework's, e.g. PyTorch's current stream) has finished.
///
/// # Safety
/// `raw` must be a live stream of `ctx` (or 0, the legacy default stream).
pub unsafe fn synchronize_foreign_stream(ctx: &Arc<Context>, raw: u64) -> Result<()> {
    ctx.bind()?;
    // SAFETY: the caller vouches for the handle; synchronizing reads nothing
    // else and changes nothing.
    check(
        unsafe { sys::cuStreamSynchronize(raw as sys::CUstream) },
        "cuStreamSynchronize",
    )
}

impl Stream {
    pub fn new(ctx: &Arc<Context>) -> Result<Self> {
        ctx.bind()?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: writes one handle; a context is current.
        check(
            unsafe {
                sys::cuStreamCreate(&mut raw, sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32)
            },
            "cuStreamCreate",
        )?;
        Ok(Stream {
            ctx: ctx.clone(),
            raw,
        })
    }

    /// Queues a host-to-device copy.
    ///
    /// # Safety
    /// `src..src+len` must stay readable and unchanged, and `dst..dst+len`
    /// must be device memory of this context that nothing else touches, until
    /// an event recorded after this call has completed.
    pub unsafe fn copy_h2d(&self, src: *const u8, dst: DevicePtr, len: usize) -> Result<()> {
        self.ctx.bind()?;
        // SAFETY: the caller upholds the lifetime contract above.
        check(
            unsafe { sys::cuMemcpyHtoDAsync_v2(dst, src.cast(), len, self.raw) },
            "cuMemcpyHtoDAsync",
        )
    }

    /// Queues a device-to-host copy.
    ///
    /// # Safety
    /// As [`Stream::copy_h2d`], with `dst` host memory that stays writable
    /// and untouched by others until the copy's event completes.
    pub unsafe fn copy_d2h(&self, src: DevicePtr, dst: *mut u8, len: usize) -> Result<()> {
        self.ctx.bind()?;
        // SAFETY: the caller upholds the lifetime contract above.
        check(
            unsafe { sys::cuMemcpyDtoHAsync_v2(dst.cast(), src, len, self.raw) },
            "cuMemcpyDtoHAsync",
        )
    }

    /// Blocks until all work queued so far has completed.
    pub fn synchronize(&self) -> Result<()> {
        self.ctx.bind()?;
        // SAFETY: `raw` is a live stream of this context.
        check(
            unsafe { sys::cuStreamSynchronize(self.raw) },
            "cuStreamSynchronize",
        )
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        if self.ctx.bind().is_ok() {
            // SAFETY: destroyed once; queued work still completes per the driver.
            unsafe { sys::cuStreamDestroy_v2(self.raw) };
        }
    }
}

/// A reusable completion marker, recorded on a stream.
#[derive(Debug)]
pub struct Event {
    ctx: Arc<Context>,
    raw: sys::CUevent,
    timing: bool,
}

// SAFETY: event handles may be recorded and queried from any thread.
unsafe impl Send for Event {}
// SAFETY: as above.
unsafe impl Sync for Event {}

impl Event {
    /// An event without timing (cheapest to record and query).
    pub fn new(ctx: &Arc<Context>) -> Result<Self> {
        Self::create(ctx, false)
    }

    /// An event that can measure elapsed time against another.
    pub fn timed(ctx: &Arc<Context>) -> Result<Self> {
        Self::create(ctx, true)
    }

    fn create(ctx: &Arc<Context>, timing: bool) -> Result<Self> {
        ctx.bind()?;
        // Blocking sync: a thread waiting on an event sleeps instead of
        // spinning, leaving the CPU to the threads that copy.
        let mut flags = sys::CUevent_flags::CU_EVENT_BLOCKING_SYNC as u32;
        if !timing {
            flags |= sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
        }
        let mut raw = std::ptr::null_mut();
        // SAFETY: writes one handle; a context is current.
        check(
            unsafe { sys::cuEventCreate(&mut raw, flags) },
            "cuEventCreate",
        )?;
        Ok(Event {
            ctx: ctx.clone(),
            raw,
            timing,
        })
    }

    /// Marks the point after all work queued so far on `stream`.
    pub fn record(&self, stream: &Stream) -> Result<()> {
        self.ctx.bind()?;
        // SAFETY: both handles are live and belong to the same context.
        check(
            unsafe { sys::cuEventRecord(self.raw, stream.raw) },
            "cuEventRecord",
        )
    }

    /// Blocks until the recorded work has completed.
    pub fn synchronize(&self) -> Result<()> {
        self.ctx.bind()?;
        // SAFETY: `raw` is a live event.
        check(
            unsafe { sys::cuEventSynchronize(self.raw) },
            "cuEventSynchronize",
        )
    }

    /// Whether the recorded work has completed, without waiting.
    pub fn query(&self) -> Result<bool> {
        // SAFETY: `raw` is a live event; the call only reads its state.
        // (Unlike the other calls here it does not bind the context first:
        // it is made in a polling loop, always by the thread that recorded
        // the event, whose context is current.)
        match unsafe { sys::cuEventQuery(self.raw) } {
            sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            status => check(status, "cuEventQuery").map(|()| true),
        }
    }

    /// Milliseconds between `start` and this event (both timed and completed).
    pub fn elapsed_ms_since(&self, start: &Event) -> Result<f32> {
        debug_assert!(
            self.timing && start.timing,
            "elapsed time needs timed events"
        );
        self.ctx.bind()?;
        let mut ms = 0f32;
        // SAFETY: writes one float; both events are live.
        check(
            unsafe { sys::cuEventElapsedTime_v2(&mut ms, start.raw, self.raw) },
            "cuEventElapsedTime",
        )?;
        Ok(ms)
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        if self.ctx.bind().is_ok() {
            // SAFETY: destroyed exactly once.
            unsafe { sys::cuEventDestroy_v2(self.raw) };
        }
    }
}

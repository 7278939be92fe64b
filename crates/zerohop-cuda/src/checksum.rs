//! XXH3-64 of device memory, computed by a kernel on the GPU
//! (`kernels/xxh3.cu`, embedded as PTX and compiled by the driver on first
//! use), so checksumming a save costs the host no reads of the data.

use crate::error::{check, CudaError, CudaErrorKind};
use crate::memory::{DeviceAllocation, DevicePtr};
use crate::{Context, Result, Stream};
use cudarc::driver::sys;
use std::ffi::c_void;
use std::sync::Arc;

/// The kernel's PTX, NUL-terminated as `cuModuleLoadData` wants it.
const PTX: &str = concat!(include_str!("../kernels/xxh3.ptx"), "\0");

/// Inputs shorter than this take XXH3's short-input paths, which the
/// kernel leaves to the host.
pub const XXH3_KERNEL_MIN_BYTES: u64 = 241;

/// Chunks per launch: bounds the descriptor upload and the grid.
const JOBS_PER_LAUNCH: usize = 1 << 20;
/// Threads per block: 8 warps, one chunk each.
const BLOCK_THREADS: u32 = 256;

/// A byte range of device memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceRange {
    pub ptr: DevicePtr,
    pub len: u64,
}

/// `struct Piece` of the kernel.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct Piece {
    addr: u64,
    start: u64,
    len: u64,
}

/// `struct Job` of the kernel.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct Job {
    len: u64,
    first: u64,
    count: u64,
}

/// The loaded kernel of one context.
#[derive(Debug)]
pub struct Xxh3Kernel {
    ctx: Arc<Context>,
    module: sys::CUmodule,
    function: sys::CUfunction,
}

// SAFETY: module and function handles may be used from any thread of the
// process; every use binds the context first.
unsafe impl Send for Xxh3Kernel {}
// SAFETY: as above; launches only read the handles.
unsafe impl Sync for Xxh3Kernel {}

impl Xxh3Kernel {
    /// Loads the kernel into `ctx` (the driver compiles the PTX for this GPU).
    pub fn load(ctx: &Arc<Context>) -> Result<Self> {
        ctx.bind()?;
        let mut module = std::ptr::null_mut();
        // SAFETY: PTX is a NUL-terminated image that lives for the program;
        // writes one handle.
        check(
            unsafe { sys::cuModuleLoadData(&mut module, PTX.as_ptr().cast()) },
            "cuModuleLoadData",
        )?;
        let mut function = std::ptr::null_mut();
        // SAFETY: `module` was just loaded; the name is NUL-terminated.
        let got = check(
            unsafe { sys::cuModuleGetFunction(&mut function, module, c"zerohop_xxh3_64".as_ptr()) },
            "cuModuleGetFunction",
        );
        let kernel = Xxh3Kernel {
            ctx: ctx.clone(),
            module,
            function,
        };
        got.map(|()| kernel)
    }

    /// XXH3-64 (seed 0) of each chunk, a chunk being its ranges' bytes one
    /// after another. Every chunk must hold at least
    /// [`XXH3_KERNEL_MIN_BYTES`]. Blocks until the values are back.
    ///
    /// # Safety
    /// Every range must be device memory of this context (or mapped into
    /// it) that stays allocated, and that nothing writes, until this returns.
    pub unsafe fn hash(&self, chunks: &[Vec<DeviceRange>]) -> Result<Vec<u64>> {
        let mut out = Vec::with_capacity(chunks.len());
        if chunks.is_empty() {
            return Ok(out);
        }
        let stream = Stream::new(&self.ctx)?;
        for batch in chunks.chunks(JOBS_PER_LAUNCH) {
            // SAFETY: forwarded from the caller.
            out.extend(unsafe { self.hash_batch(&stream, batch) }?);
        }
        Ok(out)
    }

    /// # Safety
    /// As [`Xxh3Kernel::hash`].
    unsafe fn hash_batch(&self, stream: &Stream, chunks: &[Vec<DeviceRange>]) -> Result<Vec<u64>> {
        let (jobs, pieces) = describe(chunks)?;
        let jobs_bytes = std::mem::size_of_val(jobs.as_slice());
        let pieces_bytes = std::mem::size_of_val(pieces.as_slice());
        let out_bytes = jobs.len() * 8;
        let scratch = DeviceAllocation::new(&self.ctx, jobs_bytes + pieces_bytes + out_bytes)?;
        let (jobs_at, pieces_at) = (scratch.ptr(), scratch.ptr() + jobs_bytes as u64);
        let out_at = pieces_at + pieces_bytes as u64;
        // SAFETY: both copies land inside `scratch` (sized for them) from
        // host vectors that live until the stream is synchronized below;
        // queued on the launch's own stream, they finish before the kernel
        // reads them (a blocking copy from pageable memory may return
        // before its bytes arrive, and runs on another stream).
        unsafe {
            stream.copy_h2d(jobs.as_ptr().cast(), jobs_at, jobs_bytes)?;
            stream.copy_h2d(pieces.as_ptr().cast(), pieces_at, pieces_bytes)?;
        }
        let njobs = jobs.len() as u64;
        let mut params: [*mut c_void; 4] = [
            (&jobs_at as *const u64).cast_mut().cast(),
            (&njobs as *const u64).cast_mut().cast(),
            (&pieces_at as *const u64).cast_mut().cast(),
            (&out_at as *const u64).cast_mut().cast(),
        ];
        let warps_per_block = (BLOCK_THREADS / 32) as usize;
        let grid = jobs.len().div_ceil(warps_per_block) as u32;
        self.ctx.bind()?;
        // SAFETY: the parameters match the kernel's signature (three device
        // pointers into `scratch` and a count) and outlive the call, which
        // copies them; the kernel reads only the described ranges (the
        // caller keeps them allocated) and writes `njobs` words at `out_at`.
        check(
            unsafe {
                sys::cuLaunchKernel(
                    self.function,
                    grid,
                    1,
                    1,
                    BLOCK_THREADS,
                    1,
                    1,
                    0,
                    stream.raw,
                    params.as_mut_ptr(),
                    std::ptr::null_mut(),
                )
            },
            "cuLaunchKernel",
        )?;
        stream.synchronize()?;
        let mut words = vec![0u8; out_bytes];
        scratch.read(jobs_bytes + pieces_bytes, &mut words)?;
        Ok(words
            .chunks_exact(8)
            .map(|w| u64::from_le_bytes(w.try_into().expect("8 bytes")))
            .collect())
    }
}

/// The kernel's descriptors of `chunks`, checked.
fn describe(chunks: &[Vec<DeviceRange>]) -> Result<(Vec<Job>, Vec<Piece>)> {
    let mut jobs = Vec::with_capacity(chunks.len());
    let mut pieces = Vec::new();
    for ranges in chunks {
        let mut job = Job {
            len: 0,
            first: pieces.len() as u64,
            count: 0,
        };
        for r in ranges.iter().filter(|r| r.len > 0) {
            if r.ptr.checked_add(r.len).is_none() {
                return Err(out_of_range("a device range wraps the address space"));
            }
            pieces.push(Piece {
                addr: r.ptr,
                start: job.len,
                len: r.len,
            });
            job.len += r.len;
            job.count += 1;
        }
        if job.len < XXH3_KERNEL_MIN_BYTES {
            return Err(out_of_range(format!(
                "a chunk of {} bytes is too short for the XXH3 kernel (at least {XXH3_KERNEL_MIN_BYTES})",
                job.len
            )));
        }
        jobs.push(job);
    }
    Ok((jobs, pieces))
}

fn out_of_range(message: impl Into<String>) -> CudaError {
    CudaError::new(CudaErrorKind::OutOfRange, "xxh3 kernel", message)
}

impl Drop for Xxh3Kernel {
    fn drop(&mut self) {
        if self.ctx.bind().is_ok() {
            // SAFETY: loaded once in `load`, unloaded once here; no launch is
            // in flight (`hash` waits for its own).
            unsafe { sys::cuModuleUnload(self.module) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptors_skip_empty_ranges_and_refuse_short_chunks() {
        let r = |ptr, len| DeviceRange { ptr, len };
        let (jobs, pieces) =
            describe(&[vec![r(0x1000, 200), r(0x9000, 0), r(0x5003, 100)]]).unwrap();
        assert_eq!((jobs[0].len, jobs[0].first, jobs[0].count), (300, 0, 2));
        assert_eq!((pieces[1].addr, pieces[1].start), (0x5003, 200));
        let short = describe(&[vec![r(0x1000, 240)]]).unwrap_err();
        assert_eq!(*short.kind(), CudaErrorKind::OutOfRange);
        assert!(describe(&[vec![r(u64::MAX - 10, 300)]]).is_err());
    }
}

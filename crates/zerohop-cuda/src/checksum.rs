//! XXH3-64 of device memory, computed by a kernel on the GPU
//! (`kernels/xxh3.cu`), so checksumming a save costs the host no reads of
//! the data. The kernel is embedded as SASS for sm_80, sm_90 and sm_100,
//! which loads at once, and as PTX, which the driver compiles on first use
//! (0.43 s on an H200) for other GPUs; `scripts/build-kernels.sh` makes both.

use crate::error::{check, CudaError, CudaErrorKind};
use crate::memory::{DeviceAllocation, DevicePtr};
use crate::{Context, Result, Stream};
use cudarc::driver::sys;
use std::ffi::c_void;
use std::fmt;
use std::sync::Arc;

/// The kernel's PTX, NUL-terminated as `cuModuleLoadData` wants it.
const PTX: &str = concat!(include_str!("../kernels/xxh3.ptx"), "\0");

/// The kernel's SASS for one architecture: a cubin, built from [`PTX`].
struct Cubin {
    /// `XY` of sm_XY.
    sm: u32,
    image: &'static Aligned<[u8]>,
}

/// Bytes aligned as an ELF64 image's fields, which the driver may read in
/// place.
#[repr(C, align(8))]
struct Aligned<T: ?Sized>(T);

static CUBINS: [Cubin; 3] = [
    Cubin {
        sm: 80,
        image: &Aligned(*include_bytes!("../kernels/xxh3.sm_80.cubin")),
    },
    Cubin {
        sm: 90,
        image: &Aligned(*include_bytes!("../kernels/xxh3.sm_90.cubin")),
    },
    Cubin {
        sm: 100,
        image: &Aligned(*include_bytes!("../kernels/xxh3.sm_100.cubin")),
    },
];

/// Which of its images the kernel was loaded from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelImage {
    /// Machine code built ahead for sm_`sm` (e.g. 90): nothing to compile.
    Sass { sm: u32 },
    /// The PTX, compiled by the driver at load.
    Ptx,
}

impl fmt::Display for KernelImage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KernelImage::Sass { sm } => write!(f, "SASS sm_{sm}"),
            KernelImage::Ptx => f.write_str("PTX (compiled by the driver)"),
        }
    }
}

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
    image: KernelImage,
}

// SAFETY: module and function handles may be used from any thread of the
// process; every use binds the context first.
unsafe impl Send for Xxh3Kernel {}
// SAFETY: as above; launches only read the handles.
unsafe impl Sync for Xxh3Kernel {}

impl Xxh3Kernel {
    /// Loads the kernel into `ctx`: the SASS built for its GPU where there
    /// is one, else the PTX, which the driver compiles.
    pub fn load(ctx: &Arc<Context>) -> Result<Self> {
        let cc = ctx.compute_capability()?;
        ctx.bind()?;
        let (module, image) = load_module(cc)?;
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
            image,
        };
        got.map(|()| kernel)
    }

    /// Which image was loaded: SASS, or PTX that the driver compiled.
    pub fn image(&self) -> KernelImage {
        self.image
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

/// The SASS for a device of compute capability `(major, minor)`, if any: a
/// cubin for sm_XY runs on devices of major X and minor Y or more, and the
/// highest of those is the closest to the device.
fn sass_for((major, minor): (i32, i32)) -> Option<&'static Cubin> {
    CUBINS
        .iter()
        .filter(|c| (c.sm / 10) as i32 == major && (c.sm % 10) as i32 <= minor)
        .max_by_key(|c| c.sm)
}

/// Loads the SASS for `cc` where there is one and the driver takes it, else
/// the PTX.
fn load_module(cc: (i32, i32)) -> Result<(sys::CUmodule, KernelImage)> {
    if let Some(cubin) = sass_for(cc) {
        match load_image(Some(cubin)) {
            Ok(module) => return Ok((module, KernelImage::Sass { sm: cubin.sm })),
            // A driver may still refuse a cubin (one older than the ptxas
            // that built it, say); the PTX loads wherever the kernel can run.
            Err(e) if refused(&e) => {}
            Err(e) => return Err(e),
        }
    }
    Ok((load_image(None)?, KernelImage::Ptx))
}

/// Loads `cubin`, or the PTX for `None`, into the current context.
fn load_image(cubin: Option<&'static Cubin>) -> Result<sys::CUmodule> {
    let data = cubin.map_or(PTX.as_ptr(), |c| c.image.0.as_ptr());
    let mut module = std::ptr::null_mut();
    // SAFETY: `data` is a whole embedded image that lives for the program:
    // a cubin (an ELF file, whose headers give its extent) or NUL-terminated
    // PTX; writes one handle.
    check(
        unsafe { sys::cuModuleLoadData(&mut module, data.cast()) },
        "cuModuleLoadData",
    )?;
    Ok(module)
}

/// Whether the driver refused an image as not for this GPU or not readable.
fn refused(e: &CudaError) -> bool {
    use sys::CUresult::{CUDA_ERROR_INVALID_IMAGE, CUDA_ERROR_NO_BINARY_FOR_GPU};
    [CUDA_ERROR_NO_BINARY_FOR_GPU, CUDA_ERROR_INVALID_IMAGE]
        .iter()
        .any(|&r| *e.kind() == CudaErrorKind::Driver(r as u32))
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

    #[test]
    fn a_device_gets_the_highest_sass_of_its_major_version_or_the_ptx() {
        let sass = |sm| KernelImage::Sass { sm };
        let image = |cc| sass_for(cc).map_or(KernelImage::Ptx, |c| sass(c.sm));
        for (cc, want) in [
            ((7, 5), KernelImage::Ptx),
            ((8, 0), sass(80)),
            ((8, 6), sass(80)),
            ((8, 9), sass(80)),
            ((9, 0), sass(90)),
            ((10, 0), sass(100)),
            ((10, 3), sass(100)),
            ((12, 0), KernelImage::Ptx),
        ] {
            assert_eq!(image(cc), want, "compute capability {cc:?}");
        }
        assert_eq!(sass(90).to_string(), "SASS sm_90");
        assert_eq!(KernelImage::Ptx.to_string(), "PTX (compiled by the driver)");
    }
}

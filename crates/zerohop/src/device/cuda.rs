use super::{
    wait_for_buffer_streams, CopyQueue, Device, DeviceAddr, DeviceBuffer, DeviceChecksums,
    DeviceKind, Fence, HostPin, ReservedMemory, StagingMemory,
};
use crate::{Error, Result};
use std::sync::{Arc, Mutex, OnceLock};
use zerohop_cuda::{
    Context, CudaError, DeviceAllocation, DeviceRange, Driver, Event, HostRegistration,
    PinnedBuffer, PinnedPieces, Reservation, Stream, Xxh3Kernel, XXH3_KERNEL_MIN_BYTES,
};

/// The driver's CUDA version ("13.0") and the number of GPUs; an error
/// (never a panic) where no driver is installed.
pub fn cuda_driver_summary() -> Result<(String, usize)> {
    let driver = Driver::get()?;
    let (major, minor) = driver.version();
    Ok((format!("{major}.{minor}"), driver.device_count()?))
}

/// A CUDA GPU through its primary context.
pub struct CudaDevice {
    ctx: Arc<Context>,
    description: String,
    /// The checksum kernel, loaded on first use.
    xxh3: OnceLock<std::result::Result<Xxh3Kernel, CudaError>>,
}

impl CudaDevice {
    /// Opens GPU `ordinal`; a typed error (never a panic) without a driver.
    pub fn open(ordinal: usize) -> Result<Self> {
        let driver = Driver::get()?;
        let info = driver.device_info(ordinal)?;
        let ctx = Context::new(ordinal)?;
        let description = format!(
            "cuda:{ordinal} {} ({:.0} GiB, sm_{}{}, PCI {})",
            info.name,
            info.total_memory as f64 / (1u64 << 30) as f64,
            info.compute_capability.0,
            info.compute_capability.1,
            info.pci_bus_id
        );
        Ok(CudaDevice {
            ctx,
            description,
            xxh3: OnceLock::new(),
        })
    }

    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    /// The checksum kernel, loaded (compiled by the driver) on first use.
    fn xxh3_kernel(&self) -> Result<&Xxh3Kernel> {
        self.xxh3
            .get_or_init(|| Xxh3Kernel::load(&self.ctx))
            .as_ref()
            .map_err(|e| Error::from(e.clone()).context("the checksum kernel did not load"))
    }
}

impl Device for CudaDevice {
    fn kind(&self) -> DeviceKind {
        DeviceKind::Cuda(self.ctx.ordinal())
    }

    fn describe(&self) -> String {
        self.description.clone()
    }

    fn alloc(&self, len: usize) -> Result<DeviceBuffer> {
        let alloc = DeviceAllocation::new(&self.ctx, len)?;
        Ok(DeviceBuffer::owned(
            alloc.ptr(),
            len,
            self.kind(),
            Arc::new(alloc),
        ))
    }

    fn alloc_staging(&self, len: usize) -> Result<Box<dyn StagingMemory>> {
        Ok(Box::new(PinnedStaging(PinnedBuffer::new(&self.ctx, len)?)))
    }

    fn alloc_staging_pool(&self, len: usize) -> Result<Box<dyn StagingMemory>> {
        Ok(Box::new(PinnedPool(PinnedPieces::new(
            &self.ctx,
            len,
            STAGING_PIN_PIECE,
        )?)))
    }

    fn new_queue(&self) -> Result<Box<dyn CopyQueue>> {
        Ok(Box::new(CudaQueue {
            stream: Stream::new(&self.ctx)?,
            ctx: self.ctx.clone(),
            spare_events: Arc::default(),
        }))
    }

    fn copies_by_dma(&self) -> bool {
        true
    }

    fn pins_staging(&self) -> bool {
        true
    }

    unsafe fn pin_host(&self, ptr: *const u8, len: usize) -> Result<Option<Box<dyn HostPin>>> {
        // SAFETY: forwarded contract: the caller keeps the range mapped while
        // the pin lives and outlives its copies.
        let reg = unsafe { HostRegistration::new(&self.ctx, ptr, len, true) }?;
        Ok(Some(Box::new(Registered { _registration: reg })))
    }

    unsafe fn wait_for_stream(&self, stream: u64) -> Result<()> {
        // SAFETY: forwarded contract: a live stream of this device's context.
        unsafe { zerohop_cuda::synchronize_foreign_stream(&self.ctx, stream) }.map_err(Error::from)
    }

    unsafe fn borrow(
        &self,
        addr: DeviceAddr,
        len: usize,
        stream: Option<u64>,
    ) -> Result<DeviceBuffer> {
        let kind = self.kind();
        // SAFETY: forwarded contract.
        Ok(unsafe {
            match stream {
                Some(s) => DeviceBuffer::borrowed_on_stream(addr, len, kind, s),
                None => DeviceBuffer::borrowed(addr, len, kind),
            }
        })
    }

    fn checksums(&self) -> Option<&dyn DeviceChecksums> {
        Some(self)
    }

    fn reserve(&self, len: usize) -> Result<Option<Box<dyn ReservedMemory>>> {
        Ok(Some(Box::new(GpuReservation(Reservation::new(
            &self.ctx, len,
        )?))))
    }

    fn thread_stack_bytes(&self) -> Result<Option<usize>> {
        Ok(Some(self.ctx.thread_stack_bytes()?))
    }

    fn set_thread_stack_bytes(&self, bytes: usize) -> Result<()> {
        Ok(self.ctx.set_thread_stack_bytes(bytes)?)
    }

    fn read_back(&self, src: &DeviceBuffer, offset: usize, dst: &mut [u8]) -> Result<()> {
        let src = src.slice(offset, dst.len())?;
        // Borrowed buffers have no `DeviceAllocation` to call; copy through a
        // synchronous stream copy into pinned memory instead.
        let mut pinned = PinnedBuffer::new(&self.ctx, dst.len())?;
        let stream = Stream::new(&self.ctx)?;
        // SAFETY: the source range is `src` (a checked slice), the pinned
        // destination is ours, and we synchronize before reading it.
        unsafe { stream.copy_d2h(src.addr(), pinned.as_mut_ptr(), dst.len())? };
        stream.synchronize()?;
        // SAFETY: `pinned` holds `dst.len()` initialised bytes after the sync.
        dst.copy_from_slice(unsafe { std::slice::from_raw_parts(pinned.as_ptr(), dst.len()) });
        Ok(())
    }

    fn write_from_host(&self, dst: &DeviceBuffer, offset: usize, src: &[u8]) -> Result<()> {
        let dst = dst.slice(offset, src.len())?;
        let mut pinned = PinnedBuffer::new(&self.ctx, src.len())?;
        // SAFETY: `pinned` holds `src.len()` writable bytes that we own.
        unsafe { std::slice::from_raw_parts_mut(pinned.as_mut_ptr(), src.len()) }
            .copy_from_slice(src);
        let stream = Stream::new(&self.ctx)?;
        // SAFETY: the destination is a checked slice of a live buffer, the
        // source our pinned copy, and we synchronize before dropping either.
        unsafe { stream.copy_h2d(pinned.as_ptr(), dst.addr(), src.len())? };
        stream.synchronize()?;
        Ok(())
    }
}

impl DeviceChecksums for CudaDevice {
    fn ready(&self) -> Result<()> {
        self.xxh3_kernel().map(|_| ())
    }

    fn xxh3_64(&self, chunks: &[Vec<DeviceBuffer>]) -> Result<Vec<u64>> {
        let kernel = self.xxh3_kernel()?;
        if let Some(b) = chunks.iter().flatten().find(|b| b.device() != self.kind()) {
            return Err(Error::invalid(format!(
                "a buffer of {} cannot be hashed on {}",
                b.device(),
                self.kind()
            )));
        }
        wait_for_buffer_streams(self, chunks.iter().flatten())?;
        let len = |c: &Vec<DeviceBuffer>| c.iter().map(|b| b.len() as u64).sum::<u64>();
        // XXH3 hashes short inputs differently; the kernel does long ones
        // only, and short chunks (file tails) are few and small.
        let long: Vec<Vec<DeviceRange>> = chunks
            .iter()
            .filter(|c| len(c) >= XXH3_KERNEL_MIN_BYTES)
            .map(|c| {
                c.iter()
                    .map(|b| DeviceRange {
                        ptr: b.addr(),
                        len: b.len() as u64,
                    })
                    .collect()
            })
            .collect();
        // SAFETY: every range is a `DeviceBuffer` of this device (checked
        // above), memory that stays allocated while `chunks` holds it (owned ones by their
        // allocation, borrowed ones as their creators vouched); the kernel
        // only reads it.
        let mut on_gpu = unsafe { kernel.hash(&long) }?.into_iter();
        let mut sums = Vec::with_capacity(chunks.len());
        for c in chunks {
            if len(c) >= XXH3_KERNEL_MIN_BYTES {
                sums.push(on_gpu.next().expect("one sum per long chunk"));
                continue;
            }
            let mut bytes = Vec::new();
            for b in c {
                let at = bytes.len();
                bytes.resize(at + b.len(), 0);
                self.read_back(b, 0, &mut bytes[at..])?;
            }
            sums.push(twox_hash::XxHash3_64::oneshot(&bytes));
        }
        Ok(sums)
    }
}

/// Bytes a staging pool's pinner registers at a time: four 4 MiB slots,
/// the first slots of four workers (see `StagingPool::worker_shares`).
const STAGING_PIN_PIECE: usize = 16 << 20;

struct PinnedPool(PinnedPieces);

impl StagingMemory for PinnedPool {
    fn as_mut_ptr(&mut self) -> *mut u8 {
        self.0.as_mut_ptr()
    }
    fn len(&self) -> usize {
        self.0.len()
    }
    fn wait_ready(&self, offset: usize, len: usize) -> Result<()> {
        Ok(self.0.wait_pinned(offset, len)?)
    }
    fn is_ready(&self, offset: usize, len: usize) -> bool {
        self.0.is_pinned(offset, len)
    }
    fn has_failed(&self) -> bool {
        self.0.has_failed()
    }
}

struct PinnedStaging(PinnedBuffer);

impl StagingMemory for PinnedStaging {
    fn as_mut_ptr(&mut self) -> *mut u8 {
        self.0.as_mut_ptr()
    }
    fn len(&self) -> usize {
        self.0.len()
    }
}

/// Unregisters on drop.
struct Registered {
    _registration: HostRegistration,
}
impl HostPin for Registered {}

struct CudaQueue {
    ctx: Arc<Context>,
    stream: Stream,
    /// Events whose fences were dropped, kept for reuse: creating an event
    /// per window cost measurable driver time on hot loads.
    spare_events: Arc<Mutex<Vec<Event>>>,
}

impl CopyQueue for CudaQueue {
    unsafe fn copy_to_device(&self, src: *const u8, dst: DeviceAddr, len: usize) -> Result<()> {
        // SAFETY: forwarded contract of `CopyQueue::copy_to_device`.
        unsafe { self.stream.copy_h2d(src, dst, len) }.map_err(Error::from)
    }

    unsafe fn copy_to_host(&self, src: DeviceAddr, dst: *mut u8, len: usize) -> Result<()> {
        // SAFETY: forwarded contract of `CopyQueue::copy_to_host`.
        unsafe { self.stream.copy_d2h(src, dst, len) }.map_err(Error::from)
    }

    fn record(&self) -> Result<Box<dyn Fence>> {
        let spare = self
            .spare_events
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop();
        let event = match spare {
            Some(e) => e,
            None => Event::new(&self.ctx)?,
        };
        // Re-recording an event is allowed whatever it recorded before: its
        // last fence was dropped, so nobody waits on the old point.
        event.record(&self.stream)?;
        Ok(Box::new(CudaFence {
            event: Some(event),
            spare: self.spare_events.clone(),
        }))
    }
}

impl Drop for CudaQueue {
    fn drop(&mut self) {
        // Copies queued before an error may have no fence: wait for them all
        // before their host memory can be reused. Errors were reported by
        // the fences; nothing more to say here.
        let _ = self.stream.synchronize();
    }
}

struct CudaFence {
    /// `Some` until dropped.
    event: Option<Event>,
    spare: Arc<Mutex<Vec<Event>>>,
}

/// How long a fence's waiter polls before it sleeps. A worker waits for its
/// own slot's copy, usually well under a millisecond; a sleeping waiter is
/// woken tens of microseconds late, on a cold core. In a bare probe of the
/// mapped route on the reference machine, polling ran at 51.9 - 52.8 GB/s
/// against 49.8 - 51.5 with blocking waits (bench/probe/hot_copy.cu on
/// the H200); the engine's own gain was
/// within the noise of its runs.
const FENCE_POLL: std::time::Duration = std::time::Duration::from_millis(2);

impl Fence for CudaFence {
    fn wait(&self) -> Result<()> {
        let event = self.event.as_ref().expect("a live fence has its event");
        let start = std::time::Instant::now();
        while start.elapsed() < FENCE_POLL {
            if event.query()? {
                return Ok(());
            }
            std::hint::spin_loop();
        }
        event.synchronize().map_err(Error::from)
    }

    fn passed(&self) -> Result<bool> {
        let event = self.event.as_ref().expect("a live fence has its event");
        event.query().map_err(Error::from)
    }
}

impl Drop for CudaFence {
    fn drop(&mut self) {
        if let Some(e) = self.event.take() {
            self.spare.lock().unwrap_or_else(|p| p.into_inner()).push(e);
        }
    }
}

/// GPU addresses whose memory can be released and re-created in place
/// (the driver's virtual memory management).
struct GpuReservation(Reservation);

impl ReservedMemory for GpuReservation {
    fn addr(&self) -> DeviceAddr {
        self.0.ptr()
    }

    fn len(&self) -> usize {
        self.0.len()
    }

    fn is_backed(&self) -> bool {
        self.0.is_backed()
    }

    fn back(&mut self) -> Result<()> {
        self.0.back().map_err(Error::from)
    }

    fn release(&mut self) -> Result<()> {
        self.0.release().map_err(Error::from)
    }
}

//! A device simulated in host memory. Copies are queued and done later by a
//! worker thread per queue, after an optional random delay, so a pipeline
//! that reuses a staging slot before its copy finished loads wrong bytes and
//! fails its tests. Every copy is checked against the live allocations: a
//! copy outside them is an error, never a stray write.

use crate::device::{
    wait_for_buffer_streams, CopyQueue, Device, DeviceAddr, DeviceBuffer, DeviceChecksums,
    DeviceKind, Fence, HostMemory, HostPin, HostReservation, ReservedMemory, StagingMemory,
};
use crate::{Error, ErrorKind, Result};
use std::collections::BTreeMap;
use std::hash::Hasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// Behaviour of the simulated device.
#[derive(Debug, Clone, Default)]
pub struct SimConfig {
    /// Each copy waits a random time up to this long before it runs.
    pub max_copy_delay: Duration,
    /// The seed of those waits: `None` takes `ZEROHOP_SIM_SEED` from the
    /// environment, else a fresh one. A device with delays prints its seed
    /// (a test's output is shown when it fails), and the same seed gives
    /// every queue the same waits again.
    pub seed: Option<u64>,
    /// The copy with this sequence number (counted from 0 across all queues)
    /// fails, as a broken copy engine would.
    pub fail_copy: Option<u64>,
    /// Queueing the copy with this sequence number (counted from 0 across
    /// all queues) fails at once, as queueing onto a broken stream would;
    /// copies queued before it still run, late.
    pub fail_enqueue: Option<u64>,
    /// Allocations beyond this many bytes in total fail with out-of-memory.
    pub memory_limit: Option<u64>,
    /// Refuse to pin host memory, as a driver may for some mappings.
    pub refuse_pin: bool,
    /// The first this many staging pools (`alloc_staging_pool`) fail to
    /// pin: no range of them is ever ready, and waiting for one fails, as
    /// with a pool whose registration the driver refused.
    pub failing_pools: u64,
    /// Have no checksum kernel, as a device where it cannot load: callers
    /// hash on the host instead.
    pub no_checksum_kernel: bool,
    /// Hashing fails, as a kernel launch might (the device still says it
    /// hashes).
    pub fail_checksums: bool,
    /// Claim DMA copies, so engines give it the page-cache DMA route. Its
    /// copies are still CPU copies: only for tests where no file changes
    /// under a load (a truncated file would crash the process).
    pub copies_by_dma: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Region {
    Device,
    Staging,
    Pinned,
}

/// Bytes from a simulated pool's start that were asked about (the
/// simulated pinning catches up to each question), and those whose use was
/// granted (by `wait_ready`, or an `is_ready` answering true).
#[derive(Default)]
struct PoolProgress {
    asked: u64,
    granted: u64,
}

#[derive(Default)]
struct Registry {
    /// start address -> (length, what it is)
    ranges: BTreeMap<u64, (u64, Region)>,
    /// Staging pools (`alloc_staging_pool`), by start address: how far
    /// from their start they are "pinned", as a GPU's pool is pinned in
    /// pieces after it is handed out.
    pool_ready: BTreeMap<u64, PoolProgress>,
    device_bytes: u64,
}

impl Registry {
    /// Whether `addr..addr+len`, staging memory, may take copies: outside
    /// the pools always, inside one once it was waited for.
    fn ready(&self, addr: u64, len: u64) -> bool {
        match self.pool_ready.range(..=addr).next_back() {
            Some((&start, ready))
                if self.contains(start, addr + len - start, &[Region::Staging]) =>
            {
                addr + len <= start + ready.granted
            }
            _ => true,
        }
    }

    fn contains(&self, addr: u64, len: u64, wanted: &[Region]) -> bool {
        match self.ranges.range(..=addr).next_back() {
            Some((&start, &(rlen, kind))) => {
                wanted.contains(&kind) && addr + len <= start + rlen.max(1)
            }
            None => false,
        }
    }
}

/// Host memory standing in for a GPU.
pub struct SimDevice {
    config: SimConfig,
    registry: Arc<Mutex<Registry>>,
    /// Copies the workers have taken up; numbers them for `fail_copy`.
    copies: Arc<AtomicU64>,
    /// Copies the workers have finished (run, or skipped after a failure).
    done: Arc<AtomicU64>,
    /// Copy requests, including one refused by `fail_enqueue`.
    enqueued: Arc<AtomicU64>,
    /// Copies accepted into a queue.
    accepted: Arc<AtomicU64>,
    /// Queues made so far.
    queues_made: AtomicU64,
    /// Staging pools made so far; numbers them for `failing_pools`.
    pools_made: AtomicU64,
    /// Framework streams waited for, in order (the simulation has no
    /// streams of its own to wait on; tests check the engine asked).
    stream_waits: Mutex<Vec<u64>>,
    /// The per-thread stack size, as a CUDA context keeps one (no memory
    /// is set aside for it here; tests check who changes it).
    thread_stack: AtomicU64,
}

impl SimDevice {
    pub fn new(mut config: SimConfig) -> Self {
        let seed = config.seed.unwrap_or_else(|| {
            std::env::var("ZEROHOP_SIM_SEED")
                .ok()
                .and_then(|s| s.trim().parse().ok())
                .unwrap_or_else(fresh_seed)
        });
        config.seed = Some(seed);
        if !config.max_copy_delay.is_zero() {
            eprintln!(
                "simulated device: seed {seed} (ZEROHOP_SIM_SEED={seed} replays its copy delays)"
            );
        }
        SimDevice {
            config,
            registry: Arc::default(),
            copies: Arc::default(),
            done: Arc::default(),
            enqueued: Arc::default(),
            accepted: Arc::default(),
            queues_made: AtomicU64::new(0),
            pools_made: AtomicU64::new(0),
            stream_waits: Mutex::default(),
            // CUDA's default.
            thread_stack: AtomicU64::new(1024),
        }
    }

    /// The seed of the copy delays (see [`SimConfig::seed`]).
    pub fn seed(&self) -> u64 {
        self.config.seed.expect("set by new")
    }

    /// Copy queues made so far.
    pub fn queues_made(&self) -> u64 {
        self.queues_made.load(Ordering::SeqCst)
    }

    /// Copies accepted into queues so far, and copies the copy workers have
    /// finished so far: equal whenever no copy is still pending.
    pub fn copy_counts(&self) -> (u64, u64) {
        (
            self.accepted.load(Ordering::SeqCst),
            self.done.load(Ordering::SeqCst),
        )
    }

    /// The framework streams transfers waited for so far, in order.
    pub fn stream_waits(&self) -> Vec<u64> {
        self.stream_waits.lock().unwrap().clone()
    }

    fn alloc_region(&self, len: usize, kind: Region) -> Result<HostAlloc> {
        let mut reg = self.registry.lock().unwrap();
        if kind == Region::Device {
            if let Some(limit) = self.config.memory_limit {
                if reg.device_bytes + len as u64 > limit {
                    return Err(Error::new(
                        ErrorKind::OutOfMemory,
                        format!(
                            "out of simulated device memory: asked for {len} bytes, limit {limit}"
                        ),
                    ));
                }
            }
            reg.device_bytes += len as u64;
        }
        let mem = match HostMemory::zeroed(len) {
            Ok(mem) => mem,
            Err(e) => {
                if kind == Region::Device {
                    reg.device_bytes -= len as u64;
                }
                return Err(e);
            }
        };
        reg.ranges.insert(mem.addr(), (len as u64, kind));
        Ok(HostAlloc {
            mem,
            registry: self.registry.clone(),
            device_bytes: kind == Region::Device,
        })
    }
}

/// A registered host allocation; unregistered on drop, before its memory
/// is freed (the field drops after `drop` returns), so no copy can target
/// it once freed.
struct HostAlloc {
    mem: HostMemory,
    registry: Arc<Mutex<Registry>>,
    device_bytes: bool,
}

impl Drop for HostAlloc {
    fn drop(&mut self) {
        let mut reg = self.registry.lock().unwrap();
        reg.ranges.remove(&self.mem.addr());
        if self.device_bytes {
            reg.device_bytes -= self.mem.len() as u64;
        }
    }
}

impl StagingMemory for HostAlloc {
    fn as_mut_ptr(&mut self) -> *mut u8 {
        self.mem.as_mut_ptr()
    }
    fn len(&self) -> usize {
        self.mem.len()
    }
}

/// A staging pool: a copy from or into any of it that was not waited for
/// first fails, as one from memory a GPU has not pinned yet would run as
/// a slow synchronous copy (or, into it, not at all); and a range's bytes
/// are scribbled on as it becomes ready, as a GPU's pool writes each page
/// it makes present, so bytes put there before the wait do not survive.
struct StagingPoolAlloc {
    alloc: HostAlloc,
    /// Its pinning fails (see `SimConfig::failing_pools`).
    failing: bool,
}

impl StagingMemory for StagingPoolAlloc {
    fn as_mut_ptr(&mut self) -> *mut u8 {
        self.alloc.mem.as_mut_ptr()
    }
    fn len(&self) -> usize {
        self.alloc.mem.len()
    }
    fn wait_ready(&self, offset: usize, len: usize) -> Result<()> {
        if self.failing {
            return Err(Error::new(
                ErrorKind::Device,
                "injected failure to pin the staging pool",
            ));
        }
        self.answer(offset + len, true);
        Ok(())
    }
    /// False the first time a range beyond what was asked about is asked
    /// about: asking lets the simulated pinning catch up to it, so
    /// pipelines meet both answers.
    fn is_ready(&self, offset: usize, len: usize) -> bool {
        !self.failing && self.answer(offset + len, false)
    }
    fn has_failed(&self) -> bool {
        self.failing
    }
}

impl StagingPoolAlloc {
    /// Whether the pool up to byte `end` may be used (always, with
    /// `wait`); where it may, and was not granted before, its bytes are
    /// scribbled on first.
    fn answer(&self, end: usize, wait: bool) -> bool {
        let mut reg = self.alloc.registry.lock().unwrap();
        let pool = reg
            .pool_ready
            .get_mut(&self.alloc.mem.addr())
            .expect("registered while the pool lives");
        let end = end as u64;
        if !wait && pool.asked < end {
            pool.asked = end;
            return false;
        }
        let to = (end as usize).min(self.alloc.mem.len());
        for at in (pool.granted as usize..to).step_by(SCRIBBLE_STRIDE) {
            // SAFETY: `at` lies inside the pool, in a range whose use was
            // never granted, which by the `StagingMemory` contract nobody
            // uses yet; whoever uses it asks the registry first, whose lock
            // is held here.
            unsafe { ((self.alloc.mem.addr() as usize + at) as *mut u8).write_volatile(SCRIBBLE) };
        }
        pool.asked = pool.asked.max(end);
        pool.granted = pool.granted.max(end);
        true
    }
}

/// Every this many bytes, a pool's range becoming ready gets [`SCRIBBLE`].
const SCRIBBLE_STRIDE: usize = 4096;
const SCRIBBLE: u8 = 0xA5;

impl Drop for StagingPoolAlloc {
    fn drop(&mut self) {
        let mut reg = self.alloc.registry.lock().unwrap();
        reg.pool_ready.remove(&self.alloc.mem.addr());
    }
}

/// A caller's host range known to the registry (pinned, or borrowed as
/// device memory) until dropped.
struct RegisteredRange {
    start: u64,
    registry: Arc<Mutex<Registry>>,
}
impl HostPin for RegisteredRange {}
impl Drop for RegisteredRange {
    fn drop(&mut self) {
        self.registry.lock().unwrap().ranges.remove(&self.start);
    }
}

impl Device for SimDevice {
    fn kind(&self) -> DeviceKind {
        DeviceKind::Host
    }

    fn describe(&self) -> String {
        "host memory (simulated device: no GPU used)".into()
    }

    fn alloc(&self, len: usize) -> Result<DeviceBuffer> {
        let a = self.alloc_region(len, Region::Device)?;
        Ok(DeviceBuffer::owned(
            a.mem.addr(),
            len,
            DeviceKind::Host,
            Arc::new(a),
        ))
    }

    fn alloc_staging(&self, len: usize) -> Result<Box<dyn StagingMemory>> {
        Ok(Box::new(self.alloc_region(len, Region::Staging)?))
    }

    fn alloc_staging_pool(&self, len: usize) -> Result<Box<dyn StagingMemory>> {
        let alloc = self.alloc_region(len, Region::Staging)?;
        self.registry
            .lock()
            .unwrap()
            .pool_ready
            .insert(alloc.mem.addr(), PoolProgress::default());
        let failing = self.pools_made.fetch_add(1, Ordering::SeqCst) < self.config.failing_pools;
        Ok(Box::new(StagingPoolAlloc { alloc, failing }))
    }

    fn new_queue(&self) -> Result<Box<dyn CopyQueue>> {
        let queue = self.queues_made.fetch_add(1, Ordering::SeqCst);
        let (tx, rx) = mpsc::channel::<Op>();
        let registry = self.registry.clone();
        let config = self.config.clone();
        let copies = self.copies.clone();
        let done = self.done.clone();
        std::thread::Builder::new()
            .name("zerohop-sim-copy".into())
            .spawn(move || copy_worker(rx, registry, config, queue, copies, done))
            .map_err(|e| {
                Error::with_source(ErrorKind::Device, "starting simulated copy worker", e)
            })?;
        Ok(Box::new(SimQueue {
            tx,
            enqueued: self.enqueued.clone(),
            accepted: self.accepted.clone(),
            fail_enqueue: self.config.fail_enqueue,
        }))
    }

    fn copies_by_dma(&self) -> bool {
        self.config.copies_by_dma
    }

    fn reserve(&self, len: usize) -> Result<Option<Box<dyn ReservedMemory>>> {
        // Host memory, as every simulated allocation is.
        Ok(Some(Box::new(HostReservation::new(len)?)))
    }

    fn thread_stack_bytes(&self) -> Result<Option<usize>> {
        Ok(Some(self.thread_stack.load(Ordering::SeqCst) as usize))
    }

    fn set_thread_stack_bytes(&self, bytes: usize) -> Result<()> {
        self.thread_stack.store(bytes as u64, Ordering::SeqCst);
        Ok(())
    }

    fn pins_staging(&self) -> bool {
        // Its staging is plain host memory, even when it claims DMA copies.
        false
    }

    unsafe fn pin_host(&self, ptr: *const u8, len: usize) -> Result<Option<Box<dyn HostPin>>> {
        if self.config.refuse_pin {
            return Err(Error::new(ErrorKind::Device, "injected pin refusal"));
        }
        let start = ptr as u64;
        self.registry
            .lock()
            .unwrap()
            .ranges
            .insert(start, (len as u64, Region::Pinned));
        Ok(Some(Box::new(RegisteredRange {
            start,
            registry: self.registry.clone(),
        })))
    }

    unsafe fn wait_for_stream(&self, stream: u64) -> Result<()> {
        self.stream_waits.lock().unwrap().push(stream);
        Ok(())
    }

    /// Registers the range for the copy checks, refusing one that overlaps
    /// memory this device already knows, until the last clone of the buffer
    /// drops.
    unsafe fn borrow(
        &self,
        addr: DeviceAddr,
        len: usize,
        stream: Option<u64>,
    ) -> Result<DeviceBuffer> {
        if len == 0 {
            // Nothing can be copied to or from it: nothing to register.
            // SAFETY: an empty range is never read or written.
            return Ok(unsafe { DeviceBuffer::borrowed(addr, 0, self.kind()) });
        }
        let mut reg = self.registry.lock().unwrap();
        let end = crate::device::borrow_end(addr, len)?;
        let before = reg.ranges.range(..end).next_back();
        if before.is_some_and(|(&s, &(l, _))| s + l.max(1) > addr) {
            return Err(Error::invalid(format!(
                "cannot borrow {len} bytes at {addr:#x}: they overlap memory already in use"
            )));
        }
        reg.ranges.insert(addr, (len as u64, Region::Device));
        let guard = RegisteredRange {
            start: addr,
            registry: self.registry.clone(),
        };
        let buf = DeviceBuffer::owned(addr, len, self.kind(), Arc::new(guard));
        // SAFETY: forwarded contract of `Device::borrow`: `stream` is live
        // (the simulated device only records that it was waited for).
        Ok(unsafe { buf.on_stream(stream) })
    }

    fn checksums(&self) -> Option<&dyn DeviceChecksums> {
        if self.config.no_checksum_kernel {
            None
        } else {
            Some(self)
        }
    }

    fn read_back(&self, src: &DeviceBuffer, offset: usize, dst: &mut [u8]) -> Result<()> {
        let addr = src.slice(offset, dst.len())?.addr();
        let reg = self.registry.lock().unwrap();
        if !reg.contains(addr, dst.len() as u64, &[Region::Device]) {
            return Err(Error::new(
                ErrorKind::Device,
                "read_back outside live simulated memory",
            ));
        }
        // SAFETY: the range lies in a live device allocation (checked under
        // the lock that frees hold).
        dst.copy_from_slice(unsafe { std::slice::from_raw_parts(addr as *const u8, dst.len()) });
        Ok(())
    }

    fn write_from_host(&self, dst: &DeviceBuffer, offset: usize, src: &[u8]) -> Result<()> {
        let addr = dst.slice(offset, src.len())?.addr();
        let reg = self.registry.lock().unwrap();
        if !reg.contains(addr, src.len() as u64, &[Region::Device]) {
            return Err(Error::new(
                ErrorKind::Device,
                "write_from_host outside live simulated memory",
            ));
        }
        // SAFETY: the range lies in a live device allocation (checked under
        // the lock that frees hold), and `src` is a separate host slice.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), addr as *mut u8, src.len()) };
        Ok(())
    }
}

impl DeviceChecksums for SimDevice {
    fn ready(&self) -> Result<()> {
        Ok(())
    }

    fn xxh3_64(&self, chunks: &[Vec<DeviceBuffer>]) -> Result<Vec<u64>> {
        wait_for_buffer_streams(self, chunks.iter().flatten())?;
        if self.config.fail_checksums {
            return Err(Error::new(ErrorKind::Device, "injected checksum failure"));
        }
        let mut sums = Vec::with_capacity(chunks.len());
        for chunk in chunks {
            let mut hasher = twox_hash::XxHash3_64::with_seed(0);
            for b in chunk.iter().filter(|b| !b.is_empty()) {
                // Held per piece, not per call: copies need the lock too.
                let reg = self.registry.lock().unwrap();
                if !reg.contains(b.addr(), b.len() as u64, &[Region::Device]) {
                    return Err(Error::new(
                        ErrorKind::Device,
                        "checksum of memory outside live simulated memory",
                    ));
                }
                // SAFETY: the range lies in a live device allocation
                // (checked under the lock that frees hold).
                hasher.write(unsafe { std::slice::from_raw_parts(b.addr() as *const u8, b.len()) });
            }
            sums.push(hasher.finish());
        }
        Ok(sums)
    }
}

/// Which way a copy goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Direction {
    ToDevice,
    ToHost,
}

enum Op {
    Copy {
        src: u64,
        dst: u64,
        len: u64,
        dir: Direction,
    },
    Signal(Arc<FenceState>),
}

#[derive(Default)]
struct FenceState {
    /// None while pending; Some(error text or empty) when reached.
    outcome: Mutex<Option<Option<String>>>,
    cv: Condvar,
}

struct SimQueue {
    tx: mpsc::Sender<Op>,
    enqueued: Arc<AtomicU64>,
    accepted: Arc<AtomicU64>,
    fail_enqueue: Option<u64>,
}

impl SimQueue {
    fn send_copy(&self, src: u64, dst: u64, len: usize, dir: Direction) -> Result<()> {
        let seq = self.enqueued.fetch_add(1, Ordering::Relaxed);
        if self.fail_enqueue == Some(seq) {
            return Err(Error::new(
                ErrorKind::Device,
                format!("injected failure queueing copy {seq}"),
            ));
        }
        self.accepted.fetch_add(1, Ordering::SeqCst);
        self.tx
            .send(Op::Copy {
                src,
                dst,
                len: len as u64,
                dir,
            })
            .map_err(|_| Error::new(ErrorKind::Device, "simulated copy worker stopped"))
    }
}

impl CopyQueue for SimQueue {
    unsafe fn copy_to_device(&self, src: *const u8, dst: DeviceAddr, len: usize) -> Result<()> {
        self.send_copy(src as u64, dst, len, Direction::ToDevice)
    }

    unsafe fn copy_to_host(&self, src: DeviceAddr, dst: *mut u8, len: usize) -> Result<()> {
        self.send_copy(src, dst as u64, len, Direction::ToHost)
    }

    fn record(&self) -> Result<Box<dyn Fence>> {
        let state = Arc::new(FenceState::default());
        self.tx
            .send(Op::Signal(state.clone()))
            .map_err(|_| Error::new(ErrorKind::Device, "simulated copy worker stopped"))?;
        Ok(Box::new(SimFence(state)))
    }
}

impl Drop for SimQueue {
    fn drop(&mut self) {
        // As a CUDA queue: wait for every queued copy before the memory they
        // touch can be reused.
        if let Ok(fence) = self.record() {
            let _ = fence.wait();
        }
    }
}

struct SimFence(Arc<FenceState>);

impl Fence for SimFence {
    fn wait(&self) -> Result<()> {
        let mut g = self.0.outcome.lock().unwrap();
        while g.is_none() {
            g = self.0.cv.wait(g).unwrap();
        }
        fence_outcome(g.as_ref().unwrap()).map(|_| ())
    }

    fn passed(&self) -> Result<bool> {
        match self.0.outcome.lock().unwrap().as_ref() {
            None => Ok(false),
            Some(reached) => fence_outcome(reached),
        }
    }
}

/// A reached fence's outcome: passed, or the error of a failed copy.
fn fence_outcome(reached: &Option<String>) -> Result<bool> {
    match reached {
        None => Ok(true),
        Some(msg) => Err(Error::new(ErrorKind::Device, msg.clone())),
    }
}

/// A seed no earlier device had: the clock's nanoseconds and a count.
fn fresh_seed() -> u64 {
    static MADE: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    nanos ^ MADE.fetch_add(1, Ordering::Relaxed).rotate_left(32)
}

/// The start of queue `queue`'s xorshift sequence from `seed`: a splitmix64
/// step, never 0 (xorshift stays at 0).
fn queue_rng(seed: u64, queue: u64) -> u64 {
    let mut z = seed ^ queue.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    (z ^ (z >> 31)) | 1
}

fn copy_worker(
    rx: mpsc::Receiver<Op>,
    registry: Arc<Mutex<Registry>>,
    config: SimConfig,
    queue: u64,
    copies: Arc<AtomicU64>,
    done: Arc<AtomicU64>,
) {
    // The first failure sticks to the queue, as a CUDA stream error does.
    let mut failure: Option<String> = None;
    let mut rng = queue_rng(config.seed.expect("set by SimDevice::new"), queue);
    for op in rx {
        match op {
            Op::Copy { src, dst, len, dir } => {
                let seq = copies.fetch_add(1, Ordering::Relaxed);
                'copy: {
                    if failure.is_some() {
                        break 'copy;
                    }
                    if !config.max_copy_delay.is_zero() {
                        rng ^= rng << 13;
                        rng ^= rng >> 7;
                        rng ^= rng << 17;
                        let nanos = rng % (config.max_copy_delay.as_nanos() as u64 + 1);
                        std::thread::sleep(Duration::from_nanos(nanos));
                    }
                    if config.fail_copy == Some(seq) {
                        failure = Some(format!("injected copy failure at copy {seq}"));
                        break 'copy;
                    }
                    let reg = registry.lock().unwrap();
                    let (device_side, host_side, host_kinds) = match dir {
                        Direction::ToDevice => (dst, src, &[Region::Staging, Region::Pinned][..]),
                        Direction::ToHost => (src, dst, &[Region::Staging][..]),
                    };
                    if !reg.contains(device_side, len, &[Region::Device]) {
                        failure = Some(format!(
                            "copy of {len} bytes at {device_side:#x} is outside live device memory"
                        ));
                    } else if !reg.contains(host_side, len, host_kinds) {
                        failure = Some(format!(
                            "copy of {len} bytes at {host_side:#x} is outside staging or pinned memory"
                        ));
                    } else if !reg.ready(host_side, len) {
                        failure = Some(format!(
                            "copy of {len} bytes at {host_side:#x}: staging not waited for (not yet pinned)"
                        ));
                    } else {
                        // SAFETY: both ranges lie in live registered allocations
                        // (checked under the lock that every free takes), and a
                        // device range is never also a staging range.
                        unsafe {
                            std::ptr::copy_nonoverlapping(
                                src as *const u8,
                                dst as *mut u8,
                                len as usize,
                            )
                        };
                    }
                }
                done.fetch_add(1, Ordering::SeqCst);
            }
            Op::Signal(state) => {
                *state.outcome.lock().unwrap() = Some(failure.clone());
                state.cv.notify_all();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pool's staging takes copies only where it was waited for, as a
    /// pool a GPU still pins would, and bytes written before the wait are
    /// lost, as a GPU's pool made present after them would lose them.
    #[test]
    fn a_pool_takes_copies_only_where_waited_for() {
        let dev = SimDevice::new(SimConfig::default());
        let buf = dev.alloc(8192).unwrap();
        let copy = |pool: &mut Box<dyn StagingMemory>, offset: usize| {
            let q = dev.new_queue().unwrap();
            // SAFETY: both ranges are live and untouched until the fence.
            unsafe { q.copy_to_device(pool.as_mut_ptr().add(offset), buf.addr(), 4096) }.unwrap();
            q.record().unwrap().wait()
        };
        let mut pool = dev.alloc_staging_pool(8192).unwrap();
        let refused = copy(&mut pool, 4096).unwrap_err();
        assert!(refused.to_string().contains("not waited for"), "{refused}");
        // SAFETY: the pool is 8192 bytes long, and nothing else uses it.
        let early = unsafe { std::slice::from_raw_parts_mut(pool.as_mut_ptr(), 8192) };
        early.fill(7);
        pool.wait_ready(0, 8192).unwrap();
        // SAFETY: as above, now that it is ready.
        let bytes = unsafe { std::slice::from_raw_parts(pool.as_mut_ptr(), 8192) };
        assert_eq!((bytes[0], bytes[4096], bytes[1]), (SCRIBBLE, SCRIBBLE, 7));
        copy(&mut pool, 4096).unwrap();
        let mut plain = dev.alloc_staging(8192).unwrap();
        copy(&mut plain, 0).unwrap();
    }

    #[test]
    fn a_seed_gives_each_queue_its_own_delays_and_the_same_ones_again() {
        let dev = SimDevice::new(SimConfig {
            seed: Some(42),
            ..SimConfig::default()
        });
        assert_eq!(dev.seed(), 42);
        assert_eq!(queue_rng(42, 3), queue_rng(42, 3));
        assert_ne!(queue_rng(42, 3), queue_rng(42, 4));
        assert_ne!(queue_rng(42, 3), queue_rng(43, 3));
        assert_ne!(queue_rng(0, 0), 0, "xorshift would stay at 0");
        // Devices left to choose get different seeds.
        let (a, b) = (fresh_seed(), fresh_seed());
        assert_ne!(a, b);
    }
}

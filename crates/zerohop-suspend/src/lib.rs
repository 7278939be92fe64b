//! Device memory that a process can write to storage and hand back while
//! it is idle, then get back at the very same addresses: every allocation
//! of a [`SuspendableHeap`] is a reserved range of device addresses (see
//! `zerohop::device::ReservedMemory`) with memory behind it, so the memory
//! can be freed for other processes and re-created later without moving,
//! and the pointers the program holds stay valid.
//!
//! [`SuspendableHeap::suspend`] saves every live allocation as a zerohop
//! checkpoint (checksummed, durable, committed atomically; incremental
//! against an earlier suspend), then releases the memory;
//! [`SuspendableHeap::resume`] backs every allocation again and restores
//! it, verified. Either fails cleanly: a resume that cannot get the memory
//! back (another process holds it) or finds the checkpoint damaged leaves
//! the heap suspended, to be resumed later.

pub mod control;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use zerohop::device::{Device, DeviceAddr, ReservedMemory};
use zerohop::{DeviceBuffer, Engine, Error, ErrorKind, Progress, Result, TransferStats};
use zerohop_checkpoint::{self as ckpt, Location, Region, SaveOptions, Saved};

/// Metadata key marking a checkpoint as a suspended heap.
pub const SUSPEND_KEY: &str = "zerohop.suspend";

/// Threads that put memory behind the allocations on a resume, each
/// allocation a few driver calls of its own (64 x 256 MiB took 7 - 8 ms on
/// 8 threads on the H200).
const BACKING_THREADS: usize = 8;

/// The allocations of one device, suspendable together.
pub struct SuspendableHeap {
    engine: Arc<Engine>,
    heap: Mutex<Heap>,
}

struct Heap {
    /// By address: the reservation and the bytes asked for (the
    /// reservation may be larger: the device's granularity).
    allocations: BTreeMap<DeviceAddr, (Box<dyn ReservedMemory>, usize)>,
    /// Where the heap was suspended to, while it is.
    suspended: Option<PathBuf>,
    /// The per-thread stack size to put back on resume, where the suspend
    /// handed the device's stack reserve back (see `release_stack_reserve`).
    thread_stack: Option<usize>,
}

/// What a resume did.
#[derive(Debug, Clone)]
pub struct Resumed {
    /// The restore's stats (the checkpoint read into the allocations).
    pub stats: TransferStats,
    /// Seconds spent putting memory behind the allocations first.
    pub backing_seconds: f64,
}

/// What a suspend did.
#[derive(Debug, Clone)]
pub struct Suspended {
    /// The checkpoint's save (its stats, seconds until durable, bytes
    /// written, where the checksums were computed).
    pub saved: Saved,
    pub allocations: usize,
    /// Device memory handed back (the reservations' whole length).
    pub released_bytes: u64,
}

impl SuspendableHeap {
    /// A heap of `engine`'s device, which must be able to reserve memory
    /// (a GPU, or host memory standing in for one).
    pub fn new(engine: Arc<Engine>) -> Self {
        SuspendableHeap {
            engine,
            heap: Mutex::new(Heap {
                allocations: BTreeMap::new(),
                suspended: None,
                thread_stack: None,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Heap> {
        // A panic while the lock was held leaves the bookkeeping as it was
        // at that point, which every operation below re-checks.
        self.heap.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `len` bytes of device memory at an address that stays the same
    /// across suspends (contents undefined).
    pub fn alloc(&self, len: usize) -> Result<DeviceAddr> {
        let mut heap = self.lock();
        refuse_if_suspended(&heap, "allocate")?;
        let mut memory = self.engine.device().reserve(len)?.ok_or_else(|| {
            Error::invalid(format!(
                "{} cannot reserve memory to suspend",
                self.engine.device().describe()
            ))
        })?;
        memory.back()?;
        let addr = memory.addr();
        heap.allocations.insert(addr, (memory, len));
        Ok(addr)
    }

    /// Frees the allocation at `addr` (as `alloc` returned it).
    pub fn free(&self, addr: DeviceAddr) -> Result<()> {
        let mut heap = self.lock();
        refuse_if_suspended(&heap, "free")?;
        heap.allocations
            .remove(&addr)
            .map(drop)
            .ok_or_else(|| Error::invalid(format!("no allocation at {addr:#x}")))
    }

    /// Whether `addr` is the start of one of the heap's allocations.
    pub fn owns(&self, addr: DeviceAddr) -> bool {
        self.lock().allocations.contains_key(&addr)
    }

    /// The live allocations: (address, bytes asked for), by address.
    pub fn allocations(&self) -> Vec<(DeviceAddr, usize)> {
        let heap = self.lock();
        heap.allocations
            .iter()
            .map(|(&a, (_, len))| (a, *len))
            .collect()
    }

    /// Bytes of device memory behind the heap's addresses now (whole
    /// reservations): all of them while it runs, none once suspended.
    pub fn backed_bytes(&self) -> u64 {
        let heap = self.lock();
        heap.allocations
            .values()
            .filter(|(m, _)| m.is_backed())
            .map(|(m, _)| m.len() as u64)
            .sum()
    }

    /// Where the heap is suspended to, if it is.
    pub fn suspended_to(&self) -> Option<PathBuf> {
        self.lock().suspended.clone()
    }

    /// Saves every allocation as a new checkpoint at `dir` (incrementally
    /// against `parent`, an earlier suspend's checkpoint, if given), then
    /// releases their memory, and the device's stack reserve (see
    /// `release_stack_reserve`; while suspended, kernels get only the
    /// stack they are compiled to need). If a release fails, the heap
    /// counts as suspended (the checkpoint is whole) and the error is
    /// returned.
    ///
    /// # Safety
    /// Nothing (no kernel, copy or thread) may read or write the heap's
    /// memory from the call until a [`resume`](Self::resume) returns `Ok`:
    /// the engine reads it while saving, and then it is gone.
    pub unsafe fn suspend(
        &self,
        dir: &Path,
        parent: Option<&Path>,
        progress: Option<Progress<'_>>,
    ) -> Result<Suspended> {
        let mut heap = self.lock();
        refuse_if_suspended(&heap, "suspend")?;
        // SAFETY: forwarded contract: nothing touches the memory meanwhile.
        let buffers = unsafe { self.borrow_all(&heap) }?;
        let regions: Vec<Region> = buffers
            .into_iter()
            .map(|(addr, b)| Region::raw(entry_name(addr), b))
            .collect();
        let opts = SaveOptions {
            parent: parent.map(Location::dir).transpose()?,
            metadata: [(SUSPEND_KEY.to_string(), "1".to_string())].into(),
            ..SaveOptions::default()
        };
        let saved = ckpt::save(
            &self.engine,
            &regions,
            &Location::dir(dir)?,
            &opts,
            progress,
        )?;
        drop(regions); // the borrows end before the memory goes
        heap.suspended = Some(dir.to_path_buf());
        heap.thread_stack = release_stack_reserve(self.engine.device().as_ref());
        let mut released_bytes = 0;
        let mut first_error = None;
        for (memory, _) in heap.allocations.values_mut() {
            match memory.release() {
                Ok(()) => released_bytes += memory.len() as u64,
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        match first_error {
            Some(e) => Err(e.context("the heap was saved, but not all of its memory was released")),
            None => Ok(Suspended {
                saved,
                allocations: heap.allocations.len(),
                released_bytes,
            }),
        }
    }

    /// Backs every allocation again, at its address, and restores it from
    /// the checkpoint at `dir` (the one `suspend` wrote, or a copy),
    /// every chunk verified. On any error (no device memory to be had, a
    /// missing or damaged checkpoint) the memory is released again and the
    /// heap stays suspended.
    ///
    /// # Safety
    /// As for [`suspend`](Self::suspend): nothing touches the heap's memory
    /// until this returns `Ok`.
    pub unsafe fn resume(&self, dir: &Path, progress: Option<Progress<'_>>) -> Result<Resumed> {
        let mut heap = self.lock();
        if heap.suspended.is_none() {
            return Err(Error::invalid("the heap is not suspended"));
        }
        let started = std::time::Instant::now();
        let restored: Result<Resumed> = (|| {
            if let Some(bytes) = heap.thread_stack {
                self.engine.device().set_thread_stack_bytes(bytes)?;
            }
            back_all(&mut heap.allocations)?;
            let backing_seconds = started.elapsed().as_secs_f64();
            // SAFETY: forwarded contract; every allocation is backed now.
            let buffers = unsafe { self.borrow_all(&heap) }?;
            let names: Vec<String> = buffers.iter().map(|(addr, _)| entry_name(*addr)).collect();
            let targets: Vec<(&str, DeviceBuffer)> = names
                .iter()
                .map(String::as_str)
                .zip(buffers.into_iter().map(|(_, b)| b))
                .collect();
            let stats = ckpt::restore_into(&self.engine, &Location::dir(dir)?, &targets, progress)?;
            Ok(Resumed {
                stats,
                backing_seconds,
            })
        })();
        match restored {
            Ok(resumed) => {
                heap.suspended = None;
                heap.thread_stack = None;
                Ok(resumed)
            }
            Err(e) => {
                if heap.thread_stack.is_some() {
                    // Best effort, as below: a reserve that stays is one
                    // the next resume sets again.
                    let _ = self.engine.device().set_thread_stack_bytes(0);
                }
                for (memory, _) in heap.allocations.values_mut() {
                    // Best effort: a range that stays backed is backed
                    // memory the next resume reuses.
                    let _ = memory.release();
                }
                Err(e.context("the heap stays suspended"))
            }
        }
    }

    /// Every allocation as a buffer of the engine's device.
    ///
    /// # Safety
    /// Every allocation is backed, and nothing else touches them while the
    /// buffers are used.
    unsafe fn borrow_all(&self, heap: &Heap) -> Result<Vec<(DeviceAddr, DeviceBuffer)>> {
        heap.allocations
            .iter()
            .map(|(&addr, (_, len))| {
                // SAFETY: forwarded contract: backed memory of this device,
                // reserved by this heap, untouched by anyone else.
                let b = unsafe { self.engine.device().borrow(addr, *len, None) }?;
                Ok((addr, b))
            })
            .collect()
    }
}

/// Sets the device's per-thread stack size to 0, which hands back the
/// memory it keeps aside for every thread it can run (264 MiB of an H200:
/// a suspended PyTorch process went from 620 to 364 MiB): kernels still
/// get the stack they are compiled to need, and the size is put back on
/// resume. Returns that size; `None` where there is no reserve or the
/// device refused, which leaves the suspend as it is.
fn release_stack_reserve(device: &dyn Device) -> Option<usize> {
    let bytes = device.thread_stack_bytes().ok().flatten()?;
    (bytes > 0 && device.set_thread_stack_bytes(0).is_ok()).then_some(bytes)
}

/// Puts memory behind every allocation, on a few threads at once (each
/// allocation is its own driver call, and they are independent).
fn back_all(
    allocations: &mut BTreeMap<DeviceAddr, (Box<dyn ReservedMemory>, usize)>,
) -> Result<()> {
    let mut memories: Vec<&mut Box<dyn ReservedMemory>> =
        allocations.values_mut().map(|(m, _)| m).collect();
    let per_thread = memories.len().div_ceil(BACKING_THREADS).max(1);
    std::thread::scope(|s| {
        let threads: Vec<_> = memories
            .chunks_mut(per_thread)
            .map(|chunk| s.spawn(move || chunk.iter_mut().try_for_each(|m| m.back())))
            .collect();
        // Every thread is joined before the first error is returned.
        let results: Vec<Result<()>> = threads
            .into_iter()
            .map(|t| t.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect();
        results.into_iter().collect()
    })
}

fn refuse_if_suspended(heap: &Heap, what: &str) -> Result<()> {
    match &heap.suspended {
        Some(dir) => Err(Error::new(
            ErrorKind::InvalidInput,
            format!(
                "cannot {what}: the heap is suspended to {} (resume it first)",
                dir.display()
            ),
        )),
        None => Ok(()),
    }
}

/// The checkpoint entry of the allocation at `addr`.
fn entry_name(addr: DeviceAddr) -> String {
    format!("{addr:#x}")
}

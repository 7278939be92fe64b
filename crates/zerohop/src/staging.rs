//! A fixed pool of staging slots per device: allocated once, never per
//! request, so host memory stays bounded whatever the model size.

use crate::device::{Device, StagingMemory};
use crate::storage::DIRECT_ALIGN;
use crate::{Error, Result};

/// Size of the staging pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct StagingConfig {
    /// Total bytes of pinned host memory (default 128 MiB).
    pub total_bytes: usize,
    /// Bytes per slot: one read fills one slot (default 4 MiB).
    pub slot_bytes: usize,
}

impl Default for StagingConfig {
    fn default() -> Self {
        // Measured on the reference H200 machine:
        // hot loads are bound by the CPU copy into the slots, which is
        // faster while the pool stays warm in the CPU caches: 128 MiB beat
        // 256 MiB (~30 vs ~22 GB/s), and 4 MiB slots beat 2 MiB ones by a
        // few percent (fewer reads and copies per byte).
        StagingConfig {
            total_bytes: 128 << 20,
            slot_bytes: 4 << 20,
        }
    }
}

impl StagingConfig {
    /// For engines whose "device" memory is host memory (the host device
    /// serving CPU tensors or an agent's memfds): no large pool is
    /// needed, only room for checkpoint chunks (4 MiB, which must divide a
    /// slot).
    pub fn host_memory() -> Self {
        StagingConfig {
            total_bytes: 32 << 20,
            slot_bytes: 4 << 20,
        }
    }

    /// Checks the geometry: slots aligned for O_DIRECT, at least two of them.
    pub fn validate(&self) -> Result<()> {
        if self.slot_bytes == 0 || !self.slot_bytes.is_multiple_of(DIRECT_ALIGN as usize) {
            return Err(Error::invalid(format!(
                "staging slot size {} must be a positive multiple of {DIRECT_ALIGN}",
                self.slot_bytes
            )));
        }
        if self.total_bytes < 2 * self.slot_bytes {
            return Err(Error::invalid(format!(
                "staging total {} must hold at least two slots of {} bytes",
                self.total_bytes, self.slot_bytes
            )));
        }
        Ok(())
    }

    pub fn slot_count(&self) -> usize {
        self.total_bytes / self.slot_bytes
    }
}

/// The slots themselves, each pinned the first time a worker uses it (see
/// [`StagingShare`]) and kept from then on.
pub struct StagingPool {
    config: StagingConfig,
    slots: Vec<Option<Box<dyn StagingMemory>>>,
}

impl StagingPool {
    /// A pool of `config.slot_count()` slots, none allocated yet.
    pub fn new(config: StagingConfig) -> Result<Self> {
        config.validate()?;
        let slots = (0..config.slot_count()).map(|_| None).collect();
        Ok(StagingPool { config, slots })
    }

    pub fn config(&self) -> StagingConfig {
        self.config
    }

    /// Bytes of host memory held by the pool (slots allocated so far).
    pub fn bytes(&self) -> u64 {
        self.slots.iter().flatten().map(|s| s.len() as u64).sum()
    }

    /// Allocates every slot not allocated yet, on `threads` threads at
    /// once: pinning is mostly the kernel faulting pages in, which runs in
    /// parallel (one thread pins 128 MiB in 63 - 88 ms on the H200
    /// machine; a load's 16 workers pin their shares in about 14).
    pub fn allocate_all(&mut self, device: &dyn Device, threads: usize) -> Result<()> {
        let per_thread = self.slots.len().div_ceil(threads.max(1));
        let slot_bytes = self.config.slot_bytes;
        std::thread::scope(|scope| {
            let pinning: Vec<_> = self
                .slots
                .chunks_mut(per_thread)
                .map(|slots| {
                    scope.spawn(move || {
                        for slot in slots.iter_mut().filter(|s| s.is_none()) {
                            *slot = Some(device.alloc_staging(slot_bytes)?);
                        }
                        Ok(())
                    })
                })
                .collect();
            pinning
                .into_iter()
                .try_for_each(|t| t.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
        })
    }

    /// Splits the slots among at most `workers` workers (at least one),
    /// each getting at least `min_slots` (two let a worker read one while
    /// another copies) where there are enough.
    pub(crate) fn worker_shares<'p>(
        &'p mut self,
        device: &'p dyn Device,
        workers: usize,
        min_slots: usize,
    ) -> Vec<StagingShare<'p>> {
        let n = workers.min(self.slots.len() / min_slots.max(1)).max(1);
        let per_worker = self.slots.len() / n;
        let slot_bytes = self.config.slot_bytes;
        self.slots
            .chunks_mut(per_worker)
            .take(n)
            .map(|slots| StagingShare {
                slots,
                device,
                slot_bytes,
                alloc_seconds: 0.0,
            })
            .collect()
    }
}

/// One worker's slots. A slot is allocated (pinned, on a GPU) the first
/// time its worker takes it, on the worker's own thread: a new engine's
/// first transfer starts as soon as each worker has its first slot, and
/// the workers pin in parallel, instead of the whole pool being pinned
/// before anything moves (63 - 88 ms for 128 MiB on the H200 machine).
pub(crate) struct StagingShare<'p> {
    slots: &'p mut [Option<Box<dyn StagingMemory>>],
    device: &'p dyn Device,
    slot_bytes: usize,
    /// Seconds spent allocating slots.
    pub alloc_seconds: f64,
}

impl StagingShare<'_> {
    /// Slots in this share.
    pub fn count(&self) -> usize {
        self.slots.len()
    }

    /// Bytes per slot.
    pub fn slot_bytes(&self) -> usize {
        self.slot_bytes
    }

    /// Slot `i`, allocated now if this is its first use.
    pub fn get(&mut self, i: usize) -> Result<&mut dyn StagingMemory> {
        let slot = &mut self.slots[i];
        if slot.is_none() {
            let t = std::time::Instant::now();
            *slot = Some(self.device.alloc_staging(self.slot_bytes)?);
            self.alloc_seconds += t.elapsed().as_secs_f64();
        }
        Ok(slot.as_deref_mut().expect("allocated above"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::HostDevice;

    /// Slots are allocated on first use only, once each, and the pool
    /// counts only what is allocated.
    #[test]
    fn slots_are_allocated_on_first_use() {
        let device = HostDevice::new();
        let mut pool = StagingPool::new(StagingConfig {
            total_bytes: 8 << 12,
            slot_bytes: 1 << 12,
        })
        .unwrap();
        assert_eq!(pool.bytes(), 0);
        let mut shares = pool.worker_shares(&device, 3, 2);
        assert_eq!(shares.len(), 3);
        assert!(shares.iter().all(|s| s.count() == 2));
        let first = shares[0].get(1).unwrap().as_mut_ptr();
        assert_eq!(shares[0].get(1).unwrap().as_mut_ptr(), first);
        shares[2].get(0).unwrap();
        drop(shares);
        assert_eq!(pool.bytes(), 2 << 12);
        pool.allocate_all(&device, 3).unwrap();
        assert_eq!(pool.bytes(), 8 << 12);
        pool.allocate_all(&device, 3).unwrap();
        assert_eq!(
            pool.bytes(),
            8 << 12,
            "allocated slots are kept, not made again"
        );
    }
}

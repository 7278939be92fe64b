//! A fixed pool of staging slots per device: one block of host memory,
//! allocated once (pinned, on a GPU) and never per request, so host memory
//! stays bounded whatever the model size.

use crate::device::{Device, StagingMemory};
use crate::storage::DIRECT_ALIGN;
use crate::{Error, Result};
use std::time::Instant;

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

/// The slots, in one block of host memory allocated when the first transfer
/// needs them (or when asked: [`StagingPool::allocate`]) and kept from then
/// on. One block, because the driver charges each pinning call a fixed cost
/// whatever its size and serializes the calls (on the H200 machine 32
/// registrations of 4 MiB took 27 - 33 ms); a device may pin it in pieces
/// after handing it out ([`Device::alloc_staging_pool`]), so the block is
/// laid out for that: the first slot of every worker first, then their
/// second slots, and so on (see [`StagingPool::worker_shares`]).
pub struct StagingPool {
    config: StagingConfig,
    block: Option<Box<dyn StagingMemory>>,
}

impl StagingPool {
    /// A pool of `config.slot_count()` slots, not allocated yet.
    pub fn new(config: StagingConfig) -> Result<Self> {
        config.validate()?;
        Ok(StagingPool {
            config,
            block: None,
        })
    }

    pub fn config(&self) -> StagingConfig {
        self.config
    }

    /// Bytes of host memory held by the pool (0 until it is allocated).
    pub fn bytes(&self) -> u64 {
        self.block.as_ref().map_or(0, |b| b.len() as u64)
    }

    /// Allocates the slots' block unless it is already; returns the seconds
    /// that took (0 when it was already allocated). The device may still be
    /// pinning it on return: each slot is waited for before its first use.
    /// A block whose pinning failed (which failed the transfer that met
    /// it) is dropped and allocated anew, so a later transfer may succeed.
    pub fn allocate(&mut self, device: &dyn Device) -> Result<f64> {
        match &self.block {
            Some(b) if b.has_failed() => self.block = None,
            Some(_) => return Ok(0.0),
            None => {}
        }
        let t = Instant::now();
        let bytes = self.config.slot_count() * self.config.slot_bytes;
        let block = device.alloc_staging_pool(bytes)?;
        if block.len() < bytes {
            return Err(Error::new(
                crate::ErrorKind::Device,
                format!(
                    "staging allocation gave {} bytes where {bytes} were asked for",
                    block.len()
                ),
            ));
        }
        self.block = Some(block);
        Ok(t.elapsed().as_secs_f64())
    }

    /// Blocks until all of the allocated pool may take copies (the device
    /// may pin it after handing it out).
    pub fn wait_ready(&self) -> Result<()> {
        match &self.block {
            Some(b) => b.wait_ready(0, b.len()),
            None => Ok(()),
        }
    }

    /// Splits the slots among at most `workers` workers (at least one),
    /// each getting at least `min_slots` (two let a worker read one while
    /// another copies) where there are enough. Worker `w` of `n` has the
    /// pool's slots `w`, `n + w`, `2n + w`, ...: the workers' first slots
    /// come first in the block, so a pool pinned from its start lets every
    /// worker begin before the last slot is pinned. The pool must have been
    /// allocated ([`StagingPool::allocate`]).
    pub(crate) fn worker_shares(
        &mut self,
        workers: usize,
        min_slots: usize,
    ) -> Vec<StagingShare<'_>> {
        let slots = self.config.slot_count();
        let slot_bytes = self.config.slot_bytes;
        let n = workers.min(slots / min_slots.max(1)).max(1);
        let per_worker = slots / n;
        let block = self
            .block
            .as_mut()
            .expect("the staging pool is allocated before it is shared");
        let base = block.as_mut_ptr();
        let block: &dyn StagingMemory = &**block;
        (0..n)
            .map(|w| StagingShare {
                base,
                block,
                first: w,
                stride: n,
                count: per_worker,
                slot_bytes,
            })
            .collect()
    }
}

/// One worker's slots: every `stride`-th slot of the pool's block from slot
/// `first`, which no other share of the same split reaches. The pool stays
/// borrowed mutably while any share lives, so the block outlives it and
/// nobody else hands its slots out.
pub(crate) struct StagingShare<'p> {
    base: *mut u8,
    block: &'p dyn StagingMemory,
    first: usize,
    stride: usize,
    count: usize,
    slot_bytes: usize,
}

// SAFETY: a share is the only way to its slots' memory while it lives (see
// above), as a `&mut [u8]` would be, and that can be sent to another thread;
// `block` is `Sync`.
unsafe impl Send for StagingShare<'_> {}

impl StagingShare<'_> {
    /// Bytes per slot.
    pub fn slot_bytes(&self) -> usize {
        self.slot_bytes
    }

    /// Offset of slot `i` in the pool's block.
    fn offset(&self, i: usize) -> usize {
        assert!(i < self.count, "slot {i} of a share of {}", self.count);
        (i * self.stride + self.first) * self.slot_bytes
    }

    /// The first byte of slot `i`, the start of `slot_bytes` bytes that
    /// only this share reaches, to be used (by the CPU or by copies) only
    /// after [`StagingShare::wait_ready`].
    pub fn ptr(&self, i: usize) -> *mut u8 {
        // SAFETY: `i * stride + first < count * stride <= slot_count`, so
        // the slot lies inside the block.
        unsafe { self.base.add(self.offset(i)) }
    }

    /// Blocks until slot `i` may be used (the device may still be making
    /// the block ready); immediate once it is.
    pub fn wait_ready(&self, i: usize) -> Result<()> {
        self.block.wait_ready(self.offset(i), self.slot_bytes)
    }

    /// Every slot of the share, as a list of free slots that
    /// [`StagingShare::take`] hands out first slot first.
    pub fn all_free(&self) -> Vec<usize> {
        (0..self.count).rev().collect()
    }

    /// Takes a slot off `free`: the last one the pool has pinned already
    /// where there is one; else, where the worker has no copy in flight
    /// (`idle`), the last one. `None`: the worker finishes its oldest copy
    /// first, which frees a pinned slot sooner than the pool pins another.
    pub fn take(&self, free: &mut Vec<usize>, idle: bool) -> Option<usize> {
        let pinned = free
            .iter()
            .rposition(|&s| self.block.is_ready(self.offset(s), self.slot_bytes));
        match pinned {
            Some(k) => Some(free.remove(k)),
            None if idle => free.pop(),
            None => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::HostDevice;

    /// The block is allocated once, on request, and split into disjoint
    /// shares of whole slots, the workers' first slots first.
    #[test]
    fn one_block_split_into_disjoint_shares() {
        let device = HostDevice::new();
        let mut pool = StagingPool::new(StagingConfig {
            total_bytes: 8 << 12,
            slot_bytes: 1 << 12,
        })
        .unwrap();
        assert_eq!(pool.bytes(), 0);
        pool.allocate(&device).unwrap();
        assert_eq!(pool.bytes(), 8 << 12);
        assert_eq!(
            pool.allocate(&device).unwrap(),
            0.0,
            "an allocated pool is kept, not made again"
        );
        let shares = pool.worker_shares(3, 2);
        assert_eq!(shares.len(), 3);
        assert!(shares.iter().all(|s| s.all_free() == [1, 0]));
        let base = shares[0].ptr(0) as usize;
        let mut offsets: Vec<usize> = shares
            .iter()
            .flat_map(|s| (0..2).map(|i| s.ptr(i) as usize - base))
            .collect();
        // The workers' first slots, then their second ones.
        assert_eq!(offsets, [0, 3, 1, 4, 2, 5].map(|k| k << 12));
        offsets.sort_unstable();
        offsets.dedup();
        assert_eq!(offsets.len(), 6, "no slot is handed out twice");
        assert!(shares.iter().all(|s| s.wait_ready(1).is_ok()));
        drop(shares);
        assert_eq!(
            pool.worker_shares(100, 2).len(),
            4,
            "at most slots / min_slots"
        );
        assert_eq!(pool.worker_shares(0, 2).len(), 1, "at least one share");
        assert_eq!(pool.bytes(), 8 << 12);
    }
}

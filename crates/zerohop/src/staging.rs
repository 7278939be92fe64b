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
        // Measured on the reference machine (bench/results/2026-11-30-h200*):
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

/// The slots themselves.
pub struct StagingPool {
    config: StagingConfig,
    slots: Vec<Box<dyn StagingMemory>>,
}

impl StagingPool {
    pub fn new(device: &dyn Device, config: StagingConfig) -> Result<Self> {
        config.validate()?;
        let slots = (0..config.slot_count())
            .map(|_| device.alloc_staging(config.slot_bytes))
            .collect::<Result<Vec<_>>>()?;
        Ok(StagingPool { config, slots })
    }

    pub fn config(&self) -> StagingConfig {
        self.config
    }

    /// Bytes of host memory held by the pool.
    pub fn bytes(&self) -> u64 {
        self.slots.iter().map(|s| s.len() as u64).sum()
    }

    /// Splits the slots among at most `workers` workers (at least one),
    /// each getting at least `min_slots` (two let a worker read one while
    /// another copies) where there are enough.
    pub(crate) fn worker_shares(
        &mut self,
        workers: usize,
        min_slots: usize,
    ) -> Vec<&mut [Box<dyn StagingMemory>]> {
        let n = workers.min(self.slots.len() / min_slots.max(1)).max(1);
        let per_worker = self.slots.len() / n;
        self.slots.chunks_mut(per_worker).take(n).collect()
    }
}

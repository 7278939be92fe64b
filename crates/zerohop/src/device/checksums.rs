//! Checksums computed where the memory is: a capability some devices have
//! (a kernel on a GPU), kept apart from [`Device`]'s copies because only
//! checkpoints need it.

use super::buffer::DeviceBuffer;
use crate::Result;

/// Hashes chunks of a device's memory without the host reading them.
pub trait DeviceChecksums: Send + Sync {
    /// Makes hashing ready (a GPU loads its kernel on the first call); an
    /// error says why this device cannot hash after all.
    fn ready(&self) -> Result<()>;

    /// XXH3-64 (seed 0) of each chunk, a chunk being its buffers' bytes one
    /// after another, once the work queued on the buffers' streams is done
    /// (a GPU hashes only chunks of more than 240 bytes with its kernel,
    /// reading shorter ones back to hash them on the host). Buffers that
    /// are not this device's memory are an error.
    fn xxh3_64(&self, chunks: &[Vec<DeviceBuffer>]) -> Result<Vec<u64>>;
}

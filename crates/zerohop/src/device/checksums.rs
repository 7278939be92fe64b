//! Checksums computed where the memory is: a capability some devices have
//! (a kernel on a GPU), kept apart from [`Device`]'s copies because only
//! checkpoints need it.

use super::{Device, DeviceBuffer};
use crate::Result;
use std::collections::BTreeSet;

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

/// Blocks until the work queued on the chunks' framework streams has
/// finished, each stream waited for once.
pub(crate) fn wait_for_buffer_streams(
    device: &dyn Device,
    chunks: &[Vec<DeviceBuffer>],
) -> Result<()> {
    let streams: BTreeSet<u64> = chunks
        .iter()
        .flatten()
        .filter_map(DeviceBuffer::stream)
        .collect();
    for s in streams {
        // SAFETY: buffers carry a stream only through
        // `DeviceBuffer::borrowed_on_stream`, whose caller vouches that it
        // is a live stream of the buffer's device.
        unsafe { device.wait_for_stream(s)? };
    }
    Ok(())
}

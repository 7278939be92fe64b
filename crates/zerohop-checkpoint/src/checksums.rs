//! Where a save's chunk checksums come from: the device hashes its own
//! memory (a GPU kernel) so the host never reads the bytes to hash them;
//! where it cannot, the I/O workers hash each chunk in staging.

use crate::layout::ChunkSlot;
use crate::manifest::{chunk_checksum, DataFile};
use crate::store::NewCheckpoint;
use std::time::Instant;
use zerohop::device::DeviceChecksums;
use zerohop::{DeviceBuffer, Engine, Error, ErrorKind, Result};

/// Where a save checksummed its chunks.
#[derive(Debug, Clone, PartialEq)]
pub enum ChecksumSite {
    /// On the device, in this many seconds: while the data was copied and
    /// written (`overlapped`), or before, when an incremental save needed
    /// the sums to pick the chunks to write. Included in the save's time.
    Device { seconds: f64, overlapped: bool },
    /// On the host, as each chunk passed through staging (see the
    /// transfer's worker profile), because the device could not: `why`.
    Host { why: String },
}

impl std::fmt::Display for ChecksumSite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ChecksumSite::Device {
                seconds,
                overlapped,
            } => write!(
                f,
                "on the device {}, in {:.1} ms",
                if *overlapped {
                    "while the data was written"
                } else {
                    "before the copies"
                },
                seconds * 1e3
            ),
            ChecksumSite::Host { why } => write!(f, "on the host in staging ({why})"),
        }
    }
}

/// Whether the engine's device can hash chunks itself; if not, why.
pub(crate) fn device_can_hash(engine: &Engine) -> std::result::Result<(), String> {
    match engine.device().checksums() {
        Some(hasher) => hasher.ready().map_err(|e| e.to_string()),
        None => Err(NO_KERNEL.into()),
    }
}

const NO_KERNEL: &str = "the device has no checksum kernel";

/// Every chunk's checksum from the device, and the seconds it took.
pub(crate) type DeviceSums = Result<(Vec<u64>, f64)>;

/// Every chunk's checksum, computed by the device, and the seconds it took.
pub(crate) fn on_device(engine: &Engine, pieces: &[Vec<DeviceBuffer>]) -> DeviceSums {
    let hasher = engine
        .device()
        .checksums()
        .ok_or_else(|| Error::new(ErrorKind::Device, NO_KERNEL))?;
    hash_chunks(hasher, pieces)
}

/// `pieces` hashed by `hasher`, whose answer must hold one sum per chunk:
/// callers index the sums by chunk.
fn hash_chunks(hasher: &dyn DeviceChecksums, pieces: &[Vec<DeviceBuffer>]) -> DeviceSums {
    let started = Instant::now();
    let sums = hasher.xxh3_64(pieces)?;
    if sums.len() != pieces.len() {
        return Err(Error::new(
            ErrorKind::Device,
            format!(
                "the device returned {} checksums for {} chunks",
                sums.len(),
                pieces.len()
            ),
        ));
    }
    Ok((sums, started.elapsed().as_secs_f64()))
}

/// Every chunk's checksum, read back from the data files `new` wrote
/// (when the device's hashing failed after the data was written).
pub(crate) fn from_files(
    new: &dyn NewCheckpoint,
    files: &[DataFile],
    slots: &[ChunkSlot],
) -> Result<Vec<String>> {
    let open = files
        .iter()
        .map(|f| new.open_written(&f.name))
        .collect::<Result<Vec<_>>>()?;
    let mut buf = Vec::new();
    slots
        .iter()
        .map(|c| {
            buf.resize(c.len as usize, 0);
            open[c.file].read_exact_at(&mut buf, c.offset)?;
            Ok(chunk_checksum(&buf))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A device whose hashing answers one sum, however many chunks.
    struct OneSum;

    impl DeviceChecksums for OneSum {
        fn ready(&self) -> Result<()> {
            Ok(())
        }
        fn xxh3_64(&self, _chunks: &[Vec<DeviceBuffer>]) -> Result<Vec<u64>> {
            Ok(vec![7])
        }
    }

    #[test]
    fn a_sum_per_chunk_or_a_device_error() {
        // The fake reads no buffers: chunks of none will do.
        assert_eq!(hash_chunks(&OneSum, &[vec![]]).unwrap().0, [7]);
        let err = hash_chunks(&OneSum, &[vec![], vec![]]).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Device, "{err}");
        assert!(
            err.to_string().contains("1 checksums for 2 chunks"),
            "{err}"
        );
        let err = hash_chunks(&OneSum, &[]).unwrap_err();
        assert!(
            err.to_string().contains("1 checksums for 0 chunks"),
            "{err}"
        );
    }
}

//! Checkpoints of GPU memory: safetensors data files plus a manifest with a
//! checksum per fixed-size chunk, in a directory or under an object store
//! prefix (see [`CheckpointStore`]), saved through the zerohop
//! engine's write pipeline and committed atomically, restored through its
//! read pipeline with every chunk verified on the way.
//!
//! Checksums are xxh3-64: well known (xxHash), non-cryptographic, fast on
//! a CPU (tens of GB/s per core) and parallel enough to run on a GPU. A
//! save hashes its chunks with a kernel on the GPU while the data is
//! written (before, for an incremental save, which needs the sums to pick
//! what to write), so the host does not read the bytes to hash them (it
//! hashes only chunks of 240 bytes or less, which XXH3 treats apart); where
//! the kernel cannot run, the I/O workers hash each chunk in staging.
//! Restore and verify hash on the host. It catches corruption, not
//! tampering.
#![forbid(unsafe_code)]

mod baseline;
mod checksums;
mod layout;
mod local;
mod location;
mod manifest;
mod request;
mod restore;
mod save;
mod store;
mod verify;
mod write_step;

pub use checksums::ChecksumSite;
pub use local::LocalStore;
pub use location::{check_checkpoint_name, list_checkpoints, Location};
pub use manifest::{
    checksum_hex, chunk_checksum, Chunk, DataFile, Entry, Manifest, Piece, FORMAT, MANIFEST_FILE,
    MAX_MANIFEST_BYTES, VERSION,
};
pub use request::{Region, SaveOptions, DEFAULT_CHUNK_BYTES};
pub use restore::{restore, restore_into, restore_manifest_into, Restored};
pub use save::{save, SavePhases, Saved};
pub use store::{CheckpointStore, NewCheckpoint};
pub use verify::{dependents, remove, verify, Verified};

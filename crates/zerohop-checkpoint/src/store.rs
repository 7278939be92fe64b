//! Where checkpoints live: named checkpoints side by side in a store (the
//! subdirectories of a local directory, or the prefixes under an object
//! store prefix). Saving, restoring and verifying are written once against
//! [`CheckpointStore`]; each kind of storage implements it (this crate the
//! local one, `zerohop-s3` object stores), so none of them is a special
//! case inside the checkpoint logic. One checkpoint of a store is a
//! [`Location`](crate::Location).

use zerohop::storage::{SinkFile, SourceFile};
use zerohop::Result;

/// A place holding checkpoints side by side, each under its name. Incremental
/// saves reference chunks of other checkpoints in the same store.
pub trait CheckpointStore: Send + Sync {
    /// The store itself, for messages and to tell two stores apart
    /// (`/data/ckpt`, `s3://bucket/prefix`).
    fn describe(&self) -> String;

    /// Where checkpoint `name` is, for messages.
    fn describe_checkpoint(&self, name: &str) -> String;

    /// The bytes of checkpoint `name`'s manifest, refused beyond
    /// [`crate::MAX_MANIFEST_BYTES`]. A missing checkpoint is a `NotFound`
    /// error.
    fn read_manifest(&self, name: &str) -> Result<Vec<u8>>;

    /// The names of the committed checkpoints in the store, sorted.
    fn list(&self) -> Result<Vec<String>>;

    /// Data file `file` of checkpoint `name`, for reading.
    fn open_data(&self, name: &str, file: &str) -> Result<SourceFile>;

    /// Starts a new checkpoint `name`, which must not exist. Nothing is
    /// visible under `name` until [`NewCheckpoint::commit`]; dropping the
    /// returned value uncommitted removes what was written.
    fn begin(&self, name: &str) -> Result<Box<dyn NewCheckpoint + '_>>;

    /// Removes checkpoint `name`: first what makes it visible, so a crash
    /// midway never leaves a half checkpoint that looks whole. The caller
    /// has checked that no other checkpoint needs it.
    fn remove(&self, name: &str) -> Result<()>;
}

/// A checkpoint being written.
pub trait NewCheckpoint {
    /// Creates data file `file` of `len` bytes. `copy_from` names a
    /// checkpoint in the same store holding a file of that name whose
    /// unchanged ranges a store may copy instead of receiving them again
    /// (the engine asks, through the sink, when a write filter keeps none
    /// of a part).
    fn create_data(&self, file: &str, len: u64, copy_from: Option<&str>) -> Result<SinkFile>;

    /// A data file written by this save, for reading it back.
    fn open_written(&self, file: &str) -> Result<SourceFile>;

    /// Makes the checkpoint visible, its manifest written last and durably:
    /// either the whole checkpoint is there or none of it.
    fn commit(self: Box<Self>, manifest: &[u8]) -> Result<()>;
}

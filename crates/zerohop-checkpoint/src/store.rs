//! Where checkpoints live: named checkpoints side by side in a store (the
//! subdirectories of a local directory, or the prefixes under an object
//! store prefix). Saving, restoring and verifying are written once against
//! [`CheckpointStore`]; each kind of storage implements it (this crate the
//! local one, `zerohop-s3` object stores), so none of them is a special
//! case inside the checkpoint logic.

use crate::local::LocalStore;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use zerohop::storage::{SinkFile, SourceFile};
use zerohop::{Error, ErrorKind, Result};

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

/// A checkpoint: a store and a name in it.
#[derive(Clone)]
pub struct Location {
    pub store: Arc<dyn CheckpointStore>,
    pub name: String,
}

impl Location {
    pub fn new(store: Arc<dyn CheckpointStore>, name: impl Into<String>) -> Result<Location> {
        let name = name.into();
        check_checkpoint_name(&name)?;
        Ok(Location { store, name })
    }

    /// The checkpoint directory `dir`, in the local store of its parent.
    pub fn dir(dir: &Path) -> Result<Location> {
        // `.` and `..` name their directory only once resolved.
        let resolved;
        let dir = match dir.file_name() {
            Some(_) => dir,
            None => {
                resolved = dir
                    .canonicalize()
                    .map_err(|e| Error::io(dir, "cannot resolve", e))?;
                &resolved
            }
        };
        let name = dir
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| Error::invalid(format!("{} has no usable name", dir.display())))?;
        let parent = zerohop::storage::atomic::parent_of(dir);
        Location::new(Arc::new(LocalStore::new(parent)), name)
    }

    /// A sibling checkpoint: `name` in the same store.
    pub fn sibling(&self, name: &str) -> Result<Location> {
        Location::new(self.store.clone(), name)
    }

    /// This checkpoint's manifest, checked.
    pub fn manifest(&self) -> Result<crate::Manifest> {
        let bytes = self.store.read_manifest(&self.name)?;
        crate::Manifest::decode(&bytes).map_err(|e| e.context(self))
    }

    /// Whether `other` is in the same store as this one.
    pub fn same_store(&self, other: &Location) -> bool {
        Arc::ptr_eq(&self.store, &other.store) || self.store.describe() == other.store.describe()
    }
}

impl std::fmt::Display for Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.store.describe_checkpoint(&self.name))
    }
}

impl std::fmt::Debug for Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Location({self})")
    }
}

impl TryFrom<&Path> for Location {
    type Error = Error;
    fn try_from(dir: &Path) -> Result<Location> {
        Location::dir(dir)
    }
}

impl TryFrom<&PathBuf> for Location {
    type Error = Error;
    fn try_from(dir: &PathBuf) -> Result<Location> {
        Location::dir(dir)
    }
}

/// A checkpoint's name is one path component: it names a directory or a
/// key prefix, and manifests refer to siblings by it.
pub fn check_checkpoint_name(name: &str) -> Result<()> {
    let bad = name.is_empty()
        || name == "."
        || name == ".."
        || name.starts_with('.')
        || name.contains(['/', '\\', '\0'])
        || name.len() > 255;
    if bad {
        return Err(Error::new(
            ErrorKind::InvalidInput,
            format!(
                "{name:?} cannot name a checkpoint: one path component is needed, \
                 not starting with '.'"
            ),
        ));
    }
    Ok(())
}

/// The committed checkpoints in `store`, sorted by name, each with its
/// manifest.
pub fn list_checkpoints(
    store: &Arc<dyn CheckpointStore>,
) -> Result<Vec<(String, crate::Manifest)>> {
    store
        .list()?
        .into_iter()
        .map(|name| {
            let m = Location::new(store.clone(), name.clone())?.manifest()?;
            Ok((name, m))
        })
        .collect()
}

//! One checkpoint: a store and a name in it ([`Location`]), with what
//! reads checkpoints by location (their manifests, a store's list).

use crate::local::LocalStore;
use crate::manifest::Manifest;
use crate::store::CheckpointStore;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use zerohop::{Error, ErrorKind, Result};

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
    pub fn manifest(&self) -> Result<Manifest> {
        let bytes = self.store.read_manifest(&self.name)?;
        Manifest::decode(&bytes).map_err(|e| e.context(self))
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
pub fn list_checkpoints(store: &Arc<dyn CheckpointStore>) -> Result<Vec<(String, Manifest)>> {
    store
        .list()?
        .into_iter()
        .map(|name| {
            let m = Location::new(store.clone(), name.clone())?.manifest()?;
            Ok((name, m))
        })
        .collect()
}

/// Reading a manifest from a directory goes through the checkpoint there,
/// as every other read of a checkpoint does.
impl Manifest {
    /// Reads `dir/manifest.json`.
    pub fn read(dir: &Path) -> Result<Manifest> {
        Location::dir(dir)?.manifest()
    }
}

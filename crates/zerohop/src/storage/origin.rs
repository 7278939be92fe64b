//! What sources and sinks share: their bytes are in a local file or in a
//! remote object. [`SourceFile`](super::SourceFile) and
//! [`SinkFile`](super::SinkFile) deref to theirs.

use super::file_pair::FilePair;
use std::path::{Path, PathBuf};

/// A local file (its descriptors) or a remote object (its label, length
/// and handle `R`).
#[derive(Debug)]
pub enum Origin<R> {
    Local(FilePair),
    Remote { label: PathBuf, len: u64, object: R },
}

impl<R> Origin<R> {
    /// The file's descriptors; `None` for a remote object.
    pub fn local_fds(&self) -> Option<&FilePair> {
        match self {
            Origin::Local(fds) => Some(fds),
            Origin::Remote { .. } => None,
        }
    }

    /// The remote object's handle; `None` for a local file.
    pub fn remote(&self) -> Option<&R> {
        match self {
            Origin::Local(_) => None,
            Origin::Remote { object, .. } => Some(object),
        }
    }

    /// The file's path, or the object's label.
    pub fn path(&self) -> &Path {
        match self {
            Origin::Local(fds) => fds.path(),
            Origin::Remote { label, .. } => label,
        }
    }

    pub fn len(&self) -> u64 {
        match self {
            Origin::Local(fds) => fds.len(),
            Origin::Remote { len, .. } => *len,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether O_DIRECT is possible (never for a remote object).
    pub fn direct_capable(&self) -> bool {
        self.local_fds().is_some_and(FilePair::direct_capable)
    }

    /// Remembers that O_DIRECT fails here, so later I/O goes buffered.
    pub fn refuse_direct(&self) {
        if let Some(fds) = self.local_fds() {
            fds.refuse_direct();
        }
    }
}

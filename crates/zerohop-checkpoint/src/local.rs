//! Checkpoints as the subdirectories of a local directory. A save writes
//! into a temporary sibling directory, makes it durable and renames it into
//! place: a crash leaves either no checkpoint or a complete one.

use crate::manifest::{MANIFEST_FILE, MAX_MANIFEST_BYTES};
use crate::store::{CheckpointStore, NewCheckpoint};
use std::path::{Path, PathBuf};
use zerohop::storage::{atomic, sync_dir, SinkFile, SourceFile};
use zerohop::{Error, ErrorKind, Result};

/// The checkpoints in one local directory.
#[derive(Debug, Clone)]
pub struct LocalStore {
    dir: PathBuf,
}

impl LocalStore {
    pub fn new(dir: &Path) -> LocalStore {
        LocalStore {
            dir: dir.to_path_buf(),
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
}

impl CheckpointStore for LocalStore {
    fn describe(&self) -> String {
        // Two spellings of one directory are one store.
        let dir = self.dir.canonicalize().unwrap_or_else(|_| self.dir.clone());
        dir.display().to_string()
    }

    fn describe_checkpoint(&self, name: &str) -> String {
        self.path(name).display().to_string()
    }

    fn read_manifest(&self, name: &str) -> Result<Vec<u8>> {
        let dir = self.path(name);
        let path = dir.join(MANIFEST_FILE);
        let meta = std::fs::metadata(&path).map_err(|e| {
            let err = Error::io(&path, "not a checkpoint: cannot read", e);
            if dir.is_dir() || !dir.exists() {
                err
            } else {
                Error::invalid(format!("{} is not a checkpoint directory", dir.display()))
            }
        })?;
        if meta.len() > MAX_MANIFEST_BYTES {
            return Err(Error::format(format!(
                "{}: {} bytes exceeds the manifest limit",
                path.display(),
                meta.len()
            )));
        }
        std::fs::read(&path).map_err(|e| Error::io(&path, "cannot read", e))
    }

    fn list(&self) -> Result<Vec<String>> {
        let listing =
            std::fs::read_dir(&self.dir).map_err(|e| Error::io(&self.dir, "cannot list", e))?;
        let mut names: Vec<String> = listing
            .flatten()
            .filter_map(|entry| entry.file_name().into_string().ok())
            // Dot entries are temporaries of saves in flight or crashed.
            .filter(|name| !name.starts_with('.'))
            .filter(|name| self.path(name).join(MANIFEST_FILE).is_file())
            .collect();
        names.sort();
        Ok(names)
    }

    fn open_data(&self, name: &str, file: &str) -> Result<SourceFile> {
        SourceFile::open(&self.path(name).join(file))
    }

    fn begin(&self, name: &str) -> Result<Box<dyn NewCheckpoint + '_>> {
        let target = self.path(name);
        atomic::create_dir_durable(&self.dir)?;
        if target.exists() {
            return Err(Error::new(
                ErrorKind::AlreadyExists,
                format!(
                    "{} already exists: save to a new directory",
                    target.display()
                ),
            ));
        }
        atomic::remove_stale_temps_in(&self.dir);
        let tmp = atomic::temp_sibling(&target)?;
        std::fs::create_dir(&tmp).map_err(|e| Error::io(&tmp, "cannot create", e))?;
        Ok(Box::new(NewDirectory {
            tmp,
            target,
            committed: false,
        }))
    }

    fn remove(&self, name: &str) -> Result<()> {
        let dir = self.path(name);
        let tmp = atomic::temp_sibling(&dir)?;
        std::fs::rename(&dir, &tmp).map_err(|e| Error::io(&dir, "cannot move aside", e))?;
        sync_dir(&self.dir)?;
        std::fs::remove_dir_all(&tmp).map_err(|e| Error::io(&tmp, "cannot remove", e))
    }
}

/// A checkpoint being written into a temporary directory.
struct NewDirectory {
    tmp: PathBuf,
    target: PathBuf,
    committed: bool,
}

impl NewCheckpoint for NewDirectory {
    fn create_data(&self, file: &str, len: u64, _copy_from: Option<&str>) -> Result<SinkFile> {
        SinkFile::create_new(&self.tmp.join(file), len)
    }

    fn open_written(&self, file: &str) -> Result<SourceFile> {
        SourceFile::open(&self.tmp.join(file))
    }

    fn commit(mut self: Box<Self>, manifest: &[u8]) -> Result<()> {
        use std::io::Write;
        let path = self.tmp.join(MANIFEST_FILE);
        let mut f =
            std::fs::File::create_new(&path).map_err(|e| Error::io(&path, "cannot create", e))?;
        f.write_all(manifest)
            .and_then(|()| f.sync_all())
            .map_err(|e| Error::io(&path, "cannot write", e))?;
        sync_dir(&self.tmp)?;
        atomic::commit_new(&self.tmp, &self.target)?;
        self.committed = true;
        Ok(())
    }
}

impl Drop for NewDirectory {
    fn drop(&mut self) {
        if !self.committed {
            let _ = std::fs::remove_dir_all(&self.tmp);
        }
    }
}

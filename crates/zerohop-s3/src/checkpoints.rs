//! Checkpoints under an object store prefix: `s3://bucket/prefix/NAME/`
//! holds checkpoint NAME's data objects and, written last, its
//! `manifest.json`. Objects have no rename, so the manifest is the commit:
//! it is created only where none exists (a conditional PUT), after every
//! data object is complete, and a reader looks for it first. A save that
//! fails aborts its uploads and deletes the objects it completed; one whose
//! process or server dies leaves objects but no manifest, which no reader
//! takes for a checkpoint and the next save under that name reports.

use crate::client::S3Client;
use crate::config::S3Config;
use crate::location::S3Url;
use crate::sink::{object_sink, Completed};
use crate::source::open_object;
use std::sync::Arc;
use zerohop::storage::{SinkFile, SourceFile};
use zerohop::{Error, ErrorKind, Result};
use zerohop_checkpoint::{
    CheckpointStore, Location, NewCheckpoint, MANIFEST_FILE, MAX_MANIFEST_BYTES,
};

/// The checkpoints under one prefix of a bucket.
#[derive(Debug)]
pub struct S3CheckpointStore {
    client: Arc<S3Client>,
    /// Empty (the bucket's top) or ending in `/`.
    prefix: String,
    /// Multipart upload part size: the engine's staging slot size.
    part_bytes: u64,
}

impl S3CheckpointStore {
    /// The store whose checkpoints are `prefix` + NAME in `client`'s
    /// bucket; data objects are uploaded in parts of `part_bytes` (the
    /// saving engine's staging slot size).
    pub fn new(client: Arc<S3Client>, prefix: &str, part_bytes: u64) -> Self {
        let mut prefix = prefix.to_string();
        if !prefix.is_empty() && !prefix.ends_with('/') {
            prefix.push('/');
        }
        S3CheckpointStore {
            client,
            prefix,
            part_bytes,
        }
    }

    fn key(&self, name: &str, file: &str) -> String {
        format!("{}{name}/{file}", self.prefix)
    }

    fn url(&self, key: &str) -> S3Url {
        self.client.url(key)
    }

    /// Every object under checkpoint `name`.
    fn objects_of(&self, name: &str) -> Result<Vec<String>> {
        let under = format!("{}{name}/", self.prefix);
        Ok(self
            .client
            .list(&under)?
            .into_iter()
            .map(|e| e.key)
            .collect())
    }
}

/// The checkpoint named by `url` (`s3://bucket/prefix/NAME`, a trailing
/// `/` allowed), in the store of its prefix; configuration from the
/// environment ([`S3Config::from_env`]).
pub fn checkpoint_location(url: &str, part_bytes: u64) -> Result<Location> {
    checkpoint_location_with(&S3Config::from_env()?, url, part_bytes)
}

/// As [`checkpoint_location`], with this configuration.
pub fn checkpoint_location_with(config: &S3Config, url: &str, part_bytes: u64) -> Result<Location> {
    let parsed = S3Url::parse(url)?;
    let key = parsed.key.trim_end_matches('/');
    let (prefix, name) = key.rsplit_once('/').unwrap_or(("", key));
    if name.is_empty() {
        return Err(Error::invalid(format!(
            "{url}: a checkpoint is named s3://bucket/[prefix/]NAME"
        )));
    }
    let store = store_at(config, &parsed.with_key(prefix), part_bytes)?;
    Location::new(Arc::new(store), name)
}

/// The store of the checkpoints under `url` (`s3://bucket/[prefix/]`);
/// configuration from the environment.
pub fn checkpoint_store(url: &str, part_bytes: u64) -> Result<S3CheckpointStore> {
    store_at(&S3Config::from_env()?, &S3Url::parse(url)?, part_bytes)
}

/// The store of the checkpoints under `prefix` (its key a prefix).
fn store_at(config: &S3Config, prefix: &S3Url, part_bytes: u64) -> Result<S3CheckpointStore> {
    if prefix.pattern_prefix().is_some() {
        return Err(Error::invalid(format!(
            "{prefix}: checkpoints are under s3://bucket/[prefix/], without wildcards"
        )));
    }
    let client = S3Client::new(config, &prefix.bucket)?;
    Ok(S3CheckpointStore::new(
        Arc::new(client),
        &prefix.key,
        part_bytes,
    ))
}

impl CheckpointStore for S3CheckpointStore {
    fn describe(&self) -> String {
        self.url(&self.prefix).to_string()
    }

    fn describe_checkpoint(&self, name: &str) -> String {
        self.url(&format!("{}{name}", self.prefix)).to_string()
    }

    fn read_manifest(&self, name: &str) -> Result<Vec<u8>> {
        let key = self.key(name, MANIFEST_FILE);
        let info = self.client.head(&key).map_err(|e| match e.kind() {
            ErrorKind::NotFound => Error::new(
                ErrorKind::NotFound,
                format!(
                    "{}: not a checkpoint (no {MANIFEST_FILE}): {e}",
                    self.describe_checkpoint(name)
                ),
            ),
            _ => e,
        })?;
        if info.len > MAX_MANIFEST_BYTES {
            return Err(Error::format(format!(
                "{}: {} bytes exceeds the manifest limit",
                self.url(&key),
                info.len
            )));
        }
        let mut bytes = vec![0u8; info.len as usize];
        let n = self
            .client
            .read_range(&key, &info.etag, info.len, 0, &mut bytes)?;
        bytes.truncate(n);
        Ok(bytes)
    }

    fn list(&self) -> Result<Vec<String>> {
        let suffix = format!("/{MANIFEST_FILE}");
        let mut names: Vec<String> = self
            .client
            .list(&self.prefix)?
            .into_iter()
            .filter_map(|e| {
                let name = e.key.strip_prefix(&self.prefix)?.strip_suffix(&suffix)?;
                (!name.contains('/')).then(|| name.to_string())
            })
            .collect();
        names.sort();
        Ok(names)
    }

    fn open_data(&self, name: &str, file: &str) -> Result<SourceFile> {
        open_object(self.client.clone(), &self.url(&self.key(name, file)))
    }

    fn begin(&self, name: &str) -> Result<Box<dyn NewCheckpoint + '_>> {
        let at = self.describe_checkpoint(name);
        let leftovers = self.objects_of(name)?;
        if leftovers.contains(&self.key(name, MANIFEST_FILE)) {
            return Err(Error::new(
                ErrorKind::AlreadyExists,
                format!("{at} already exists: save under a new name"),
            ));
        }
        if !leftovers.is_empty() {
            return Err(Error::new(
                ErrorKind::AlreadyExists,
                format!(
                    "{at}/ holds {} object(s) but no manifest: the leftovers of a save that \
                     died or is still running. Remove them with `zerohop checkpoint rm \
                     --unfinished {at}` once no save is running",
                    leftovers.len()
                ),
            ));
        }
        Ok(Box::new(NewObjects {
            store: self,
            name: name.to_string(),
            completed: Completed::default(),
            committed: false,
        }))
    }

    fn remove(&self, name: &str) -> Result<()> {
        // The manifest first: from then on no reader sees a checkpoint.
        self.client.delete(&self.key(name, MANIFEST_FILE))?;
        for key in self.objects_of(name)? {
            self.client.delete(&key)?;
        }
        Ok(())
    }
}

/// A checkpoint being uploaded: its data objects appear as they complete,
/// its manifest last.
struct NewObjects<'s> {
    store: &'s S3CheckpointStore,
    name: String,
    /// Keys of the data objects completed, to delete if never committed.
    completed: Completed,
    committed: bool,
}

impl NewCheckpoint for NewObjects<'_> {
    fn create_data(&self, file: &str, len: u64, copy_from: Option<&str>) -> Result<SinkFile> {
        let s = self.store;
        let key = s.key(&self.name, file);
        let source = copy_from.map(|parent| s.key(parent, file));
        // Only if new: a concurrent save of the same name cannot mix its
        // objects with ours; one of the two fails.
        object_sink(
            s.client.clone(),
            &s.url(&key),
            len,
            s.part_bytes,
            true,
            source.as_deref(),
            Some(self.completed.clone()),
        )
    }

    fn open_written(&self, file: &str) -> Result<SourceFile> {
        self.store.open_data(&self.name, file)
    }

    fn commit(mut self: Box<Self>, manifest: &[u8]) -> Result<()> {
        let s = self.store;
        s.client
            .put(&s.key(&self.name, MANIFEST_FILE), manifest, true)
            .map_err(|e| {
                e.context(format!(
                    "{}: committing the manifest",
                    s.describe_checkpoint(&self.name)
                ))
            })?;
        self.committed = true;
        Ok(())
    }
}

impl Drop for NewObjects<'_> {
    fn drop(&mut self) {
        if self.committed {
            return;
        }
        // Uploads not completed were aborted with their sinks. Best effort:
        // a server that is gone keeps them, and the next save under this
        // name says so.
        for key in self
            .completed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
        {
            let _ = self.store.client.delete(key);
        }
    }
}

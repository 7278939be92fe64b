//! Names opened where they live. Every front end (the CLI, the Python
//! package, the lab) opens what a user names through this crate: where a
//! name lives is [`zerohop::location`]'s answer, a local file is opened by
//! the engine ([`SourceFile::open`]) and never passes through the object
//! store crate, and an object (`s3://...`) is opened by `zerohop-s3`.
#![forbid(unsafe_code)]

use std::path::Path;
use std::sync::Arc;
use zerohop::location::{is_object, Lives};
use zerohop::storage::SourceFile;
use zerohop::{Error, ErrorKind, Result};
use zerohop_checkpoint::{CheckpointStore, LocalStore, Location};

/// Opens each name for reading, in order: a local file, or an object (one
/// HEAD request: its length and ETag; the object store's settings from the
/// environment, read once for all of them).
pub fn open_sources<P: AsRef<Path>>(names: &[P]) -> Result<Vec<SourceFile>> {
    let urls: Vec<&str> = names
        .iter()
        .filter_map(|n| n.as_ref().to_str().filter(|s| is_object(s)))
        .collect();
    let mut objects = zerohop_s3::open_objects(&urls)?.into_iter();
    names
        .iter()
        .map(|name| match Lives::of(name) {
            Lives::Local => SourceFile::open(name.as_ref()),
            Lives::ObjectStore => Ok(objects.next().expect("one object opened per object name")),
        })
        .collect()
}

/// `names` with each object store prefix (`s3://bucket/dir/`) or pattern
/// (`s3://bucket/dir/*.safetensors`) replaced by the objects it names whose
/// keys end in `suffix`; local names as they are.
pub fn expand(names: &[String], suffix: &str) -> Result<Vec<String>> {
    if !names.iter().any(is_object) {
        return Ok(names.to_vec());
    }
    let mut out = Vec::with_capacity(names.len());
    for name in names {
        match Lives::of(name) {
            Lives::Local => out.push(name.clone()),
            Lives::ObjectStore => out.extend(zerohop_s3::expand_objects(
                std::slice::from_ref(name),
                suffix,
            )?),
        }
    }
    Ok(out)
}

/// The checkpoint `name` names: `s3://bucket/[prefix/]NAME` in an object
/// store (data uploaded in parts of `part_bytes`: the saving engine's
/// staging slot size), anything else a local directory.
pub fn checkpoint_at(name: &str, part_bytes: u64) -> Result<Location> {
    match Lives::of(name) {
        Lives::ObjectStore => zerohop_s3::checkpoint_location(name, part_bytes),
        Lives::Local => Location::dir(Path::new(name)),
    }
}

/// The place `name` names as a holder of checkpoints: `s3://bucket/[prefix/]`
/// or a local directory.
pub fn checkpoints_in(name: &str, part_bytes: u64) -> Result<Arc<dyn CheckpointStore>> {
    match Lives::of(name) {
        Lives::ObjectStore => Ok(Arc::new(zerohop_s3::checkpoint_store(name, part_bytes)?)),
        Lives::Local if Path::new(name).is_dir() => Ok(Arc::new(LocalStore::new(Path::new(name)))),
        Lives::Local => Err(Error::new(
            ErrorKind::NotFound,
            format!("{name}: no such directory"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Local names never reach the object store crate: with no object store
    /// settings at all, they open, expand and hold checkpoints.
    #[test]
    fn local_names_need_no_object_store() {
        let dir = std::env::temp_dir().join(format!("zerohop-names-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("f.bin");
        std::fs::write(&file, b"bytes").unwrap();
        let opened = open_sources(&[&file, &file]).unwrap();
        assert_eq!(opened.iter().map(|f| f.len()).collect::<Vec<_>>(), [5, 5]);
        let names = vec![
            file.display().to_string(),
            "/nowhere/x.safetensors".to_string(),
        ];
        assert_eq!(expand(&names, ".safetensors").unwrap(), names);
        assert!(checkpoints_in(dir.to_str().unwrap(), 1 << 20).is_ok());
        let missing = checkpoints_in("/nowhere/at/all", 1 << 20).err().unwrap();
        assert_eq!(missing.kind(), ErrorKind::NotFound);
        let e = open_sources(&[dir.join("missing")]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NotFound);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

//! The parent an incremental save compares its chunks with.

use crate::manifest::Manifest;
use std::collections::HashMap;
use std::path::Path;
use zerohop::storage::atomic;
use zerohop::{Error, Result};

/// The parent's chunks an incremental save may reference.
pub(crate) struct Baseline {
    /// Directory name to record as `parent`.
    pub name: Option<String>,
    /// (file name, offset, len) -> (checksum, the checkpoint holding the bytes).
    pub chunks: HashMap<(String, u64, u64), (String, String)>,
}

impl Baseline {
    pub fn of(dir: &Path, parent: Option<&Path>) -> Result<Baseline> {
        let Some(parent) = parent else {
            return Ok(Baseline {
                name: None,
                chunks: HashMap::new(),
            });
        };
        let same_dir = |p: &Path| atomic::parent_of(p).canonicalize().ok();
        if same_dir(parent).is_none() || same_dir(parent) != same_dir(dir) {
            return Err(Error::invalid(format!(
                "the parent checkpoint {} must be a sibling of {}",
                parent.display(),
                dir.display()
            )));
        }
        let name = parent
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| Error::invalid(format!("{} has no usable name", parent.display())))?
            .to_string();
        let m = Manifest::read(parent)?;
        let chunks = m
            .chunks
            .iter()
            .map(|c| {
                let holder = c.stored_in.clone().unwrap_or_else(|| name.clone());
                (
                    (m.files[c.file].name.clone(), c.offset, c.len),
                    (c.xxh3.clone(), holder),
                )
            })
            .collect();
        Ok(Baseline {
            name: Some(name),
            chunks,
        })
    }
}

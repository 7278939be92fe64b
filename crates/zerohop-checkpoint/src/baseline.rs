//! The parent an incremental save compares its chunks with.

use crate::location::Location;
use std::collections::HashMap;
use zerohop::{Error, Result};

/// The parent's chunks an incremental save may reference.
pub(crate) struct Baseline {
    /// The parent's name, to record as `parent`.
    pub name: Option<String>,
    /// (file name, offset, len) -> (checksum, the checkpoint holding the bytes).
    pub chunks: HashMap<(String, u64, u64), (String, String)>,
}

impl Baseline {
    pub fn of(at: &Location, parent: Option<&Location>) -> Result<Baseline> {
        let Some(parent) = parent else {
            return Ok(Baseline {
                name: None,
                chunks: HashMap::new(),
            });
        };
        if !parent.same_store(at) {
            return Err(Error::invalid(format!(
                "the parent checkpoint {parent} must be a sibling of {at}"
            )));
        }
        let name = parent.name.clone();
        let m = parent.manifest()?;
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

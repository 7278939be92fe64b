use super::header::{read_header, Dtype, Header};
use crate::device::DeviceBuffer;
use crate::engine::Engine;
use crate::plan::TransferPlan;
use crate::stats::TransferStats;
use crate::storage::SourceFile;
use crate::Progress;
use crate::{Error, Result};
use std::collections::{BTreeMap, HashSet};
use std::path::Path;

/// How device memory is allocated for a model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Allocation {
    /// One allocation per file holding its whole data section; tensors are
    /// views into it (fewest allocations, one long extent per file).
    #[default]
    PerFile,
    /// One allocation per tensor (each freeable on its own).
    PerTensor,
}

/// A tensor in device memory.
#[derive(Debug, Clone)]
pub struct LoadedTensor {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<u64>,
    /// Index of the shard it came from.
    pub file: usize,
    /// File offset of its first byte (for verification).
    pub file_offset: u64,
    /// Its bytes on the device.
    pub buffer: DeviceBuffer,
}

/// A loaded model: every tensor of every shard, and how it got there.
#[derive(Debug)]
pub struct LoadedModel {
    pub tensors: Vec<LoadedTensor>,
    /// Each shard's `__metadata__`.
    pub metadata: Vec<BTreeMap<String, String>>,
    pub stats: TransferStats,
}

impl LoadedModel {
    pub fn get(&self, name: &str) -> Option<&LoadedTensor> {
        self.tensors.iter().find(|t| t.name == name)
    }
}

/// Loads safetensors shards into the engine's device. Tensor names must be
/// unique across shards.
pub fn load_safetensors<P: AsRef<Path>>(
    engine: &Engine,
    paths: &[P],
    allocation: Allocation,
    progress: Option<Progress<'_>>,
) -> Result<LoadedModel> {
    load_safetensors_sources(engine, &Engine::open_files(paths)?, allocation, progress)
}

/// As [`load_safetensors`], from shards already opened (local files or
/// remote objects).
pub fn load_safetensors_sources(
    engine: &Engine,
    files: &[SourceFile],
    allocation: Allocation,
    progress: Option<Progress<'_>>,
) -> Result<LoadedModel> {
    let headers: Vec<Header> = files.iter().map(read_header).collect::<Result<_>>()?;
    let mut seen = HashSet::new();
    for (h, f) in headers.iter().zip(files) {
        if let Some(t) = h.tensors.iter().find(|t| !seen.insert(t.name.as_str())) {
            return Err(Error::format(format!(
                "tensor {:?} appears in more than one shard (again in {})",
                t.name,
                f.path().display()
            )));
        }
    }
    let device = engine.device();
    let mut plan = TransferPlan::new();
    let mut tensors = Vec::new();
    for (i, h) in headers.iter().enumerate() {
        let whole = match allocation {
            Allocation::PerFile => Some(device.alloc(h.data_len as usize)?),
            Allocation::PerTensor => None,
        };
        for t in &h.tensors {
            let file_offset = h.data_start + t.begin;
            let buffer = match &whole {
                Some(b) => b.slice(t.begin as usize, t.len() as usize)?,
                None => device.alloc(t.len() as usize)?,
            };
            plan.add(files, i, file_offset, t.len(), &buffer, 0)?;
            tensors.push(LoadedTensor {
                name: t.name.clone(),
                dtype: t.dtype,
                shape: t.shape.clone(),
                file: i,
                file_offset,
                buffer,
            });
        }
    }
    let stats = engine.transfer(files, &plan, progress)?;
    Ok(LoadedModel {
        tensors,
        metadata: headers.into_iter().map(|h| h.metadata).collect(),
        stats,
    })
}

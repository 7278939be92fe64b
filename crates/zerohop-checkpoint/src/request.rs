//! What a save is asked for: the regions of device memory, and how.

use crate::location::Location;
use std::collections::BTreeMap;
use zerohop::safetensors::{Dtype, TensorToSave};
use zerohop::DeviceBuffer;

/// Default chunk size: one checksum per 4 MiB.
pub const DEFAULT_CHUNK_BYTES: u64 = 4 << 20;

/// A region of device memory to save: a typed tensor or raw bytes.
#[derive(Debug, Clone)]
pub struct Region {
    pub name: String,
    /// `Some((dtype, shape))` for a tensor; `None` for raw bytes.
    pub tensor: Option<(Dtype, Vec<u64>)>,
    pub data: DeviceBuffer,
}

impl Region {
    pub fn tensor(
        name: impl Into<String>,
        dtype: Dtype,
        shape: Vec<u64>,
        data: DeviceBuffer,
    ) -> Self {
        Region {
            name: name.into(),
            tensor: Some((dtype, shape)),
            data,
        }
    }

    pub fn raw(name: impl Into<String>, data: DeviceBuffer) -> Self {
        Region {
            name: name.into(),
            tensor: None,
            data,
        }
    }

    /// The region as a safetensors tensor (raw bytes as a `U8` vector).
    pub(crate) fn to_save(&self) -> TensorToSave {
        let (dtype, shape) = self
            .tensor
            .clone()
            .unwrap_or((Dtype::U8, vec![self.data.len() as u64]));
        TensorToSave {
            name: self.name.clone(),
            dtype,
            shape,
            data: self.data.clone(),
        }
    }
}

/// How to save.
#[derive(Debug, Clone)]
pub struct SaveOptions {
    /// Save incrementally against this checkpoint (in the same store):
    /// chunks whose checksum is unchanged are referenced, not rewritten.
    pub parent: Option<Location>,
    /// Data files to spread the regions over (several writers at once);
    /// default: [`Engine::write_spread`](zerohop::Engine::write_spread),
    /// fewer where each would hold under 16 MiB.
    pub shards: Option<usize>,
    /// Checksum granularity; must divide the engine's staging slot size.
    pub chunk_bytes: u64,
    /// Stored in the manifest and in each data file's header.
    pub metadata: BTreeMap<String, String>,
}

impl Default for SaveOptions {
    fn default() -> Self {
        SaveOptions {
            parent: None,
            shards: None,
            chunk_bytes: DEFAULT_CHUNK_BYTES,
            metadata: BTreeMap::new(),
        }
    }
}

//! Writing safetensors files from device (or host) memory,
//! through the engine's write pipeline, durably and atomically.

use super::header::{serialize_header, Dtype, TensorInfo, MAX_HEADER_BYTES};
use crate::plan::TransferPlan;
use crate::storage::{atomic, SinkFile, DIRECT_ALIGN};
use crate::{DeviceBuffer, Engine, Error, Progress, Result, TransferStats};
use std::collections::{BTreeMap, HashSet};
use std::path::Path;

/// A tensor to save: its name, type, shape and the device bytes holding it.
#[derive(Debug, Clone)]
pub struct TensorToSave {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<u64>,
    pub data: DeviceBuffer,
}

/// Where everything goes in one safetensors file.
#[derive(Debug, Clone)]
pub struct FileLayout {
    /// Bytes at offset 0: length prefix and JSON header, padded with spaces
    /// so the data section starts 4 KiB aligned (O_DIRECT writes).
    pub header: Vec<u8>,
    /// Tensors in data order; offsets relative to the data section.
    pub tensors: Vec<TensorInfo>,
    pub data_start: u64,
    pub file_len: u64,
}

/// Lays out `tensors` (in the order given) with `metadata`, checking names
/// and that each tensor's bytes match its dtype and shape.
pub fn layout(tensors: &[TensorToSave], metadata: &BTreeMap<String, String>) -> Result<FileLayout> {
    let mut seen = HashSet::new();
    let mut infos = Vec::with_capacity(tensors.len());
    let mut begin = 0u64;
    for t in tensors {
        if t.name == "__metadata__" || !seen.insert(t.name.as_str()) {
            return Err(Error::invalid(format!(
                "tensor name {:?} is reserved or used twice",
                t.name
            )));
        }
        let bytes = t
            .dtype
            .byte_len(&t.shape)
            .map_err(|e| Error::invalid(format!("tensor {:?}: {e}", t.name)))?;
        if bytes != t.data.len() as u64 {
            return Err(Error::invalid(format!(
                "tensor {:?}: {} with shape {:?} needs {bytes} bytes, but its buffer holds {}",
                t.name,
                t.dtype.name(),
                t.shape,
                t.data.len()
            )));
        }
        infos.push(TensorInfo {
            name: t.name.clone(),
            dtype: t.dtype,
            shape: t.shape.clone(),
            begin,
            end: begin + bytes,
        });
        begin += bytes;
    }
    let header = serialize_header(&infos, metadata, DIRECT_ALIGN);
    if header.len() as u64 - 8 > MAX_HEADER_BYTES {
        return Err(Error::invalid(format!(
            "the header would be {} bytes, over the {MAX_HEADER_BYTES}-byte limit readers enforce",
            header.len() - 8
        )));
    }
    let data_start = header.len() as u64;
    Ok(FileLayout {
        header,
        tensors: infos,
        data_start,
        file_len: data_start + begin,
    })
}

impl FileLayout {
    /// Writes the header into `file` (new, `file_len` bytes long) through
    /// `engine`'s write backend, pushes the file onto `files` and adds the
    /// tensors' device ranges to `plan` for it.
    pub fn start_file(
        &self,
        engine: &Engine,
        file: SinkFile,
        tensors: &[TensorToSave],
        files: &mut Vec<SinkFile>,
        plan: &mut TransferPlan,
    ) -> Result<()> {
        engine.write_host_bytes(&file, 0, &self.header)?;
        files.push(file);
        let index = files.len() - 1;
        for (t, info) in tensors.iter().zip(&self.tensors) {
            plan.add(
                files,
                index,
                self.data_start + info.begin,
                info.len(),
                &t.data,
                0,
            )?;
        }
        Ok(())
    }
}

/// Saves `tensors` as one safetensors file at `path`, replacing any file
/// there atomically: the new file is written under a temporary name, made
/// durable, then renamed into place and its directory synced. On error the
/// old file (if any) is untouched and the temporary file removed.
pub fn save_safetensors(
    engine: &Engine,
    path: &Path,
    tensors: &[TensorToSave],
    metadata: &BTreeMap<String, String>,
    progress: Option<Progress<'_>>,
) -> Result<TransferStats> {
    let layout = layout(tensors, metadata)?;
    atomic::remove_stale_temps(path);
    let tmp = atomic::temp_sibling(path)?;
    let written = (|| {
        let mut files = Vec::new();
        let mut plan = TransferPlan::new();
        let file = SinkFile::create_new(&tmp, layout.file_len)?;
        layout.start_file(engine, file, tensors, &mut files, &mut plan)?;
        let stats = engine.write(&files, &plan, None, progress)?;
        atomic::commit(&tmp, path)?;
        Ok(stats)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

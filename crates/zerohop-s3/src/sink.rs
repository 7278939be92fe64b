//! Objects written by the engine: a multipart upload whose parts are the
//! engine's staging slots, sent whole, straight from them.

use crate::client::{to_io, S3Client};
use crate::location::S3Url;
use crate::multipart::{MultipartUpload, MAX_PARTS, MIN_PART_BYTES};
use std::sync::{Arc, Mutex, RwLock};
use zerohop::staging::StagingConfig;
use zerohop::storage::{RemoteSink, SinkFile};
use zerohop::EngineConfig;
use zerohop::{Error, Result};

/// An object being written as parts of `part_bytes`.
#[derive(Debug)]
struct ObjectSink {
    /// `None` once finished.
    upload: RwLock<Option<MultipartUpload>>,
    client: Arc<S3Client>,
    key: String,
    len: u64,
    part_bytes: u64,
    only_if_new: bool,
    /// An object of the same bucket whose ranges a part filtered out is
    /// copied from.
    copy_from: Option<String>,
    /// Where the key goes once the object is complete.
    completed: Option<Completed>,
}

/// The keys of objects completed, for a caller that may have to delete
/// them again (and must not touch objects it did not complete).
pub(crate) type Completed = Arc<Mutex<Vec<String>>>;

impl RemoteSink for ObjectSink {
    fn part_bytes(&self) -> u64 {
        self.part_bytes
    }

    fn write_part(&self, offset: u64, buf: &[u8]) -> std::io::Result<()> {
        let whole = offset.is_multiple_of(self.part_bytes)
            && buf.len() as u64 == self.part_bytes.min(self.len.saturating_sub(offset));
        if !whole {
            return Err(std::io::Error::other(format!(
                "not a whole part: {} bytes at {offset} (parts of {})",
                buf.len(),
                self.part_bytes
            )));
        }
        self.with_upload(|upload| upload.upload_part(self.number(offset), buf))
    }

    fn copy_part(&self, offset: u64, len: u64) -> std::io::Result<()> {
        let source = self.copy_from.as_deref().ok_or_else(|| {
            std::io::Error::other(format!(
                "the part at {offset} was filtered out, and no object to copy it from was named"
            ))
        })?;
        self.with_upload(|upload| {
            upload.copy_part(self.number(offset), source, offset..offset + len)
        })
    }

    fn finish(&self) -> std::io::Result<()> {
        let upload = self
            .upload
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        let upload =
            upload.ok_or_else(|| std::io::Error::other("the object was already finished"))?;
        if self.len == 0 {
            // A multipart upload needs a part: an empty object is one PUT.
            upload.abort().map_err(to_io)?;
            self.client
                .put(&self.key, &[], self.only_if_new)
                .map_err(to_io)?;
        } else {
            upload.complete(self.only_if_new).map_err(to_io)?;
        }
        if let Some(done) = &self.completed {
            done.lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(self.key.clone());
        }
        Ok(())
    }
}

impl ObjectSink {
    fn number(&self, offset: u64) -> u16 {
        (offset / self.part_bytes + 1) as u16
    }

    fn with_upload(&self, f: impl FnOnce(&MultipartUpload) -> Result<()>) -> std::io::Result<()> {
        let upload = self.upload.read().unwrap_or_else(|p| p.into_inner());
        let upload = upload
            .as_ref()
            .ok_or_else(|| std::io::Error::other("the object was already finished"))?;
        f(upload).map_err(to_io)
    }
}

/// Slot size for engines that upload: S3's parts are the engine's staging
/// slots, and every part but the last must hold 5 MiB. 8 MiB is the AWS
/// CLI's part size.
pub const UPLOAD_SLOT_BYTES: usize = 8 << 20;

/// `config` fit for uploads. Uploads wait on the server, not on the CPU:
/// twice the I/O threads, one part in flight each (on the reference
/// H200 machine, against a local S3 server, 32 parallel uploads beat 16
/// by 10 - 17 %), and slots of parts S3 accepts
/// ([`UPLOAD_SLOT_BYTES`] where smaller), one per thread at least.
pub fn config_for_uploads(config: EngineConfig) -> EngineConfig {
    let io_threads = 2 * config.io_threads.max(1);
    let slot_bytes = match config.staging.slot_bytes {
        s if s < MIN_PART_BYTES => UPLOAD_SLOT_BYTES,
        s => s,
    };
    let slots = config.staging.slot_count().max(io_threads).max(2);
    EngineConfig {
        io_threads,
        staging: StagingConfig {
            slot_bytes,
            total_bytes: slots * slot_bytes,
        },
        ..config
    }
}

/// A new object at `url` of `len` bytes, for [`zerohop::Engine::write`],
/// written as a multipart upload whose parts are `part_bytes` long (the
/// engine's staging slots: at least 5 MiB unless the object is one part,
/// and at most 10,000 parts). Nothing is visible until the write returns;
/// a write that fails, or a sink dropped unfinished, leaves no object
/// (its upload is aborted). With `only_if_new`, an existing object is not
/// replaced: the write fails instead. Parts a write filter keeps none of
/// are copied, server-side, from the same range of object `copy_from` of
/// the bucket (an incremental save's parent); without it they fail.
pub fn create_object(
    client: Arc<S3Client>,
    url: &S3Url,
    len: u64,
    part_bytes: u64,
    only_if_new: bool,
    copy_from: Option<&str>,
) -> Result<SinkFile> {
    object_sink(client, url, len, part_bytes, only_if_new, copy_from, None)
}

/// As [`create_object`], noting the key in `completed` once complete.
pub(crate) fn object_sink(
    client: Arc<S3Client>,
    url: &S3Url,
    len: u64,
    part_bytes: u64,
    only_if_new: bool,
    copy_from: Option<&str>,
    completed: Option<Completed>,
) -> Result<SinkFile> {
    let parts = len.div_ceil(part_bytes.max(1));
    if part_bytes == 0 || (parts > 1 && part_bytes < MIN_PART_BYTES as u64) {
        return Err(Error::invalid(format!(
            "{url}: parts of {part_bytes} bytes; S3 needs at least {MIN_PART_BYTES} \
             (use staging slots of 8 MiB or more)"
        )));
    }
    if parts > u64::from(MAX_PARTS) {
        return Err(Error::invalid(format!(
            "{url}: {len} bytes in parts of {part_bytes} make {parts} parts; S3 allows \
             {MAX_PARTS} (use larger staging slots)"
        )));
    }
    let upload = MultipartUpload::start(client.clone(), &url.key)?;
    let sink = ObjectSink {
        upload: RwLock::new(Some(upload)),
        client,
        key: url.key.clone(),
        len,
        part_bytes,
        only_if_new,
        copy_from: copy_from.map(str::to_string),
        completed,
    };
    Ok(SinkFile::remote(url.to_string(), len, Box::new(sink)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upload_engines_have_parts_s3_accepts_and_a_slot_per_thread() {
        let config = |threads, total_bytes, slot_bytes| EngineConfig {
            io_threads: threads,
            staging: StagingConfig {
                total_bytes,
                slot_bytes,
            },
            ..EngineConfig::default()
        };
        let fit = config_for_uploads(config(16, 128 << 20, 4 << 20));
        assert_eq!(fit.io_threads, 32);
        assert_eq!(
            (fit.staging.slot_bytes, fit.staging.total_bytes),
            (8 << 20, 256 << 20)
        );
        let fit = config_for_uploads(config(2, 32 << 20, 4 << 20));
        assert_eq!(
            (fit.staging.slot_bytes, fit.staging.total_bytes),
            (8 << 20, 64 << 20)
        );
        // Parts S3 accepts already, and slots enough for the threads.
        let fit = config_for_uploads(config(4, 512 << 20, 16 << 20));
        assert_eq!((fit.io_threads, fit.staging.total_bytes), (8, 512 << 20));
        fit.staging.validate().unwrap();
    }
}

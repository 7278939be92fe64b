//! Objects written by the engine: a multipart upload whose parts are the
//! engine's staging slots, sent whole, straight from them.

use crate::client::{to_io, S3Client};
use crate::location::S3Url;
use crate::multipart::{MultipartUpload, MAX_PARTS, MIN_PART_BYTES};
use std::sync::{Arc, RwLock};
use zerohop::storage::{RemoteSink, SinkFile};
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
}

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
        let upload = self.upload.read().unwrap_or_else(|p| p.into_inner());
        let upload = upload
            .as_ref()
            .ok_or_else(|| std::io::Error::other("the object was already finished"))?;
        let number = (offset / self.part_bytes + 1) as u16;
        upload.upload_part(number, buf).map_err(to_io)
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
            return self
                .client
                .put(&self.key, &[], self.only_if_new)
                .map(drop)
                .map_err(to_io);
        }
        upload.complete(self.only_if_new).map(drop).map_err(to_io)
    }
}

/// A new object at `url` of `len` bytes, for [`zerohop::Engine::write`],
/// written as a multipart upload whose parts are `part_bytes` long (the
/// engine's staging slots: at least 5 MiB unless the object is one part,
/// and at most 10,000 parts). Nothing is visible until the write returns;
/// a write that fails, or a sink dropped unfinished, leaves no object
/// (its upload is aborted). With `only_if_new`, an existing object is not
/// replaced: the write fails instead.
pub fn create_object(
    client: Arc<S3Client>,
    url: &S3Url,
    len: u64,
    part_bytes: u64,
    only_if_new: bool,
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
    };
    Ok(SinkFile::remote(url.to_string(), len, Box::new(sink)))
}

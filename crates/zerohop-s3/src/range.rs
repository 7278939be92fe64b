//! A byte range of one version of an object, read in order from as few
//! requests as the connection allows ([`RangeReader`], and
//! [`S3Client::read_range`] on it).

use crate::client::{to_io, S3Client};
use std::borrow::Borrow;
use std::io::Read;
use ureq::BodyReader;
use zerohop::{Error, ErrorKind, Result};

/// Bytes `pos .. end` of object `key` while its ETag is `etag`. One GET
/// serves them all unless its response breaks off: then the rest is asked
/// for again from where it stopped (still `If-Match`, so never bytes of
/// another version), up to the retry policy's attempts in all, each
/// request itself tried as [`S3Client::with_retries`] does.
pub(crate) struct RangeReader<C: Borrow<S3Client>> {
    client: C,
    key: String,
    etag: String,
    pos: u64,
    end: u64,
    body: Option<BodyReader<'static>>,
    breaks: u32,
}

impl<C: Borrow<S3Client>> RangeReader<C> {
    /// Makes no request until the first read.
    pub(crate) fn new(client: C, key: &str, etag: &str, offset: u64, end: u64) -> Self {
        RangeReader {
            client,
            key: key.to_string(),
            etag: etag.to_string(),
            pos: offset,
            end,
            body: None,
            breaks: 0,
        }
    }

    /// Reads into `buf` (0 bytes only at the range's end or for an empty
    /// `buf`).
    pub(crate) fn read_some(&mut self, buf: &mut [u8]) -> Result<usize> {
        let client = self.client.borrow();
        loop {
            let want = buf
                .len()
                .min((self.end - self.pos).min(usize::MAX as u64) as usize);
            if want == 0 {
                return Ok(0);
            }
            let body = match &mut self.body {
                Some(b) => b,
                None => self
                    .body
                    .insert(client.open_range(&self.key, &self.etag, self.pos, self.end)?),
            };
            let why = match body.read(&mut buf[..want]) {
                Ok(0) => "the response ended early".to_string(),
                Ok(n) => {
                    self.pos += n as u64;
                    return Ok(n);
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => format!("connection lost: {e}"),
            };
            self.body = None;
            self.breaks += 1;
            if self.breaks >= client.retry.attempts {
                return Err(Error::new(
                    ErrorKind::Io,
                    format!(
                        "{}: gave up after {} attempts (AWS_MAX_ATTEMPTS) at {}: {why} at byte {}",
                        client.url(&self.key),
                        self.breaks,
                        client.endpoint,
                        self.pos,
                    ),
                ));
            }
            std::thread::sleep(client.retry.delay(self.breaks - 1));
        }
    }
}

impl<C: Borrow<S3Client>> Read for RangeReader<C> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.read_some(buf).map_err(to_io)
    }
}

/// Ranged reads into a caller's buffer, built on `RangeReader`.
impl S3Client {
    /// Reads `buf.len()` bytes of `key` from `offset` (fewer only where the
    /// object ends first: `len` is its length) into `buf`, straight from the
    /// connection. `etag` must still be the object's: a replaced object is
    /// an error.
    pub fn read_range(
        &self,
        key: &str,
        etag: &str,
        len: u64,
        offset: u64,
        buf: &mut [u8],
    ) -> Result<usize> {
        let want = len.saturating_sub(offset).min(buf.len() as u64) as usize;
        let mut range = RangeReader::new(self, key, etag, offset, offset + want as u64);
        let mut got = 0;
        while got < want {
            got += range.read_some(&mut buf[got..want])?;
        }
        Ok(want)
    }
}

//! Multipart uploads: one object written as numbered parts, from several
//! threads and in any order, that appears whole when completed and not at
//! all before: an upload that is aborted, or whose writer or server dies,
//! leaves nothing a reader can see.

use crate::client::{
    error_field, header, multipart_etag, parse_xml, refused_create, Failure, S3Client,
    MAX_ERROR_BODY, SIGNATURE_LIFETIME,
};
use crate::location::S3Url;
use rusty_s3::actions::{CreateMultipartUpload, S3Action};
use std::ops::Range;
use std::sync::{Arc, Mutex};
use zerohop::{Error, ErrorKind, Result};

/// S3's limits: parts are numbered 1 - 10,000; every part but the last
/// must hold at least 5 MiB.
pub const MAX_PARTS: u16 = 10_000;
pub const MIN_PART_BYTES: usize = 5 << 20;

/// A multipart upload in progress. Dropped without [`MultipartUpload::complete`],
/// it is aborted (best effort: a server that is gone keeps the parts until
/// its own clean-up, still invisible).
pub struct MultipartUpload {
    client: Arc<S3Client>,
    key: String,
    upload_id: String,
    /// Each part's ETag by part number - 1, once uploaded.
    etags: Mutex<Vec<Option<String>>>,
    done: bool,
}

impl std::fmt::Debug for MultipartUpload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MultipartUpload({})", self.client.url(&self.key))
    }
}

impl MultipartUpload {
    /// Starts an upload of `key` in `client`'s bucket.
    pub fn start(client: Arc<S3Client>, key: &str) -> Result<Self> {
        let what = client.url(key);
        let upload_id = client.with_retries(&what, || {
            let url = client
                .bucket
                .create_multipart_upload(client.credentials.as_ref(), key)
                .sign(SIGNATURE_LIFETIME);
            let mut resp = client.classify(&what, client.agent.post(url.as_str()).send_empty())?;
            let parsed = parse_xml(
                &mut resp,
                MAX_ERROR_BODY,
                &what,
                "the server's answer to a new upload",
                CreateMultipartUpload::parse_response,
            )?;
            Ok(parsed.upload_id().to_string())
        })?;
        Ok(MultipartUpload {
            client,
            key: key.to_string(),
            upload_id,
            etags: Mutex::new(Vec::new()),
            done: false,
        })
    }

    /// Uploads part `number` (1 to [`MAX_PARTS`]; every part but the last
    /// at least [`MIN_PART_BYTES`]). Safe to call from several threads at
    /// once; sending a number again replaces that part.
    pub fn upload_part(&self, number: u16, bytes: &[u8]) -> Result<()> {
        self.send_part(number, |c, what| {
            let url = c
                .bucket
                .upload_part(c.credentials.as_ref(), &self.key, number, &self.upload_id)
                .sign(SIGNATURE_LIFETIME);
            let resp = c.classify(what, c.agent.put(url.as_str()).send(bytes))?;
            header(&resp, "etag").map(str::to_string).ok_or_else(|| {
                Error::new(ErrorKind::Io, format!("{what}: no ETag for part {number}")).into()
            })
        })
    }

    /// Makes part `number` a server-side copy of `range` of object
    /// `source` in the same bucket (S3's UploadPartCopy): no bytes pass
    /// through us. As [`MultipartUpload::upload_part`] otherwise.
    pub fn copy_part(&self, number: u16, source: &str, range: Range<u64>) -> Result<()> {
        let copy_source = format!("/{}/{}", self.client.bucket.name(), encode_key(source));
        let copy_range = format!("bytes={}-{}", range.start, range.end - 1);
        self.send_part(number, |c, what| {
            let mut action =
                c.bucket
                    .upload_part(c.credentials.as_ref(), &self.key, number, &self.upload_id);
            // Signed, as S3 wants every x-amz-* header it is sent.
            action
                .headers_mut()
                .insert("x-amz-copy-source", copy_source.clone());
            action
                .headers_mut()
                .insert("x-amz-copy-source-range", copy_range.clone());
            let url = action.sign(SIGNATURE_LIFETIME);
            let mut resp = c.classify(
                what,
                c.agent
                    .put(url.as_str())
                    .header("x-amz-copy-source", &copy_source)
                    .header("x-amz-copy-source-range", &copy_range)
                    .send_empty(),
            )?;
            // A copy can fail after S3 answered 200: the error is the body.
            let body = parse_xml(
                &mut resp,
                MAX_ERROR_BODY,
                what,
                "the server's answer to a part copy",
                |text: &str| Ok::<_, std::convert::Infallible>(text.to_string()),
            )?;
            match (error_field(&body, "ETag"), error_field(&body, "Code")) {
                (Some(etag), None) => Ok(etag.replace("&quot;", "\"")),
                (_, Some(code)) => Err(Failure::Final(Error::new(
                    ErrorKind::Io,
                    format!(
                        "{what}: copying {source} {copy_range} into part {number} failed: {code}"
                    ),
                ))),
                (None, None) => Err(Failure::Passing(format!(
                    "no ETag in the answer to copying part {number}"
                ))),
            }
        })
    }

    /// Sends part `number` with `send` (retried), recording its ETag.
    fn send_part(
        &self,
        number: u16,
        send: impl Fn(&S3Client, &S3Url) -> std::result::Result<String, Failure>,
    ) -> Result<()> {
        if !(1..=MAX_PARTS).contains(&number) {
            return Err(Error::invalid(format!(
                "part number {number}: S3 numbers parts 1 to {MAX_PARTS}"
            )));
        }
        let c = &self.client;
        let what = c.url(&self.key);
        let etag = c.with_retries(&what, || send(c, &what))?;
        let mut etags = self.etags.lock().unwrap_or_else(|p| p.into_inner());
        let i = usize::from(number) - 1;
        if etags.len() <= i {
            etags.resize(i + 1, None);
        }
        etags[i] = Some(etag);
        Ok(())
    }

    /// Completes the upload: the object appears, whole. Parts 1 to the
    /// highest sent must all have been uploaded. With `only_if_new`, only
    /// where no object `key` exists yet (otherwise an `AlreadyExists` error
    /// and nothing changes). Returns the object's ETag.
    pub fn complete(mut self, only_if_new: bool) -> Result<String> {
        let etags = std::mem::take(&mut *self.etags.lock().unwrap_or_else(|p| p.into_inner()));
        let missing = etags.iter().position(Option::is_none);
        if etags.is_empty() || missing.is_some() {
            return Err(Error::invalid(format!(
                "{}: part {} was never uploaded",
                self.client.url(&self.key),
                missing.map_or(1, |i| i + 1)
            )));
        }
        let etags: Vec<&str> = etags.iter().flatten().map(String::as_str).collect();
        let c = &self.client;
        let what = c.url(&self.key);
        let result = c.create_once(&self.key, multipart_etag(&etags), || {
            let action = c.bucket.complete_multipart_upload(
                c.credentials.as_ref(),
                &self.key,
                &self.upload_id,
                etags.iter().copied(),
            );
            let url = action.sign(SIGNATURE_LIFETIME);
            let body = action.body();
            let mut req = c.agent.post(url.as_str());
            if only_if_new {
                req = req.header("If-None-Match", "*");
            }
            let resp = c
                .classify(&what, req.send(body.as_bytes()))
                .map_err(|f| refused_create(f, &what))?;
            Ok(header(&resp, "etag").unwrap_or_default().to_string())
        });
        if result.is_ok() {
            self.done = true;
        }
        result
    }

    /// Aborts the upload: its parts are dropped and no object appears.
    pub fn abort(mut self) -> Result<()> {
        self.done = true;
        self.send_abort()
    }

    fn send_abort(&self) -> Result<()> {
        let c = &self.client;
        let what = c.url(&self.key);
        c.with_retries(&what, || {
            let url = c
                .bucket
                .abort_multipart_upload(c.credentials.as_ref(), &self.key, &self.upload_id)
                .sign(SIGNATURE_LIFETIME);
            c.classify(&what, c.agent.delete(url.as_str()).call())?;
            Ok(())
        })
    }
}

impl Drop for MultipartUpload {
    fn drop(&mut self) {
        if !self.done {
            let _ = self.send_abort();
        }
    }
}

/// `key` as the path of an `x-amz-copy-source` header: percent-encoded,
/// but for the characters a URL path keeps as they are.
fn encode_key(key: &str) -> String {
    let mut out = String::with_capacity(key.len());
    for b in key.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~/".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

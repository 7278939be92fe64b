//! Requests to one bucket: presigned (SigV4) URLs made by `rusty-s3`, sent
//! by a blocking `ureq` agent whose connections the engine's workers share,
//! each request tried again per the [`RetryPolicy`] where it failed for a
//! passing reason.

use crate::config::{AddressingStyle, S3Config};
use crate::location::S3Url;
use crate::retry::RetryPolicy;
use rusty_s3::actions::{ListObjectsV2, S3Action};
use rusty_s3::{Bucket, Credentials, UrlStyle};
use std::time::Duration;
use ureq::http::Response;
use ureq::{Body, BodyReader};
use zerohop::{Error, ErrorKind, Result};

/// How long a signed URL stays valid: one attempt's worth (each attempt
/// signs anew).
pub(crate) const SIGNATURE_LIFETIME: Duration = Duration::from_secs(15 * 60);
/// Error bodies, and other short XML answers, are read up to this size.
pub(crate) const MAX_ERROR_BODY: u64 = 64 << 10;
/// Listing pages are read up to this size (1,000 keys of up to 1 KiB).
const MAX_LIST_BODY: u64 = 8 << 20;
/// A listing stops with an error past this many objects.
const MAX_LISTED: usize = 100_000;
/// Idle connections the client keeps: more than an engine runs workers.
const POOLED_CONNECTIONS: usize = 256;

/// What a HEAD request tells about an object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectInfo {
    pub len: u64,
    /// As the server sent it, quotes included.
    pub etag: String,
}

/// One object of a listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectEntry {
    pub key: String,
    pub len: u64,
}

/// A client of one bucket.
pub struct S3Client {
    pub(crate) bucket: Bucket,
    name: String,
    pub(crate) credentials: Option<Credentials>,
    pub(crate) agent: ureq::Agent,
    pub(crate) retry: RetryPolicy,
    pub(crate) endpoint: String,
}

impl std::fmt::Debug for S3Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "S3Client(s3://{} at {})", self.name, self.endpoint)
    }
}

/// Why an attempt failed: for a passing reason (tried again), because a
/// condition of the request did not hold (412: what that means is the
/// caller's to say), or for good.
pub(crate) enum Failure {
    Passing(String),
    Precondition,
    Final(Error),
}

impl From<Error> for Failure {
    fn from(e: Error) -> Self {
        Failure::Final(e)
    }
}

impl S3Client {
    /// A client of `bucket` per `config`. Makes no request.
    pub fn new(config: &S3Config, bucket: &str) -> Result<Self> {
        let endpoint: url::Url = config.endpoint.parse().map_err(|e| {
            Error::with_source(
                ErrorKind::InvalidInput,
                format!("S3 endpoint {:?} is not a URL", config.endpoint),
                e,
            )
        })?;
        let style = match config.addressing {
            AddressingStyle::Path => UrlStyle::Path,
            AddressingStyle::VirtualHost => UrlStyle::VirtualHost,
        };
        let b = Bucket::new(endpoint, style, bucket.to_string(), config.region.clone()).map_err(
            |e| {
                Error::with_source(
                    ErrorKind::InvalidInput,
                    format!("cannot address bucket {bucket:?} at {}", config.endpoint),
                    e,
                )
            },
        )?;
        let credentials = config
            .credentials
            .as_ref()
            .map(|(id, secret, token)| match token {
                Some(t) => Credentials::new_with_token(id, secret, t),
                None => Credentials::new(id, secret),
            });
        let agent: ureq::Agent = ureq::Agent::config_builder()
            // Statuses are read here: an S3 error's code is in its body.
            .http_status_as_error(false)
            .timeout_connect(Some(Duration::from_secs(10)))
            .timeout_recv_response(Some(Duration::from_secs(60)))
            .timeout_recv_body(Some(Duration::from_secs(300)))
            // Every worker's connection kept between its requests (ureq
            // keeps 10 in all by default): one dropped costs a new TCP
            // connection for a later part.
            .max_idle_connections(POOLED_CONNECTIONS)
            .max_idle_connections_per_host(POOLED_CONNECTIONS)
            .build()
            .into();
        Ok(S3Client {
            bucket: b,
            name: bucket.to_string(),
            credentials,
            agent,
            retry: config.retry,
            endpoint: config.endpoint.clone(),
        })
    }

    pub(crate) fn url(&self, key: &str) -> S3Url {
        S3Url {
            bucket: self.name.clone(),
            key: key.to_string(),
        }
    }

    /// The object's length and ETag.
    pub fn head(&self, key: &str) -> Result<ObjectInfo> {
        let what = self.url(key);
        let found = self.with_retries(&what, || {
            let url = self
                .bucket
                .head_object(self.credentials.as_ref(), key)
                .sign(SIGNATURE_LIFETIME);
            let resp = self.classify(&what, self.agent.head(url.as_str()).call())?;
            let len = header(&resp, "content-length")
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| Error::new(ErrorKind::Io, format!("{what}: no Content-Length")))?;
            let etag = header(&resp, "etag")
                .ok_or_else(|| Error::new(ErrorKind::Io, format!("{what}: no ETag")))?;
            Ok(ObjectInfo {
                len,
                etag: etag.to_string(),
            })
        });
        match found {
            // A HEAD's 404 has no body to tell a missing bucket from a
            // missing key: ask.
            Err(e) if e.kind() == ErrorKind::NotFound => match self.list_page("", None, 1) {
                Err(b) if b.kind() == ErrorKind::NotFound => Err(b),
                _ => Err(e),
            },
            other => other,
        }
    }

    /// A response carrying bytes `offset .. end` of `key` (`end` past
    /// `offset`, at most the object's length), whose ETag must still be
    /// `etag`, ready to be read.
    pub(crate) fn open_range(
        &self,
        key: &str,
        etag: &str,
        offset: u64,
        end: u64,
    ) -> Result<BodyReader<'static>> {
        let what = self.url(key);
        self.with_retries(&what, || {
            let url = self
                .bucket
                .get_object(self.credentials.as_ref(), key)
                .sign(SIGNATURE_LIFETIME);
            let range = format!("bytes={offset}-{}", end - 1);
            let sent = self
                .agent
                .get(url.as_str())
                .header("Range", &range)
                .header("If-Match", etag)
                .call();
            let resp = self.classify(&what, sent).map_err(|f| match f {
                Failure::Precondition => replaced(&what, etag).into(),
                f => f,
            })?;
            // A server that ignores If-Match still says which object it sent.
            if header(&resp, "etag").is_some_and(|e| e != etag) {
                return Err(replaced(&what, etag).into());
            }
            if resp.status().as_u16() != 206 && offset != 0 {
                return Err(Error::new(
                    ErrorKind::Io,
                    format!("{what}: the server ignored the byte range {range}"),
                )
                .into());
            }
            Ok(resp.into_body().into_reader())
        })
    }

    /// Writes `bytes` as object `key` in one request; with `only_if_new`,
    /// only where no such object exists yet (a conditional create:
    /// otherwise an `AlreadyExists` error). Returns the new ETag.
    pub fn put(&self, key: &str, bytes: &[u8], only_if_new: bool) -> Result<String> {
        let what = self.url(key);
        self.create_once(key, Some(md5_hex(&[bytes])), || {
            let url = self
                .bucket
                .put_object(self.credentials.as_ref(), key)
                .sign(SIGNATURE_LIFETIME);
            let mut req = self.agent.put(url.as_str());
            if only_if_new {
                req = req.header("If-None-Match", "*");
            }
            let sent = req.send(bytes);
            let resp = self
                .classify(&what, sent)
                .map_err(|f| refused_create(f, &what))?;
            Ok(header(&resp, "etag").unwrap_or_default().to_string())
        })
    }

    /// Deletes object `key` (no error if there is none).
    pub fn delete(&self, key: &str) -> Result<()> {
        let what = self.url(key);
        self.with_retries(&what, || {
            let url = self
                .bucket
                .delete_object(self.credentials.as_ref(), key)
                .sign(SIGNATURE_LIFETIME);
            self.classify(&what, self.agent.delete(url.as_str()).call())?;
            Ok(())
        })
    }

    /// Every object whose key starts with `prefix`, in key order.
    pub fn list(&self, prefix: &str) -> Result<Vec<ObjectEntry>> {
        let mut all = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let (page, next) = self.list_page(prefix, token.as_deref(), 1000)?;
            all.extend(page);
            if all.len() > MAX_LISTED {
                return Err(Error::invalid(format!(
                    "{}: more than {MAX_LISTED} objects; name fewer",
                    self.url(prefix)
                )));
            }
            match next {
                Some(t) => token = Some(t),
                None => return Ok(all),
            }
        }
    }

    /// One page of a listing, and the token of the next if there is one.
    fn list_page(
        &self,
        prefix: &str,
        token: Option<&str>,
        max_keys: usize,
    ) -> Result<(Vec<ObjectEntry>, Option<String>)> {
        let what = self.url(prefix);
        self.with_retries(&what, || {
            let mut action = ListObjectsV2::new(&self.bucket, self.credentials.as_ref());
            action.with_prefix(prefix);
            action.with_max_keys(max_keys);
            if let Some(t) = token {
                action.with_continuation_token(t);
            }
            let url = action.sign(SIGNATURE_LIFETIME);
            let mut resp = self.classify(&what, self.agent.get(url.as_str()).call())?;
            let parsed = parse_xml(
                &mut resp,
                MAX_LIST_BODY,
                &what,
                "the server's listing",
                ListObjectsV2::parse_response,
            )?;
            let entries = parsed
                .contents
                .into_iter()
                .map(|c| ObjectEntry {
                    len: c.size.unwrap_or(0),
                    key: c.key,
                })
                .collect();
            Ok((entries, parsed.next_continuation_token))
        })
    }

    /// Runs `attempt`, a request creating object `key` (a conditional PUT,
    /// a completion) that fails when repeated, as [`S3Client::with_retries`]
    /// does; but where a retry fails, an earlier attempt may have succeeded
    /// with its answer lost: if the object's ETag is now `etag` (the one
    /// the request makes), that attempt's work is the result.
    pub(crate) fn create_once(
        &self,
        key: &str,
        etag: Option<String>,
        mut attempt: impl FnMut() -> Result<String, Failure>,
    ) -> Result<String> {
        let what = self.url(key);
        let mut tries = 0;
        let result = self.with_retries(&what, || {
            tries += 1;
            attempt()
        });
        match (result, etag) {
            (Err(e), Some(etag)) if tries > 1 => match self.head(key) {
                Ok(info) if unquoted(&info.etag) == etag => Ok(info.etag),
                _ => Err(e),
            },
            (result, _) => result,
        }
    }

    /// Runs `attempt` until it succeeds, fails for good, or has been tried
    /// `retry.attempts` times.
    pub(crate) fn with_retries<T>(
        &self,
        what: &S3Url,
        mut attempt: impl FnMut() -> Result<T, Failure>,
    ) -> Result<T> {
        let mut last = String::new();
        for n in 0..self.retry.attempts {
            if n > 0 {
                std::thread::sleep(self.retry.delay(n - 1));
            }
            match attempt() {
                Ok(v) => return Ok(v),
                Err(Failure::Final(e)) => return Err(e),
                Err(Failure::Precondition) => {
                    return Err(Error::new(
                        ErrorKind::Io,
                        format!("{what}: the server refused the request's condition (HTTP 412)"),
                    ))
                }
                Err(Failure::Passing(why)) => last = why,
            }
        }
        Err(Error::new(
            ErrorKind::Io,
            format!(
                "{what}: gave up after {} attempts (AWS_MAX_ATTEMPTS) at {}: {last}",
                self.retry.attempts, self.endpoint
            ),
        ))
    }

    /// The response if it succeeded; else why not, read from S3's error
    /// body where there is one.
    pub(crate) fn classify(
        &self,
        what: &S3Url,
        sent: Result<Response<Body>, ureq::Error>,
    ) -> Result<Response<Body>, Failure> {
        let mut resp = match sent {
            Ok(r) => r,
            Err(e @ (ureq::Error::BadUri(_) | ureq::Error::Http(_))) => {
                return Err(Error::with_source(
                    ErrorKind::InvalidInput,
                    format!("{what}: cannot make the request"),
                    e,
                )
                .into())
            }
            // Connections refused, reset or timed out, broken responses.
            Err(e) => return Err(Failure::Passing(e.to_string())),
        };
        let status = resp.status().as_u16();
        if (200..300).contains(&status) {
            return Ok(resp);
        }
        let body = resp
            .body_mut()
            .with_config()
            .limit(MAX_ERROR_BODY)
            .read_to_string()
            .unwrap_or_default();
        let code = error_field(&body, "Code").unwrap_or_default();
        let message = error_field(&body, "Message").unwrap_or_default();
        let said = match (code.is_empty(), message.is_empty()) {
            (true, _) => format!("HTTP {status}"),
            (false, true) => format!("HTTP {status} {code}"),
            (false, false) => format!("HTTP {status} {code}: {message}"),
        };
        if matches!(status, 429 | 500 | 502 | 503 | 504) {
            return Err(Failure::Passing(said));
        }
        let (kind, hint) = match (status, code.as_str()) {
            (_, "NoSuchBucket") => (
                ErrorKind::NotFound,
                format!("no bucket {:?} at {}", what.bucket, self.endpoint),
            ),
            (404, _) => (ErrorKind::NotFound, "no such object".to_string()),
            (401 | 403, _) => (
                ErrorKind::PermissionDenied,
                "the server refused these credentials (AWS_ACCESS_KEY_ID and \
                 AWS_SECRET_ACCESS_KEY, or the profile's)"
                    .to_string(),
            ),
            (412, _) => return Err(Failure::Precondition),
            _ => (ErrorKind::Io, "the request failed".to_string()),
        };
        Err(Error::new(kind, format!("{what}: {hint} ({said})")).into())
    }
}

/// `e` as an I/O error of the matching kind, for the engine's storage
/// traits (which turn it back into a [`zerohop::Error`] of that kind).
pub(crate) fn to_io(e: Error) -> std::io::Error {
    let kind = match e.kind() {
        ErrorKind::NotFound => std::io::ErrorKind::NotFound,
        ErrorKind::PermissionDenied => std::io::ErrorKind::PermissionDenied,
        ErrorKind::AlreadyExists => std::io::ErrorKind::AlreadyExists,
        _ => std::io::ErrorKind::Other,
    };
    std::io::Error::new(kind, e.to_string())
}

/// A conditional create's failure: a 412 means the key exists.
pub(crate) fn refused_create(f: Failure, what: &S3Url) -> Failure {
    match f {
        Failure::Precondition => {
            Error::new(ErrorKind::AlreadyExists, format!("{what} already exists")).into()
        }
        f => f,
    }
}

/// The error for an object whose ETag is no longer `etag`.
fn replaced(what: &S3Url, etag: &str) -> Error {
    Error::new(
        ErrorKind::Io,
        format!(
            "{what} was replaced while it was being read (its ETag is no longer {etag}); \
             nothing read from it was kept"
        ),
    )
}

/// A successful response's XML document (at most `limit` bytes), parsed
/// by `parse`; `doc` names it in errors. A body cut short is a passing
/// failure (tried again); one that is not the XML expected is final.
pub(crate) fn parse_xml<T, E: std::fmt::Display>(
    resp: &mut Response<Body>,
    limit: u64,
    what: &S3Url,
    doc: &str,
    parse: impl FnOnce(&str) -> Result<T, E>,
) -> Result<T, Failure> {
    let text = resp
        .body_mut()
        .with_config()
        .limit(limit)
        .read_to_string()
        .map_err(|e| Failure::Passing(format!("{doc}: {e}")))?;
    parse(&text).map_err(|e| {
        Error::with_source(
            ErrorKind::Format,
            format!("{what}: {doc} is not S3's XML"),
            e.to_string(),
        )
        .into()
    })
}

/// An ETag without its quotes.
fn unquoted(etag: &str) -> &str {
    etag.trim_matches('"')
}

/// The MD5 of `pieces` run together, in hex: a single PUT's ETag.
pub(crate) fn md5_hex(pieces: &[&[u8]]) -> String {
    use md5::Digest;
    let mut h = md5::Md5::new();
    pieces.iter().for_each(|p| h.update(p));
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

/// The ETag S3 gives an object completed from parts with these ETags: the
/// MD5 of their MD5s, then `-` and the count. `None` where a part's ETag
/// is not an MD5 (objects encrypted with KMS keys, say).
pub(crate) fn multipart_etag(parts: &[&str]) -> Option<String> {
    let mut digests = Vec::with_capacity(parts.len() * 16);
    for p in parts {
        let hex = unquoted(p);
        if hex.len() != 32 {
            return None;
        }
        for i in (0..32).step_by(2) {
            digests.push(u8::from_str_radix(hex.get(i..i + 2)?, 16).ok()?);
        }
    }
    Some(format!("{}-{}", md5_hex(&[&digests]), parts.len()))
}

pub(crate) fn header<'r>(resp: &'r Response<Body>, name: &str) -> Option<&'r str> {
    resp.headers().get(name).and_then(|v| v.to_str().ok())
}

/// The text of the first `<name>...</name>` element of an S3 error
/// document (`Code`, `Message`). They are flat: no parser needed for two
/// fields.
pub fn error_field(body: &str, name: &str) -> Option<String> {
    let open = format!("<{name}>");
    let start = body.find(&open)? + open.len();
    let len = body[start..].find(&format!("</{name}>"))?;
    Some(body[start..start + len].trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etags_are_computed_as_s3_computes_them() {
        assert_eq!(md5_hex(&[b""]), "d41d8cd98f00b204e9800998ecf8427e");
        assert_eq!(md5_hex(&[b"ab", b"c"]), md5_hex(&[b"abc"]));
        let parts = [
            md5_hex(&[b"first"]),
            format!("\"{}\"", md5_hex(&[b"second"])),
        ];
        let parts: Vec<&str> = parts.iter().map(String::as_str).collect();
        let mut both = Vec::new();
        for p in ["first", "second"] {
            use md5::Digest;
            both.extend_from_slice(&md5::Md5::digest(p.as_bytes()));
        }
        assert_eq!(
            multipart_etag(&parts).unwrap(),
            format!("{}-2", md5_hex(&[&both]))
        );
        assert_eq!(multipart_etag(&["not-an-md5"]), None);
        assert_eq!(multipart_etag(&["zz".repeat(16).as_str()]), None);
    }

    #[test]
    fn error_fields_are_read_from_s3_error_documents() {
        let body = "<?xml version=\"1.0\"?><Error><Code>NoSuchKey</Code>\
                    <Message>The specified key does not exist.</Message></Error>";
        assert_eq!(error_field(body, "Code").unwrap(), "NoSuchKey");
        assert_eq!(
            error_field(body, "Message").unwrap(),
            "The specified key does not exist."
        );
        assert_eq!(error_field(body, "Resource"), None);
        assert_eq!(error_field("<Code>unterminated", "Code"), None);
        assert_eq!(error_field("", "Code"), None);
    }
}

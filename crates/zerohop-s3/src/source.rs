//! Objects opened as the engine's sources (local files are the engine's
//! own; `zerohop-names` opens each name where it lives).

use crate::client::{ObjectInfo, S3Client};
use crate::config::S3Config;
use crate::location::S3Url;
use crate::range::RangeReader;
use std::collections::HashMap;
use std::io::Read;
use std::sync::Arc;
use zerohop::storage::{RemoteObject, SourceFile};
use zerohop::{Error, ErrorKind, Result};

/// An object as the engine reads it: ranged GETs of the version opened.
#[derive(Debug)]
struct ObjectSource {
    client: Arc<S3Client>,
    key: String,
    etag: String,
    len: u64,
}

impl RemoteObject for ObjectSource {
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<usize> {
        self.client
            .read_range(&self.key, &self.etag, self.len, offset, buf)
            .map_err(crate::client::to_io)
    }

    fn read_stream(&self, offset: u64, end: u64) -> std::io::Result<Box<dyn Read + Send>> {
        Ok(Box::new(RangeReader::new(
            self.client.clone(),
            &self.key,
            &self.etag,
            offset,
            end,
        )))
    }
}

/// Clients by bucket, made on first use; the configuration is read from
/// the environment at the first object name, unless given.
#[derive(Default)]
struct Clients {
    config: Option<S3Config>,
    by_bucket: HashMap<String, Arc<S3Client>>,
}

impl Clients {
    fn get(&mut self, bucket: &str) -> Result<Arc<S3Client>> {
        if let Some(c) = self.by_bucket.get(bucket) {
            return Ok(c.clone());
        }
        let config = match &self.config {
            Some(c) => c,
            None => self.config.insert(S3Config::from_env()?),
        };
        let client = Arc::new(S3Client::new(config, bucket)?);
        self.by_bucket.insert(bucket.to_string(), client.clone());
        Ok(client)
    }
}

/// Opens each object (`s3://bucket/key`) for reading: one HEAD request
/// each, for its length and ETag. Configuration: [`S3Config::from_env`].
pub fn open_objects<S: AsRef<str>>(urls: &[S]) -> Result<Vec<SourceFile>> {
    open_with(Clients::default(), urls)
}

/// As [`open_objects`], with this configuration rather than the
/// environment's.
pub fn open_objects_with<S: AsRef<str>>(config: &S3Config, urls: &[S]) -> Result<Vec<SourceFile>> {
    open_with(Clients::with(config), urls)
}

impl Clients {
    fn with(config: &S3Config) -> Self {
        Clients {
            config: Some(config.clone()),
            by_bucket: HashMap::new(),
        }
    }
}

fn open_with<S: AsRef<str>>(mut clients: Clients, urls: &[S]) -> Result<Vec<SourceFile>> {
    urls.iter()
        .map(|url| {
            let url = S3Url::parse(url.as_ref())?;
            if url.key.is_empty() || url.key.ends_with('/') || url.pattern_prefix().is_some() {
                return Err(Error::invalid(format!(
                    "{url}: names no single object (a prefix or a pattern: expand it first)"
                )));
            }
            open_object(clients.get(&url.bucket)?, &url)
        })
        .collect()
}

/// The object at `url` (of `client`'s bucket), for reading: one HEAD
/// request, for its length and the ETag every read will carry.
pub(crate) fn open_object(client: Arc<S3Client>, url: &S3Url) -> Result<SourceFile> {
    let info = client.head(&url.key)?;
    let object = ObjectSource {
        client,
        key: url.key.clone(),
        etag: info.etag,
        len: info.len,
    };
    Ok(SourceFile::remote(
        url.to_string(),
        info.len,
        Box::new(object),
    ))
}

/// The length and ETag of the object at `url` (`s3://bucket/key`).
pub fn head(url: &str) -> Result<ObjectInfo> {
    let url = S3Url::parse(url)?;
    Clients::default().get(&url.bucket)?.head(&url.key)
}

/// Expands object store names (each `s3://...`) that stand for several
/// objects, keeping the others (single objects) as they are:
/// - `s3://bucket/prefix/` (or `s3://bucket`): every object under it whose
///   key ends in `suffix` (say `.safetensors`), in key order;
/// - `s3://bucket/dir/model-*.safetensors`: every key the pattern matches
///   (`*` and `?` stop at `/`), in key order.
///
/// A name that matches nothing is an error that says so. Configuration:
/// [`S3Config::from_env`].
pub fn expand_objects(names: &[String], suffix: &str) -> Result<Vec<String>> {
    expand_with(Clients::default(), names, suffix)
}

/// As [`expand_objects`], with this configuration rather than the
/// environment's.
pub fn expand_objects_with(
    config: &S3Config,
    names: &[String],
    suffix: &str,
) -> Result<Vec<String>> {
    expand_with(Clients::with(config), names, suffix)
}

fn expand_with(mut clients: Clients, names: &[String], suffix: &str) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for name in names {
        let url = S3Url::parse(name)?;
        let pattern = url.pattern_prefix();
        let prefix = match pattern {
            Some(p) => p,
            None if url.key.is_empty() || url.key.ends_with('/') => &url.key,
            None => {
                out.push(name.clone());
                continue;
            }
        };
        let keep = |key: &str| match pattern {
            Some(_) => url.matches(key),
            None => key.ends_with(suffix),
        };
        let found: Vec<String> = clients
            .get(&url.bucket)?
            .list(prefix)?
            .into_iter()
            .filter(|e| keep(&e.key))
            .map(|e| url.with_key(e.key).to_string())
            .collect();
        if found.is_empty() {
            return Err(Error::new(
                ErrorKind::NotFound,
                format!("{name}: no object matches"),
            ));
        }
        out.extend(found);
    }
    Ok(out)
}

//! `s3://bucket/key` names, and the wildcards a name may carry.

use std::fmt;
use zerohop::{Error, Result};

const SCHEME: &str = zerohop::location::OBJECT_STORE_SCHEME;

/// An object, a prefix or a pattern in a bucket: `s3://bucket/key`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct S3Url {
    pub bucket: String,
    /// May be empty (the whole bucket) or end in `/` (a prefix).
    pub key: String,
}

impl S3Url {
    /// Parses `s3://bucket/key`. The bucket must be a valid S3 bucket name
    /// (3 - 63 characters: lowercase letters, digits, `.` and `-`).
    pub fn parse(name: &str) -> Result<Self> {
        let rest = name
            .strip_prefix(SCHEME)
            .ok_or_else(|| Error::invalid(format!("{name:?} is not an s3:// URL")))?;
        let (bucket, key) = rest.split_once('/').unwrap_or((rest, ""));
        let valid = (3..=63).contains(&bucket.len())
            && bucket
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'-')
            && !bucket.starts_with(['.', '-'])
            && !bucket.ends_with(['.', '-']);
        if !valid {
            return Err(Error::invalid(format!(
                "{name}: {bucket:?} is not a valid bucket name (3 - 63 lowercase letters, \
                 digits, '.' and '-')"
            )));
        }
        Ok(S3Url {
            bucket: bucket.to_string(),
            key: key.to_string(),
        })
    }

    /// The same bucket, another key.
    pub fn with_key(&self, key: impl Into<String>) -> Self {
        S3Url {
            bucket: self.bucket.clone(),
            key: key.into(),
        }
    }

    /// Whether `key` matches this URL's key as a pattern (`*`: any run of
    /// characters but `/`; `?`: any one but `/`).
    pub fn matches(&self, key: &str) -> bool {
        glob_matches(&self.key, key)
    }

    /// The key's part before its first wildcard (`*`, `?`), where it has
    /// one: a listing under it finds every match.
    pub fn pattern_prefix(&self) -> Option<&str> {
        self.key.find(['*', '?']).map(|i| &self.key[..i])
    }
}

impl fmt::Display for S3Url {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{SCHEME}{}/{}", self.bucket, self.key)
    }
}

/// Whether `key` matches `pattern`, where `*` stands for any run of
/// characters other than `/` and `?` for any one such character (as a
/// shell's glob does within one directory).
fn glob_matches(pattern: &str, key: &str) -> bool {
    let (p, k): (Vec<char>, Vec<char>) = (pattern.chars().collect(), key.chars().collect());
    // Classic backtracking over the last `*`: linear in practice, and keys
    // are at most 1,024 bytes in S3.
    let (mut pi, mut ki) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ki < k.len() {
        match p.get(pi) {
            Some('*') => {
                star = Some((pi, ki));
                pi += 1;
            }
            Some(&c) if c == k[ki] || (c == '?' && k[ki] != '/') => {
                pi += 1;
                ki += 1;
            }
            _ => match star {
                // The star takes one more character, never a '/'.
                Some((sp, sk)) if k[sk] != '/' => {
                    star = Some((sp, sk + 1));
                    pi = sp + 1;
                    ki = sk + 1;
                }
                _ => return false,
            },
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse_and_print_back() {
        let u = S3Url::parse("s3://my-bucket.v2/models/a.safetensors").unwrap();
        assert_eq!(u.bucket, "my-bucket.v2");
        assert_eq!(u.key, "models/a.safetensors");
        assert_eq!(u.to_string(), "s3://my-bucket.v2/models/a.safetensors");
        assert_eq!(S3Url::parse("s3://bkt").unwrap().key, "");
        assert_eq!(S3Url::parse("s3://bkt/").unwrap().key, "");
    }

    #[test]
    fn bad_urls_are_refused_with_the_reason() {
        for bad in [
            "/tmp/x",
            "s3:/bkt/k",
            "s3://",
            "s3://ab/k",
            "s3://Upper/k",
            "s3://-bkt/k",
        ] {
            let e = S3Url::parse(bad).unwrap_err();
            assert_eq!(e.kind(), zerohop::ErrorKind::InvalidInput, "{bad}");
        }
        let e = S3Url::parse("s3://Bad_Name/k").unwrap_err().to_string();
        assert!(e.contains("not a valid bucket name"), "{e}");
    }

    #[test]
    fn patterns_match_within_one_level() {
        let m = glob_matches;
        assert!(m("m/*.safetensors", "m/model-00001.safetensors"));
        assert!(!m("m/*.safetensors", "m/sub/model.safetensors"));
        assert!(!m("m/*.safetensors", "m/model.bin"));
        assert!(m("m/model-0000?.safetensors", "m/model-00002.safetensors"));
        assert!(!m("m/model-0000?.safetensors", "m/model-00010.safetensors"));
        assert!(m("*", "anything"));
        assert!(!m("*", "a/b"));
        assert!(m("a*b*c", "aXbYbZc"));
        assert!(!m("a*b*c", "aXbYbZ"));
        assert!(m("", ""));
        assert!(!m("", "x"));
        let u = S3Url::parse("s3://bkt/m/part-*.safetensors").unwrap();
        assert_eq!(u.pattern_prefix(), Some("m/part-"));
        assert_eq!(S3Url::parse("s3://bkt/m/").unwrap().pattern_prefix(), None);
    }
}

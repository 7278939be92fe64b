//! Where the store is and who we are, read as AWS tools read it.

use crate::ini;
use crate::retry::RetryPolicy;
use std::path::PathBuf;
use zerohop::{Error, ErrorKind, Result};

/// How a bucket is named in request URLs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddressingStyle {
    /// `https://endpoint/bucket/key`: what most S3-compatible servers need.
    Path,
    /// `https://bucket.endpoint/key`: AWS's own.
    VirtualHost,
}

/// An S3 client's settings.
#[derive(Clone)]
pub struct S3Config {
    /// `http(s)://host[:port]`.
    pub endpoint: String,
    pub region: String,
    /// Access key id, secret key and session token; `None` sends unsigned
    /// (anonymous) requests.
    pub credentials: Option<(String, String, Option<String>)>,
    pub addressing: AddressingStyle,
    pub retry: RetryPolicy,
}

impl std::fmt::Debug for S3Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the secret.
        f.debug_struct("S3Config")
            .field("endpoint", &self.endpoint)
            .field("region", &self.region)
            .field("access_key_id", &self.credentials.as_ref().map(|c| &c.0))
            .field("addressing", &self.addressing)
            .field("retry", &self.retry)
            .finish()
    }
}

impl S3Config {
    /// From this process's environment and the AWS files, as the AWS CLI
    /// reads them (the first that is set wins):
    /// - profile: `AWS_PROFILE`, else `default`;
    /// - credentials: `AWS_ACCESS_KEY_ID` + `AWS_SECRET_ACCESS_KEY` (+
    ///   `AWS_SESSION_TOKEN`), the profile in `~/.aws/credentials`
    ///   (`AWS_SHARED_CREDENTIALS_FILE`), the profile in `~/.aws/config`
    ///   (`AWS_CONFIG_FILE`); none: unsigned requests;
    /// - region: `AWS_REGION`, `AWS_DEFAULT_REGION`, the profile's
    ///   `region`, else `us-east-1`;
    /// - endpoint: `AWS_ENDPOINT_URL_S3`, `AWS_ENDPOINT_URL`, the profile's
    ///   `s3.endpoint_url` or `endpoint_url`, else AWS's for the region;
    /// - addressing: the profile's `s3.addressing_style` (`path`,
    ///   `virtual`); else path-style for a custom endpoint, virtual-host
    ///   style for AWS;
    /// - attempts per request: `AWS_MAX_ATTEMPTS` (see [`RetryPolicy`]).
    pub fn from_env() -> Result<Self> {
        Self::from_lookup(|name| std::env::var(name).ok().filter(|v| !v.is_empty()))
    }

    /// As [`S3Config::from_env`], with `var` standing for the environment.
    pub fn from_lookup(var: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let profile = var("AWS_PROFILE").unwrap_or_else(|| "default".to_string());
        let home = var("HOME").map(PathBuf::from);
        let file = |env: &str, name: &str| {
            var(env)
                .map(PathBuf::from)
                .or_else(|| home.as_ref().map(|h| h.join(".aws").join(name)))
        };
        // The config file names profiles `[profile x]`, but `[default]`.
        let config_section = match profile.as_str() {
            "default" => "default".to_string(),
            p => format!("profile {p}"),
        };
        let config = read_section(file("AWS_CONFIG_FILE", "config"), &config_section)?;
        let creds = read_section(file("AWS_SHARED_CREDENTIALS_FILE", "credentials"), &profile)?;
        let setting = |key: &str| creds.get(key).or_else(|| config.get(key)).cloned();

        let credentials = match (var("AWS_ACCESS_KEY_ID"), var("AWS_SECRET_ACCESS_KEY")) {
            (Some(id), Some(secret)) => Some((id, secret, var("AWS_SESSION_TOKEN"))),
            (Some(_), None) | (None, Some(_)) => {
                return Err(Error::invalid(
                    "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY must be set together",
                ))
            }
            (None, None) => match (
                setting("aws_access_key_id"),
                setting("aws_secret_access_key"),
            ) {
                (Some(id), Some(secret)) => Some((id, secret, setting("aws_session_token"))),
                _ => None,
            },
        };
        let region = var("AWS_REGION")
            .or_else(|| var("AWS_DEFAULT_REGION"))
            .or_else(|| config.get("region").cloned())
            .unwrap_or_else(|| "us-east-1".to_string());
        let custom = var("AWS_ENDPOINT_URL_S3")
            .or_else(|| var("AWS_ENDPOINT_URL"))
            .or_else(|| config.get("s3.endpoint_url").cloned())
            .or_else(|| config.get("endpoint_url").cloned());
        let addressing = match config.get("s3.addressing_style").map(String::as_str) {
            Some("path") => AddressingStyle::Path,
            Some("virtual") => AddressingStyle::VirtualHost,
            Some("auto") | None if custom.is_some() => AddressingStyle::Path,
            Some("auto") | None => AddressingStyle::VirtualHost,
            Some(other) => {
                return Err(Error::invalid(format!(
                    "s3.addressing_style {other:?} in profile {profile:?}: \
                     expected path, virtual or auto"
                )))
            }
        };
        let endpoint = custom.unwrap_or_else(|| format!("https://s3.{region}.amazonaws.com"));
        if !(endpoint.starts_with("http://") || endpoint.starts_with("https://")) {
            return Err(Error::invalid(format!(
                "S3 endpoint {endpoint:?} must start with http:// or https://"
            )));
        }
        let mut retry = RetryPolicy::default();
        if let Some(n) = var("AWS_MAX_ATTEMPTS") {
            retry.attempts = n.parse().ok().filter(|&n| n >= 1).ok_or_else(|| {
                Error::invalid(format!(
                    "AWS_MAX_ATTEMPTS={n:?}: expected a whole number >= 1"
                ))
            })?;
        }
        Ok(S3Config {
            endpoint,
            region,
            credentials,
            addressing,
            retry,
        })
    }
}

/// The settings of `section` in the file at `path`; none if there is no
/// such file or section.
fn read_section(
    path: Option<PathBuf>,
    section: &str,
) -> Result<std::collections::HashMap<String, String>> {
    let Some(path) = path else {
        return Ok(Default::default());
    };
    let text = match std::fs::read(&path) {
        Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Default::default()),
        Err(e) => return Err(Error::io(&path, "cannot read", e)),
    };
    let mut sections = ini::parse(&text).map_err(|why| {
        Error::new(
            ErrorKind::Format,
            format!("{}: not an AWS config file: {why}", path.display()),
        )
    })?;
    Ok(sections.remove(section).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn config(env: &[(&str, &str)]) -> Result<S3Config> {
        let env: HashMap<String, String> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        S3Config::from_lookup(|k| env.get(k).cloned())
    }

    #[test]
    fn environment_alone() {
        let c = config(&[
            ("AWS_ACCESS_KEY_ID", "id"),
            ("AWS_SECRET_ACCESS_KEY", "secret"),
            ("AWS_SESSION_TOKEN", "token"),
            ("AWS_DEFAULT_REGION", "eu-north-1"),
            ("HOME", "/nonexistent"),
        ])
        .unwrap();
        assert_eq!(
            c.credentials,
            Some(("id".into(), "secret".into(), Some("token".into())))
        );
        assert_eq!(c.region, "eu-north-1");
        assert_eq!(c.endpoint, "https://s3.eu-north-1.amazonaws.com");
        assert_eq!(c.addressing, AddressingStyle::VirtualHost);
        assert!(!format!("{c:?}").contains("secret"));
        let c = config(&[("AWS_ENDPOINT_URL", "http://127.0.0.1:9000")]).unwrap();
        assert_eq!(c.addressing, AddressingStyle::Path);
        assert_eq!(c.credentials, None);
        assert_eq!(c.region, "us-east-1");
    }

    #[test]
    fn profiles_from_the_files_and_the_environment_first() {
        let dir = std::env::temp_dir().join(format!("zerohop-s3-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (cfg, creds) = (dir.join("config"), dir.join("credentials"));
        std::fs::write(
            &cfg,
            "[default]\nregion = us-west-2\n[profile lab]\nregion = eu-west-3\n\
             s3 =\n  endpoint_url = http://lab:9000\n  addressing_style = virtual\n",
        )
        .unwrap();
        std::fs::write(
            &creds,
            "[default]\naws_access_key_id = d\naws_secret_access_key = ds\n\
             [lab]\naws_access_key_id = l\naws_secret_access_key = ls\n",
        )
        .unwrap();
        let files = [
            ("AWS_CONFIG_FILE", cfg.to_str().unwrap()),
            ("AWS_SHARED_CREDENTIALS_FILE", creds.to_str().unwrap()),
        ];
        let c = config(&files).unwrap();
        assert_eq!(c.region, "us-west-2");
        assert_eq!(c.credentials.unwrap().0, "d");
        let lab = [files[0], files[1], ("AWS_PROFILE", "lab")];
        let c = config(&lab).unwrap();
        assert_eq!(
            (c.region.as_str(), c.endpoint.as_str()),
            ("eu-west-3", "http://lab:9000")
        );
        assert_eq!(c.addressing, AddressingStyle::VirtualHost);
        assert_eq!(c.credentials.unwrap().1, "ls");
        let over = [
            files[0],
            files[1],
            ("AWS_PROFILE", "lab"),
            ("AWS_REGION", "ap-south-1"),
            ("AWS_ACCESS_KEY_ID", "e"),
            ("AWS_SECRET_ACCESS_KEY", "es"),
        ];
        let c = config(&over).unwrap();
        assert_eq!(c.region, "ap-south-1");
        assert_eq!(c.credentials.unwrap().0, "e");
        std::fs::write(&cfg, "[default]\nnonsense\n").unwrap();
        let e = config(&files).unwrap_err();
        assert!(e.to_string().contains("line 2"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn half_credentials_and_bad_settings_are_refused() {
        for env in [
            vec![("AWS_ACCESS_KEY_ID", "id")],
            vec![("AWS_ENDPOINT_URL", "127.0.0.1:9000")],
            vec![("AWS_MAX_ATTEMPTS", "0")],
        ] {
            let e = config(&env).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidInput, "{env:?}");
        }
        assert_eq!(
            config(&[("AWS_MAX_ATTEMPTS", "2")]).unwrap().retry.attempts,
            2
        );
    }
}

//! Where a name lives: a local path, or an object in an object store
//! (`s3://bucket/key`). This is the one place that decides; every front
//! end (the CLI, the Python package, the lab) and the object store crate
//! ask it. Opening a name where it lives is `zerohop-names`' job.

use std::path::Path;

/// The scheme of object store names.
pub const OBJECT_STORE_SCHEME: &str = "s3://";

/// Where a name lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lives {
    /// A path on this machine's file systems.
    Local,
    /// An object, a prefix or a pattern in an object store.
    ObjectStore,
}

impl Lives {
    /// Where `name` lives. A name that is not UTF-8 is a local path.
    pub fn of(name: impl AsRef<Path>) -> Lives {
        match name.as_ref().to_str() {
            Some(s) if s.starts_with(OBJECT_STORE_SCHEME) => Lives::ObjectStore,
            _ => Lives::Local,
        }
    }
}

/// Whether `name` lives in an object store.
pub fn is_object(name: impl AsRef<Path>) -> bool {
    Lives::of(name) == Lives::ObjectStore
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;

    #[test]
    fn only_the_scheme_makes_an_object() {
        assert_eq!(Lives::of("s3://bucket/key"), Lives::ObjectStore);
        assert_eq!(Lives::of("s3://"), Lives::ObjectStore);
        for local in [
            "model.safetensors",
            "/data/s3://x",
            "./s3://x",
            "S3://b/k",
            "s3:/b/k",
            "",
        ] {
            assert_eq!(Lives::of(local), Lives::Local, "{local}");
        }
        assert!(!is_object(OsStr::from_bytes(b"s3://\xff")));
        assert!(is_object(Path::new("s3://b/k")));
    }
}

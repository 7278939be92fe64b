use rustix::io::Errno;
use std::fmt;
use std::io;
use std::path::Path;

/// What kind of failure an [`Error`] is; callers branch on this, users read
/// the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// A file or device does not exist.
    NotFound,
    /// The OS refused access.
    PermissionDenied,
    /// An argument is wrong (bad device name, out-of-range extent, a directory
    /// where a file was expected, ...).
    InvalidInput,
    /// A file's contents are malformed (e.g. a bad safetensors header).
    Format,
    /// A read or write failed, or a file ended early.
    Io,
    /// The file system is full (ENOSPC) or over quota (EDQUOT).
    StorageFull,
    /// Stored bytes do not match their checksum.
    Integrity,
    /// The target already exists or is in use (e.g. a checkpoint that
    /// another one still references).
    AlreadyExists,
    /// No NVIDIA driver or GPU where one was asked for.
    NoGpu,
    /// Device or pinned memory ran out.
    OutOfMemory,
    /// Any other CUDA driver failure.
    Cuda,
    /// A copy engine (the simulated device, or a driver) reported a failure.
    Device,
}

/// zerohop's one error type: a kind, a human-readable context, and the
/// underlying cause.
#[derive(Debug)]
pub struct Error {
    kind: ErrorKind,
    context: String,
    source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

/// Result with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub fn new(kind: ErrorKind, context: impl Into<String>) -> Self {
        Error {
            kind,
            context: context.into(),
            source: None,
        }
    }

    pub fn with_source(
        kind: ErrorKind,
        context: impl Into<String>,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        Error {
            kind,
            context: context.into(),
            source: Some(source.into()),
        }
    }

    /// An I/O error on `path`, classified by the OS error.
    pub fn io(path: &Path, what: &str, err: io::Error) -> Self {
        let kind = match err.kind() {
            io::ErrorKind::NotFound => ErrorKind::NotFound,
            io::ErrorKind::PermissionDenied => ErrorKind::PermissionDenied,
            io::ErrorKind::AlreadyExists => ErrorKind::AlreadyExists,
            io::ErrorKind::StorageFull => ErrorKind::StorageFull,
            _ => match Errno::from_io_error(&err) {
                Some(Errno::ISDIR) => ErrorKind::InvalidInput,
                Some(Errno::NOSPC | Errno::DQUOT) => ErrorKind::StorageFull,
                _ => ErrorKind::Io,
            },
        };
        Error::with_source(kind, format!("{what} {}", path.display()), err)
    }

    pub fn format(context: impl Into<String>) -> Self {
        Error::new(ErrorKind::Format, context)
    }

    pub fn invalid(context: impl Into<String>) -> Self {
        Error::new(ErrorKind::InvalidInput, context)
    }

    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// Adds an outer layer of context ("loading model.safetensors: ...").
    pub fn context(mut self, outer: impl fmt::Display) -> Self {
        self.context = format!("{outer}: {}", self.context);
        self
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.context)?;
        if let Some(src) = &self.source {
            write!(f, ": {src}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source.as_ref().map(|s| s.as_ref() as _)
    }
}

impl From<zerohop_cuda::CudaError> for Error {
    fn from(e: zerohop_cuda::CudaError) -> Self {
        use zerohop_cuda::CudaErrorKind as K;
        let kind = match e.kind() {
            K::DriverNotFound | K::NoDevice => ErrorKind::NoGpu,
            K::InvalidDevice => ErrorKind::InvalidInput,
            K::OutOfMemory => ErrorKind::OutOfMemory,
            _ => ErrorKind::Cuda,
        };
        Error::with_source(kind, "CUDA", e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn os_errors_map_to_kinds() {
        let p = Path::new("/x");
        let kind = |e: io::Error| Error::io(p, "open", e).kind();
        assert_eq!(
            kind(io::Error::from(io::ErrorKind::NotFound)),
            ErrorKind::NotFound
        );
        assert_eq!(
            kind(io::Error::from(io::ErrorKind::PermissionDenied)),
            ErrorKind::PermissionDenied
        );
        assert_eq!(kind(io::Error::from(Errno::ISDIR)), ErrorKind::InvalidInput);
        assert_eq!(kind(io::Error::from(Errno::IO)), ErrorKind::Io);
        let e = Error::io(p, "cannot open", io::Error::from(Errno::ACCESS)).context("loading");
        assert_eq!(
            e.to_string(),
            "loading: cannot open /x: Permission denied (os error 13)"
        );
    }
}

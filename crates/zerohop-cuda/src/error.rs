use cudarc::driver::sys::{self, CUresult};
use std::ffi::CStr;
use std::fmt;

/// What went wrong in a call to the CUDA driver.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum CudaErrorKind {
    /// `libcuda` could not be loaded: no NVIDIA driver on this machine.
    DriverNotFound,
    /// The driver loaded but reports no usable device.
    NoDevice,
    /// The device ordinal does not name a device.
    InvalidDevice,
    /// Device or pinned host memory is exhausted.
    OutOfMemory,
    /// A range outside an allocation was asked for (checked before any call).
    OutOfRange,
    /// The driver lacks a function zerohop asked for (an older driver).
    NotSupported,
    /// Any other driver error, with its numeric code.
    Driver(u32),
}

/// An error from the CUDA driver: the kind, the call that failed, and the
/// driver's own description.
#[derive(Debug, Clone)]
pub struct CudaError {
    kind: CudaErrorKind,
    call: &'static str,
    message: String,
}

impl CudaError {
    pub(crate) fn new(kind: CudaErrorKind, call: &'static str, message: impl Into<String>) -> Self {
        CudaError {
            kind,
            call,
            message: message.into(),
        }
    }

    /// The kind of failure.
    pub fn kind(&self) -> &CudaErrorKind {
        &self.kind
    }

    /// The driver call (or step) that failed.
    pub fn call(&self) -> &'static str {
        self.call
    }
}

impl fmt::Display for CudaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.call, self.message)
    }
}

impl std::error::Error for CudaError {}

/// Result of a CUDA driver call.
pub type Result<T> = std::result::Result<T, CudaError>;

/// Turns a driver status into a `Result`, naming the call.
pub(crate) fn check(status: CUresult, call: &'static str) -> Result<()> {
    if status == CUresult::CUDA_SUCCESS {
        return Ok(());
    }
    let kind = match status {
        CUresult::CUDA_ERROR_OUT_OF_MEMORY => CudaErrorKind::OutOfMemory,
        CUresult::CUDA_ERROR_NO_DEVICE => CudaErrorKind::NoDevice,
        CUresult::CUDA_ERROR_INVALID_DEVICE => CudaErrorKind::InvalidDevice,
        other => CudaErrorKind::Driver(other as u32),
    };
    Err(CudaError::new(kind, call, describe(status)))
}

fn describe(status: CUresult) -> String {
    let mut name: *const std::ffi::c_char = std::ptr::null();
    let mut text: *const std::ffi::c_char = std::ptr::null();
    // SAFETY: only reached after the driver library loaded (a status exists);
    // both calls write a pointer to a static string or leave it null.
    unsafe {
        sys::cuGetErrorName(status, &mut name);
        sys::cuGetErrorString(status, &mut text);
    }
    let read = |p: *const std::ffi::c_char| {
        if p.is_null() {
            None
        } else {
            // SAFETY: the driver returned a NUL-terminated static string.
            Some(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
        }
    };
    match (read(name), read(text)) {
        (Some(n), Some(t)) => format!("{n} ({t})"),
        (Some(n), None) => n,
        _ => format!("CUDA error {}", status as u32),
    }
}

//! zerohop's error kinds as Python exceptions.

use pyo3::exceptions::{
    PyFileExistsError, PyFileNotFoundError, PyOSError, PyPermissionError, PyRuntimeError,
    PyValueError,
};
use pyo3::{create_exception, PyErr};
use zerohop::{Error, ErrorKind};

create_exception!(
    zerohop,
    IntegrityError,
    pyo3::exceptions::PyException,
    "Stored bytes do not match their checksum; the message names the first bad chunk."
);

/// The Python exception for `e`, carrying its whole message.
pub fn to_py(e: Error) -> PyErr {
    let msg = e.to_string();
    match e.kind() {
        ErrorKind::NotFound => PyFileNotFoundError::new_err(msg),
        ErrorKind::PermissionDenied => PyPermissionError::new_err(msg),
        ErrorKind::AlreadyExists => PyFileExistsError::new_err(msg),
        ErrorKind::InvalidInput | ErrorKind::Format => PyValueError::new_err(msg),
        ErrorKind::Integrity => IntegrityError::new_err(msg),

        ErrorKind::StorageFull => PyOSError::new_err((libc::ENOSPC, msg)),
        ErrorKind::Io => PyOSError::new_err(msg),
        // Driver failures (out of memory included, as torch reports it), a
        // missing GPU, copy-engine failures.
        _ => PyRuntimeError::new_err(msg),
    }
}

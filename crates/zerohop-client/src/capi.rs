//! The C ABI (`zerohop.h`), shaped like 3FS USRBIO: iovs (host memory the
//! agent shares, or wrapped GPU memory), iors (rings), registered fds,
//! prep/submit/wait. Every function returns 0 or a count on success and a
//! negative errno on failure; none unwinds into C.

use crate::{Client, HostBuffer, IoRing, Submission};
use rustix::io::Errno;
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::io;
use std::os::fd::BorrowedFd;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;
use zerohop_wire::ring::{OP_READ, OP_WRITE};

/// `zh_client`: a session and the fds registered through it.
pub struct ZhClient {
    client: Client,
    files: Mutex<HashMap<c_int, u32>>,
}

/// `zh_ior`: a ring, bound to the client that made it.
pub struct ZhIor {
    ring: IoRing,
    client: *const ZhClient,
}

/// `struct zh_iov` (caller-allocated, filled by create/wrap).
#[repr(C)]
pub struct ZhIov {
    pub base: *mut u8,
    pub size: u64,
    pub id: u32,
    /// -1 for host memory, else the CUDA device.
    pub device: c_int,
    /// Owned host buffer (host iovs), null for wrapped device memory.
    private: *mut c_void,
}

/// `struct zh_cqe`.
#[repr(C)]
pub struct ZhCqe {
    pub result: i64,
    pub userdata: *mut c_void,
}

/// The errno `e` stands for (EIO where it names none), for C callers.
fn errno_of(e: &io::Error) -> c_int {
    e.raw_os_error().unwrap_or_else(|| {
        match e.kind() {
            io::ErrorKind::NotFound => Errno::NOENT,
            io::ErrorKind::PermissionDenied => Errno::ACCESS,
            io::ErrorKind::InvalidInput => Errno::INVAL,
            io::ErrorKind::WouldBlock => Errno::AGAIN,
            io::ErrorKind::AlreadyExists => Errno::EXIST,
            io::ErrorKind::Unsupported => Errno::NOTSUP,
            io::ErrorKind::ConnectionAborted => Errno::SHUTDOWN,
            _ => Errno::IO,
        }
        .raw_os_error()
    })
}

/// Runs the body of a C call: its errors and panics become a negative
/// errno, so none unwinds into C.
pub fn guard(f: impl FnOnce() -> io::Result<c_int>) -> c_int {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(Ok(n)) => n,
        Ok(Err(e)) => -errno_of(&e),
        Err(_) => -Errno::IO.raw_os_error(),
    }
}

fn invalid(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, what.to_string())
}

/// # Safety
/// `socket_path` is null or a NUL-terminated string; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn zh_client_connect(
    socket_path: *const c_char,
    out: *mut *mut ZhClient,
) -> c_int {
    guard(|| {
        if out.is_null() {
            return Err(invalid("out is null"));
        }
        let path = if socket_path.is_null() {
            crate::default_socket_path()
        } else {
            // SAFETY: the caller passes a NUL-terminated string.
            let s = unsafe { CStr::from_ptr(socket_path) };
            PathBuf::from(
                s.to_str()
                    .map_err(|_| invalid("socket path is not UTF-8"))?,
            )
        };
        let client = Client::connect(&path)?;
        let boxed = Box::new(ZhClient {
            client,
            files: Mutex::default(),
        });
        // SAFETY: checked non-null; the caller provides a writable pointer.
        unsafe { *out = Box::into_raw(boxed) };
        Ok(0)
    })
}

/// # Safety
/// `client` came from `zh_client_connect` and is not used afterwards; its
/// iors are destroyed first.
#[no_mangle]
pub unsafe extern "C" fn zh_client_close(client: *mut ZhClient) {
    if !client.is_null() {
        // SAFETY: per the contract, a pointer from Box::into_raw, once.
        drop(unsafe { Box::from_raw(client) });
    }
}

/// # Safety
/// `client` is live; `iov` is writable.
#[no_mangle]
pub unsafe extern "C" fn zh_iov_create(client: *mut ZhClient, iov: *mut ZhIov, size: u64) -> c_int {
    guard(|| {
        // SAFETY: per the contract.
        let (c, iov) = unsafe { (client.as_ref(), iov.as_mut()) };
        let (c, iov) = c.zip(iov).ok_or_else(|| invalid("null argument"))?;
        let buf: HostBuffer = c.client.create_host_buffer(size as usize)?;
        *iov = ZhIov {
            base: buf.as_ptr(),
            size,
            id: buf.id(),
            device: -1,
            private: Box::into_raw(Box::new(buf)).cast(),
        };
        Ok(0)
    })
}

/// # Safety
/// `client` is live; `iov` is writable; `ptr..ptr+size` is GPU memory of
/// `device` that stays allocated until `zh_iov_destroy`.
#[no_mangle]
pub unsafe extern "C" fn zh_iov_wrap_device(
    client: *mut ZhClient,
    iov: *mut ZhIov,
    ptr: *mut c_void,
    size: u64,
    device: c_int,
) -> c_int {
    guard(|| {
        // SAFETY: per the contract.
        let (c, iov) = unsafe { (client.as_ref(), iov.as_mut()) };
        let (c, iov) = c.zip(iov).ok_or_else(|| invalid("null argument"))?;
        let dev = u32::try_from(device).map_err(|_| invalid("negative device"))?;
        let id = c.client.register_device_buffer(dev, ptr as u64, size)?;
        *iov = ZhIov {
            base: ptr.cast(),
            size,
            id,
            device,
            private: std::ptr::null_mut(),
        };
        Ok(0)
    })
}

/// # Safety
/// `client` is live; `iov` was filled by `zh_iov_create`/`zh_iov_wrap_device`
/// with this client, and no I/O on it is in flight.
#[no_mangle]
pub unsafe extern "C" fn zh_iov_destroy(client: *mut ZhClient, iov: *mut ZhIov) {
    let _ = guard(|| {
        // SAFETY: per the contract.
        let (c, iov) = unsafe { (client.as_ref(), iov.as_mut()) };
        let (c, iov) = c.zip(iov).ok_or_else(|| invalid("null argument"))?;
        let _ = c.client.deregister_buffer(iov.id);
        if !iov.private.is_null() {
            // SAFETY: set by zh_iov_create from Box::into_raw, freed once.
            drop(unsafe { Box::from_raw(iov.private.cast::<HostBuffer>()) });
        }
        iov.private = std::ptr::null_mut();
        iov.base = std::ptr::null_mut();
        Ok(0)
    });
}

/// # Safety
/// `client` is live; `fd` is an open descriptor of this process.
#[no_mangle]
pub unsafe extern "C" fn zh_reg_fd(client: *mut ZhClient, fd: c_int) -> c_int {
    guard(|| {
        // SAFETY: per the contract.
        let c = unsafe { client.as_ref() }.ok_or_else(|| invalid("null client"))?;
        if fd < 0 {
            return Err(Errno::BADF.into());
        }
        // SAFETY: `fd` is not negative (checked above), and the caller
        // keeps it open during the call (the contract); it is borrowed,
        // never closed here. A descriptor that is not open anyway makes the
        // send fail with EBADF.
        let borrowed = unsafe { BorrowedFd::borrow_raw(fd) };
        let mut files = c.files.lock().unwrap_or_else(|p| p.into_inner());
        if files.contains_key(&fd) {
            return Err(io::Error::from(Errno::EXIST));
        }
        let id = c.client.register_file(borrowed)?;
        files.insert(fd, id);
        Ok(0)
    })
}

/// # Safety
/// `client` is live.
#[no_mangle]
pub unsafe extern "C" fn zh_dereg_fd(client: *mut ZhClient, fd: c_int) -> c_int {
    guard(|| {
        // SAFETY: per the contract.
        let c = unsafe { client.as_ref() }.ok_or_else(|| invalid("null client"))?;
        let id = c
            .files
            .lock()
            .unwrap()
            .remove(&fd)
            .ok_or_else(|| io::Error::from(Errno::BADF))?;
        c.client.deregister_file(id)?;
        Ok(0)
    })
}

/// # Safety
/// `client` is live and outlives the ior; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn zh_ior_create(
    client: *mut ZhClient,
    out: *mut *mut ZhIor,
    entries: c_int,
) -> c_int {
    guard(|| {
        // SAFETY: per the contract.
        let c = unsafe { client.as_ref() }.ok_or_else(|| invalid("null client"))?;
        if out.is_null() {
            return Err(invalid("out is null"));
        }
        let entries = u32::try_from(entries).map_err(|_| invalid("negative entries"))?;
        let ring = c.client.create_ring(entries)?;
        let ior = Box::new(ZhIor { ring, client });
        // SAFETY: checked non-null.
        unsafe { *out = Box::into_raw(ior) };
        Ok(0)
    })
}

/// Deregisters and frees a ring.
///
/// # Safety
/// `ior` came from `zh_ior_create` and is not used afterwards; its client
/// is still live.
#[no_mangle]
pub unsafe extern "C" fn zh_ior_destroy(ior: *mut ZhIor) {
    if !ior.is_null() {
        // SAFETY: per the contract, a pointer from Box::into_raw, once.
        let ior = unsafe { Box::from_raw(ior) };
        // SAFETY: the client outlives its iors (contract of zh_ior_create).
        if let Some(c) = unsafe { ior.client.as_ref() } {
            let _ = c.client.deregister_ring(ior.ring.id());
        }
    }
}

/// Prepares one I/O of `len` bytes between `ptr` (inside `iov`) and offset
/// `off` of the registered `fd`. Returns the number of prepared I/Os.
///
/// # Safety
/// `ior` and its client are live; `iov` was filled by this client.
#[no_mangle]
pub unsafe extern "C" fn zh_prep_io(
    ior: *mut ZhIor,
    iov: *const ZhIov,
    read: bool,
    ptr: *mut c_void,
    fd: c_int,
    off: u64,
    len: u64,
    userdata: *mut c_void,
) -> c_int {
    guard(|| {
        // SAFETY: per the contract.
        let (r, iov) = unsafe { (ior.as_mut(), iov.as_ref()) };
        let (r, iov) = r.zip(iov).ok_or_else(|| invalid("null argument"))?;
        // SAFETY: the client outlives its iors (contract of zh_ior_create).
        let c = unsafe { &*r.client };
        let file = *c
            .files
            .lock()
            .unwrap()
            .get(&fd)
            .ok_or_else(|| io::Error::from(Errno::BADF))?;
        let at = (ptr as u64)
            .checked_sub(iov.base as u64)
            .filter(|o| o.checked_add(len).is_some_and(|end| end <= iov.size));
        let at = at.ok_or_else(|| io::Error::from(Errno::FAULT))?;
        let op = if read { OP_READ } else { OP_WRITE };
        r.ring.prepare(Submission::raw(
            op,
            file,
            off,
            iov.id,
            at,
            len,
            userdata as u64,
        ))?;
        Ok(r.ring.in_flight() as c_int)
    })
}

/// Hands every prepared I/O to the agent.
///
/// # Safety
/// `ior` is live.
#[no_mangle]
pub unsafe extern "C" fn zh_submit_ios(ior: *mut ZhIor) -> c_int {
    guard(|| {
        // SAFETY: per the contract.
        let r = unsafe { ior.as_mut() }.ok_or_else(|| invalid("null ior"))?;
        r.ring.submit()?;
        Ok(0)
    })
}

/// Waits for at least `min_results` completions (or `timeout_ms`; < 0
/// waits without limit) and copies up to `cqec` into `cqes`. Returns how
/// many were copied.
///
/// # Safety
/// `ior` is live; `cqes` has room for `cqec` entries.
#[no_mangle]
pub unsafe extern "C" fn zh_wait_for_ios(
    ior: *mut ZhIor,
    cqes: *mut ZhCqe,
    cqec: c_int,
    min_results: c_int,
    timeout_ms: c_int,
) -> c_int {
    guard(|| {
        // SAFETY: per the contract.
        let r = unsafe { ior.as_mut() }.ok_or_else(|| invalid("null ior"))?;
        let cap = usize::try_from(cqec).map_err(|_| invalid("negative cqec"))?;
        if cqes.is_null() && cap > 0 {
            return Err(invalid("null cqes"));
        }
        let min = usize::try_from(min_results).unwrap_or(0).min(cap);
        let timeout = u64::try_from(timeout_ms).ok().map(Duration::from_millis);
        let done = r.ring.wait_up_to(min, cap, timeout)?;
        for (i, c) in done.iter().enumerate() {
            // SAFETY: i < cap, the caller's array length.
            unsafe {
                *cqes.add(i) = ZhCqe {
                    result: c.result,
                    userdata: c.user_data as *mut c_void,
                }
            };
        }
        Ok(done.len() as c_int)
    })
}

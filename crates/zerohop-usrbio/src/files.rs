//! Files: mount points, registered descriptors (kept per process, as
//! USRBIO keeps them), and the POSIX stand-ins for 3FS's hole punching and
//! hard links.

use crate::agents::{self, Agent};
use crate::guard;
use rustix::fs::FallocateFlags;
use rustix::io::Errno;
use std::collections::HashMap;
use std::ffi::{c_char, c_int, CStr};
use std::os::fd::BorrowedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

/// A descriptor registered with the agent serving its file.
#[derive(Clone)]
pub struct Registered {
    pub agent: Arc<Agent>,
    pub id: u32,
}

static REGISTERED: Mutex<Option<HashMap<c_int, Registered>>> = Mutex::new(None);

/// The registration of `fd`, if it has one.
pub fn registered(fd: c_int) -> Option<Registered> {
    let table = REGISTERED.lock().unwrap_or_else(|p| p.into_inner());
    table.as_ref()?.get(&fd).cloned()
}

/// The path the kernel keeps for the open `fd`.
fn path_of(fd: c_int) -> Option<PathBuf> {
    if fd < 0 {
        return None;
    }
    std::fs::read_link(format!("/proc/self/fd/{fd}")).ok()
}

#[no_mangle]
pub extern "C" fn hf3fs_is_hf3fs(fd: c_int) -> bool {
    std::panic::catch_unwind(|| path_of(fd).and_then(|p| agents::serving(&p)).is_some())
        .unwrap_or(false)
}

/// # Safety
/// `path` is a NUL-terminated string; `out` has room for `size` bytes (or
/// is null with `size` 0).
#[no_mangle]
pub unsafe extern "C" fn hf3fs_extract_mount_point(
    out: *mut c_char,
    size: c_int,
    path: *const c_char,
) -> c_int {
    let found = std::panic::catch_unwind(|| {
        if path.is_null() {
            return None;
        }
        // SAFETY: the caller passes a NUL-terminated string.
        let path = unsafe { CStr::from_ptr(path) };
        agents::serving(std::path::Path::new(std::ffi::OsStr::from_bytes(
            path.to_bytes(),
        )))
    });
    let Ok(Some((_, mount))) = found else {
        return -1;
    };
    let bytes = mount.as_os_str().as_bytes();
    let Ok(needed) = c_int::try_from(bytes.len() + 1) else {
        return -1;
    };
    if !out.is_null() && needed <= size {
        // SAFETY: `out` has room for `size` >= needed bytes (the contract).
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr().cast(), out, bytes.len());
            *out.add(bytes.len()) = 0;
        }
    }
    needed
}

/// 0, or a positive errno (USRBIO's convention for this call).
#[no_mangle]
pub extern "C" fn hf3fs_reg_fd(fd: c_int, _flags: u64) -> c_int {
    -guard(|| {
        let Some((agent, _)) = path_of(fd).and_then(|p| agents::serving(&p)) else {
            return Err(crate::fail(Errno::BADF));
        };
        let mut table = REGISTERED.lock().unwrap_or_else(|p| p.into_inner());
        let table = table.get_or_insert_with(HashMap::new);
        if table.contains_key(&fd) {
            return Err(crate::fail(Errno::INVAL));
        }
        // SAFETY: `fd` is open (its /proc link was just read) and only
        // borrowed for the call; the agent receives its own duplicate.
        let borrowed = unsafe { BorrowedFd::borrow_raw(fd) };
        let id = agent.client.register_file(borrowed)?;
        table.insert(fd, Registered { agent, id });
        Ok(0)
    })
}

#[no_mangle]
pub extern "C" fn hf3fs_dereg_fd(fd: c_int) {
    let _ = guard(|| {
        let mut table = REGISTERED.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(r) = table.as_mut().and_then(|t| t.remove(&fd)) {
            r.agent.client.deregister_file(r.id)?;
        }
        Ok(0)
    });
}

/// # Safety
/// `target` and `link_name` are NUL-terminated strings.
#[no_mangle]
pub unsafe extern "C" fn hf3fs_hardlink(target: *const c_char, link_name: *const c_char) -> c_int {
    -guard(|| {
        if target.is_null() || link_name.is_null() {
            return Err(crate::fail(Errno::INVAL));
        }
        // SAFETY: the caller passes NUL-terminated strings.
        let (target, link) = unsafe { (CStr::from_ptr(target), CStr::from_ptr(link_name)) };
        rustix::fs::link(target, link)?;
        Ok(0)
    })
}

/// Punches `n` holes `[start[i], end[i])` into `fd`, keeping its size.
///
/// # Safety
/// `start` and `end` hold `n` values each.
#[no_mangle]
pub unsafe extern "C" fn hf3fs_punchhole(
    fd: c_int,
    n: c_int,
    start: *const usize,
    end: *const usize,
    _flags: usize,
) -> c_int {
    -guard(|| {
        let n = usize::try_from(n).map_err(|_| crate::fail(Errno::INVAL))?;
        if n > 0 && (start.is_null() || end.is_null()) {
            return Err(crate::fail(Errno::INVAL));
        }
        if fd < 0 {
            return Err(crate::fail(Errno::BADF));
        }
        // SAFETY: not negative; borrowed for the call, which fails with
        // EBADF if it is not open.
        let file = unsafe { BorrowedFd::borrow_raw(fd) };
        for i in 0..n {
            // SAFETY: i < n, the arrays' length (the contract).
            let (s, e) = unsafe { (*start.add(i), *end.add(i)) };
            let len = e.checked_sub(s).ok_or_else(|| crate::fail(Errno::INVAL))?;
            if len > 0 {
                rustix::fs::fallocate(
                    file,
                    FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE,
                    s as u64,
                    len as u64,
                )?;
            }
        }
        Ok(0)
    })
}

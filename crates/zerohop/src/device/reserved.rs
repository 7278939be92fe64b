//! Device address ranges whose memory can be released and later re-created
//! at the very same addresses: what suspending a process's GPU memory to
//! storage needs, so that pointers the program holds (in its own data, in
//! kernels' arguments, in captured graphs) stay valid across a suspend.

use super::buffer::DeviceAddr;
use crate::{Error, ErrorKind, Result};
use std::ffi::c_void;

/// A reserved range of device addresses, with or without memory behind it.
/// Dropping it releases the memory and the reservation.
pub trait ReservedMemory: Send + Sync {
    fn addr(&self) -> DeviceAddr;

    /// Bytes reserved (the length asked for, rounded up to the device's
    /// granularity).
    fn len(&self) -> usize;

    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether memory is behind the range now.
    fn is_backed(&self) -> bool;

    /// Puts new memory behind the whole range (its contents undefined).
    /// Does nothing when it is backed already; on an error (out of device
    /// memory) the range stays unbacked.
    fn back(&mut self) -> Result<()>;

    /// Frees the memory behind the range, keeping the addresses reserved:
    /// nothing may touch the range until it is backed again.
    fn release(&mut self) -> Result<()>;
}

/// Host memory standing in for device memory: an inaccessible anonymous
/// mapping (address space only), replaced in place by a readable and
/// writable one to back it, and by an inaccessible one again to release it.
#[derive(Debug)]
pub struct HostReservation {
    ptr: *mut c_void,
    len: usize,
    backed: bool,
}

// SAFETY: the reservation owns its mapping; the address is only handed out
// as a number, and the mapping is replaced or unmapped only through
// `&mut self` or `Drop`.
unsafe impl Send for HostReservation {}
// SAFETY: as above: `&self` exposes the address, length and state only.
unsafe impl Sync for HostReservation {}

impl HostReservation {
    /// Reserves at least `len` bytes (whole pages; at least one), unbacked.
    pub fn new(len: usize) -> Result<Self> {
        let page = rustix::param::page_size();
        let len = len.max(1).div_ceil(page) * page;
        // SAFETY: a new mapping at an address the kernel picks aliases no
        // existing memory; it is owned by the value returned.
        let ptr = unsafe { map(std::ptr::null_mut(), len, false) }?;
        Ok(HostReservation {
            ptr,
            len,
            backed: false,
        })
    }
}

/// An anonymous private mapping of `len` bytes at `at` (replacing what was
/// there when `at` is not null), readable and writable or inaccessible.
///
/// # Safety
/// A non-null `at..at + len` must be a mapping the caller owns and that no
/// reference points into: its contents are discarded.
unsafe fn map(at: *mut c_void, len: usize, accessible: bool) -> Result<*mut c_void> {
    use rustix::mm::{MapFlags, ProtFlags};
    let (prot, mut flags) = if accessible {
        (ProtFlags::READ | ProtFlags::WRITE, MapFlags::PRIVATE)
    } else {
        (ProtFlags::empty(), MapFlags::PRIVATE | MapFlags::NORESERVE)
    };
    if !at.is_null() {
        flags |= MapFlags::FIXED;
    }
    // SAFETY: forwarded contract: `at` is null or the caller's own mapping.
    unsafe { rustix::mm::mmap_anonymous(at, len, prot, flags) }.map_err(|e| {
        Error::with_source(
            if accessible {
                ErrorKind::OutOfMemory
            } else {
                ErrorKind::Io
            },
            format!("mapping {len} bytes of host memory"),
            std::io::Error::from(e),
        )
    })
}

impl ReservedMemory for HostReservation {
    fn addr(&self) -> DeviceAddr {
        self.ptr as DeviceAddr
    }

    fn len(&self) -> usize {
        self.len
    }

    fn is_backed(&self) -> bool {
        self.backed
    }

    fn back(&mut self) -> Result<()> {
        if !self.backed {
            // SAFETY: replaces our own inaccessible mapping, which nothing
            // can reference (any access to it would fault).
            unsafe { map(self.ptr, self.len, true) }?;
            self.backed = true;
        }
        Ok(())
    }

    fn release(&mut self) -> Result<()> {
        if self.backed {
            // SAFETY: replaces our own mapping; the caller promised that
            // nothing touches the range until it is backed again.
            unsafe { map(self.ptr, self.len, false) }?;
            self.backed = false;
        }
        Ok(())
    }
}

impl Drop for HostReservation {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping this value owns.
        let _ = unsafe { rustix::mm::munmap(self.ptr, self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::resident_kib;

    /// Backed memory is usable and zeroed; released memory is given back
    /// to the system; backing again gives the same addresses.
    #[test]
    fn host_memory_is_released_and_backed_again_at_the_same_address() {
        let mut r = HostReservation::new(3 << 20).unwrap();
        let addr = r.addr();
        assert!(!r.is_backed() && r.len() == 3 << 20);
        r.back().unwrap();
        // SAFETY: the range is backed and ours.
        let bytes = unsafe { std::slice::from_raw_parts_mut(addr as *mut u8, r.len()) };
        assert!(bytes.iter().all(|&b| b == 0));
        bytes.fill(7);
        assert!(resident_kib(addr as usize) >= 3 << 10);
        r.release().unwrap();
        assert_eq!(resident_kib(addr as usize), 0);
        r.back().unwrap();
        assert_eq!(r.addr(), addr);
        // SAFETY: as above; backed anew.
        let bytes = unsafe { std::slice::from_raw_parts(addr as *const u8, r.len()) };
        assert!(
            bytes.iter().all(|&b| b == 0),
            "fresh memory after a release"
        );
    }
}

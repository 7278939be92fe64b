//! The structs and constants of `hf3fs_usrbio.h`, laid out as C lays them
//! out (the tests below pin every offset).

use std::ffi::{c_char, c_int, c_void};

pub const HF3FS_SUPER_MAGIC: u32 = 0x8f3f_5fff;
pub const HF3FS_IOR_ALLOW_READ_UNCOMMITTED: u64 = 1;
pub const HF3FS_IOR_FORBID_READ_HOLES: u64 = 2;

pub const MOUNT_POINT_BYTES: usize = 256;

#[repr(C)]
pub struct Hf3fsIov {
    pub base: *mut u8,
    pub iovh: *mut c_void,
    pub id: [u8; 16],
    pub mount_point: [c_char; MOUNT_POINT_BYTES],
    pub size: usize,
    pub block_size: usize,
    pub numa: c_int,
}

#[repr(C)]
pub struct Hf3fsIor {
    pub iov: Hf3fsIov,
    pub iorh: *mut c_void,
    pub mount_point: [c_char; MOUNT_POINT_BYTES],
    pub for_read: bool,
    pub io_depth: c_int,
    pub priority: c_int,
    pub timeout: c_int,
    pub flags: u64,
}

#[repr(C)]
pub struct Hf3fsCqe {
    pub index: i32,
    pub reserved: i32,
    pub result: i64,
    pub userdata: *const c_void,
}

/// `enum hf3fs_mem_type`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemType {
    Host = 0,
    Device = 1,
    Managed = 2,
}

/// Copies `path` into a mount-point field, NUL-terminated; false if it does
/// not fit.
pub fn set_mount_point(field: &mut [c_char; MOUNT_POINT_BYTES], path: &[u8]) -> bool {
    if path.len() >= MOUNT_POINT_BYTES {
        return false;
    }
    field.fill(0);
    for (d, s) in field.iter_mut().zip(path) {
        *d = *s as c_char;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    #[test]
    fn layouts_are_those_of_the_c_header() {
        assert_eq!(size_of::<Hf3fsIov>(), 312);
        assert_eq!(offset_of!(Hf3fsIov, iovh), 8);
        assert_eq!(offset_of!(Hf3fsIov, id), 16);
        assert_eq!(offset_of!(Hf3fsIov, mount_point), 32);
        assert_eq!(offset_of!(Hf3fsIov, size), 288);
        assert_eq!(offset_of!(Hf3fsIov, block_size), 296);
        assert_eq!(offset_of!(Hf3fsIov, numa), 304);
        assert_eq!(size_of::<Hf3fsIor>(), 600);
        assert_eq!(offset_of!(Hf3fsIor, iorh), 312);
        assert_eq!(offset_of!(Hf3fsIor, mount_point), 320);
        assert_eq!(offset_of!(Hf3fsIor, for_read), 576);
        assert_eq!(offset_of!(Hf3fsIor, io_depth), 580);
        assert_eq!(offset_of!(Hf3fsIor, priority), 584);
        assert_eq!(offset_of!(Hf3fsIor, timeout), 588);
        assert_eq!(offset_of!(Hf3fsIor, flags), 592);
        assert_eq!(size_of::<Hf3fsCqe>(), 24);
        assert_eq!(offset_of!(Hf3fsCqe, result), 8);
        assert_eq!(offset_of!(Hf3fsCqe, userdata), 16);
        assert_eq!(size_of::<MemType>(), size_of::<c_int>());
    }

    #[test]
    fn mount_points_are_terminated_and_bounded() {
        let mut field = [1 as c_char; MOUNT_POINT_BYTES];
        assert!(set_mount_point(&mut field, b"/data"));
        assert_eq!(field[5], 0);
        assert!(!set_mount_point(&mut field, &[b'a'; MOUNT_POINT_BYTES]));
        assert!(set_mount_point(&mut field, &[b'a'; MOUNT_POINT_BYTES - 1]));
    }
}

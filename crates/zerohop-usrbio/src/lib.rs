//! 3FS's USRBIO interface (`hf3fs_usrbio.h`) over zerohop's agent: a
//! program written against `libhf3fs_api_shared.so` runs unchanged on any
//! POSIX file system, with host or GPU buffers.
//!
//! A thin layer: USRBIO's names, structs and return conventions mapped
//! onto [`zerohop_client`]. What USRBIO keeps per process without a handle
//! (the agents, the registered descriptors) lives in [`agents`] and
//! [`files`]; iovs and rings keep theirs behind the struct's handle field.
//! Iovs are opened from other processes by their 16-byte id through
//! [`published`] names. No call unwinds into C, and every call fails
//! cleanly in a process with no agent and no GPU.
#![deny(unsafe_op_in_unsafe_fn)]

pub mod abi;
mod agents;
mod batches;
mod files;
mod ior;
mod iov;
pub mod published;

use rustix::io::Errno;
use std::io;
use zerohop_client::guard;

fn fail(errno: Errno) -> io::Error {
    io::Error::from_raw_os_error(errno.raw_os_error())
}

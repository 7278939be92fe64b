//! Whole processes and their GPU state.
//!
//! - [`suspend_client`]: asks a process that serves its suspendable GPU
//!   memory (Python's `zerohop.serve_suspend`, the preloaded library) to
//!   suspend or resume it.
//! - [`gpu_state`]: the driver's process checkpoint with zerohop as its
//!   transport (`zerohop checkpoint-process` / `restore-process`): the
//!   suspendable memory goes to storage through zerohop, the driver stages
//!   only what is left in the process's host memory.
//! - [`freeze`]: a whole process to a directory and back (`zerohop freeze`
//!   / `thaw`): its GPU state as above, then CRIU for the rest, with a
//!   manifest written last that checksums every image.

#![forbid(unsafe_code)]

mod criu;
pub mod freeze;
pub mod gpu_state;
mod image_sums;
mod proc_fs;
pub mod suspend_client;

pub use freeze::{freeze, thaw, CriuFlags, FreezeOptions, FreezeReport, ThawReport};
pub use gpu_state::{GpuCheckpoint, GpuRestore};

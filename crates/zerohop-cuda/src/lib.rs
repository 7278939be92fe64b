//! The only crate of zerohop that talks to the CUDA driver.
//!
//! The driver library is loaded at run time (cudarc's `dynamic-loading`), so
//! every binary builds and starts on machines without CUDA: [`Driver::get`]
//! answers a typed [`CudaError`] instead of panicking when `libcuda` is absent.
//!
//! Every handle here binds its context before each driver call, so values may
//! move between threads freely.
#![deny(unsafe_op_in_unsafe_fn)]

mod checksum;
mod context;
mod driver;
mod error;
mod ipc;
mod memory;
pub mod next_symbol;
mod pinned_pieces;
mod process;
mod stream;
mod vmm;

pub use checksum::{DeviceRange, KernelImage, Xxh3Kernel, XXH3_KERNEL_MIN_BYTES};
pub use context::Context;
pub use driver::{DeviceInfo, Driver};
pub use error::{CudaError, CudaErrorKind, Result};
pub use ipc::{allocation_range, export_ipc, IpcExport, IpcHandleBytes, IpcMapping};
pub use memory::{DeviceAllocation, DevicePtr, HostRegistration, PinnedBuffer};
pub use pinned_pieces::PinnedPieces;
pub use process::{ProcessCheckpoint, ProcessState};
pub use stream::{synchronize_foreign_stream, Event, Stream};
pub use vmm::{export_vmm, Reservation, VmmAllocation, VmmExport, VmmMapping};

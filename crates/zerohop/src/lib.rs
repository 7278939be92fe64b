//! zerohop: moves bytes between files and GPU memory with the fewest,
//! fully overlapped hops.
//!
//! A transfer is a list of [`plan::Extent`]s between files and device
//! memory. The [`Engine`] cuts them into slot-sized windows and runs them
//! through a pipeline: for loads, storage reads into a fixed pool of staging
//! slots (pinned on a GPU), async copies to the device, slots recycled on completion
//! (files already in the page cache can skip the CPU copy: page-cache DMA);
//! for saves ([`Engine::write`]) the mirror image, then `fsync`.
#![deny(unsafe_op_in_unsafe_fn)]

pub mod cache_drop;
mod crew;
pub mod device;
mod engine;
mod error;
mod host_read;
pub mod location;
pub mod machine;
pub mod plan;
pub mod safetensors;
pub mod staging;
pub mod stats;
pub mod storage;
#[cfg(test)]
mod test_support;
#[cfg(feature = "testing")]
pub mod testing;

pub use device::{open_device, Device, DeviceBuffer, DeviceKind, DeviceName};
pub use engine::hot_choice;
pub use engine::{
    DirectIo, Engine, EngineConfig, HotRoute, OnArrival, PlannedRead, Progress, ReadChain,
    ReadCheck, WriteFilter,
};
pub use error::{Error, ErrorKind, Result};
pub use stats::{Direction, TransferStats, WorkerProfile};

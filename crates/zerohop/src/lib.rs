//! zerohop: moves bytes between files and GPU memory with the fewest,
//! fully overlapped hops.
//!
//! A transfer is a list of [`plan::Extent`]s between files and device
//! memory. The [`Engine`] cuts them into slot-sized windows and runs them
//! through a pipeline: for loads, storage reads into a fixed pool of pinned
//! staging slots, async copies to the device, slots recycled on completion
//! (files already in the page cache can skip the CPU copy: page-cache DMA);
//! for saves ([`Engine::write`]) the mirror image, then `fsync`.
#![deny(unsafe_op_in_unsafe_fn)]

pub mod device;
mod engine;
mod error;
mod host_read;
pub mod hot;
pub mod hot_choice;
pub mod machine;
mod pipeline;
pub mod plan;
pub mod probe;
pub mod progress_line;
pub mod safetensors;
pub mod staging;
pub mod stats;
pub mod storage;
#[cfg(feature = "testing")]
pub mod testing;
mod write_pipeline;

pub use device::{open_device, Device, DeviceBuffer, DeviceKind, DeviceName};
pub use engine::{DirectIo, Engine, EngineConfig, HotRoute};
pub use error::{Error, ErrorKind, Result};
pub use pipeline::Progress;
pub use stats::{Direction, TransferStats, WorkerProfile};
pub use write_pipeline::WriteFilter;

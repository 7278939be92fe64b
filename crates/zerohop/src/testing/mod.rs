//! Test doubles, beside the real parts they stand in for (cargo feature
//! `testing`): a simulated device whose copies run late, in random order
//! of delay, with injected failures and every copy checked against live
//! memory; and storage backends that inject I/O faults. Production code
//! uses [`crate::device::HostDevice`] for host memory instead, and opens
//! only real devices by name: [`open_named`] opens the simulated one too.

mod faulty_storage;
mod open;
mod sim_device;

pub use faulty_storage::{Fault, FaultyBackend, FaultyWriteBackend, WriteFault};
pub use open::{open_device, open_named};
pub use sim_device::{SimConfig, SimDevice};

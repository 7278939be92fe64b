//! Test doubles, beside the real parts they stand in for (cargo feature
//! `testing`): a simulated device whose copies run late, in random order
//! of delay, with injected failures and every copy checked against live
//! memory; and storage backends that inject I/O faults. Production code
//! uses [`crate::device::HostDevice`] for host memory instead, and opens
//! only real devices by name: [`open_named`] opens the simulated one too.

mod faulty_storage;
mod sim_device;

pub use faulty_storage::{Fault, FaultyBackend, FaultyWriteBackend, WriteFault};
pub use sim_device::{SimConfig, SimDevice};

use crate::device::{Device, DeviceName};
use crate::Result;
use std::sync::Arc;

/// Opens the device `name` names: `sim` as a [`SimDevice`] with the
/// default [`SimConfig`], any other as production opens it (`auto` as
/// [`DeviceName::resolve`] says).
pub fn open_named(name: DeviceName) -> Result<Arc<dyn Device>> {
    match name {
        DeviceName::Sim => Ok(Arc::new(SimDevice::new(SimConfig::default()))),
        name => name.open_real(),
    }
}

/// Opens the device named by `spec` (see [`crate::device::DEVICE_HELP`]),
/// `sim` included.
pub fn open_device(spec: &str) -> Result<Arc<dyn Device>> {
    open_named(spec.parse()?)
}

/// Callers outside this crate open devices with [`DeviceName::open`] and
/// [`crate::open_device`]; in builds with the `testing` feature this
/// method is the one they reach, so `sim` opens there too.
impl DeviceName {
    /// Opens the named device (`auto` as [`DeviceName::resolve`] says),
    /// `sim` as the simulated device: see [`open_named`].
    pub fn open(self) -> Result<Arc<dyn Device>> {
        open_named(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sim_opens_the_simulated_device() {
        let dev = DeviceName::Sim.open().unwrap();
        assert!(dev.describe().contains("simulated"));
        let dev = open_device("sim").unwrap();
        assert!(dev.describe().contains("simulated"));
    }

    #[test]
    fn other_names_open_as_production_opens_them() {
        assert_eq!(
            open_named(DeviceName::Host).unwrap().kind(),
            crate::DeviceKind::Host
        );
        assert_eq!(
            open_device("tpu:0").err().unwrap().kind(),
            crate::ErrorKind::InvalidInput
        );
    }
}

use crate::error::{check, CudaError, CudaErrorKind};
use crate::Result;
use cudarc::driver::sys;
use std::sync::OnceLock;

/// The loaded and initialised CUDA driver.
#[derive(Debug)]
pub struct Driver {
    version: i32,
}

/// What `info` reports about one GPU.
#[derive(Debug, Clone)]
pub struct DeviceInfo {
    pub ordinal: usize,
    pub name: String,
    pub total_memory: u64,
    pub compute_capability: (i32, i32),
    pub pci_bus_id: String,
}

impl Driver {
    /// Loads `libcuda` and calls `cuInit` once per process.
    ///
    /// Never panics: a missing library is [`CudaErrorKind::DriverNotFound`].
    pub fn get() -> Result<&'static Driver> {
        static DRIVER: OnceLock<Result<Driver>> = OnceLock::new();
        DRIVER
            .get_or_init(Driver::load)
            .as_ref()
            .map_err(Clone::clone)
    }

    fn load() -> Result<Driver> {
        // SAFETY: only probes whether the shared library can be opened.
        if !unsafe { sys::is_culib_present() } {
            return Err(CudaError::new(
                CudaErrorKind::DriverNotFound,
                "load libcuda",
                "no NVIDIA driver library (libcuda.so) on this machine",
            ));
        }
        // SAFETY: the library is present, so symbol loading succeeds; cuInit
        // takes no pointers.
        check(unsafe { sys::cuInit(0) }, "cuInit")?;
        let mut version = 0;
        // SAFETY: writes one int.
        check(
            unsafe { sys::cuDriverGetVersion(&mut version) },
            "cuDriverGetVersion",
        )?;
        Ok(Driver { version })
    }

    /// Driver API version as the driver reports it, e.g. 13000.
    pub fn raw_version(&self) -> i32 {
        self.version
    }

    /// Driver API version as (major, minor), e.g. (13, 0).
    pub fn version(&self) -> (i32, i32) {
        (self.version / 1000, (self.version % 1000) / 10)
    }

    /// Number of visible CUDA devices.
    pub fn device_count(&self) -> Result<usize> {
        let mut n = 0;
        // SAFETY: writes one int; the driver is initialised.
        check(unsafe { sys::cuDeviceGetCount(&mut n) }, "cuDeviceGetCount")?;
        Ok(n.max(0) as usize)
    }

    /// The driver's handle for device `ordinal`, checked against the count.
    pub(crate) fn device(&self, ordinal: usize) -> Result<sys::CUdevice> {
        let count = self.device_count()?;
        if ordinal >= count {
            return Err(CudaError::new(
                CudaErrorKind::InvalidDevice,
                "cuDeviceGet",
                format!("no CUDA device {ordinal}: this machine has {count}"),
            ));
        }
        let mut dev = 0;
        // SAFETY: the ordinal is in range; writes one int.
        check(
            unsafe { sys::cuDeviceGet(&mut dev, ordinal as i32) },
            "cuDeviceGet",
        )?;
        Ok(dev)
    }

    /// Name, memory, compute capability and PCI address of a device.
    pub fn device_info(&self, ordinal: usize) -> Result<DeviceInfo> {
        let dev = self.device(ordinal)?;
        let mut name = [0 as std::ffi::c_char; 256];
        let mut bus = [0 as std::ffi::c_char; 64];
        let mut total = 0usize;
        // SAFETY: each call writes into a buffer of the length passed, or one
        // integer; `dev` is a valid device handle.
        unsafe {
            check(
                sys::cuDeviceGetName(name.as_mut_ptr(), 255, dev),
                "cuDeviceGetName",
            )?;
            check(
                sys::cuDeviceGetPCIBusId(bus.as_mut_ptr(), 63, dev),
                "cuDeviceGetPCIBusId",
            )?;
            check(
                sys::cuDeviceTotalMem_v2(&mut total, dev),
                "cuDeviceTotalMem",
            )?;
        }
        let text = |b: &[std::ffi::c_char]| {
            // SAFETY: the buffers were zeroed and the driver writes at most
            // len-1 bytes, so a NUL terminator exists.
            unsafe { std::ffi::CStr::from_ptr(b.as_ptr()) }
                .to_string_lossy()
                .into_owned()
        };
        Ok(DeviceInfo {
            ordinal,
            name: text(&name),
            total_memory: total as u64,
            compute_capability: compute_capability(dev)?,
            pci_bus_id: text(&bus),
        })
    }
}

/// The (major, minor) compute capability of a device handle.
pub(crate) fn compute_capability(dev: sys::CUdevice) -> Result<(i32, i32)> {
    use sys::CUdevice_attribute::*;
    let (mut major, mut minor) = (0, 0);
    // SAFETY: each call writes one integer; `dev` comes from the loaded
    // driver (one it does not know is an error, not a fault).
    unsafe {
        check(
            sys::cuDeviceGetAttribute(
                &mut major,
                CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
                dev,
            ),
            "cuDeviceGetAttribute",
        )?;
        check(
            sys::cuDeviceGetAttribute(
                &mut minor,
                CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
                dev,
            ),
            "cuDeviceGetAttribute",
        )?;
    }
    Ok((major, minor))
}

//! Device names, one parser for the CLI, the Python package and the agent.

use super::{cuda_driver_summary, CudaDevice, Device, HostDevice};
use crate::{Error, ErrorKind, Result};
use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

/// What the names mean, for help texts and errors (`sim` only in builds
/// with the `testing` feature, the only ones that take it).
#[cfg(feature = "testing")]
pub const DEVICE_HELP: &str = "auto (the first GPU, else host memory), cuda (= cuda:0), cuda:N, \
     host or cpu (host memory), or sim (host memory through the simulated device, for tests)";
/// What the names mean, for help texts and errors.
#[cfg(not(feature = "testing"))]
pub const DEVICE_HELP: &str = "auto (the first GPU, else host memory), cuda (= cuda:0), cuda:N, \
     or host or cpu (host memory)";

/// A device as users name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeviceName {
    /// The first GPU, else host memory.
    Auto,
    /// A CUDA GPU by ordinal (`cuda` is `cuda:0`).
    Cuda(usize),
    /// Host memory (`host` or `cpu`).
    Host,
    /// Host memory through the simulated device (feature `testing`).
    Sim,
}

impl FromStr for DeviceName {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "auto" => Ok(DeviceName::Auto),
            "cuda" => Ok(DeviceName::Cuda(0)),
            "host" | "cpu" => Ok(DeviceName::Host),
            "sim" => Ok(DeviceName::Sim),
            _ => match s.strip_prefix("cuda:").map(str::parse::<usize>) {
                Some(Ok(n)) => Ok(DeviceName::Cuda(n)),
                _ => Err(Error::invalid(format!(
                    "unknown device {s:?}: expected {DEVICE_HELP}"
                ))),
            },
        }
    }
}

impl fmt::Display for DeviceName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceName::Auto => f.write_str("auto"),
            DeviceName::Cuda(n) => write!(f, "cuda:{n}"),
            DeviceName::Host => f.write_str("host"),
            DeviceName::Sim => f.write_str("sim"),
        }
    }
}

impl DeviceName {
    /// `Auto` made definite without opening anything: `cuda:0` where the
    /// driver counts a GPU, `host` where there is no GPU or driver. Any
    /// other driver failure is an error, and so is, later, a GPU that does
    /// not open (out of memory, permission): never a silent fallback.
    pub fn resolve(self) -> Result<DeviceName> {
        Ok(match self {
            DeviceName::Auto => match cuda_driver_summary() {
                Ok((_, gpus)) if gpus > 0 => DeviceName::Cuda(0),
                Ok(_) => DeviceName::Host,
                Err(e) if e.kind() == ErrorKind::NoGpu => DeviceName::Host,
                Err(e) => {
                    return Err(e.context(
                        "auto: the CUDA driver failed, so no GPU can be used; \
                         to use host memory instead, pass --device host (device=\"cpu\" in Python)",
                    ))
                }
            },
            name => name,
        })
    }

    /// Opens the named device (`auto` as [`DeviceName::resolve`] says).
    /// `sim` is refused here: the simulated device is a test double, built
    /// by `zerohop::testing`, whose own `DeviceName::open` (in builds with
    /// the `testing` feature) stands in for this one and opens it.
    #[cfg(not(feature = "testing"))]
    pub fn open(self) -> Result<Arc<dyn Device>> {
        self.open_real()
    }

    /// Opens the named device if it is a real one (`auto` as
    /// [`DeviceName::resolve`] says); `sim` is an error.
    pub(crate) fn open_real(self) -> Result<Arc<dyn Device>> {
        match self.resolve()? {
            DeviceName::Cuda(n) => Ok(Arc::new(open_gpu(n)?)),
            DeviceName::Host | DeviceName::Auto => Ok(Arc::new(HostDevice::new())),
            DeviceName::Sim => Err(Error::invalid(
                "the simulated device (sim) is for tests: build zerohop with the `testing` feature, \
                 or use host memory (host)",
            )),
        }
    }
}

/// Opens GPU `ordinal`; where there is no GPU or driver, the error says so
/// and how to use host memory instead.
pub fn open_gpu(ordinal: usize) -> Result<CudaDevice> {
    CudaDevice::open(ordinal).map_err(|e| match e.kind() {
        ErrorKind::NoGpu => Error::new(
            ErrorKind::NoGpu,
            format!(
                "cannot open cuda:{ordinal}: {e}; to use host memory instead, \
                 pass --device host (device=\"cpu\" in Python)"
            ),
        ),
        _ => e.context(format!("cannot open cuda:{ordinal}")),
    })
}

/// Opens the device named by `spec` (see [`DEVICE_HELP`]), as
/// [`DeviceName::open`] does.
pub fn open_device(spec: &str) -> Result<Arc<dyn Device>> {
    spec.parse::<DeviceName>()?.open()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_and_print_back() {
        let cases = [
            ("auto", DeviceName::Auto, "auto"),
            ("cuda", DeviceName::Cuda(0), "cuda:0"),
            ("cuda:3", DeviceName::Cuda(3), "cuda:3"),
            ("host", DeviceName::Host, "host"),
            ("cpu", DeviceName::Host, "host"),
            ("sim", DeviceName::Sim, "sim"),
        ];
        for (text, name, shown) in cases {
            assert_eq!(text.parse::<DeviceName>().unwrap(), name, "{text}");
            assert_eq!(name.to_string(), shown);
            assert_eq!(shown.parse::<DeviceName>().unwrap(), name);
        }
    }

    #[test]
    fn unknown_names_list_the_known_ones() {
        for bad in [
            "", "none", "tpu:0", "cuda:", "cuda:x", "cuda:-1", "CUDA", "cuda0",
        ] {
            let e = bad.parse::<DeviceName>().unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidInput, "{bad:?}");
            assert!(e.to_string().contains(DEVICE_HELP), "{e}");
        }
    }

    #[test]
    fn host_memory_opens_anywhere() {
        for name in [DeviceName::Host, DeviceName::Auto.resolve().unwrap()] {
            let dev = name.open().unwrap();
            if name == DeviceName::Host {
                assert_eq!(dev.kind(), crate::DeviceKind::Host);
            }
        }
    }

    #[test]
    fn a_missing_gpu_says_how_to_use_host_memory() {
        match open_gpu(99) {
            Err(e) if e.kind() == ErrorKind::NoGpu => {
                let text = e.to_string();
                assert!(text.contains("cuda:99"), "{text}");
                assert!(text.contains("--device host"), "{text}");
                assert!(text.contains("device=\"cpu\""), "{text}");
            }
            // A GPU machine: ordinal 99 does not exist.
            Err(e) => assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}"),
            Ok(_) => panic!("cuda:99 opened"),
        }
    }
}

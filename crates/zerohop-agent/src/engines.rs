//! The engines the agent runs clients' I/O on: one for host memory (the
//! host device, whose "device memory" is the clients' memfds), and one for
//! the GPU it serves, if any.

use std::sync::Arc;
use zerohop::device::{open_gpu, CudaDevice, HostDevice};
use zerohop::staging::StagingConfig;
use zerohop::{Device, DeviceName, Engine, EngineConfig, HotRoute, Result};

/// Clients own their files and may truncate them at any time: hot files
/// take the mapped-copy route, whose mappings are guarded (a page a
/// truncation removed fails that I/O, it does not kill the agent), and
/// never page-cache DMA, whose probe would cost the first client's I/O.
fn agent_config() -> EngineConfig {
    EngineConfig {
        hot_route: HotRoute::Mapped,
        ..EngineConfig::default()
    }
}

pub struct CudaEngine {
    pub device: Arc<CudaDevice>,
    pub engine: Engine,
}

pub struct Engines {
    pub host: Engine,
    pub cuda: Option<CudaEngine>,
}

impl Engines {
    /// `device` (see [`zerohop::device::DEVICE_HELP`]) names the GPU to
    /// serve: `auto` the first one if there is one; `host` (or `sim`, the
    /// simulated device for tests) none, serving host memory only.
    pub fn open(device: &str) -> Result<Engines> {
        let name: DeviceName = device.parse()?;
        let host_config = EngineConfig {
            staging: StagingConfig::host_memory(),
            ..agent_config()
        };
        let host_device: Arc<dyn Device> = match name {
            DeviceName::Sim => name.open()?,
            _ => Arc::new(HostDevice::new()),
        };
        let host = Engine::new(host_device, host_config)?;
        let ordinal = match name.resolve()? {
            DeviceName::Cuda(n) => Some(n),
            DeviceName::Host | DeviceName::Sim | DeviceName::Auto => None,
        };
        let cuda = match ordinal {
            None => None,
            Some(n) => {
                let device = Arc::new(open_gpu(n)?);
                let engine = Engine::new(device.clone() as Arc<dyn Device>, agent_config())?;
                Some(CudaEngine { device, engine })
            }
        };
        Ok(Engines { host, cuda })
    }

    pub fn describe(&self) -> String {
        match &self.cuda {
            Some(c) => c.device.describe(),
            None => "host memory only (no GPU served)".into(),
        }
    }
}

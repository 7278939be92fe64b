//! The engines the agent runs clients' I/O on: one for host memory (the
//! simulated device's pipeline, whose "device memory" is host memory: the
//! clients' memfds), and one for the GPU it serves, if any.

use std::sync::Arc;
use zerohop::device::{CudaDevice, SimConfig, SimDevice};
use zerohop::staging::StagingConfig;
use zerohop::{Device, Engine, EngineConfig, Error, HotRoute, Result};

/// Clients own their files and may truncate them at any time: the agent
/// never maps one (a page gone from a mapping is SIGBUS for the whole
/// agent), so hot files take the staged route (read() into staging).
fn agent_config() -> EngineConfig {
    EngineConfig {
        hot_route: HotRoute::Staged,
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
    /// `device`: `auto` (the first GPU if there is one), `none`, or `cuda:N`.
    pub fn open(device: &str) -> Result<Engines> {
        let host_config = EngineConfig {
            staging: StagingConfig::host_memory(),
            ..agent_config()
        };
        let host = Engine::new(Arc::new(SimDevice::new(SimConfig::default())), host_config)?;
        let ordinal = match device {
            "none" => None,
            "auto" => CudaDevice::open(0).ok().map(|_| 0),
            s => match s.strip_prefix("cuda:").map(str::parse::<usize>) {
                Some(Ok(n)) => Some(n),
                _ => {
                    return Err(Error::invalid(format!(
                        "unknown device {s:?}: expected auto, none or cuda:N"
                    )))
                }
            },
        };
        let cuda = match ordinal {
            None => None,
            Some(n) => {
                let device = Arc::new(CudaDevice::open(n)?);
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

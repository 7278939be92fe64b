//! Options and helpers shared by the commands.

use clap::{Args, ValueEnum};
use std::sync::Arc;
use zerohop::staging::StagingConfig;
use zerohop::storage::BackendKind;
use zerohop::{Device, DeviceName, DirectIo, Engine, EngineConfig, HotRoute, Result};

/// Engine settings on the command line.
#[derive(Args, Debug, Clone)]
pub struct EngineArgs {
    #[arg(long, default_value = "auto", help = zerohop::device::DEVICE_HELP)]
    pub device: String,
    /// I/O worker threads.
    #[arg(long)]
    pub threads: Option<usize>,
    /// Pinned staging memory in total, e.g. 256MiB.
    #[arg(long, value_parser = parse_size)]
    pub staging: Option<u64>,
    /// Staging slot size (one read), e.g. 8MiB.
    #[arg(long, value_parser = parse_size)]
    pub slot: Option<u64>,
    #[arg(long, value_enum, default_value_t = BackendArg::Auto)]
    pub backend: BackendArg,
    /// O_DIRECT: auto (for files not in the page cache), always, never.
    #[arg(long, value_enum, default_value_t = DirectArg::Auto)]
    pub direct: DirectArg,
    /// Route for hot files: auto, staged (CPU copies), dma (page-cache DMA).
    #[arg(long, value_enum, default_value_t = HotArg::Auto)]
    pub hot_route: HotArg,
    /// Bytes pinned per page-cache DMA window, e.g. 64MiB.
    #[arg(long, value_parser = parse_size)]
    pub dma_window: Option<u64>,
}

#[derive(ValueEnum, Debug, Clone, Copy)]
pub enum BackendArg {
    Auto,
    IoUring,
    Pread,
}

#[derive(ValueEnum, Debug, Clone, Copy)]
pub enum DirectArg {
    Auto,
    Always,
    Never,
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum HotArg {
    Auto,
    Staged,
    Dma,
}

impl EngineArgs {
    pub fn config(&self) -> EngineConfig {
        let mut c = EngineConfig::default();
        if let Some(t) = self.threads {
            c.io_threads = t;
        }
        let d = StagingConfig::default();
        c.staging = StagingConfig {
            total_bytes: self.staging.map_or(d.total_bytes, |v| v as usize),
            slot_bytes: self.slot.map_or(d.slot_bytes, |v| v as usize),
        };
        c.backend = match self.backend {
            BackendArg::Auto => BackendKind::Auto,
            BackendArg::IoUring => BackendKind::IoUring,
            BackendArg::Pread => BackendKind::Pread,
        };
        c.direct_io = match self.direct {
            DirectArg::Auto => DirectIo::Auto,
            DirectArg::Always => DirectIo::Always,
            DirectArg::Never => DirectIo::Never,
        };
        c.hot_route = match self.hot_route {
            HotArg::Auto => HotRoute::Auto,
            HotArg::Staged => HotRoute::Staged,
            HotArg::Dma => HotRoute::PageCacheDma,
        };
        if let Some(w) = self.dma_window {
            c.dma_window_bytes = w as usize;
        }
        c.hot_choice_file = zerohop::hot_choice::default_file();
        c
    }

    pub fn open_device(&self) -> Result<Arc<dyn Device>> {
        open_device_or_host(&self.device)
    }

    pub fn engine(&self) -> Result<Engine> {
        Engine::new(self.open_device()?, self.config())
    }
}

/// `auto` means the first GPU, or host memory (with a note) when there is none.
pub fn open_device_or_host(spec: &str) -> Result<Arc<dyn Device>> {
    let name: DeviceName = spec.parse()?;
    if name != DeviceName::Auto {
        return name.open();
    }
    match zerohop::device::CudaDevice::open(0) {
        Ok(d) => Ok(Arc::new(d)),
        Err(e) => {
            eprintln!("note: no GPU available ({e}); using host memory instead (same pipeline)");
            DeviceName::Host.open()
        }
    }
}

/// Parses sizes like `8GiB`, `512MiB`, `1G`, `4096`.
pub fn parse_size(s: &str) -> std::result::Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a size (try 8GiB, 512MiB, 4096)"))?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        "t" | "tib" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        u => return Err(format!("unknown size unit {u:?} in {s:?}")),
    };
    let v = n * mult as f64;
    if !v.is_finite() || v < 0.0 || v > u64::MAX as f64 {
        return Err(format!("{s:?} is out of range"));
    }
    Ok(v as u64)
}

pub fn gib(bytes: u64) -> String {
    if bytes >= 1 << 30 {
        format!("{:.2} GiB", bytes as f64 / (1u64 << 30) as f64)
    } else {
        format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("8GiB").unwrap(), 8 << 30);
        assert_eq!(parse_size("512MiB").unwrap(), 512 << 20);
        assert_eq!(parse_size("1G").unwrap(), 1 << 30);
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("1.5k").unwrap(), 1536);
        assert!(parse_size("abc").is_err());
        assert!(parse_size("1XB").is_err());
    }
}

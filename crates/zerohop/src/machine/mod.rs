//! What this machine offers zerohop, and why: the facts behind `zerohop
//! info` and the Python package's `zerohop.info()`.
//!
//! Serialized (`zerohop info --json`, `zerohop.info()`), [`MachineInfo`] is
//! one JSON object:
//!
//! ```text
//! {
//!   "driver":   {"available": bool, "version": "13.0" | null, "why_not": str | null},
//!   "gpus":     [{"description": str}, ...],
//!   "gds":      {"direct_path": bool, "nvidia_fs_loaded": bool, "cufile_library": bool,
//!                "pci_p2pdma_kernel": bool | null, "reason": str},
//!   "io_uring": {"available": bool, "version": null, "why_not": str | null},
//!   "process_checkpoint": {"available": bool, "version": "base" | "storage hook" | null,
//!                "why_not": str | null},
//!   "criu":     {"available": bool, "version": "4.2" | null, "why_not": str | null},
//!   "o_direct": null | {"path": str, "available": bool, "version": null, "why_not": str | null},
//!   "staging":  {"total_bytes": int, "slot_bytes": int},
//!   "io_threads": int,
//!   "cpus": int
//! }
//! ```
//!
//! Every yes-or-no fact is an [`Availability`]: `why_not` is null exactly
//! when `available` is true. CRIU's version is there wherever CRIU
//! reports one, also when it is unavailable (too old, or failing `criu
//! check`).

pub(crate) mod availability;
mod criu;
mod gds;

pub use availability::{available_cpus, Availability};
pub use criu::{
    criu_availability, criu_availability_from, criu_output_gist, parse_criu_version, usable_criu,
    CriuVersion, CRIU_ENV, CRIU_HINT, CRIU_MIN_VERSION,
};
pub use gds::{gds_support, GdsSupport};

use crate::device::{cuda_driver_summary, CudaDevice, Device};
use crate::staging::StagingConfig;
use crate::EngineConfig;
use serde::Serialize;
use std::path::Path;

/// The machine's facts; see the module documentation for the JSON.
#[derive(Debug, Serialize)]
pub struct MachineInfo {
    /// The CUDA driver, with its version.
    pub driver: Availability,
    pub gpus: Vec<Gpu>,
    pub gds: GdsSupport,
    pub io_uring: Availability,
    /// The driver's checkpoint of other processes (`cuCheckpointProcess*`,
    /// for `zerohop checkpoint-process`); its version is `storage hook`
    /// where the driver also has CUDA 13.4's caller-side storage
    /// (`cuCheckpointOperationComplete`), else `base`.
    pub process_checkpoint: Availability,
    /// CRIU for checkpointing whole processes (`ZEROHOP_CRIU`, else `criu`
    /// on `PATH`): available where version 4.0 or later passes `criu
    /// check`; see [`criu_availability`].
    pub criu: Availability,
    /// O_DIRECT on the path asked about, if one was.
    pub o_direct: Option<PathCheck>,
    pub staging: StagingConfig,
    pub io_threads: usize,
    pub cpus: usize,
}

#[derive(Debug, Serialize)]
pub struct Gpu {
    pub description: String,
}

/// Whether a path's file system accepts O_DIRECT. JSON: the path beside the
/// [`Availability`] fields.
#[derive(Debug, Serialize)]
pub struct PathCheck {
    pub path: String,
    #[serde(flatten)]
    pub o_direct: Availability,
}

impl MachineInfo {
    /// Probes the driver, GPUs, GDS, io_uring, CRIU, and O_DIRECT on
    /// `path`.
    pub fn gather(path: Option<&Path>) -> MachineInfo {
        let (driver, gpus) = match cuda_driver_summary() {
            Ok((version, count)) => {
                let gpus = (0..count)
                    .map(|i| Gpu {
                        description: CudaDevice::open(i)
                            .map(|d| d.describe())
                            .unwrap_or_else(|e| format!("cuda:{i}: {e}")),
                    })
                    .collect();
                (Availability::available(Some(version)), gpus)
            }
            Err(e) => (Availability::unavailable(e.to_string()), Vec::new()),
        };
        let config = EngineConfig::default();
        MachineInfo {
            driver,
            gpus,
            gds: gds_support(),
            io_uring: Availability::of(io_uring_available()),
            process_checkpoint: match zerohop_cuda::ProcessCheckpoint::get() {
                Ok(api) if api.has_storage_hook() => {
                    Availability::available(Some("storage hook".into()))
                }
                Ok(_) => Availability::available(Some("base".into())),
                Err(e) => Availability::unavailable(e.to_string()),
            },
            criu: criu_availability(),
            o_direct: path.map(|p| PathCheck {
                path: p.display().to_string(),
                o_direct: Availability::of(o_direct_supported(p)),
            }),
            staging: config.staging,
            io_threads: config.io_threads,
            cpus: available_cpus(),
        }
    }
}

/// Whether the kernel lets this process create an io_uring.
pub fn io_uring_available() -> Result<(), String> {
    crate::storage::UringBackend::probe()
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// Whether the file system holding `path` (a file or directory) accepts
/// O_DIRECT reads, with the reason when it does not.
pub fn o_direct_supported(path: &Path) -> Result<(), String> {
    use std::os::unix::fs::{FileExt, OpenOptionsExt};
    let probe_file;
    let target = if path.is_dir() {
        probe_file =
            ProbeFile::create_in(path).map_err(|e| format!("cannot create a probe file: {e}"))?;
        probe_file.0.as_path()
    } else {
        path
    };
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags((rustix::fs::OFlags::DIRECT | rustix::fs::OFlags::NONBLOCK).bits() as i32)
        .open(target)
        .map_err(|e| format!("open(O_DIRECT) refused: {e}"))?;
    crate::storage::regular_file_len(&f, target).map_err(|e| e.to_string())?;
    // One aligned block: O_DIRECT needs an aligned buffer as well.
    const BLOCK: usize = 4096;
    let mut buf = vec![0u8; 2 * BLOCK];
    let at = buf.as_ptr().align_offset(BLOCK);
    f.read_at(&mut buf[at..at + BLOCK], 0)
        .map_err(|e| format!("an aligned O_DIRECT read failed: {e}"))?;
    Ok(())
}

/// A probe file that removes itself on drop.
struct ProbeFile(std::path::PathBuf);

impl ProbeFile {
    fn create_in(dir: &Path) -> std::io::Result<ProbeFile> {
        let p = dir.join(format!(".zerohop-probe-{}", std::process::id()));
        std::fs::write(&p, vec![0u8; 8192])?;
        Ok(ProbeFile(p))
    }
}

impl Drop for ProbeFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn facts_serialize_to_the_documented_schema() {
        let info = MachineInfo::gather(Some(Path::new(env!("CARGO_MANIFEST_DIR"))));
        let json = serde_json::to_value(&info).unwrap();
        let mut keys: Vec<&str> = json
            .as_object()
            .unwrap()
            .keys()
            .map(|k| k.as_str())
            .collect();
        keys.sort_unstable();
        assert_eq!(
            keys,
            [
                "cpus",
                "criu",
                "driver",
                "gds",
                "gpus",
                "io_threads",
                "io_uring",
                "o_direct",
                "process_checkpoint",
                "staging"
            ]
        );
        for fact in [
            &json["criu"],
            &json["driver"],
            &json["io_uring"],
            &json["o_direct"],
            &json["process_checkpoint"],
        ] {
            let available = fact["available"].as_bool().expect("a bool");
            assert_eq!(fact["why_not"].is_null(), available, "{fact}");
            assert!(
                fact.get("Ok").is_none() && fact.get("Err").is_none(),
                "{fact}"
            );
        }
        assert_eq!(json["driver"]["version"].is_string(), info.driver.available);
        assert!(json["o_direct"]["path"].is_string());
        assert!(json["staging"]["total_bytes"].as_u64().unwrap() > 0);
        assert!(json["cpus"].as_u64().unwrap() >= 1);

        let gone = Availability::unavailable("no driver");
        assert_eq!(
            serde_json::to_string(&gone).unwrap(),
            r#"{"available":false,"version":null,"why_not":"no driver"}"#
        );
        let check = PathCheck {
            path: "/x".into(),
            o_direct: Availability::available(None),
        };
        assert_eq!(
            serde_json::to_string(&check).unwrap(),
            r#"{"path":"/x","available":true,"version":null,"why_not":null}"#
        );
    }
}

//! A whole process to a directory and back: `zerohop freeze` / `thaw`.
//!
//! A freeze checkpoints the process's GPU state through zerohop and the
//! driver ([`crate::gpu_state`]) where it has any, then has CRIU dump the
//! rest (its host memory, the driver's small staging in it, threads,
//! files) into `images/`, makes every image durable and checksums it, and
//! writes `FREEZE.json` last: a directory without it is no freeze. A thaw
//! checks the images against their sums, has CRIU restore the process
//! under its own pid, and puts its GPU state back, verified.
//!
//! ```text
//! DIR/FREEZE.json   the manifest (written last)
//! DIR/images/       CRIU's images ("parent": a link to the earlier
//!                   freeze's, for an incremental one)
//! DIR/gpu/          the GPU state (gpu_state's directory), where any
//! DIR/dump.log      CRIU's logs; restore.log and restored.pid after a thaw
//! ```

use crate::criu::{Criu, Dump};
use crate::gpu_state::{self, GpuCheckpoint};
use crate::image_sums::{self, ImageFile};
use crate::proc_fs::{self, expect_exists};
use serde::{Deserialize, Serialize};
use std::path::{Component, Path, PathBuf};
use std::time::{Duration, Instant};
use zerohop::storage::atomic::{create_dir_durable, write_new};
use zerohop::{Error, ErrorKind, Result};

const MANIFEST: &str = "FREEZE.json";
const FORMAT: &str = "zerohop-freeze/1";
const IMAGES: &str = "images";
const GPU: &str = "gpu";

/// CRIU's options for what a process holds beyond its memory: given to
/// the dump, kept in the manifest, and given to the restore again.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CriuFlags {
    /// `--shell-job`: the process belongs to a shell's session or has a
    /// terminal (started from a shell, not as a daemon).
    pub shell_job: bool,
    /// `--tcp-established`: its established TCP connections go with it.
    pub tcp_established: bool,
    /// `--file-locks`: its file locks go with it.
    pub file_locks: bool,
    /// `--ext-unix-sk`: it is connected to Unix sockets outside it.
    pub ext_unix_sk: bool,
    /// Any other CRIU arguments, given to both the dump and the restore.
    pub extra: Vec<String>,
}

impl CriuFlags {
    fn args(&self) -> Vec<String> {
        let named = [
            (self.shell_job, "--shell-job"),
            (self.tcp_established, "--tcp-established"),
            (self.file_locks, "--file-locks"),
            (self.ext_unix_sk, "--ext-unix-sk"),
        ];
        named
            .iter()
            .filter(|(on, _)| *on)
            .map(|(_, flag)| flag.to_string())
            .chain(self.extra.iter().cloned())
            .collect()
    }
}

/// How to freeze.
#[derive(Debug, Clone)]
pub struct FreezeOptions {
    /// A snapshot: the process runs on after the freeze, its GPU state
    /// back, and a later freeze can name this one as its `parent`.
    pub leave_running: bool,
    /// An earlier snapshot of the same process: CRIU writes only the host
    /// memory pages changed since, where the snapshot's were tracked (the
    /// GPU memory is written whole).
    pub parent: Option<PathBuf>,
    pub criu: CriuFlags,
    /// How long the driver may wait for the process's CUDA calls in
    /// flight.
    pub lock_timeout: Duration,
}

/// Where a frozen process's GPU state went.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GpuHalf {
    /// It had none: CRIU alone.
    None,
    /// Its suspendable memory through zerohop, the rest by the driver.
    Zerohop,
    /// All of it by the driver, staged in its host memory (a process
    /// that serves no suspend requests: NVIDIA's own flow).
    Driver,
}

/// Seconds of a freeze's steps.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FreezeSeconds {
    pub gpu: f64,
    pub criu_dump: f64,
    pub seal: f64,
    /// From the call to the manifest's commit: the time to durable.
    pub durable: f64,
    /// A snapshot's GPU state put back after it (0 otherwise).
    pub resume: f64,
}

/// `FREEZE.json`: what was frozen and how, and every image's sums.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FreezeReport {
    pub format: String,
    pub pid: u32,
    pub gpu: GpuHalf,
    /// The GPU state's record, where it had any.
    pub gpu_checkpoint: Option<GpuCheckpoint>,
    pub criu_version: String,
    pub criu: CriuFlags,
    pub leave_running: bool,
    /// Whether CRIU tracks memory changes from this freeze on: a snapshot's
    /// does where the kernel can (soft-dirty pages), so that a freeze
    /// naming it as parent writes only the pages changed since.
    pub track_mem: bool,
    /// The parent freeze's directory, relative to this one, where CRIU
    /// wrote only the pages changed since it (a thaw then needs it too).
    pub parent: Option<String>,
    pub images: Vec<ImageFile>,
    pub image_bytes: u64,
    pub seconds: FreezeSeconds,
}

/// What a thaw did.
#[derive(Debug, Clone, Serialize)]
pub struct ThawReport {
    pub pid: u32,
    pub gpu: GpuHalf,
    /// The images checked against their sums (this freeze's and its
    /// parents').
    pub check_seconds: f64,
    pub criu_restore_seconds: f64,
    pub gpu_seconds: f64,
    /// The GPU memory zerohop restored and verified.
    pub gpu_bytes: u64,
    pub seconds: f64,
}

/// Freezes process `pid` into `dir`, a new directory. Without
/// `leave_running` the process is gone when this returns, and `dir`
/// durable; on any failure the process is left running as it was and
/// `dir` is removed.
pub fn freeze(pid: u32, dir: &Path, options: &FreezeOptions) -> Result<FreezeReport> {
    let start = Instant::now();
    expect_exists(pid)?;
    if proc_fs::state(pid) == Some('Z') {
        return Err(Error::invalid(format!(
            "process {pid} has exited (a zombie): nothing to freeze"
        )));
    }
    if dir.exists() {
        return Err(Error::new(
            ErrorKind::AlreadyExists,
            format!(
                "{} already exists: a freeze goes to a new directory",
                dir.display()
            ),
        ));
    }
    let criu = Criu::find()?;
    let parent = options
        .parent
        .as_deref()
        .map(|p| parent_of_incremental(pid, p))
        .transpose()?;
    let has_gpu_state = proc_fs::holds_gpu_state(pid)?;
    create_dir_durable(dir)?;
    let images = dir.join(IMAGES);
    let made = std::fs::create_dir(&images).map_err(|e| Error::io(&images, "cannot create", e));
    let result = made.and_then(|()| {
        freeze_in(
            pid,
            dir,
            options,
            &criu,
            parent.as_ref(),
            has_gpu_state,
            start,
        )
    });
    if result.is_err() && !dir.join(MANIFEST).exists() {
        let _ = std::fs::remove_dir_all(dir);
    }
    result
}

/// A checked parent of an incremental freeze: its directory and manifest.
struct Parent {
    dir: PathBuf,
    manifest: FreezeReport,
}

fn parent_of_incremental(pid: u32, dir: &Path) -> Result<Parent> {
    let manifest = read_manifest(dir)?;
    if manifest.pid != pid {
        return Err(Error::invalid(format!(
            "{} is a freeze of process {}, not of process {pid}",
            dir.display(),
            manifest.pid
        )));
    }
    if !manifest.leave_running {
        return Err(Error::invalid(format!(
            "{} is no snapshot (it was not frozen with leave_running): the process it froze is gone",
            dir.display()
        )));
    }
    Ok(Parent {
        dir: dir.to_path_buf(),
        manifest,
    })
}

fn freeze_in(
    pid: u32,
    dir: &Path,
    options: &FreezeOptions,
    criu: &Criu,
    parent: Option<&Parent>,
    has_gpu_state: bool,
    start: Instant,
) -> Result<FreezeReport> {
    let gpu_dir = dir.join(GPU);
    let gpu_checkpoint = match has_gpu_state {
        // Written whole even for an incremental freeze: a zerohop
        // checkpoint references chunks only in sibling checkpoints of its
        // store, and each freeze keeps its own GPU directory.
        true => Some(gpu_state::checkpoint(
            pid,
            &gpu_dir,
            None,
            options.lock_timeout,
        )?),
        false => None,
    };
    let gpu_seconds = start.elapsed().as_secs_f64();
    // From here on, a failure puts the GPU state back before it returns.
    let undo = |e: Error| match &gpu_checkpoint {
        Some(_) => match gpu_state::restore(pid, &gpu_dir) {
            Ok(_) => e,
            Err(r) => e.context(format!(
                "and process {pid}'s GPU state could not be put back ({r}): it is kept in {}",
                gpu_dir.display()
            )),
        },
        None => e,
    };
    let images = dir.join(IMAGES);
    // Without tracked memory in the parent CRIU writes every page again;
    // the GPU half is incremental all the same.
    let prev_images = parent
        .filter(|p| p.manifest.track_mem)
        .map(|p| relative_to(&images, &p.dir.join(IMAGES)))
        .transpose()
        .map_err(undo)?;
    let track_mem = options.leave_running && criu.tracks_memory();
    let dump = Dump {
        pid,
        leave_running: options.leave_running,
        track_mem,
        prev_images: prev_images.as_deref(),
    };
    let dumped = Instant::now();
    criu.dump(&dump, &images, dir, &options.criu.args())
        .map_err(undo)?;
    let criu_dump = dumped.elapsed().as_secs_f64();
    // Without leave_running the process is gone: its state lives on only
    // here, so nothing below may undo the dump.
    let sealed = Instant::now();
    let sealing = image_sums::seal(&images);
    let files = match sealing {
        Ok(files) => files,
        Err(e) if options.leave_running => return Err(undo(e)),
        Err(e) => return Err(e),
    };
    let seal = sealed.elapsed().as_secs_f64();
    let gpu = match &gpu_checkpoint {
        None => GpuHalf::None,
        Some(c) if c.zerohop_suspend => GpuHalf::Zerohop,
        Some(_) => GpuHalf::Driver,
    };
    let mut report = FreezeReport {
        format: FORMAT.into(),
        pid,
        gpu,
        gpu_checkpoint,
        criu_version: criu.version.to_string(),
        criu: options.criu.clone(),
        leave_running: options.leave_running,
        track_mem,
        parent: parent
            .filter(|_| prev_images.is_some())
            .map(|p| relative_to(dir, &p.dir).map(|r| r.display().to_string()))
            .transpose()?,
        image_bytes: files.iter().map(|f| f.size).sum(),
        images: files,
        seconds: FreezeSeconds {
            gpu: gpu_seconds,
            criu_dump,
            seal,
            durable: 0.0,
            resume: 0.0,
        },
    };
    report.seconds.durable = start.elapsed().as_secs_f64();
    let written = write_manifest(dir, &report);
    if options.leave_running && report.gpu != GpuHalf::None {
        let resumed = Instant::now();
        let back = gpu_state::restore(pid, &gpu_dir);
        report.seconds.resume = resumed.elapsed().as_secs_f64();
        back.map_err(|e| {
            e.context(format!(
                "the freeze in {} is complete, but process {pid} could not take its GPU state back",
                dir.display()
            ))
        })?;
    }
    written?;
    Ok(report)
}

/// Thaws the freeze in `dir`: its images checked, the process restored
/// by CRIU under its own pid, its GPU state put back and verified.
/// `extra_criu` goes to `criu restore` after the freeze's own flags. On
/// failure no restored process is left running.
pub fn thaw(dir: &Path, extra_criu: &[String]) -> Result<ThawReport> {
    let start = Instant::now();
    let manifest = read_manifest(dir)?;
    let criu = Criu::find()?;
    check_images(dir, &manifest, 0)?;
    if manifest.gpu != GpuHalf::None {
        gpu_state::read_record(&dir.join(GPU))?;
    }
    let pid = manifest.pid;
    if proc_fs::exists(pid) {
        let state = proc_fs::state(pid).map_or(String::new(), |s| format!(" (state {s})"));
        return Err(Error::new(
            ErrorKind::AlreadyExists,
            format!(
                "process {pid} exists{state}: a thaw brings the frozen process back under its own pid, so stop that one first (a zombie is gone once its parent waits for it)"
            ),
        ));
    }
    let check_seconds = start.elapsed().as_secs_f64();
    let mut flags = manifest.criu.args();
    flags.extend(extra_criu.iter().cloned());
    let restoring = Instant::now();
    let restored = criu.restore(&dir.join(IMAGES), dir, &flags)?;
    let criu_restore_seconds = restoring.elapsed().as_secs_f64();
    let stop = |e: Error| {
        let killed = rustix::process::Pid::from_raw(restored as i32)
            .map(|p| rustix::process::kill_process(p, rustix::process::Signal::KILL));
        e.context(match killed {
            Some(Ok(())) => format!(
                "the restored process {restored} was killed, so nothing is left half-restored; {} is unchanged",
                dir.display()
            ),
            _ => format!("and the restored process {restored} could not be killed"),
        })
    };
    if restored != pid {
        return Err(stop(Error::invalid(format!(
            "CRIU restored process {restored}, not the frozen process {pid}"
        ))));
    }
    let gpu_started = Instant::now();
    let mut gpu_bytes = 0;
    if manifest.gpu != GpuHalf::None {
        let back = gpu_state::restore(pid, &dir.join(GPU)).map_err(stop)?;
        gpu_bytes = back.zerohop_bytes.unwrap_or(0);
    }
    Ok(ThawReport {
        pid,
        gpu: manifest.gpu,
        check_seconds,
        criu_restore_seconds,
        gpu_seconds: gpu_started.elapsed().as_secs_f64(),
        gpu_bytes,
        seconds: start.elapsed().as_secs_f64(),
    })
}

/// The deepest chain of parents a thaw follows.
const MAX_PARENTS: usize = 64;

/// Checks `dir`'s images against `manifest`, and its parents' in turn.
fn check_images(dir: &Path, manifest: &FreezeReport, depth: usize) -> Result<()> {
    image_sums::check(&dir.join(IMAGES), &manifest.images)?;
    let Some(parent) = &manifest.parent else {
        return Ok(());
    };
    if depth == MAX_PARENTS {
        return Err(Error::format(format!(
            "{} has over {MAX_PARENTS} parents",
            dir.display()
        )));
    }
    let parent_dir = dir.join(parent);
    let parent_manifest = read_manifest(&parent_dir).map_err(|e| {
        e.context(format!(
            "{} is incremental, and its parent is needed",
            dir.display()
        ))
    })?;
    check_images(&parent_dir, &parent_manifest, depth + 1)
}

/// The manifest of the freeze in `dir`.
pub fn read_manifest(dir: &Path) -> Result<FreezeReport> {
    let path = dir.join(MANIFEST);
    let bytes = std::fs::read(&path).map_err(|e| {
        Error::io(&path, "cannot read", e)
            .context(format!("{} holds no finished freeze", dir.display()))
    })?;
    decode_manifest(&bytes).map_err(|e| e.context(format!("{}", path.display())))
}

/// A manifest from its bytes (untrusted: a freeze directory may come from
/// anywhere), checked to hold together: its format, image names that stay
/// in the image directory, one sum per chunk, the bytes they add up to,
/// and a parent that is a relative path.
pub fn decode_manifest(bytes: &[u8]) -> Result<FreezeReport> {
    let manifest: FreezeReport = serde_json::from_slice(bytes)
        .map_err(|e| Error::with_source(ErrorKind::Format, "not a freeze manifest", e))?;
    if manifest.format != FORMAT {
        return Err(Error::format(format!(
            "the format is {:?}, not {FORMAT:?}",
            manifest.format
        )));
    }
    image_sums::validate(&manifest.images)?;
    let total = manifest
        .images
        .iter()
        .try_fold(0u64, |sum, f| sum.checked_add(f.size));
    if total != Some(manifest.image_bytes) {
        return Err(Error::format(format!(
            "image_bytes is {}, not the images' sum",
            manifest.image_bytes
        )));
    }
    if let Some(parent) = &manifest.parent {
        let relative = Path::new(parent)
            .components()
            .all(|c| matches!(c, Component::Normal(_) | Component::ParentDir));
        if parent.is_empty() || !relative {
            return Err(Error::format(format!(
                "the parent {parent:?} is not a path relative to the freeze"
            )));
        }
    }
    Ok(manifest)
}

fn write_manifest(dir: &Path, manifest: &FreezeReport) -> Result<()> {
    let json = serde_json::to_vec_pretty(manifest).expect("a manifest serializes");
    write_new(&dir.join(MANIFEST), &json)
}

/// `to` as a path relative to the directory `from` (both made absolute
/// and normal first).
fn relative_to(from: &Path, to: &Path) -> Result<PathBuf> {
    let normal = |p: &Path| -> Result<Vec<String>> {
        let abs = std::path::absolute(p).map_err(|e| Error::io(p, "cannot resolve", e))?;
        let mut parts: Vec<String> = Vec::new();
        for c in abs.components() {
            match c {
                Component::Normal(s) => parts.push(
                    s.to_str()
                        .ok_or_else(|| Error::invalid(format!("{} is not UTF-8", p.display())))?
                        .to_string(),
                ),
                Component::ParentDir => {
                    parts.pop();
                }
                _ => {}
            }
        }
        Ok(parts)
    };
    let (from, to) = (normal(from)?, normal(to)?);
    let common = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
    let mut rel = PathBuf::new();
    for _ in common..from.len() {
        rel.push("..");
    }
    for part in &to[common..] {
        rel.push(part);
    }
    Ok(rel)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_paths_climb_to_the_common_directory() {
        let rel = |a: &str, b: &str| relative_to(Path::new(a), Path::new(b)).unwrap();
        assert_eq!(
            rel("/f/b/images", "/f/a/images"),
            Path::new("../../a/images")
        );
        assert_eq!(rel("/f/b", "/f/a"), Path::new("../a"));
        assert_eq!(rel("/f/b/../c", "/f/a"), Path::new("../a"));
        assert_eq!(rel("/f", "/f/a"), Path::new("a"));
    }

    #[test]
    fn a_manifest_that_does_not_hold_together_is_refused() {
        let good = serde_json::json!({
            "format": FORMAT, "pid": 7, "gpu": "none", "gpu_checkpoint": null,
            "criu_version": "4.2", "criu": CriuFlags::default(), "leave_running": false,
            "track_mem": false, "parent": "../snap",
            "images": [{"name": "core-7.img", "size": 10, "xxh3": ["0123456789abcdef"]}],
            "image_bytes": 10, "seconds": FreezeSeconds::default(),
        });
        let decode = |v: &serde_json::Value| decode_manifest(v.to_string().as_bytes());
        assert_eq!(decode(&good).unwrap().images[0].name, "core-7.img");
        let bad = |path: &str, value: serde_json::Value, why: &str| {
            let mut v = good.clone();
            *v.pointer_mut(path).unwrap() = value;
            let e = decode(&v).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::Format, "{e}");
            assert!(e.to_string().contains(why), "{path}: {e}");
        };
        bad("/images/0/name", "../core-7.img".into(), "no image name");
        bad("/images/0/name", "..".into(), "no image name");
        bad(
            "/images/0/xxh3",
            serde_json::json!([]),
            "has 0 sums for 10 bytes",
        );
        bad("/images/0/xxh3/0", "xyz".into(), "16 hex digits");
        bad("/image_bytes", 11.into(), "not the images' sum");
        bad("/parent", "/etc".into(), "not a path relative");
        bad(
            "/format",
            "zerohop-freeze/9".into(),
            "not \"zerohop-freeze/1\"",
        );
        assert!(decode_manifest(b"{").is_err());
    }

    /// Timings come back from a manifest as the very numbers written: a
    /// parser that rounds the last bit would encode them otherwise.
    #[test]
    fn a_manifest_encodes_again_to_the_same_bytes() {
        let mut report = decode_manifest(
            serde_json::json!({
                "format": FORMAT, "pid": 7, "gpu": "none", "gpu_checkpoint": null,
                "criu_version": "4.2", "criu": CriuFlags::default(), "leave_running": false,
                "track_mem": false, "parent": null, "images": [], "image_bytes": 0,
                "seconds": FreezeSeconds::default(),
            })
            .to_string()
            .as_bytes(),
        )
        .unwrap();
        report.seconds.durable = 0.24448109944444446;
        report.seconds.seal = 0.1 + 0.2;
        let bytes = serde_json::to_vec(&report).unwrap();
        let again = serde_json::to_vec(&decode_manifest(&bytes).unwrap()).unwrap();
        assert_eq!(
            String::from_utf8(again).unwrap(),
            String::from_utf8(bytes).unwrap()
        );
    }

    #[test]
    fn flags_become_criu_arguments_in_order() {
        let flags = CriuFlags {
            shell_job: true,
            file_locks: true,
            extra: vec!["--link-remap".into()],
            ..CriuFlags::default()
        };
        assert_eq!(
            flags.args(),
            ["--shell-job", "--file-locks", "--link-remap"]
        );
        assert!(CriuFlags::default().args().is_empty());
    }
}

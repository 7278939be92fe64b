//! CRIU's `dump` and `restore`, run as commands: their logs kept in a work
//! directory, and the gist of a failure's log in the error.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use zerohop::machine::{criu_output_gist, usable_criu, CriuVersion};
use zerohop::{Error, ErrorKind, Result};

/// The most of a log read back for an error.
const LOG_TAIL: u64 = 256 * 1024;

/// A CRIU binary of version 4.0 or later.
pub struct Criu {
    path: PathBuf,
    pub version: CriuVersion,
}

/// What one dump is asked to do beyond the defaults.
pub struct Dump<'a> {
    pub pid: u32,
    /// The process keeps running after the dump.
    pub leave_running: bool,
    /// Memory changes are tracked from this dump on, for a later
    /// incremental dump.
    pub track_mem: bool,
    /// The earlier dump's image directory, relative to this one's.
    pub prev_images: Option<&'a Path>,
}

impl Criu {
    /// The CRIU of `ZEROHOP_CRIU` or `PATH`.
    pub fn find() -> Result<Criu> {
        let (path, version) = usable_criu().map_err(|why| Error::new(ErrorKind::NotFound, why))?;
        Ok(Criu { path, version })
    }

    /// Whether this kernel lets CRIU track memory changes (soft-dirty
    /// pages), which an incremental dump needs.
    pub fn tracks_memory(&self) -> bool {
        Command::new(&self.path)
            .args(["check", "--feature", "mem_dirty_track"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    /// `criu dump` of `dump.pid` into `images`, its log in `work`.
    pub fn dump(&self, dump: &Dump, images: &Path, work: &Path, flags: &[String]) -> Result<()> {
        let mut args: Vec<String> = vec!["dump".into(), "-t".into(), dump.pid.to_string()];
        args.extend(dirs(images, work, "dump.log"));
        if dump.leave_running {
            args.push("--leave-running".into());
        }
        if dump.track_mem {
            args.push("--track-mem".into());
        }
        if let Some(prev) = dump.prev_images {
            args.push("--prev-images-dir".into());
            args.push(path_arg(prev)?);
        }
        args.extend(flags.iter().cloned());
        self.run(&args, &work.join("dump.log"))
            .map_err(|e| e.context(format!("CRIU could not dump process {}", dump.pid)))
    }

    /// `criu restore` from `images`, detached: the restored process's pid.
    pub fn restore(&self, images: &Path, work: &Path, flags: &[String]) -> Result<u32> {
        let pidfile = std::path::absolute(work.join("restored.pid"))
            .map_err(|e| Error::io(work, "cannot resolve", e))?;
        let mut args: Vec<String> = vec!["restore".into()];
        args.extend(dirs(images, work, "restore.log"));
        args.extend([
            "--restore-detached".into(),
            "--pidfile".into(),
            path_arg(&pidfile)?,
        ]);
        args.extend(flags.iter().cloned());
        self.run(&args, &work.join("restore.log"))
            .map_err(|e| e.context(format!("CRIU could not restore from {}", images.display())))?;
        let text = std::fs::read_to_string(&pidfile)
            .map_err(|e| Error::io(&pidfile, "CRIU restored, but cannot read", e))?;
        text.trim().parse().map_err(|_| {
            Error::format(format!(
                "CRIU restored, but {} holds {text:?}, not a pid",
                pidfile.display()
            ))
        })
    }

    /// Runs CRIU with `args`; on failure the error quotes its output and
    /// the gist of `log`, and names the log.
    fn run(&self, args: &[String], log: &Path) -> Result<()> {
        let capture: File =
            rustix::fs::memfd_create("zerohop-criu", rustix::fs::MemfdFlags::CLOEXEC)
                .map_err(|e| Error::new(ErrorKind::Io, format!("no output file for CRIU: {e}")))?
                .into();
        let spawn_error = |e: std::io::Error| {
            Error::with_source(
                ErrorKind::Io,
                format!("cannot run {}", self.path.display()),
                e,
            )
        };
        let status = Command::new(&self.path)
            .args(args)
            .stdin(Stdio::null())
            .stdout(capture.try_clone().map_err(spawn_error)?)
            .stderr(capture.try_clone().map_err(spawn_error)?)
            .status()
            .map_err(spawn_error)?;
        if status.success() {
            return Ok(());
        }
        let output = read_tail(capture).unwrap_or_default();
        let log_text = File::open(log).and_then(read_tail).unwrap_or_default();
        let gist = criu_output_gist(&format!("{output}\n{log_text}"));
        Err(Error::new(
            ErrorKind::Io,
            format!(
                "`criu {}` failed ({status}): {gist} (its log: {})",
                args[0],
                log.display()
            ),
        ))
    }
}

/// The image and work directories and the log's name, as CRIU takes them.
fn dirs(images: &Path, work: &Path, log: &str) -> Vec<String> {
    vec![
        "-D".into(),
        images.display().to_string(),
        "-W".into(),
        work.display().to_string(),
        "-o".into(),
        log.into(),
    ]
}

fn path_arg(p: &Path) -> Result<String> {
    p.to_str()
        .map(str::to_string)
        .ok_or_else(|| Error::invalid(format!("{} is not valid UTF-8", p.display())))
}

/// The last [`LOG_TAIL`] bytes of `f`, as text.
fn read_tail(mut f: File) -> std::io::Result<String> {
    let len = f.seek(SeekFrom::End(0))?;
    f.seek(SeekFrom::Start(len.saturating_sub(LOG_TAIL)))?;
    let mut bytes = Vec::new();
    f.read_to_end(&mut bytes)?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

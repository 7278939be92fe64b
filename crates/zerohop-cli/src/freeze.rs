//! `zerohop freeze PID DIR` and `zerohop thaw DIR`: a whole process to a
//! directory and back, its GPU state through zerohop and the driver, the
//! rest through CRIU (`zerohop_process::freeze`).

use clap::Args;
use std::path::PathBuf;
use std::time::Duration;
use zerohop::Result;
use zerohop_cmd::size::human_bytes;
use zerohop_process::freeze::GpuHalf;
use zerohop_process::{CriuFlags, FreezeOptions};

#[derive(Args, Debug)]
pub struct FreezeArgs {
    /// The process (a CUDA process, or any other CRIU can dump).
    pub pid: u32,
    /// A new directory for the frozen process.
    pub dir: PathBuf,
    /// Take a snapshot: the process runs on, its GPU state back.
    #[arg(long)]
    pub leave_running: bool,
    /// An earlier snapshot (--leave-running) of the same process: CRIU
    /// writes only the host memory pages changed since, where the kernel
    /// tracks them (GPU memory is written whole; default: none).
    #[arg(long)]
    pub parent: Option<PathBuf>,
    /// The process was started from a shell (it shares the shell's
    /// session or has a terminal): CRIU's --shell-job.
    #[arg(long)]
    pub shell_job: bool,
    /// Its established TCP connections go with it: CRIU's
    /// --tcp-established.
    #[arg(long)]
    pub tcp_established: bool,
    /// Its file locks go with it: CRIU's --file-locks.
    #[arg(long)]
    pub file_locks: bool,
    /// It is connected to Unix sockets outside it: CRIU's --ext-unix-sk.
    #[arg(long)]
    pub ext_unix_sk: bool,
    /// Another CRIU argument for the dump and the thaw's restore
    /// (repeatable; default: none).
    #[arg(long = "criu-arg", allow_hyphen_values = true)]
    pub criu_args: Vec<String>,
    /// How long the driver may wait for the process's CUDA calls in flight
    /// before giving up (seconds).
    #[arg(long, default_value_t = 30)]
    pub lock_timeout: u64,
    /// Print the manifest (FREEZE.json) as JSON instead of a summary.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct ThawArgs {
    /// The directory `zerohop freeze` wrote.
    pub dir: PathBuf,
    /// Another argument for `criu restore`, after the freeze's own
    /// (repeatable; default: none).
    #[arg(long = "criu-arg", allow_hyphen_values = true)]
    pub criu_args: Vec<String>,
    /// Print what the thaw did as JSON instead of a summary.
    #[arg(long)]
    pub json: bool,
}

pub fn freeze(args: &FreezeArgs) -> Result<()> {
    let options = FreezeOptions {
        leave_running: args.leave_running,
        parent: args.parent.clone(),
        criu: CriuFlags {
            shell_job: args.shell_job,
            tcp_established: args.tcp_established,
            file_locks: args.file_locks,
            ext_unix_sk: args.ext_unix_sk,
            extra: args.criu_args.clone(),
        },
        lock_timeout: Duration::from_secs(args.lock_timeout),
    };
    let report = zerohop_process::freeze(args.pid, &args.dir, &options)?;
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).expect("a report serializes")
        );
        return Ok(());
    }
    let s = &report.seconds;
    let gpu = match (&report.gpu, &report.gpu_checkpoint) {
        (GpuHalf::None, _) | (_, None) => "no GPU state".to_string(),
        (half, Some(c)) => format!(
            "GPU state {:.2} s: {}driver {:.2} s staging {}",
            s.gpu,
            match half {
                GpuHalf::Zerohop => format!("zerohop {}, ", human_bytes(c.zerohop_bytes)),
                _ => "all by the driver (the process serves no suspend requests), ".into(),
            },
            c.driver_seconds,
            human_bytes(c.driver_host_bytes.max(0) as u64)
        ),
    };
    println!(
        "froze process {} to {} in {:.2} s, durable ({gpu}; criu dump {:.2} s, {} of images; sealed in {:.2} s); {}",
        report.pid,
        args.dir.display(),
        s.durable,
        s.criu_dump,
        human_bytes(report.image_bytes),
        s.seal,
        match (report.leave_running, report.gpu) {
            (true, GpuHalf::None) => "the process runs on".to_string(),
            (true, _) => format!("the process runs on (GPU state back in {:.2} s)", s.resume),
            (false, _) => "the process is stopped: `zerohop thaw` brings it back".into(),
        }
    );
    if let Some(parent) = &report.parent {
        println!(
            "incremental on the snapshot in {parent} (relative to this freeze); a thaw needs both"
        );
    }
    Ok(())
}

pub fn thaw(args: &ThawArgs) -> Result<()> {
    let report = zerohop_process::thaw(&args.dir, &args.criu_args)?;
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).expect("a report serializes")
        );
        return Ok(());
    }
    println!(
        "thawed process {} from {} in {:.2} s (images checked {:.2} s; criu restore {:.2} s; {})",
        report.pid,
        args.dir.display(),
        report.seconds,
        report.check_seconds,
        report.criu_restore_seconds,
        match report.gpu {
            GpuHalf::None => "no GPU state".to_string(),
            GpuHalf::Zerohop => format!(
                "GPU state {:.2} s, zerohop {} verified",
                report.gpu_seconds,
                human_bytes(report.gpu_bytes)
            ),
            GpuHalf::Driver => format!("GPU state {:.2} s, by the driver", report.gpu_seconds),
        }
    );
    Ok(())
}

//! `zerohop bench agent`: a file read into this process's memory through the
//! agent (another process) against the in-process engine, same file, same
//! run; and the agent child process the agent benchmarks start.

use clap::Args;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use zerohop::cache_drop::drop_from_page_cache;
use zerohop::plan::TransferPlan;
use zerohop::{Device, DeviceBuffer, DeviceKind, Engine, EngineConfig, Error, ErrorKind, Result};
use zerohop_client::{Client, Submission};
use zerohop_cmd::engine_args::open_device_or_host;
use zerohop_cmd::size::{human_bytes, parse_length};
use zerohop_wire::ring::OP_READ;

#[derive(Args, Debug)]
pub struct BenchAgentArgs {
    /// The file to read.
    pub file: PathBuf,
    /// Drop the file from the page cache before every timed read.
    #[arg(long)]
    pub cold: bool,
    /// Timed reads each way (through the agent, in-process).
    #[arg(long, default_value_t = 3)]
    pub repeat: usize,
    #[arg(long, default_value = "auto", help = zerohop::device::DEVICE_HELP)]
    pub device: String,
    /// Bytes per submitted read.
    #[arg(long, value_parser = parse_length, default_value = "64MiB")]
    pub chunk: u64,
    /// Allocate the GPU memory with cuMemCreate (VMM, shared with the agent
    /// by file descriptor) instead of cuMemAlloc (shared by IPC handle).
    #[arg(long)]
    pub vmm: bool,
}

/// A `zerohop agent` child process on a private socket, stopped with
/// SIGTERM (and killed if still running when dropped).
pub(crate) struct AgentProcess {
    child: Child,
    pub(super) socket: PathBuf,
}

/// The `zerohop` binary that serves as the agent: `ZEROHOP_BIN`, else the
/// one beside this program (cargo builds both into one directory).
fn zerohop_binary() -> Result<PathBuf> {
    if let Some(bin) = std::env::var_os("ZEROHOP_BIN") {
        return Ok(PathBuf::from(bin));
    }
    let me = std::env::current_exe()
        .map_err(|e| Error::io(Path::new("zerohop-lab"), "cannot find", e))?;
    let beside = me.with_file_name("zerohop");
    if !beside.is_file() {
        return Err(Error::invalid(format!(
            "no zerohop binary beside {} to run the agent: build it (cargo build -p zerohop-cli) \
             or name one in ZEROHOP_BIN",
            me.display()
        )));
    }
    Ok(beside)
}

impl AgentProcess {
    pub(super) fn start(device: &str) -> Result<Self> {
        let socket =
            std::env::temp_dir().join(format!("zerohop-bench-agent-{}.sock", std::process::id()));
        let exe = zerohop_binary()?;
        let child = Command::new(&exe)
            .args([
                "agent",
                "--log-level",
                "warn",
                "--device",
                device,
                "--socket",
            ])
            .arg(&socket)
            .stdin(Stdio::null())
            .spawn()
            .map_err(|e| Error::io(&exe, "cannot start an agent with", e))?;
        let mut agent = AgentProcess { child, socket };
        let deadline = Instant::now() + Duration::from_secs(60);
        while zerohop_wire::socket::connect(&agent.socket).is_err() {
            if Instant::now() > deadline || agent.child.try_wait().ok().flatten().is_some() {
                return Err(Error::new(ErrorKind::Io, "the agent did not start"));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(agent)
    }

    pub(super) fn stop(mut self) -> Result<()> {
        // Our own child, not yet waited for: its pid cannot have been reused.
        let pid = rustix::process::Pid::from_child(&self.child);
        rustix::process::kill_process(pid, rustix::process::Signal::TERM)
            .map_err(|e| Error::io(&self.socket, "cannot stop the agent of", e.into()))?;
        let status = self
            .child
            .wait()
            .map_err(|e| Error::io(&self.socket, "cannot wait for the agent of", e))?;
        if !status.success() {
            return Err(Error::new(
                ErrorKind::Io,
                format!("the agent exited with {status}"),
            ));
        }
        Ok(())
    }
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

pub(super) fn io_err(what: &str) -> impl Fn(std::io::Error) -> Error + '_ {
    move |e| Error::with_source(ErrorKind::Io, what.to_string(), e)
}

/// Where a benchmark's memory is: a GPU, or host memory (the agent's host
/// device route).
pub fn bench(a: &BenchAgentArgs) -> Result<()> {
    let device = open_device_or_host(&a.device)?;
    let size = std::fs::metadata(&a.file)
        .map_err(|e| Error::io(&a.file, "cannot stat", e))?
        .len();
    let agent = AgentProcess::start(&match device.kind() {
        DeviceKind::Cuda(n) => format!("cuda:{n}"),
        DeviceKind::Host => "host".into(),
    })?;
    let engine = Engine::new(device.clone(), EngineConfig::keeping_hot_choice())?;
    println!(
        "device   {}{}",
        device.describe(),
        if a.vmm {
            ", memory from cuMemCreate (VMM, shared by file descriptor)"
        } else {
            ""
        }
    );
    println!("file     {} ({})", a.file.display(), human_bytes(size));
    let client = Client::connect(&agent.socket).map_err(io_err("cannot connect to the agent"))?;
    // The registered buffer starts 1 MiB + 256 bytes into its allocation,
    // as a tensor from a caching allocator would.
    const OFFSET: u64 = (1 << 20) + 256;
    let mut vmm = None;
    let (alloc, buf_id, host_buf) = match device.kind() {
        DeviceKind::Cuda(n) => {
            let alloc = if a.vmm {
                let ctx = zerohop_cuda::Context::new(n)?;
                let v = vmm.insert(zerohop_cuda::VmmAllocation::new(
                    &ctx,
                    (size + OFFSET) as usize,
                )?);
                // SAFETY: `vmm` keeps the allocation mapped until this
                // function returns, after every use of the buffer.
                unsafe { DeviceBuffer::borrowed(v.ptr(), v.len(), device.kind()) }
            } else {
                device.alloc((size + OFFSET) as usize)?
            };
            let id = client
                .register_device_buffer(n as u32, alloc.addr() + OFFSET, size)
                .map_err(io_err("cannot register GPU memory with the agent"))?;
            (Some(alloc), id, None)
        }
        DeviceKind::Host => {
            let b = client
                .create_simulated_device_buffer(size as usize)
                .map_err(io_err("cannot make a buffer"))?;
            (None, b.id(), Some(b))
        }
    };
    let file = File::open(&a.file).map_err(|e| Error::io(&a.file, "cannot open", e))?;
    let file_id = client
        .register_file(&file)
        .map_err(io_err("cannot register the file"))?;
    let chunks = size.div_ceil(a.chunk.max(4096)) as usize;
    let entries = chunks.next_power_of_two().clamp(1, 4096) as u32;
    let mut ring = client
        .create_ring(entries)
        .map_err(io_err("cannot make a ring"))?;
    let local = match &alloc {
        Some(x) => x.clone(),
        None => device.alloc(size as usize)?,
    };
    let files = Engine::open_files(&[&a.file])?;
    let (mut best_local, mut best_agent) = (0f64, 0f64);
    for run in 1..=a.repeat {
        for via_agent in [true, false] {
            let cache = prepare_cache(&a.file, a.cold)?;
            let started = Instant::now();
            if via_agent {
                let mut at = 0u64;
                let mut user = 0u64;
                while at < size {
                    let len = a.chunk.max(4096).min(size - at);
                    if ring
                        .prepare(Submission::raw(OP_READ, file_id, at, buf_id, at, len, user))
                        .is_err()
                    {
                        ring.submit().map_err(io_err("submit"))?;
                        check_all(ring.wait(ring.in_flight(), None).map_err(io_err("wait"))?)?;
                        continue;
                    }
                    at += len;
                    user += 1;
                }
                ring.submit().map_err(io_err("submit"))?;
                check_all(ring.wait(ring.in_flight(), None).map_err(io_err("wait"))?)?;
            } else {
                let mut plan = TransferPlan::new();
                plan.add(
                    &files,
                    0,
                    0,
                    size,
                    &local,
                    if alloc.is_some() { OFFSET } else { 0 },
                )?;
                engine.transfer(&files, &plan, None)?;
            }
            let gbps = size as f64 / started.elapsed().as_secs_f64() / 1e9;
            let who = if via_agent {
                "agent     "
            } else {
                "in-process"
            };
            println!("run #{run}  {who} {gbps:6.2} GB/s ({cache})");
            if via_agent {
                best_agent = best_agent.max(gbps);
            } else {
                best_local = best_local.max(gbps);
            }
        }
    }
    let view = match (&alloc, &host_buf) {
        (Some(x), _) => Verify::Device(device.as_ref(), x, OFFSET),
        // SAFETY: every I/O on the buffer has completed.
        (None, Some(h)) => Verify::Host(unsafe { h.as_slice() }),
        _ => unreachable!("one of the two exists"),
    };
    let checked = verify_samples(&a.file, size, view)?;
    println!("verify   {checked} sample windows of the agent's last read match the file");
    println!(
        "result   agent {best_agent:.2} GB/s = {:.1}% of in-process {best_local:.2} GB/s ({}, best of {})",
        100.0 * best_agent / best_local,
        if a.cold { "cold" } else { "hot" },
        a.repeat
    );
    drop(ring);
    drop(client);
    drop(vmm);
    agent.stop()
}

fn prepare_cache(file: &Path, cold: bool) -> Result<String> {
    if cold {
        let (how, left) = drop_from_page_cache(file)
            .map_err(|e| Error::io(file, "cannot drop the cache of", e))?;
        return Ok(format!(
            "cache dropped with {how:?}, {:.0}% left",
            left * 100.0
        ));
    }
    zerohop_cmd::raw_io::warm(file)?;
    Ok("hot".into())
}

fn check_all(done: Vec<zerohop_client::Completion>) -> Result<()> {
    match done.iter().find(|c| c.result < 0) {
        Some(c) => Err(Error::new(
            ErrorKind::Io,
            format!("an agent read failed: errno {}", -c.result),
        )),
        None => Ok(()),
    }
}

enum Verify<'a> {
    Device(&'a dyn Device, &'a DeviceBuffer, u64),
    Host(&'a [u8]),
}

/// Compares 4 MiB windows at the start, middle and end with the file.
fn verify_samples(path: &Path, size: u64, view: Verify<'_>) -> Result<usize> {
    use std::os::unix::fs::FileExt;
    let f = File::open(path).map_err(|e| Error::io(path, "cannot open", e))?;
    let win = (4u64 << 20).min(size);
    let starts = [0, size / 2 - win / 2, size - win];
    for &at in &starts {
        let mut want = vec![0u8; win as usize];
        f.read_exact_at(&mut want, at)
            .map_err(|e| Error::io(path, "cannot read", e))?;
        let got = match &view {
            Verify::Device(d, buf, offset) => {
                let mut got = vec![0u8; win as usize];
                d.read_back(buf, (offset + at) as usize, &mut got)?;
                got
            }
            Verify::Host(h) => h[at as usize..(at + win) as usize].to_vec(),
        };
        if got != want {
            return Err(Error::new(
                ErrorKind::Integrity,
                format!("bytes at {at} differ from the file"),
            ));
        }
    }
    Ok(starts.len())
}

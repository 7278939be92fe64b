//! `zerohop bench agent`: a file read into this process's memory through the
//! agent (another process) against the in-process engine, same file, same
//! run. `bench agent-stress`: many client processes doing mixed reads and
//! writes through one agent, every I/O checked.

use crate::common::open_device_or_host;
use crate::size::{human_bytes, parse_size};
use clap::Args;
use serde::{Deserialize, Serialize};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};
use zerohop::cache_drop::drop_from_page_cache;
use zerohop::plan::TransferPlan;
use zerohop::{
    Device, DeviceBuffer, DeviceKind, DeviceName, Engine, EngineConfig, Error, ErrorKind, Result,
};
use zerohop_client::{Client, Submission};
use zerohop_wire::ring::{OP_READ, OP_WRITE};

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
    #[arg(long, value_parser = parse_size, default_value = "64MiB")]
    pub chunk: u64,
    /// Allocate the GPU memory with cuMemCreate (VMM, shared with the agent
    /// by file descriptor) instead of cuMemAlloc (shared by IPC handle).
    #[arg(long)]
    pub vmm: bool,
}

#[derive(Args, Debug)]
pub struct BenchAgentStressArgs {
    /// Client processes.
    #[arg(long, default_value_t = 32)]
    pub clients: usize,
    /// I/Os per client.
    #[arg(long, default_value_t = 10_000)]
    pub ios: usize,
    /// Directory for the clients' files (one each).
    #[arg(long)]
    pub dir: PathBuf,
    // Where the clients' buffers live.
    #[arg(long, default_value = "auto", help = zerohop::device::DEVICE_HELP)]
    pub device: String,
}

#[derive(Args, Debug)]
pub struct AgentClientArgs {
    /// The agent's socket.
    #[arg(long)]
    socket: PathBuf,
    /// This client's file (made anew).
    #[arg(long)]
    file: PathBuf,
    /// I/Os to submit.
    #[arg(long)]
    ios: usize,
    /// Seed of the random I/Os and data.
    #[arg(long)]
    seed: u64,
    /// Where the buffer lives: host, sim or cuda:N.
    #[arg(long)]
    memory: String,
}

/// A `zerohop agent` child process on a private socket, stopped with
/// SIGTERM (and killed if still running when dropped).
struct AgentProcess {
    child: Child,
    socket: PathBuf,
}

impl AgentProcess {
    fn start(device: &str) -> Result<Self> {
        let socket =
            std::env::temp_dir().join(format!("zerohop-bench-agent-{}.sock", std::process::id()));
        let exe = std::env::current_exe()
            .map_err(|e| Error::io(Path::new("zerohop"), "cannot find", e))?;
        let child = Command::new(exe)
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
            .map_err(|e| Error::io(&socket, "cannot start an agent for", e))?;
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

    fn stop(mut self) -> Result<()> {
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

fn io_err(what: &str) -> impl Fn(std::io::Error) -> Error + '_ {
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
    let engine = Engine::new(
        device.clone(),
        EngineConfig {
            hot_choice_file: zerohop::hot_choice::default_file(),
            ..EngineConfig::default()
        },
    )?;
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
    super::raw_io::warm(file)?;
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

/// What one stress client reports (JSON on stdout).
#[derive(Serialize, Deserialize, Debug, Default)]
struct ClientReport {
    ios: usize,
    completions: usize,
    reads: usize,
    writes: usize,
    mismatches: usize,
    errors: usize,
    unknown_or_repeated: usize,
    seconds: f64,
}

pub fn stress(a: &BenchAgentStressArgs) -> Result<()> {
    let memory = match a.device.parse::<DeviceName>()? {
        DeviceName::Auto => match zerohop::device::CudaDevice::open(0) {
            Ok(_) => "cuda:0".to_string(),
            Err(_) => "sim".to_string(),
        },
        name => name.to_string(),
    };
    let agent_device = if memory.starts_with("cuda:") {
        memory.clone()
    } else {
        "host".into()
    };
    std::fs::create_dir_all(&a.dir).map_err(|e| Error::io(&a.dir, "cannot create", e))?;
    let agent = AgentProcess::start(&agent_device)?;
    let exe =
        std::env::current_exe().map_err(|e| Error::io(Path::new("zerohop"), "cannot find", e))?;
    println!(
        "stress   {} client processes x {} mixed I/Os, buffers in {memory}",
        a.clients, a.ios
    );
    let started = Instant::now();
    let mut children = Vec::new();
    for i in 0..a.clients {
        let path = a.dir.join(format!("client-{i}.bin"));
        let child = Command::new(&exe)
            .args([
                "bench",
                "agent-client",
                "--ios",
                &a.ios.to_string(),
                "--seed",
                &i.to_string(),
                "--memory",
                &memory,
                "--socket",
            ])
            .arg(&agent.socket)
            .arg("--file")
            .arg(&path)
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| Error::io(&path, "cannot start a client for", e))?;
        children.push((path, child));
    }
    let mut total = ClientReport::default();
    let mut failed = 0;
    for (path, child) in children {
        let out = child
            .wait_with_output()
            .map_err(|e| Error::io(&path, "cannot wait for the client of", e))?;
        let report: Option<ClientReport> = serde_json::from_slice(&out.stdout).ok();
        match report {
            Some(r) if out.status.success() => {
                total.ios += r.ios;
                total.completions += r.completions;
                total.reads += r.reads;
                total.writes += r.writes;
                total.mismatches += r.mismatches;
                total.errors += r.errors;
                total.unknown_or_repeated += r.unknown_or_repeated;
            }
            _ => failed += 1,
        }
        let _ = std::fs::remove_file(&path);
    }
    let seconds = started.elapsed().as_secs_f64();
    let status =
        zerohop_agent::query_status(&agent.socket).map_err(io_err("cannot ask the agent"))?;
    println!(
        "result   {} I/Os submitted, {} completed ({} reads, {} writes) in {seconds:.2} s ({:.0} I/Os/s)",
        total.ios, total.completions, total.reads, total.writes, total.completions as f64 / seconds
    );
    println!(
        "check    wrong data {}, errors {}, unknown or repeated completions {}, failed clients {failed}",
        total.mismatches, total.errors, total.unknown_or_repeated
    );
    println!(
        "agent    {} I/Os served, {} errors, {} clients still connected",
        status.ios,
        status.errors,
        status.clients.len()
    );
    agent.stop()?;
    let exact = total.completions == total.ios && total.ios == a.clients * a.ios;
    if failed > 0
        || total.mismatches > 0
        || total.errors > 0
        || total.unknown_or_repeated > 0
        || !exact
    {
        return Err(Error::new(
            ErrorKind::Integrity,
            "the stress run found problems (above)",
        ));
    }
    println!("ok       every I/O completed exactly once with the right data");
    Ok(())
}

const STRIPE: u64 = 256 << 10;
const STRIPES: usize = 64;

/// The client's buffer: shared host memory, or GPU memory of this process.
enum ClientBuffer {
    Shared(zerohop_client::HostBuffer),
    Device(Arc<dyn Device>, DeviceBuffer, u32),
}

impl ClientBuffer {
    fn id(&self) -> u32 {
        match self {
            ClientBuffer::Shared(b) => b.id(),
            ClientBuffer::Device(_, _, id) => *id,
        }
    }

    fn put(&mut self, at: u64, bytes: &[u8]) -> Result<()> {
        match self {
            ClientBuffer::Shared(b) => {
                // SAFETY: called between batches: no I/O on the buffer in flight.
                let all = unsafe { b.as_mut_slice() };
                all[at as usize..at as usize + bytes.len()].copy_from_slice(bytes);
                Ok(())
            }
            ClientBuffer::Device(d, buf, _) => d.write_from_host(buf, at as usize, bytes),
        }
    }

    fn get(&self, at: u64, len: u64) -> Result<Vec<u8>> {
        match self {
            // SAFETY: called between batches: no I/O on the buffer in flight.
            ClientBuffer::Shared(b) => {
                Ok(unsafe { b.as_slice() }[at as usize..(at + len) as usize].to_vec())
            }
            ClientBuffer::Device(d, buf, _) => {
                let mut out = vec![0u8; len as usize];
                d.read_back(buf, at as usize, &mut out)?;
                Ok(out)
            }
        }
    }
}

/// One stress client: batches of reads and writes on disjoint stripes of
/// its own file, each checked against a model of the file's contents.
pub fn client(a: &AgentClientArgs) -> Result<()> {
    let started = Instant::now();
    let file_bytes = STRIPE * STRIPES as u64;
    let mut rng = a.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut model: Vec<u8> = (0..file_bytes).map(|_| next() as u8).collect();
    std::fs::write(&a.file, &model).map_err(|e| Error::io(&a.file, "cannot write", e))?;
    let file = File::options()
        .read(true)
        .write(true)
        .open(&a.file)
        .map_err(|e| Error::io(&a.file, "cannot open", e))?;
    let client = Client::connect(&a.socket).map_err(io_err("cannot connect to the agent"))?;
    let file_id = client
        .register_file(&file)
        .map_err(io_err("cannot register the file"))?;
    let mut buf = match a.memory.as_str() {
        "host" => ClientBuffer::Shared(
            client
                .create_host_buffer(file_bytes as usize)
                .map_err(io_err("buffer"))?,
        ),
        "sim" => ClientBuffer::Shared(
            client
                .create_simulated_device_buffer(file_bytes as usize)
                .map_err(io_err("buffer"))?,
        ),
        spec => {
            let d = zerohop::open_device(spec)?;
            let b = d.alloc(file_bytes as usize)?;
            let DeviceKind::Cuda(n) = d.kind() else {
                return Err(Error::invalid(format!("unknown memory {spec:?}")));
            };
            let id = client
                .register_device_buffer(n as u32, b.addr(), file_bytes)
                .map_err(io_err("register GPU memory"))?;
            ClientBuffer::Device(d, b, id)
        }
    };
    let mut ring = client
        .create_ring(STRIPES as u32)
        .map_err(io_err("cannot make a ring"))?;
    let mut report = ClientReport {
        ios: a.ios,
        ..Default::default()
    };
    let mut user = 0u64;
    while user < a.ios as u64 {
        let batch = (a.ios as u64 - user).min(STRIPES as u64);
        // (user data, op, file offset, buffer offset, bytes written)
        let mut planned = Vec::with_capacity(batch as usize);
        for j in 0..batch {
            let op = if next() % 2 == 0 { OP_READ } else { OP_WRITE };
            let start = next() % STRIPE;
            let len = 1 + next() % (STRIPE - start);
            let at = j * STRIPE + start;
            let data: Vec<u8> = if op == OP_WRITE {
                (0..len).map(|_| next() as u8).collect()
            } else {
                Vec::new()
            };
            if op == OP_WRITE {
                buf.put(at, &data)?;
            }
            ring.prepare(Submission::raw(op, file_id, at, buf.id(), at, len, user))
                .map_err(io_err("prepare"))?;
            planned.push((user, op, at, len, data));
            user += 1;
        }
        ring.submit().map_err(io_err("submit"))?;
        let done = ring
            .wait(batch as usize, Some(Duration::from_secs(120)))
            .map_err(io_err("wait"))?;
        let mut seen = std::collections::HashSet::new();
        for c in &done {
            let known = planned.iter().any(|p| p.0 == c.user_data);
            if !known || !seen.insert(c.user_data) {
                report.unknown_or_repeated += 1;
            }
        }
        report.completions += done.len();
        for (u, op, at, len, data) in planned {
            let result = done.iter().find(|c| c.user_data == u).map(|c| c.result);
            if result != Some(len as i64) {
                report.errors += 1;
                continue;
            }
            let range = at as usize..(at + len) as usize;
            if op == OP_WRITE {
                model[range].copy_from_slice(&data);
                report.writes += 1;
            } else {
                report.reads += 1;
                if buf.get(at, len)? != model[range] {
                    report.mismatches += 1;
                }
            }
        }
    }
    // The file itself must hold what the writes put there.
    let on_disk = std::fs::read(&a.file).map_err(|e| Error::io(&a.file, "cannot read", e))?;
    if on_disk != model {
        report.mismatches += 1;
    }
    report.seconds = started.elapsed().as_secs_f64();
    println!(
        "{}",
        serde_json::to_string(&report).expect("report serializes")
    );
    Ok(())
}

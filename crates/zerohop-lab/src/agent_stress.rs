//! `zerohop bench agent-stress`: many client processes doing mixed reads
//! and writes through one agent, every I/O checked; and one such client
//! (`bench agent-client`, hidden, run by it).

use crate::agent::{io_err, AgentProcess};
use clap::Args;
use serde::{Deserialize, Serialize};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};
use zerohop::{Device, DeviceBuffer, DeviceName, Error, ErrorKind, Result};
use zerohop_client::{Client, Submission};
use zerohop_wire::ring::{OP_READ, OP_WRITE};

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
    /// Where the buffer lives (auto: the first GPU, else host memory).
    #[arg(long, help = zerohop::device::DEVICE_HELP)]
    memory: DeviceName,
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
    let memory = a.device.parse::<DeviceName>()?.resolve()?;
    if memory == DeviceName::Sim {
        // Only builds with zerohop's `testing` feature have it: refuse once,
        // clearly, rather than from every client.
        memory.open()?;
    }
    // The agent serves the clients' GPU, or host memory only (simulated
    // device buffers included: the agent moves them through its host engine).
    let agent_device = match memory {
        DeviceName::Cuda(n) => format!("cuda:{n}"),
        _ => "host".into(),
    };
    std::fs::create_dir_all(&a.dir).map_err(|e| Error::io(&a.dir, "cannot create", e))?;
    let agent = AgentProcess::start(&agent_device)?;
    let exe = std::env::current_exe()
        .map_err(|e| Error::io(Path::new("zerohop-lab"), "cannot find", e))?;
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
                "agent-client",
                "--ios",
                &a.ios.to_string(),
                "--seed",
                &i.to_string(),
                "--memory",
                &memory.to_string(),
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
    let mut buf = match a.memory.resolve()? {
        DeviceName::Cuda(n) => {
            let d: Arc<dyn Device> = Arc::new(zerohop::device::open_gpu(n)?);
            let b = d.alloc(file_bytes as usize)?;
            let id = client
                .register_device_buffer(n as u32, b.addr(), file_bytes)
                .map_err(io_err("register GPU memory"))?;
            ClientBuffer::Device(d, b, id)
        }
        DeviceName::Sim => ClientBuffer::Shared(
            client
                .create_simulated_device_buffer(file_bytes as usize)
                .map_err(io_err("buffer"))?,
        ),
        // `resolve` leaves no `Auto`.
        DeviceName::Host | DeviceName::Auto => ClientBuffer::Shared(
            client
                .create_host_buffer(file_bytes as usize)
                .map_err(io_err("buffer"))?,
        ),
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

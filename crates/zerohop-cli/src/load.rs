//! `zerohop load`, `gen` and `demo`.

use crate::common::{gib, EngineArgs};
use clap::Args;
use serde::Serialize;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use zerohop::progress_line::ProgressLine;
use zerohop::safetensors::{self, Allocation};
use zerohop::{DeviceBuffer, Engine, Error, Result, TransferStats};

#[derive(Args, Debug)]
pub struct LoadArgs {
    /// Files to load: safetensors shards (by the .safetensors extension) or raw files.
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
    #[command(flatten)]
    pub engine: EngineArgs,
    /// Treat every file as raw bytes, even .safetensors ones.
    #[arg(long)]
    pub raw: bool,
    /// One device allocation per tensor instead of one per file.
    #[arg(long)]
    pub per_tensor: bool,
    /// Compare the device contents against the files afterwards.
    #[arg(long)]
    pub verify: bool,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

/// What `load --json` prints.
#[derive(Serialize)]
struct LoadReport<'a> {
    #[serde(flatten)]
    stats: &'a TransferStats,
    tensors: Option<usize>,
    verified: Option<bool>,
}

/// Destination ranges and where their bytes come from, for `--verify`.
pub(crate) struct Placed {
    pub path: PathBuf,
    pub file_offset: u64,
    pub buffer: DeviceBuffer,
}

/// Loads files as asked; returns the stats and what went where.
fn load(engine: &Engine, args: &LoadArgs) -> Result<(TransferStats, Option<usize>, Vec<Placed>)> {
    let total: u64 = args
        .files
        .iter()
        .map(|p| {
            std::fs::metadata(p)
                .map(|m| m.len())
                .map_err(|e| Error::io(p, "cannot stat", e))
        })
        .sum::<Result<u64>>()?;
    let bar = ProgressLine::new("loading", total);
    let progress = |n| bar.advance(n);
    let is_safetensors = !args.raw
        && args
            .files
            .iter()
            .all(|p| p.extension().is_some_and(|e| e == "safetensors"));
    let result = if is_safetensors {
        let alloc = if args.per_tensor {
            Allocation::PerTensor
        } else {
            Allocation::PerFile
        };
        safetensors::load_safetensors(engine, &args.files, alloc, Some(&progress)).map(|m| {
            let placed = m
                .tensors
                .iter()
                .map(|t| Placed {
                    path: args.files[t.file].clone(),
                    file_offset: t.file_offset,
                    buffer: t.buffer.clone(),
                })
                .collect();
            (m.stats, Some(m.tensors.len()), placed)
        })
    } else {
        engine
            .load_files(&args.files, Some(&progress))
            .map(|(bufs, stats)| {
                let placed = bufs
                    .into_iter()
                    .zip(&args.files)
                    .map(|(buffer, p)| Placed {
                        path: p.clone(),
                        file_offset: 0,
                        buffer,
                    })
                    .collect();
                (stats, None, placed)
            })
    };
    bar.finish();
    result
}

pub fn run(args: &LoadArgs) -> Result<()> {
    let engine = args.engine.engine()?;
    let (stats, tensors, placed) = load(&engine, args)?;
    let verified = if args.verify {
        Some(verify(&engine, &placed)?)
    } else {
        None
    };
    if args.json {
        let report = LoadReport {
            stats: &stats,
            tensors,
            verified,
        };
        println!(
            "{}",
            serde_json::to_string(&report).expect("stats serialize")
        );
    } else {
        print_stats(&stats, tensors);
        if let Some(ok) = verified {
            println!(
                "verify:  {}",
                if ok {
                    "device contents match the files"
                } else {
                    "MISMATCH"
                }
            );
        }
    }
    match verified {
        Some(false) => Err(Error::new(
            zerohop::ErrorKind::Io,
            "verification failed: device contents differ from the files",
        )),
        _ => Ok(()),
    }
}

pub fn print_stats(s: &TransferStats, tensors: Option<usize>) {
    let what = match tensors {
        Some(n) => format!("{n} tensors from {} file(s)", s.files),
        None => format!("{} file(s)", s.files),
    };
    println!("loaded   {} ({what}) into {}", gib(s.bytes), s.device);
    println!("time     {:.3} s, {:.2} GB/s", s.seconds, s.gbps);
    println!("path     {}", s.path);
    println!(
        "host     {} staging, {} I/O threads, {} windows; CPU {:.2} s ({:.3} s/GB)",
        gib(s.staging_bytes),
        s.io_threads,
        s.windows,
        s.cpu_seconds,
        s.cpu_seconds_per_gb
    );
    for n in &s.notes {
        println!("note     {n}");
    }
}

/// Reads every placed range back from the device and compares it with the
/// file, 64 MiB at a time. Prints the first difference.
pub(crate) fn verify(engine: &Engine, placed: &[Placed]) -> Result<bool> {
    const CHUNK: usize = 64 << 20;
    let total = placed.iter().map(|p| p.buffer.len() as u64).sum();
    let bar = ProgressLine::new("verifying", total);
    let mut dev = vec![0u8; CHUNK];
    let mut host = vec![0u8; CHUNK];
    let mut open: Option<(PathBuf, std::fs::File)> = None;
    for p in placed {
        if open.as_ref().is_none_or(|(path, _)| *path != p.path) {
            let f =
                std::fs::File::open(&p.path).map_err(|e| Error::io(&p.path, "cannot open", e))?;
            open = Some((p.path.clone(), f));
        }
        let file = &open.as_ref().expect("opened above").1;
        let mut off = 0;
        while off < p.buffer.len() {
            let n = CHUNK.min(p.buffer.len() - off);
            engine.device().read_back(&p.buffer, off, &mut dev[..n])?;
            let at = p.file_offset + off as u64;
            file.read_exact_at(&mut host[..n], at)
                .map_err(|e| Error::io(&p.path, "cannot read", e))?;
            if let Some(i) = (0..n).find(|&i| dev[i] != host[i]) {
                bar.finish();
                eprintln!(
                    "first difference: {} byte {} (device {:#04x}, file {:#04x})",
                    p.path.display(),
                    at + i as u64,
                    dev[i],
                    host[i]
                );
                return Ok(false);
            }
            off += n;
            bar.advance(n as u64);
        }
    }
    bar.finish();
    Ok(true)
}

pub fn gen(out: &Path, size: u64, seed: u64) -> Result<()> {
    let bar = ProgressLine::new("writing", size);
    let progress = |n| bar.advance(n);
    let written = safetensors::write_synthetic(out, size, seed, Some(&progress))?;
    bar.finish();
    let tensors = safetensors::transformer_shapes(size).len();
    println!(
        "wrote {} ({tensors} bf16 tensors) to {}",
        gib(written),
        out.display()
    );
    Ok(())
}

pub fn demo(size: u64, dir: Option<PathBuf>) -> Result<()> {
    let dir = dir.unwrap_or_else(|| std::env::temp_dir().join("zerohop-demo"));
    std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, "cannot create", e))?;
    let path = dir.join("demo.safetensors");
    println!("== generating a {} transformer-shaped model", gib(size));
    gen(&path, size, 1)?;
    println!("== loading it with verification");
    let args = LoadArgs {
        files: vec![path.clone()],
        engine: crate::common::EngineArgs {
            device: "auto".into(),
            threads: None,
            staging: None,
            slot: None,
            backend: crate::common::BackendArg::Auto,
            direct: crate::common::DirectArg::Auto,
            hot_route: crate::common::HotArg::Auto,
            dma_window: None,
        },
        raw: false,
        per_tensor: false,
        verify: true,
        json: false,
    };
    run(&args)?;
    println!("== saving it as a checkpoint, then restoring that and comparing with the model");
    let ck = dir.join("demo-checkpoint");
    if ck.exists() {
        zerohop_checkpoint::remove(&ck)?;
    }
    use crate::checkpoint::{run as checkpoint, CheckpointCommand};
    checkpoint(CheckpointCommand::Save {
        from: vec![path.clone()],
        dir: ck.clone(),
        parent: None,
        shards: None,
        engine: args.engine.clone(),
        json: false,
    })?;
    checkpoint(CheckpointCommand::Restore {
        dir: ck,
        against: vec![path],
        engine: args.engine,
        json: false,
    })
}

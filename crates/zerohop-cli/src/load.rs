//! `zerohop load`: files into device memory, optionally compared afterwards.

use crate::verify::{compare_with_files, Placed};
use clap::Args;
use serde::Serialize;
use std::path::PathBuf;
use zerohop::safetensors::{self, Allocation};
use zerohop::storage::SourceFile;
use zerohop::{Engine, Error, Result, TransferStats};
use zerohop_cmd::engine_args::EngineArgs;
use zerohop_cmd::progress::bytes_bar;
use zerohop_cmd::size::human_bytes;

#[derive(Args, Debug)]
pub struct LoadArgs {
    /// Files to load: safetensors shards (by the .safetensors extension) or raw files,
    /// local or in an object store: s3://bucket/key, or s3://bucket/prefix/ or
    /// s3://bucket/dir/*.safetensors for every shard there (AWS_* settings: see README).
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

/// Loads files as asked; returns the stats and what went where.
fn load(
    engine: &Engine,
    args: &LoadArgs,
    (names, sources): (Vec<PathBuf>, Vec<SourceFile>),
) -> Result<(TransferStats, Option<usize>, Vec<Placed>)> {
    let total: u64 = sources.iter().map(|s| s.len()).sum();
    let bar = bytes_bar("loading", total, args.json);
    let progress = |n| bar.inc(n);
    let is_safetensors = !args.raw
        && names
            .iter()
            .all(|p| p.extension().is_some_and(|e| e == "safetensors"));
    let result = if is_safetensors {
        let alloc = if args.per_tensor {
            Allocation::PerTensor
        } else {
            Allocation::PerFile
        };
        safetensors::load_safetensors_sources(engine, &sources, alloc, Some(&progress)).map(|m| {
            let placed = m
                .tensors
                .iter()
                .map(|t| Placed {
                    path: names[t.file].clone(),
                    file_offset: t.file_offset,
                    buffer: t.buffer.clone(),
                })
                .collect();
            (m.stats, Some(m.tensors.len()), placed)
        })
    } else {
        engine
            .load_sources(&sources, Some(&progress))
            .map(|(bufs, stats)| {
                let placed = bufs
                    .into_iter()
                    .zip(&names)
                    .map(|(buffer, p)| Placed {
                        path: p.clone(),
                        file_offset: 0,
                        buffer,
                    })
                    .collect();
                (stats, None, placed)
            })
    };
    bar.finish_and_clear();
    result
}

/// The names to load: object store prefixes and patterns expanded to
/// every object they name (safetensors shards), other names as given.
fn expand_names(files: &[PathBuf]) -> Result<Vec<PathBuf>> {
    let remote = |p: &PathBuf| p.to_str().is_some_and(zerohop::location::is_object);
    if !files.iter().any(remote) {
        return Ok(files.to_vec());
    }
    let names: Vec<String> = files
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    Ok(zerohop_names::expand(&names, ".safetensors")?
        .into_iter()
        .map(PathBuf::from)
        .collect())
}

pub fn run(args: &LoadArgs) -> Result<()> {
    // The inputs first: a missing file is an error before the device is
    // opened (and says so) rather than after.
    let inputs = open_inputs(&args.files)?;
    report(&args.engine.engine()?, args, inputs)
}

/// `run` with an engine already made (the demo's; `args.engine` unused).
pub fn run_on(engine: &Engine, args: &LoadArgs) -> Result<()> {
    report(engine, args, open_inputs(&args.files)?)
}

/// The names to load (see `expand_names`) and their sources, opened.
fn open_inputs(files: &[PathBuf]) -> Result<(Vec<PathBuf>, Vec<SourceFile>)> {
    let names = expand_names(files)?;
    let sources = zerohop_names::open_sources(&names)?;
    Ok((names, sources))
}

fn report(engine: &Engine, args: &LoadArgs, inputs: (Vec<PathBuf>, Vec<SourceFile>)) -> Result<()> {
    let (stats, tensors, placed) = load(engine, args, inputs)?;
    let verified = if args.verify {
        Some(compare_with_files(engine, &placed, args.json)?)
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

fn print_stats(s: &TransferStats, tensors: Option<usize>) {
    let what = match tensors {
        Some(n) => format!("{n} tensors from {} file(s)", s.files),
        None => format!("{} file(s)", s.files),
    };
    println!(
        "loaded   {} ({what}) into {}",
        human_bytes(s.bytes),
        s.device
    );
    println!("time     {:.3} s, {:.2} GB/s", s.seconds, s.gbps);
    println!("path     {}", s.path);
    println!(
        "host     {} staging{}, {} I/O threads, {} windows; CPU {:.2} s ({:.3} s/GB)",
        human_bytes(s.staging_bytes),
        if s.pinned_staging {
            " (pinned)"
        } else {
            " (not pinned)"
        },
        s.io_threads,
        s.windows,
        s.cpu_seconds,
        s.cpu_seconds_per_gb
    );
    for n in &s.notes {
        println!("note     {n}");
    }
}

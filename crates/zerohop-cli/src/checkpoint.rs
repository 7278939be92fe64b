//! `zerohop checkpoint save|restore|verify|ls|rm`.

use crate::common::EngineArgs;
use crate::progress::bytes_bar;
use crate::size::human_bytes;
use crate::verify::{compare_with_files, Placed};
use clap::Subcommand;
use serde::Serialize;
use std::path::{Path, PathBuf};
use zerohop::safetensors::{self, Allocation};
use zerohop::storage::SourceFile;
use zerohop::{Engine, Error, ErrorKind, Result, TransferStats};
use zerohop_checkpoint::{self as ckpt, Manifest, Region, SaveOptions};

#[derive(Subcommand, Debug)]
pub enum CheckpointCommand {
    /// Load safetensors files into device memory and save their tensors as
    /// a checkpoint at DIR (a new directory).
    Save {
        /// A safetensors file whose tensors to checkpoint; repeat for several.
        #[arg(long = "from", required = true)]
        from: Vec<PathBuf>,
        /// The new checkpoint's directory (must not exist yet).
        dir: PathBuf,
        /// Save incrementally against this sibling checkpoint: unchanged
        /// chunks are referenced, not rewritten (default: none, a full save).
        #[arg(long)]
        parent: Option<PathBuf>,
        /// Data files to spread the tensors over (default: one per I/O thread).
        #[arg(long)]
        shards: Option<usize>,
        #[command(flatten)]
        engine: EngineArgs,
        /// Print one JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Restore a checkpoint into fresh device memory, checking every chunk.
    Restore {
        /// The checkpoint's directory.
        dir: PathBuf,
        /// Also compare the restored tensors with this safetensors file (by
        /// tensor name); repeat for several (default: none).
        #[arg(long)]
        against: Vec<PathBuf>,
        #[command(flatten)]
        engine: EngineArgs,
        /// Print one JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Check every chunk's checksum and every data file (no GPU needed).
    Verify {
        /// The checkpoint's directory.
        dir: PathBuf,
        /// Reader threads.
        #[arg(long, default_value_t = 8)]
        threads: usize,
        /// Print one JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
    /// List a checkpoint's entries and sizes.
    Ls {
        /// The checkpoint's directory.
        dir: PathBuf,
        /// Print the manifest as JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Delete a checkpoint, refused while another one still needs its chunks.
    Rm {
        /// The checkpoint's directory.
        dir: PathBuf,
    },
}

#[derive(Serialize)]
struct SaveReport<'a> {
    dir: String,
    entries: usize,
    bytes: u64,
    written_bytes: u64,
    seconds_to_durable: f64,
    gbps: f64,
    checksums: String,
    transfer: &'a TransferStats,
}

pub fn run(cmd: CheckpointCommand) -> Result<()> {
    match cmd {
        CheckpointCommand::Save {
            from,
            dir,
            parent,
            shards,
            engine,
            json,
        } => save(&engine.engine()?, &from, &dir, parent, shards, json),
        CheckpointCommand::Restore {
            dir,
            against,
            engine,
            json,
        } => restore(&engine.engine()?, &dir, &against, json),
        CheckpointCommand::Verify { dir, threads, json } => {
            let total = Manifest::read(&dir)?.bytes();
            let bar = bytes_bar("verifying", total, json);
            let progress = |n| bar.inc(n);
            let v = ckpt::verify(&dir, threads, Some(&progress))?;
            bar.finish_and_clear();
            if json {
                println!(
                    "{}",
                    serde_json::json!({"dir": dir, "ok": true, "chunks": v.chunks, "bytes": v.bytes, "referenced_chunks": v.referenced_chunks})
                );
            } else {
                println!(
                    "ok: {} chunks ({}) match their checksums{}",
                    v.chunks,
                    human_bytes(v.bytes),
                    if v.referenced_chunks > 0 {
                        format!(
                            ", {} of them stored in parent checkpoints",
                            v.referenced_chunks
                        )
                    } else {
                        String::new()
                    }
                );
            }
            Ok(())
        }
        CheckpointCommand::Ls { dir, json } => ls(&dir, json),
        CheckpointCommand::Rm { dir } => {
            ckpt::remove(&dir)?;
            println!("removed {}", dir.display());
            Ok(())
        }
    }
}

/// Loads the tensors of the safetensors files `from` and saves them as a
/// checkpoint at `dir`.
pub fn save(
    engine: &Engine,
    from: &[PathBuf],
    dir: &Path,
    parent: Option<PathBuf>,
    shards: Option<usize>,
    json: bool,
) -> Result<()> {
    let model = safetensors::load_safetensors(engine, from, Allocation::PerTensor, None)?;
    let regions: Vec<Region> = model
        .tensors
        .iter()
        .map(|t| Region::tensor(t.name.clone(), t.dtype, t.shape.clone(), t.buffer.clone()))
        .collect();
    let bytes: u64 = regions.iter().map(|r| r.data.len() as u64).sum();
    let bar = bytes_bar("saving", bytes, json);
    let progress = |n| bar.inc(n);
    let opts = SaveOptions {
        parent,
        shards,
        ..SaveOptions::default()
    };
    let saved = ckpt::save(engine, &regions, dir, &opts, Some(&progress))?;
    bar.finish_and_clear();
    let gbps = bytes as f64 / saved.seconds / 1e9;
    if json {
        let report = SaveReport {
            dir: dir.display().to_string(),
            entries: regions.len(),
            bytes,
            written_bytes: saved.written_bytes,
            seconds_to_durable: saved.seconds,
            gbps,
            checksums: saved.checksums.to_string(),
            transfer: &saved.stats,
        };
        println!(
            "{}",
            serde_json::to_string_pretty(&report).expect("report serializes")
        );
    } else {
        println!(
            "saved    {} entries ({}) to {} in {} data files",
            regions.len(),
            human_bytes(bytes),
            dir.display(),
            saved.manifest.files.len()
        );
        println!(
            "time     {:.3} s to durable (data, manifest and directory synced), {gbps:.2} GB/s",
            saved.seconds
        );
        let skipped = saved.stats.skipped_bytes;
        println!(
            "wrote    {}{}",
            human_bytes(saved.written_bytes),
            if skipped > 0 {
                format!(
                    " ({} unchanged, referenced from the parent)",
                    human_bytes(skipped)
                )
            } else {
                String::new()
            }
        );
        println!("checksum {}", saved.checksums);
        println!("path     {}", saved.stats.path);
    }
    Ok(())
}

/// Restores the checkpoint at `dir`, and compares it with the safetensors
/// files `against` if any.
pub fn restore(engine: &Engine, dir: &Path, against: &[PathBuf], json: bool) -> Result<()> {
    let manifest = Manifest::read(dir)?;
    let bar = bytes_bar("restoring", manifest.bytes(), json);
    let progress = |n| bar.inc(n);
    let r = ckpt::restore(engine, dir, Some(&progress))?;
    bar.finish_and_clear();
    let mut matches = None;
    if !against.is_empty() {
        let mut placed = Vec::new();
        let mut headers = Vec::new();
        for p in against {
            headers.push((p, safetensors::read_header(&SourceFile::open(p)?)?));
        }
        for (e, b) in r.manifest.entries.iter().zip(&r.buffers) {
            let found = headers.iter().find_map(|(p, h)| {
                h.tensors
                    .iter()
                    .find(|t| t.name == e.name)
                    .map(|t| (p, h.data_start + t.begin, t.len()))
            });
            match found {
                Some((p, off, len)) if len == e.bytes => placed.push(Placed {
                    path: p.to_path_buf(),
                    file_offset: off,
                    buffer: b.clone(),
                }),
                _ => {
                    return Err(Error::invalid(format!(
                        "entry {:?} is not in the --against files with the same size",
                        e.name
                    )))
                }
            }
        }
        matches = Some(compare_with_files(engine, &placed, json)?);
    }
    let s = &r.stats;
    if json {
        println!(
            "{}",
            serde_json::json!({"dir": dir, "entries": r.buffers.len(), "matches": matches, "transfer": s})
        );
    } else {
        println!(
            "restored {} entries ({}) into {}, every chunk verified",
            r.buffers.len(),
            human_bytes(s.bytes),
            s.device
        );
        println!("time     {:.3} s, {:.2} GB/s", s.seconds, s.gbps);
        println!("path     {}", s.path);
        if let Some(m) = matches {
            println!(
                "compare: {}",
                if m {
                    "contents match the files"
                } else {
                    "CONTENTS DIFFER"
                }
            );
        }
    }
    match matches {
        Some(false) => Err(Error::new(
            ErrorKind::Integrity,
            "restored contents differ from the --against files",
        )),
        _ => Ok(()),
    }
}

fn ls(dir: &Path, json: bool) -> Result<()> {
    let m = Manifest::read(dir)?;
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&m).expect("manifest serializes")
        );
        return Ok(());
    }
    println!(
        "{}: {} entries, {} in {} data files, {} chunks of {}{}",
        dir.display(),
        m.entries.len(),
        human_bytes(m.bytes()),
        m.files.len(),
        m.chunks.len(),
        human_bytes(m.chunk_bytes),
        m.parent
            .as_ref()
            .map_or(String::new(), |p| format!(", parent {p}"))
    );
    println!("{:>10}  {:<24} NAME", "SIZE", "TYPE");
    for e in &m.entries {
        let kind = match (&e.dtype, &e.shape) {
            (Some(d), Some(s)) => format!("{d} {s:?}"),
            _ => "raw".to_string(),
        };
        println!("{:>10}  {:<24} {}", human_bytes(e.bytes), kind, e.name);
    }
    let referenced = m.chunks.iter().filter(|c| c.stored_in.is_some()).count();
    if referenced > 0 {
        println!("{referenced} chunks are stored in parent checkpoints");
    }
    Ok(())
}

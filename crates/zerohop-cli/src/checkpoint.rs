//! `zerohop checkpoint save|restore|verify|ls|rm`.

use crate::verify::{compare_with_files, Placed};
use clap::Subcommand;
use serde::Serialize;
use std::path::PathBuf;
use zerohop::safetensors::{self, Allocation};
use zerohop::staging::StagingConfig;
use zerohop::storage::SourceFile;
use zerohop::{Engine, Error, ErrorKind, Result, TransferStats};
use zerohop_checkpoint::{self as ckpt, Location, Region, SaveOptions};
use zerohop_cmd::engine_args::EngineArgs;
use zerohop_cmd::progress::bytes_bar;
use zerohop_cmd::size::human_bytes;

#[derive(Subcommand, Debug)]
pub enum CheckpointCommand {
    /// Load safetensors files into device memory and save their tensors as
    /// a new checkpoint: a directory, or s3://bucket/[prefix/]NAME.
    Save {
        /// A safetensors file whose tensors to checkpoint; repeat for several.
        #[arg(long = "from", required = true)]
        from: Vec<PathBuf>,
        /// The new checkpoint (must not exist yet): a directory, or
        /// s3://bucket/[prefix/]NAME.
        at: String,
        /// Save incrementally against this sibling checkpoint: unchanged
        /// chunks are referenced, not rewritten (on S3, parts of them are
        /// copied by the server) (default: none, a full save).
        #[arg(long)]
        parent: Option<String>,
        /// Data files to spread the tensors over (default: one per staging
        /// slot, at least 16 MiB each).
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
        /// The checkpoint: a directory, or s3://bucket/[prefix/]NAME.
        at: String,
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
        /// The checkpoint: a directory, or s3://bucket/[prefix/]NAME.
        at: String,
        /// Reader threads.
        #[arg(long, default_value_t = 8)]
        threads: usize,
        /// Print one JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
    /// List a checkpoint's entries and sizes; or, given a place holding
    /// checkpoints (a directory, s3://bucket/[prefix/]), the checkpoints.
    Ls {
        /// A checkpoint, or where checkpoints are.
        at: String,
        /// Print the manifest as JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Delete a checkpoint, refused while another one still needs its chunks.
    Rm {
        /// The checkpoint: a directory, or s3://bucket/[prefix/]NAME.
        at: String,
        /// Remove the objects an S3 save left without a manifest (it died);
        /// only once no save under that name is running.
        #[arg(long)]
        unfinished: bool,
    },
}

#[derive(Serialize)]
struct SaveReport<'a> {
    at: String,
    entries: usize,
    bytes: u64,
    written_bytes: u64,
    seconds_to_durable: f64,
    gbps: f64,
    checksums: String,
    /// Where the time around the transfer went.
    phases: ckpt::SavePhases,
    transfer: &'a TransferStats,
}

/// Where checkpoints are only read or removed, the default part size.
fn locate_to_read(at: &str) -> Result<Location> {
    zerohop_names::checkpoint_at(at, StagingConfig::default().slot_bytes as u64)
}

pub fn run(cmd: CheckpointCommand) -> Result<()> {
    match cmd {
        CheckpointCommand::Save {
            from,
            at,
            parent,
            shards,
            engine,
            json,
        } => {
            let mut config = engine.config();
            if zerohop::location::is_object(&at) {
                config = zerohop_s3::config_for_uploads(config);
            }
            let engine = Engine::new(engine.open_device()?, config)?;
            let slot = engine.config().staging.slot_bytes as u64;
            let at = zerohop_names::checkpoint_at(&at, slot)?;
            let parent = parent
                .map(|p| zerohop_names::checkpoint_at(&p, slot))
                .transpose()?;
            save(&engine, &from, &at, parent, shards, json)
        }
        CheckpointCommand::Restore {
            at,
            against,
            engine,
            json,
        } => restore(&engine.engine()?, &locate_to_read(&at)?, &against, json),
        CheckpointCommand::Verify { at, threads, json } => {
            let at = locate_to_read(&at)?;
            let total = at.manifest()?.bytes();
            let bar = bytes_bar("verifying", total, json);
            let progress = |n| bar.inc(n);
            let v = ckpt::verify(&at, threads, Some(&progress))?;
            bar.finish_and_clear();
            if json {
                println!(
                    "{}",
                    serde_json::json!({"at": at.to_string(), "ok": true, "chunks": v.chunks, "bytes": v.bytes, "referenced_chunks": v.referenced_chunks})
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
        CheckpointCommand::Ls { at, json } => ls(&at, json),
        CheckpointCommand::Rm { at, unfinished } => {
            let at = locate_to_read(&at)?;
            if unfinished {
                remove_unfinished(&at)?;
                println!("removed what an unfinished save left at {at}");
            } else {
                ckpt::remove(&at)?;
                println!("removed {at}");
            }
            Ok(())
        }
    }
}

/// Removes the objects a save that died left under `at`, which must have
/// no manifest. Local saves leave nothing under the checkpoint's name.
fn remove_unfinished(at: &Location) -> Result<()> {
    if !zerohop::location::is_object(at.to_string()) {
        return Err(Error::invalid(format!(
            "{at}: --unfinished is for object stores; a local save that dies leaves only \
             a temporary directory, which the next save removes"
        )));
    }
    match at.manifest() {
        Ok(_) => Err(Error::new(
            ErrorKind::AlreadyExists,
            format!("{at} is a committed checkpoint: remove it without --unfinished"),
        )),
        Err(e) if e.kind() == ErrorKind::NotFound => at.store.remove(&at.name),
        Err(e) => Err(e),
    }
}

/// Loads the tensors of the safetensors files `from` and saves them as
/// the checkpoint `at`.
pub fn save(
    engine: &Engine,
    from: &[PathBuf],
    at: &Location,
    parent: Option<Location>,
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
    let saved = ckpt::save(engine, &regions, at, &opts, Some(&progress))?;
    bar.finish_and_clear();
    let gbps = bytes as f64 / saved.seconds / 1e9;
    if json {
        let report = SaveReport {
            at: at.to_string(),
            entries: regions.len(),
            bytes,
            written_bytes: saved.written_bytes,
            seconds_to_durable: saved.seconds,
            gbps,
            checksums: saved.checksums.to_string(),
            phases: saved.phases,
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
            at,
            saved.manifest.files.len()
        );
        let p = saved.phases;
        println!(
            "time     {:.3} s to durable (data, then the manifest that commits it), {gbps:.2} GB/s",
            saved.seconds
        );
        println!(
            "phases   layout {:.1} ms, data {:.3} s, checksums waited for {:.1} ms, manifest {:.1} ms",
            p.layout_seconds * 1e3,
            saved.stats.seconds,
            p.checksum_wait_seconds * 1e3,
            p.commit_seconds * 1e3
        );
        let skipped = saved.stats.skipped_bytes;
        println!(
            "wrote    {}{}",
            human_bytes(saved.written_bytes),
            if skipped > 0 {
                format!(
                    " ({} unchanged, referenced from the parent{})",
                    human_bytes(skipped),
                    if saved.stats.remote_bytes > 0 {
                        "; the server copied those parts"
                    } else {
                        ""
                    }
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

/// Restores the checkpoint `at`, and compares it with the safetensors
/// files `against` if any.
pub fn restore(engine: &Engine, at: &Location, against: &[PathBuf], json: bool) -> Result<()> {
    let manifest = at.manifest()?;
    let bar = bytes_bar("restoring", manifest.bytes(), json);
    let progress = |n| bar.inc(n);
    let r = ckpt::restore(engine, at, Some(&progress))?;
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
            serde_json::json!({"at": at.to_string(), "entries": r.buffers.len(), "matches": matches, "transfer": s})
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

fn ls(name: &str, json: bool) -> Result<()> {
    let at = locate_to_read(name)?;
    let m = match at.manifest() {
        Ok(m) => m,
        Err(e) if e.kind() == ErrorKind::NotFound => return ls_store(name, json, e),
        Err(e) => return Err(e),
    };
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&m).expect("manifest serializes")
        );
        return Ok(());
    }
    println!(
        "{}: {} entries, {} in {} data files, {} chunks of {}{}",
        at,
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

/// Lists the checkpoints in the store `name` names (a directory, or
/// `s3://bucket/[prefix/]`); `missing` is the error if there are none.
fn ls_store(name: &str, json: bool, missing: Error) -> Result<()> {
    let Ok(store) = zerohop_names::checkpoints_in(name, StagingConfig::default().slot_bytes as u64)
    else {
        return Err(missing);
    };
    let rows = ckpt::list_checkpoints(&store)?;
    if rows.is_empty() {
        return Err(missing);
    }
    if json {
        let list: Vec<_> = rows
            .iter()
            .map(|(n, m)| {
                serde_json::json!({"name": n, "entries": m.entries.len(), "bytes": m.bytes(), "parent": m.parent})
            })
            .collect();
        println!(
            "{}",
            serde_json::json!({"store": store.describe(), "checkpoints": list})
        );
        return Ok(());
    }
    let plural = if rows.len() == 1 { "" } else { "s" };
    println!("{}: {} checkpoint{plural}", store.describe(), rows.len());
    println!("{:>10}  {:>7}  {:<24} PARENT", "SIZE", "ENTRIES", "NAME");
    for (n, m) in &rows {
        println!(
            "{:>10}  {:>7}  {:<24} {}",
            human_bytes(m.bytes()),
            m.entries.len(),
            n,
            m.parent.as_deref().unwrap_or("-")
        );
    }
    Ok(())
}

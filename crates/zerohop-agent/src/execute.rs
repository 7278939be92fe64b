//! Running a batch of checked submissions through the engines. Entries of
//! one batch that share a direction and an engine run as one transfer (one
//! pipeline run, all I/O threads); if that fails, each runs alone so every
//! entry gets its own result. Entries of one batch are unordered, as in
//! io_uring without links.

use crate::engines::Engines;
use crate::resources::{Buffer, Memory, RegisteredFile};
use rustix::io::Errno;
use std::collections::HashMap;
use zerohop::plan::TransferPlan;
use zerohop::{Engine, Error, ErrorKind, Result};
use zerohop_wire::ring::{SubmissionEntry, OP_READ};

/// One checked submission and what it names.
pub struct Work<'a> {
    pub sqe: SubmissionEntry,
    pub file: &'a RegisteredFile,
    pub buf: &'a Buffer,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Route {
    Read(Memory),
    Write(Memory),
}

/// The result of each work, in order: its length, or a negative errno.
pub fn run(engines: &Engines, works: &[Work<'_>]) -> Vec<i64> {
    let mut groups: HashMap<Route, Vec<usize>> = HashMap::new();
    for (i, w) in works.iter().enumerate() {
        let route = match w.sqe.op {
            OP_READ => Route::Read(w.buf.memory),
            _ => Route::Write(w.buf.memory),
        };
        groups.entry(route).or_default().push(i);
    }
    let mut results = vec![0i64; works.len()];
    for (route, members) in groups {
        let batch: Vec<&Work<'_>> = members.iter().map(|&i| &works[i]).collect();
        let outcome = run_group(engines, route, &batch);
        if outcome.is_ok() || members.len() == 1 {
            for &i in &members {
                results[i] = outcome
                    .as_ref()
                    .map_or_else(|e| -errno(e), |_| works[i].sqe.len as i64);
            }
            continue;
        }
        for &i in &members {
            results[i] = match run_group(engines, route, &[&works[i]]) {
                Ok(()) => works[i].sqe.len as i64,
                Err(e) => -errno(&e),
            };
        }
    }
    results
}

fn engine_for(engines: &Engines, memory: Memory) -> Result<&Engine> {
    match memory {
        Memory::Host | Memory::SimulatedDevice => Ok(&engines.host),
        Memory::Cuda => engines
            .cuda
            .as_ref()
            .map(|c| &c.engine)
            .ok_or_else(|| Error::new(ErrorKind::NoGpu, "no GPU served")),
    }
}

/// Distinct files of a batch, in first-use order, and each work's index.
fn distinct_files<'a>(batch: &[&Work<'a>]) -> (Vec<&'a RegisteredFile>, Vec<usize>) {
    let mut files: Vec<&RegisteredFile> = Vec::new();
    let index = batch
        .iter()
        .map(
            |w| match files.iter().position(|f| std::ptr::eq(*f, w.file)) {
                Some(i) => i,
                None => {
                    files.push(w.file);
                    files.len() - 1
                }
            },
        )
        .collect();
    (files, index)
}

fn run_group(engines: &Engines, route: Route, batch: &[&Work<'_>]) -> Result<()> {
    let (files, index) = distinct_files(batch);
    match route {
        Route::Read(memory) => {
            let engine = engine_for(engines, memory)?;
            let sources = files
                .iter()
                .map(|f| f.source())
                .collect::<Result<Vec<_>>>()?;
            let mut plan = TransferPlan::new();
            for (w, &f) in batch.iter().zip(&index) {
                plan.add(
                    &sources,
                    f,
                    w.sqe.file_offset,
                    w.sqe.len,
                    &w.buf.data,
                    w.sqe.buf_offset,
                )?;
            }
            engine.transfer(&sources, &plan, None).map(drop)
        }
        Route::Write(memory) => {
            let engine = engine_for(engines, memory)?;
            let mut ends = vec![0u64; files.len()];
            for (w, &f) in batch.iter().zip(&index) {
                ends[f] = ends[f].max(w.sqe.file_offset + w.sqe.len);
            }
            let sinks = files
                .iter()
                .zip(&ends)
                .map(|(f, &end)| f.sink(end))
                .collect::<Result<Vec<_>>>()?;
            let mut plan = TransferPlan::new();
            for (w, &f) in batch.iter().zip(&index) {
                plan.add(
                    &sinks,
                    f,
                    w.sqe.file_offset,
                    w.sqe.len,
                    &w.buf.data,
                    w.sqe.buf_offset,
                )?;
            }
            engine.write(&sinks, &plan, None, None).map(drop)
        }
    }
}

/// The errno a failed transfer completes with.
fn errno(e: &Error) -> i64 {
    let os = std::error::Error::source(e)
        .and_then(|s| s.downcast_ref::<std::io::Error>())
        .and_then(|io| io.raw_os_error());
    let by_kind = match e.kind() {
        ErrorKind::StorageFull => Errno::NOSPC,
        ErrorKind::InvalidInput | ErrorKind::Format => Errno::INVAL,
        ErrorKind::NotFound => Errno::NOENT,
        ErrorKind::PermissionDenied => Errno::ACCESS,
        ErrorKind::OutOfMemory => Errno::NOMEM,
        _ => Errno::IO,
    };
    i64::from(os.unwrap_or(by_kind.raw_os_error()))
}

//! `Engine::write`: device memory into files, durable on return.

use super::write_pipeline::{self, WriteFilter, WriteJob, WriteWorker};
use super::{Engine, Progress};
use crate::device::wait_for_buffer_streams;
use crate::plan::{interleave_files, whole_chunks, windows, TransferPlan};
use crate::stats::{Direction, TransferStats};
use crate::storage::{in_memory, sync_dir, IoMode, Origin, SinkFile, WriteMapping, DIRECT_ALIGN};
use crate::{Error, ErrorKind, Result};
use std::collections::BTreeSet;
use std::path::Path;
use std::time::Instant;

impl Engine {
    /// Writes `plan`'s device ranges into `files` (created with
    /// [`SinkFile::create_new`]) through the staging slots, then makes every
    /// file's data and size, and every file's directory entry, durable
    /// (`fsync` of the files and their directories) before returning.
    /// Ranges must not overlap in a file. `filter`, if given, sees each
    /// window's bytes and picks which to write (see [`WriteFilter`]). Either
    /// everything is durable or an error is returned.
    pub fn write(
        &self,
        files: &[SinkFile],
        plan: &TransferPlan,
        filter: Option<WriteFilter<'_>>,
        progress: Option<Progress<'_>>,
    ) -> Result<TransferStats> {
        let started = Instant::now();
        let cpu_before = crate::stats::cpu_seconds();
        plan.check_files(files.len())?;
        check_disjoint(files, plan)?;
        let mut pool = self.pool.lock().unwrap_or_else(|p| p.into_inner());
        wait_for_buffer_streams(self.device.as_ref(), plan.buffers())?;
        let slot_bytes = pool.config().slot_bytes as u64;
        let remote = files.iter().any(|f| f.remote().is_some());
        let cap = match filter.is_some() || remote {
            true => slot_bytes,
            false => (self.config.write_window_bytes as u64).min(slot_bytes),
        };
        let mut windows = windows(plan.extents(), cap, DIRECT_ALIGN);
        for (i, f) in files.iter().enumerate() {
            let Some(sink) = f.remote() else {
                continue;
            };
            check_parts(f, sink.part_bytes(), slot_bytes)?;
            windows = whole_chunks(windows, i, f.len(), slot_bytes);
        }
        let windows = interleave_files(windows);
        // A worker sends one part at a time and waits on the server for it:
        // with remote objects one slot each suffices (its copy is done long
        // before the part is sent), so as many parts are in flight as there
        // are threads. Local writes keep two slots each, a copy overlapping
        // each write.
        let min_slots = if remote { 1 } else { 2 };
        let staging_seconds = pool.allocate(self.device.as_ref())?;
        let shares = pool.worker_shares(self.config.io_threads.min(windows.len()), min_slots);
        let threads = shares.len();
        let workers = shares
            .into_iter()
            .map(|slots| WriteWorker { slots })
            .collect();
        let job = WriteJob {
            device: self.device.as_ref(),
            queues: &self.queues,
            files,
            maps: match self.writer.allows_mapped_writes() {
                true => write_mappings(files, threads),
                false => files.iter().map(|_| None).collect(),
            },
            writer: self.writer.as_ref(),
            windows,
            filter,
            progress,
        };
        let written = write_pipeline::run(&job, workers)?;
        let synced = Instant::now();
        self.sync_all(files)?;
        let mut stats = TransferStats {
            direction: Direction::Save,
            device: self.device.describe(),
            bytes: plan.bytes(),
            backend: self.writer.name().to_string(),
            direct_bytes: written.direct,
            buffered_bytes: written.buffered,
            mapped_bytes: written.mapped,
            remote_bytes: written.remote,
            skipped_bytes: written.skipped,
            sync_seconds: synced.elapsed().as_secs_f64(),
            staging_bytes: pool.bytes(),
            pinned_staging: self.device.pins_staging(),
            io_threads: threads,
            files: files.len(),
            windows: job.windows.len(),
            profile: written.profile,
            staging_seconds,
            engine_setup_seconds: self.take_setup_seconds(),
            ..Default::default()
        };
        debug_assert_eq!(
            stats.direct_bytes
                + stats.buffered_bytes
                + stats.mapped_bytes
                + stats.remote_bytes
                + stats.skipped_bytes,
            plan.bytes()
        );
        stats.finish(started, cpu_before);
        Ok(stats)
    }

    /// Writes host bytes (a header, small metadata) into `file` at `offset`
    /// through the engine's write backend, buffered; made durable by the
    /// next [`Engine::write`] of the file. A remote object keeps them (up
    /// to 64 MiB) for that write, which sends them with their part.
    pub fn write_host_bytes(&self, file: &SinkFile, offset: u64, bytes: &[u8]) -> Result<()> {
        let Some(fds) = file.local_fds() else {
            return file.keep_host_bytes(offset, bytes);
        };
        self.writer
            .write_at(fds, IoMode::Buffered, offset, bytes)
            .map_err(|e| write_pipeline::write_error(file, offset, bytes.len() as u64, e))
    }

    /// `fsync`s every file (several at once) and then their directories.
    fn sync_all(&self, files: &[SinkFile]) -> Result<()> {
        let threads = self.config.io_threads.min(files.len()).max(1);
        let per_thread = files.len().div_ceil(threads).max(1);
        std::thread::scope(|s| {
            let handles: Vec<_> = files
                .chunks(per_thread)
                .map(|group| {
                    s.spawn(move || {
                        group.iter().try_for_each(|f| {
                            let synced = match &**f {
                                Origin::Local(fds) => self.writer.sync(fds),
                                // The object appears, whole.
                                Origin::Remote { object, .. } => object.finish(),
                            };
                            synced.map_err(|e| Error::io(f.path(), "cannot make durable", e))
                        })
                    })
                })
                .collect();
            handles.into_iter().try_for_each(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(Error::new(ErrorKind::Io, "an fsync thread panicked")))
            })
        })?;
        let dirs: BTreeSet<&Path> = files
            .iter()
            .filter(|f| f.syncs_parent())
            .map(|f| crate::storage::atomic::parent_of(f.path()))
            .collect();
        dirs.into_iter().try_for_each(sync_dir)
    }
}

/// Mappings of the files that `threads` workers write through one: those
/// on a memory file system that several workers share. Such a file system
/// serializes the `write()`s into one file, not copies into its mapping
/// (8 GiB into one tmpfs file from 16 threads: 2.0 - 2.4 GB/s written,
/// 4.6 GB/s copied into a mapping, on the H200 machine). A file that cannot
/// be mapped (opened write-only by a client) is written as any other.
fn write_mappings(files: &[SinkFile], threads: usize) -> Vec<Option<WriteMapping>> {
    let shared = threads >= 2 * files.len();
    files
        .iter()
        .map(|f| {
            let fd = f.local_fds()?.fd_for(IoMode::Buffered);
            if !shared || f.is_empty() || !in_memory(fd) {
                return None;
            }
            WriteMapping::new(fd, f.len()).ok()
        })
        .collect()
}

/// Refuses a remote object whose parts are of another size than the
/// staging slots: each part is written from one slot.
fn check_parts(file: &SinkFile, part_bytes: u64, slot_bytes: u64) -> Result<()> {
    if part_bytes != slot_bytes {
        return Err(Error::invalid(format!(
            "{}: parts of {part_bytes} bytes, but staging slots of {slot_bytes}: \
             each part is written from one slot",
            file.path().display()
        )));
    }
    Ok(())
}

/// Refuses plans that write one file byte twice (two workers would race).
fn check_disjoint(files: &[SinkFile], plan: &TransferPlan) -> Result<()> {
    let mut ranges: Vec<(usize, u64, u64)> = plan
        .extents()
        .iter()
        .map(|e| (e.file, e.file_offset, e.file_offset + e.len))
        .collect();
    ranges.sort_unstable();
    for pair in ranges.windows(2) {
        let ((fa, _, end_a), (fb, start_b, _)) = (pair[0], pair[1]);
        if fa == fb && start_b < end_a {
            return Err(Error::invalid(format!(
                "{}: two ranges of the save overlap at byte {start_b}",
                files[fa].path().display()
            )));
        }
    }
    Ok(())
}

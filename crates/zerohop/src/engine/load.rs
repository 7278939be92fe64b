//! Loads: the planned extents go through the read pipeline, each file on
//! its route, the hot route measured first where it is still unknown (and
//! remembered in `hot_choice`).

use super::claims::Gather;
use super::config::HotRoute;
use super::hot_choice::{self, HotChoice};
use super::page_cache_dma;
use super::read_pipeline::{self, Job, Moved, ReadCheck, Worker};
use super::route::{FileRoute, NO_DMA_NOTE};
use super::work::{PlannedRead, Work};
use super::workers::Progress;
use super::Engine;
use crate::device::{wait_for_buffer_streams, DeviceAddr};
use crate::plan::{
    mapped_payload, split_extents, taper, work_items, Extent, Route, TransferPlan, WindowCaps,
    WorkItem,
};
use crate::staging::{StagingPool, StagingShare};
use crate::stats::TransferStats;
use crate::storage::SourceFile;
use crate::Result;
use std::ops::Range;
use std::time::Instant;

/// A read's windows and claims, and the workers to run them (see
/// [`Engine::plan_phase`]).
pub(super) struct PhasePlan {
    pub items: Vec<WorkItem>,
    pub claims: Vec<Range<usize>>,
    pub workers: usize,
    /// Staging slots each worker needs at least.
    pub min_slots: usize,
    pub notes: Vec<String>,
}

/// What one or more pipeline runs of a transfer did.
#[derive(Default)]
struct Phase {
    moved: Moved,
    windows: usize,
    threads: usize,
    notes: Vec<String>,
    /// Allocating the staging pool, where this phase did.
    staging_seconds: f64,
}

impl Phase {
    fn absorb(&mut self, o: Phase) {
        self.moved.add(o.moved);
        self.windows += o.windows;
        self.threads = self.threads.max(o.threads);
        self.notes.extend(o.notes);
        self.staging_seconds += o.staging_seconds;
    }
}

impl Engine {
    /// [`Engine::transfer`] and [`Engine::transfer_checked`]: routes each
    /// file, measures the hot route if it must, moves everything, then checks
    /// that no file changed under the load.
    pub(super) fn run_transfer(
        &self,
        files: &[SourceFile],
        plan: &TransferPlan,
        check: Option<ReadCheck<'_>>,
        progress: Option<Progress<'_>>,
    ) -> Result<TransferStats> {
        let started = Instant::now();
        let cpu_before = crate::stats::cpu_seconds();
        let mut pool = self.pool.lock().unwrap_or_else(|p| p.into_inner());
        plan.check_files(files.len())?;
        plan.check_disjoint_destinations()?;
        wait_for_buffer_streams(self.device.as_ref(), plan.buffers())?;
        // Each file's ranges to read: a small read asks about its own pages.
        let mut ranges: Vec<Vec<(u64, u64)>> = vec![Vec::new(); files.len()];
        for e in plan.extents() {
            ranges[e.file].push((e.file_offset, e.len));
        }
        let routes: Vec<FileRoute> = files
            .iter()
            .zip(&ranges)
            .map(|(f, ranges)| match self.route_for(f, ranges) {
                r @ FileRoute::Fixed(Route::Staged(_)) => r,
                // A check reads the bytes in staging, which page-cache DMA
                // bypasses: hot files are copied out of their mapping. That
                // also spares a restore of a just-written checkpoint the
                // slow first read() of new tmpfs pages, which the mapping's
                // sequential advice avoids (see `GuardedMapping::new`).
                _ if check.is_some() => FileRoute::Fixed(Route::MappedCopy),
                r => r,
            })
            .collect();
        let (hot, other): (Vec<Extent>, Vec<Extent>) = plan
            .extents()
            .iter()
            .partition(|e| routes[e.file] == FileRoute::MeasuredHot);
        let mut done = Phase::default();
        if self.config.hot_route == HotRoute::PageCacheDma && !self.dma_copies {
            done.notes.push(NO_DMA_NOTE.into());
        }
        let regions = plan.buffer_ranges();
        let (hot_route, hot_left) =
            self.choose_hot_route(files, hot, &regions, &mut pool, progress, &mut done)?;
        let extents: Vec<Extent> = hot_left.into_iter().chain(other).collect();
        let setup_seconds = started.elapsed().as_secs_f64();
        let route_of = |f: usize| match routes[f] {
            FileRoute::Fixed(r) => r,
            FileRoute::MeasuredHot => hot_route,
        };
        done.absorb(self.run_phase(
            files, &extents, &regions, route_of, &mut pool, check, progress,
        )?);
        files.iter().try_for_each(SourceFile::check_unchanged)?;

        let mut stats = TransferStats {
            device: self.device.describe(),
            bytes: plan.bytes(),
            backend: self.backend.name().to_string(),
            direct_bytes: done.moved.direct,
            buffered_bytes: done.moved.buffered,
            remote_bytes: done.moved.remote,
            mapped_bytes: done.moved.mapped,
            page_cache_dma_bytes: done.moved.page_cache_dma,
            staging_bytes: pool.bytes(),
            pinned_staging: self.device.pins_staging(),
            io_threads: done.threads,
            files: files.len(),
            windows: done.windows,
            profile: done.moved.profile,
            setup_seconds,
            staging_seconds: done.staging_seconds,
            engine_setup_seconds: self.take_setup_seconds(),
            notes: done.notes,
            ..Default::default()
        };
        debug_assert_eq!(
            stats.direct_bytes
                + stats.buffered_bytes
                + stats.remote_bytes
                + stats.mapped_bytes
                + stats.page_cache_dma_bytes,
            plan.bytes()
        );
        stats.finish(started, cpu_before);
        Ok(stats)
    }

    /// The route for hot files, and the hot extents still to move. With
    /// `HotRoute::Auto` and no earlier measurement, the first transfer with
    /// enough hot bytes moves a probe's worth by each route (mapped copies,
    /// then page-cache DMA), timing both; the faster takes the rest, and
    /// later transfers (and processes, with `hot_choice_file`).
    fn choose_hot_route(
        &self,
        files: &[SourceFile],
        hot: Vec<Extent>,
        regions: &[(DeviceAddr, u64)],
        pool: &mut StagingPool,
        progress: Option<Progress<'_>>,
        done: &mut Phase,
    ) -> Result<(Route, Vec<Extent>)> {
        if hot.is_empty() {
            return Ok((Route::MappedCopy, hot));
        }
        if let Some(choice) = *self.hot_choice.lock().unwrap_or_else(|p| p.into_inner()) {
            let kept = self
                .config
                .hot_choice_file
                .as_ref()
                .map_or(String::new(), |p| format!(" (kept in {})", p.display()));
            done.notes.push(format!(
                "hot route measured earlier{kept}: {}",
                choice.describe()
            ));
            return Ok((choice.route(), hot));
        }
        let probe = self.config.hot_probe_bytes;
        if hot.iter().map(|e| e.len).sum::<u64>() < 4 * probe {
            // Too little to measure: mapped copies, which pin no
            // page-cache pages and won on the reference machine.
            return Ok((Route::MappedCopy, hot));
        }
        // Neither route's time includes making the staging pool, which the
        // first phase would otherwise pay alone.
        let t = Instant::now();
        pool.allocate(self.device.as_ref())?;
        pool.wait_ready()?;
        done.staging_seconds += t.elapsed().as_secs_f64();
        let (a, rest) = split_extents(&hot, probe);
        let (b, rest) = split_extents(&rest, probe);
        let mut timed = |extents: Vec<Extent>, route: Route| -> Result<f64> {
            let t = Instant::now();
            done.absorb(self.run_phase(
                files,
                &extents,
                regions,
                |_| route,
                pool,
                None,
                progress,
            )?);
            Ok(probe as f64 / t.elapsed().as_secs_f64() / 1e9)
        };
        let choice = HotChoice {
            mapped_gbps: timed(a, Route::MappedCopy)?,
            dma_gbps: timed(b, Route::PageCacheDma)?,
        };
        done.notes.push(format!(
            "hot route measured on this transfer: {}",
            choice.describe()
        ));
        *self.hot_choice.lock().unwrap_or_else(|p| p.into_inner()) = Some(choice);
        if let Some(file) = &self.config.hot_choice_file {
            hot_choice::store(file, &self.hot_choice_key, choice);
        }
        Ok((choice.route(), rest))
    }

    /// One pipeline run over `extents` (into `regions`: see
    /// [`TransferPlan::buffer_ranges`]), each file taking `route_of(file)`.
    #[allow(clippy::too_many_arguments)]
    fn run_phase(
        &self,
        files: &[SourceFile],
        extents: &[Extent],
        regions: &[(DeviceAddr, u64)],
        route_of: impl Fn(usize) -> Route,
        pool: &mut StagingPool,
        check: Option<ReadCheck<'_>>,
        progress: Option<Progress<'_>>,
    ) -> Result<Phase> {
        let started = Instant::now();
        let planned = self.plan_phase(
            files,
            extents,
            route_of,
            pool.config().slot_bytes as u64,
            check,
        );
        let windows = planned.items.len();
        let staging_seconds = pool.allocate(self.device.as_ref())?;
        let shares =
            pool.worker_shares(planned.workers.min(planned.claims.len()), planned.min_slots);
        let threads = shares.len();
        let work = Work::whole(PlannedRead::whole(
            planned.items,
            planned.claims,
            regions.to_vec(),
        ));
        let (moved, pin_refusal) =
            self.run_pipeline(files, &work, shares, started, check, progress)?;
        let mut notes = planned.notes;
        if let Some(why) = pin_refusal {
            notes.push(format!(
                "page-cache DMA could not pin pages ({why}); those windows were staged instead"
            ));
        }
        Ok(Phase {
            moved,
            windows,
            threads,
            notes,
            staging_seconds,
        })
    }

    /// Runs the read pipeline over `work` on a worker per share. Returns
    /// the bytes moved, and why page-cache DMA windows fell back to
    /// staging if any did.
    pub(super) fn run_pipeline(
        &self,
        files: &[SourceFile],
        work: &Work,
        shares: Vec<StagingShare<'_>>,
        started: Instant,
        check: Option<ReadCheck<'_>>,
        progress: Option<Progress<'_>>,
    ) -> Result<(Moved, Option<String>)> {
        // A sole worker runs on the calling thread, and its mapped copies
        // are shared with the crew.
        let crew = (shares.len() == 1).then_some(&self.crew);
        // Each worker makes its copy queue and reader on its own thread.
        let workers = shares.into_iter().map(|slots| Worker { slots }).collect();
        let job = Job {
            device: self.device.as_ref(),
            queues: &self.queues,
            started,
            backend: self.backend.as_ref(),
            files,
            work,
            check,
            progress,
            crew,
        };
        read_pipeline::run(&job, workers)
    }

    /// The windows and claims of a read of `extents`, each file taking
    /// `route_of(file)` (or the staged route where it cannot be mapped),
    /// and the workers to run them: the same for a transfer's phase and a
    /// chained read.
    pub(super) fn plan_phase(
        &self,
        files: &[SourceFile],
        extents: &[Extent],
        route_of: impl Fn(usize) -> Route,
        slot: u64,
        check: Option<ReadCheck<'_>>,
    ) -> PhasePlan {
        let mut routes: Vec<Route> = (0..files.len()).map(route_of).collect();
        let notes = page_cache_dma::map_files(files, extents, &mut routes);
        let caps = WindowCaps {
            slot,
            // A check sees whole slots, whatever the route (restores check
            // whole chunks, and a slot holds whole chunks).
            mapped: match check {
                Some(_) => slot,
                None => self.config.mapped_window_bytes as u64,
            },
            dma: self.config.dma_window_bytes as u64,
        };
        let items = work_items(extents, &routes, caps);
        // Workers of remote objects wait on the server: more of them, and
        // one slot each suffices (its copy is done long before the next
        // window has arrived).
        let remote = items
            .iter()
            .any(|i| files[i.window.file].remote().is_some());
        let (workers, min_slots) = match remote {
            true => (self.config.remote_streams, 1),
            false => (self.config.io_threads, 2),
        };
        // A check sees each window's file range in its slot: those windows
        // are neither cut finer at the end nor gathered. A transfer of no
        // more than a slot's worth per worker is not cut finer either: its
        // windows go one to a worker already, and more of them would start
        // more workers, which costs a small read more than it gains.
        let most = caps.mapped.min(slot);
        let tail = workers as u64 * most;
        let (items, gather) = match check {
            Some(_) => (items, None),
            None => {
                let gather = Gather {
                    most,
                    tail: if mapped_payload(&items) > tail {
                        tail
                    } else {
                        0
                    },
                    tail_most: most / 4,
                };
                (taper(items, gather.tail, gather.tail_most), Some(gather))
            }
        };
        let claims = super::claims::claims(
            &items,
            files,
            self.config.remote_read_bytes,
            workers,
            gather,
        );
        PhasePlan {
            items,
            claims,
            workers,
            min_slots,
            notes,
        }
    }
}

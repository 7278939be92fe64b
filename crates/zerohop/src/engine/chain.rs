//! Reads chained into one pipeline run: a read queued while the one before
//! it is under way joins that run rather than starting its own, so the
//! engine goes from one to the next without its workers' start and the
//! pipeline's fill and drain in between. `safe_open`'s read-ahead windows
//! are read so: twelve transfers of the halves of 3,278 small tensors (4.30
//! GB) moved 40.43 GB/s where one moved 49.36 (an H100 machine,
//! `bench/probe/scattered_read.py`).

use super::route::FileRoute;
use super::work::{OnArrival, PlannedRead, Work};
use super::Engine;
use crate::plan::{Route, TransferPlan};
use crate::stats::TransferStats;
use crate::storage::SourceFile;
use crate::{Error, ErrorKind, Result};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::Instant;

/// Reads of one set of files that join one pipeline run while it lasts.
pub struct ReadChain {
    files: Arc<Vec<SourceFile>>,
    work: Work,
}

impl ReadChain {
    /// A chain of reads of `files`, none queued yet.
    pub fn new(files: Arc<Vec<SourceFile>>) -> Self {
        ReadChain {
            files,
            work: Work::open(),
        }
    }

    /// Queues `read` behind the chain's others; gives it back once the
    /// chain's run is over (a new chain then takes it).
    ///
    /// # Panics
    /// Where `read` was planned for other files than the chain's.
    pub fn join(&self, read: Box<PlannedRead>) -> std::result::Result<(), Box<PlannedRead>> {
        assert!(
            read.files
                .as_ref()
                .is_some_and(|f| Arc::ptr_eq(f, &self.files)),
            "a read joins only a chain of the files it was planned for"
        );
        self.work.add(read)
    }

    /// The files the chain reads.
    pub fn files(&self) -> &Arc<Vec<SourceFile>> {
        &self.files
    }
}

impl Engine {
    /// Plans a read of `plan`'s extents of `files` (local files only) for a
    /// [`ReadChain`] of those files. `on_arrival` is told the read's stats
    /// once every byte has arrived and no file changed, or its error; it is
    /// told on a thread of the engine's.
    ///
    /// Hot files take the route measured by an earlier transfer, else
    /// mapped copies: a chained read is not measured.
    pub fn plan_chained(
        &self,
        files: &Arc<Vec<SourceFile>>,
        plan: TransferPlan,
        on_arrival: OnArrival,
    ) -> Result<Box<PlannedRead>> {
        plan.check_files(files.len())?;
        plan.check_disjoint_destinations()?;
        if let Some(f) = files.iter().find(|f| f.remote().is_some()) {
            return Err(Error::invalid(format!(
                "{}: only local files are read in chains",
                f.path().display()
            )));
        }
        let mut ranges: Vec<Vec<(u64, u64)>> = vec![Vec::new(); files.len()];
        for e in plan.extents() {
            ranges[e.file].push((e.file_offset, e.len));
        }
        let hot = self
            .hot_choice
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .map_or(Route::MappedCopy, |c| c.route());
        let routes: Vec<Route> = files
            .iter()
            .zip(&ranges)
            .map(|(f, ranges)| match self.route_for(f, ranges) {
                FileRoute::Fixed(r) => r,
                FileRoute::MeasuredHot => hot,
            })
            .collect();
        let slot = self.config.staging.slot_bytes as u64;
        let planned = self.plan_phase(files, plan.extents(), |f| routes[f], slot, None);
        let stats = TransferStats {
            device: self.device.describe(),
            bytes: plan.bytes(),
            backend: self.backend.name().to_string(),
            pinned_staging: self.device.pins_staging(),
            files: files.len(),
            windows: planned.items.len(),
            notes: planned.notes,
            ..Default::default()
        };
        Ok(PlannedRead::chained(
            planned.items,
            planned.claims,
            files.clone(),
            plan,
            stats,
            on_arrival,
        ))
    }

    /// Runs `chain`'s reads, and those that join it meanwhile, through one
    /// pipeline run over the engine's I/O threads; returns once none is
    /// left, every read's owner told its outcome. Transfers on one engine
    /// run one at a time, chains included.
    pub fn run_chain(&self, chain: &ReadChain) {
        let started = Instant::now();
        let mut pool = self.pool.lock().unwrap_or_else(|p| p.into_inner());
        // Its reads' owners wait to be told: a panic is told as an error.
        let ran = catch_unwind(AssertUnwindSafe(|| {
            pool.allocate(self.device.as_ref())?;
            let shares = pool.worker_shares(self.config.io_threads, 2);
            self.run_pipeline(&chain.files, &chain.work, shares, started, None, None)
        }))
        .unwrap_or_else(|_| Err(Error::new(ErrorKind::Device, "a chained read panicked")));
        // No read joins from here on; those not told yet failed.
        chain.work.stop();
        let e = ran.err().unwrap_or_else(|| {
            Error::new(
                ErrorKind::Device,
                "a chained read ended before all its bytes arrived",
            )
        });
        chain.work.fail_all(&e);
    }
}

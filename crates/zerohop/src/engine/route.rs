//! Route choice: how each file's bytes travel to the device. The routes are
//! one family: [`HotRoute`] is the setting for files already in the page
//! cache, [`FileRoute`] a file's route before the hot route is measured,
//! and [`Route`] (a part of the plan) how one window's bytes finally travel.

use super::hot_choice::{self, HotChoice};
use super::load::Phase;
use super::{DirectIo, Engine, Progress};
pub(crate) use crate::plan::{Route, STAGED};

use crate::plan::{split_extents, Extent};
use crate::staging::StagingPool;
use crate::storage::{IoMode, SourceFile};
use crate::Result;
use std::time::Instant;

/// Which route hot files (already in the page cache) take. Page-cache DMA
/// runs only on devices that copy by DMA (GPUs); elsewhere hot files take
/// the mapped-copy route, and with `PageCacheDma` a note says so.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HotRoute {
    /// Mapped copies, or page-cache DMA where the engine measures that
    /// faster on this machine (devices that copy by DMA only).
    Auto,
    /// The CPU copies out of the file's mapping into staging slots.
    Mapped,
    /// `read()` into staging slots (the kernel copies out of the page cache).
    Staged,
    /// The GPU copies from the registered page-cache pages.
    PageCacheDma,
}

/// A file's route before the hot route is decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum FileRoute {
    Fixed(Route),
    /// In the page cache, with `HotRoute::Auto`: the engine's measured choice.
    MeasuredHot,
}

/// The note a transfer carries when page-cache DMA was asked for on a device
/// that copies with the CPU.
pub(super) const NO_DMA_NOTE: &str = "page-cache DMA needs a device that copies by DMA (a GPU); \
     this one copies with the CPU, so files in the page cache took the mapped-copy route \
     (the same CPU copy, out of the file's mapping)";

impl Engine {
    /// The route for a file whose `ranges` (byte offset, length) are to be
    /// read: for ranges in the page cache, per `hot_route` (`MeasuredHot`
    /// where it is to be measured); else staged reads, O_DIRECT per
    /// `direct_io`. Page-cache DMA is forced on every file. Remote objects
    /// are always read into staging slots.
    pub(super) fn route_for(&self, f: &SourceFile, ranges: &[(u64, u64)]) -> FileRoute {
        if f.local_fds().is_none() {
            return FileRoute::Fixed(STAGED);
        }
        let hot = self.is_hot(f, ranges);
        match self.config.hot_route {
            HotRoute::PageCacheDma if self.dma_copies => {
                return FileRoute::Fixed(Route::PageCacheDma)
            }
            HotRoute::Auto if hot && self.dma_copies => return FileRoute::MeasuredHot,
            HotRoute::Auto | HotRoute::Mapped | HotRoute::PageCacheDma if hot => {
                return FileRoute::Fixed(Route::MappedCopy)
            }
            _ => {}
        }
        let direct = f.direct_capable() && self.reads_direct(|| hot);
        FileRoute::Fixed(Route::Staged(if direct {
            IoMode::Direct
        } else {
            IoMode::Buffered
        }))
    }

    /// Whether most of `ranges` of `f` is in the page cache (per
    /// `hot_threshold`).
    pub(super) fn is_hot(&self, f: &SourceFile, ranges: &[(u64, u64)]) -> bool {
        f.resident_fraction(ranges) >= self.config.hot_threshold
    }

    /// Whether a file is read with O_DIRECT per `direct_io`; `hot` (whether
    /// the file is in the page cache, a system call) is asked only by
    /// `DirectIo::Auto`.
    pub(super) fn reads_direct(&self, hot: impl FnOnce() -> bool) -> bool {
        match self.config.direct_io {
            DirectIo::Never => false,
            DirectIo::Always => true,
            DirectIo::Auto => !hot(),
        }
    }

    /// The route for hot files, and the hot extents still to move. With
    /// `HotRoute::Auto` and no earlier measurement, the first transfer with
    /// enough hot bytes moves a probe's worth by each route (mapped copies,
    /// then page-cache DMA), timing both; the faster takes the rest, and
    /// later transfers (and processes, with `hot_choice_file`).
    pub(super) fn choose_hot_route(
        &self,
        files: &[SourceFile],
        hot: Vec<Extent>,
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
        let (a, rest) = split_extents(&hot, probe);
        let (b, rest) = split_extents(&rest, probe);
        let mut timed = |extents: Vec<Extent>, route: Route| -> Result<f64> {
            let t = Instant::now();
            done.absorb(self.run_phase(files, &extents, |_| route, pool, None, progress)?);
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
}

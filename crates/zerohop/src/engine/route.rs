//! Route choice: how each file's bytes travel to the device. The routes are
//! one family: [`HotRoute`] is the setting for files already in the page
//! cache, [`FileRoute`] a file's route before the hot route is measured
//! (which loads do: see `load`), and [`Route`] (a part of the plan) how one
//! window's bytes finally travel.

use super::config::{DirectIo, HotRoute};
use super::Engine;
use crate::plan::{Route, STAGED};
use crate::storage::{IoMode, SourceFile};

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
}

//! Emptying the page cache of a file, for cold measurements (benchmarks).

use rustix::fs::Advice;
use std::path::Path;

/// How the page cache was emptied for a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CacheDrop {
    /// `/proc/sys/vm/drop_caches` (root): every clean page dropped.
    DropCaches,
    /// `posix_fadvise(DONTNEED)` on the file only.
    Fadvise,
}

/// Drops `path` from the page cache: drop_caches where permitted, else
/// fadvise DONTNEED. Says which was done and the residency afterwards.
pub fn drop_from_page_cache(path: &Path) -> std::io::Result<(CacheDrop, f64)> {
    let (f, stamp) = crate::storage::open_regular(path, crate::storage::Access::Read)
        .map_err(std::io::Error::other)?;
    // Dirty pages cannot be dropped: write them first. Failing that, the
    // residency reported below says what stayed cached.
    let _ = rustix::fs::fdatasync(&f);
    rustix::fs::sync();
    let how = match std::fs::write("/proc/sys/vm/drop_caches", "1") {
        Ok(()) => CacheDrop::DropCaches,
        Err(_) => {
            rustix::fs::fadvise(&f, 0, None, Advice::DontNeed)?;
            CacheDrop::Fadvise
        }
    };
    Ok((
        how,
        crate::storage::page_cache_residency(&f, stamp.len).unwrap_or(0.0),
    ))
}

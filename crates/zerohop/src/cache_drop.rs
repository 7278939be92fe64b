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
    /// Nothing done: the file lives in memory (tmpfs, ramfs), whose pages
    /// cannot be dropped. A drop would leave them slow to map: on the
    /// reference H200 machine, mapped restores of a tmpfs checkpoint ran at
    /// 24 - 40 GB/s before one and 13 - 16 after it, in every later
    /// restore, a state that a restore right after a save never meets.
    MemoryFileSystem,
}

/// Drops `path` from the page cache: drop_caches where permitted, else
/// fadvise DONTNEED; nothing on a memory file system. Says which was done
/// and the residency afterwards.
pub fn drop_from_page_cache(path: &Path) -> std::io::Result<(CacheDrop, f64)> {
    let (f, stamp) = crate::storage::open_regular(path, crate::storage::Access::Read)
        .map_err(std::io::Error::other)?;
    let how = match crate::storage::in_memory(&f) {
        true => CacheDrop::MemoryFileSystem,
        false => drop_caches(&f)?,
    };
    Ok((
        how,
        crate::storage::page_cache_residency(&f, stamp.len, &[(0, stamp.len)]).unwrap_or(0.0),
    ))
}

/// drop_caches where permitted, else fadvise DONTNEED on `f`.
fn drop_caches(f: &std::fs::File) -> std::io::Result<CacheDrop> {
    // Dirty pages cannot be dropped: write them first. Failing that, the
    // residency reported says what stayed cached.
    let _ = rustix::fs::fdatasync(f);
    rustix::fs::sync();
    Ok(match std::fs::write("/proc/sys/vm/drop_caches", "1") {
        Ok(()) => CacheDrop::DropCaches,
        Err(_) => {
            rustix::fs::fadvise(f, 0, None, Advice::DontNeed)?;
            CacheDrop::Fadvise
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_in_memory_are_left_as_they_are() {
        let dir = Path::new("/dev/shm");
        let on_tmpfs = std::fs::File::open(dir).is_ok_and(|d| crate::storage::in_memory(&d));
        if !on_tmpfs {
            crate::test_support::skip("/dev/shm is not a tmpfs here");
            return;
        }
        let path = dir.join(format!("zerohop-cache-drop-{}", std::process::id()));
        std::fs::write(&path, vec![1u8; 1 << 20]).unwrap();
        let dropped = drop_from_page_cache(&path);
        std::fs::remove_file(&path).unwrap();
        let (how, left) = dropped.unwrap();
        assert_eq!(how, CacheDrop::MemoryFileSystem);
        assert_eq!(left, 1.0);
    }
}

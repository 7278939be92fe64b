//! The zero-hop route for hot data: a file already in the page cache is
//! mapped read-only, each window's pages are pinned (host-registered
//! read-only) while its copies run, and the GPU copies straight from them.
//! No CPU copy touches the bytes. Pinning per window, rather than the whole
//! file in one call, overlaps pinning with copying and bounds what is pinned:
//! on the reference H200 machine it ran at ~13 GB/s against ~9 GB/s for
//! one whole-file registration. Only devices that
//! copy by DMA take this route (see `Device::copies_by_dma`).
//!
//! The files of the mapped-copy route are mapped here too: the same
//! mapping, which the CPU copies out of instead (guarded: see
//! `GuardedMapping`).

use crate::plan::{Extent, Route, STAGED};
use crate::storage::SourceFile;

/// Maps every file whose route reads a mapping (mapped copies, page-cache
/// DMA) and that `extents` read (once per file, see
/// [`SourceFile::mapping`]): the read pipeline copies out of those. A file
/// that cannot be mapped takes the staged route instead; the notes say so.
pub(super) fn map_files(
    files: &[SourceFile],
    extents: &[Extent],
    routes: &mut [Route],
) -> Vec<String> {
    let mut used = vec![false; files.len()];
    for e in extents {
        used[e.file] = true;
    }
    let mut notes = Vec::new();
    for ((f, r), used) in files.iter().zip(routes.iter_mut()).zip(used) {
        if !r.maps_file() || f.is_empty() || !used {
            continue;
        }
        if f.remote().is_some() {
            *r = STAGED;
            continue;
        }
        if let Err(why) = f.mapping() {
            notes.push(format!(
                "{}: cannot map the file ({why}); read into staging slots instead",
                f.path().display()
            ));
            *r = STAGED;
        }
    }
    notes
}

/// Maps a window's pages into our page tables before registration, which
/// would otherwise fault them in one by one. Errors are ignored (kernels
/// before 5.14, or a file truncated meanwhile): registration then faults
/// the pages itself, or fails and the window is staged.
pub(super) fn populate(ptr: *const u8, len: usize) {
    // SAFETY: advice only, on a page-aligned range of a live mapping; it
    // changes no memory contents.
    let _ = unsafe {
        rustix::mm::madvise(
            ptr.cast_mut().cast(),
            len,
            rustix::mm::Advice::LinuxPopulateRead,
        )
    };
}

//! Files into host memory (pinned or not) that the caller owns: no staging
//! and no GPU, the reads land in place. The I/O threads each take 8 MiB
//! chunks; O_DIRECT is used for cold files where the chunk is aligned.

use crate::stats::TransferStats;
use crate::storage::{IoMode, ReadBackend, SourceFile, DIRECT_ALIGN};
use crate::{Error, ErrorKind, Result};
use std::sync::Mutex;
use std::time::Instant;

const CHUNK: usize = 8 << 20;

/// One piece of a host read: `dst.len()` bytes of `file` from `offset`.
pub(crate) struct HostRead<'a> {
    pub file: &'a SourceFile,
    pub offset: u64,
    pub dst: &'a mut [u8],
    /// Ask for O_DIRECT where alignment allows (files not in the cache).
    pub direct: bool,
}

/// Reads every piece with `threads` readers sharing the pieces' 8 MiB
/// chunks. All ranges are checked against their files before any read.
pub(crate) fn read_to_host(
    backend: &dyn ReadBackend,
    threads: usize,
    reads: Vec<HostRead<'_>>,
) -> Result<TransferStats> {
    let started = Instant::now();
    let cpu_before = crate::stats::cpu_seconds();
    let mut len = 0;
    // Each file once, to count them and check them afterwards: by identity,
    // since two different files may carry one label (descriptors a client
    // passed, a path opened again after the file was replaced).
    let mut files = std::collections::HashMap::new();
    for r in &reads {
        let n = r.dst.len() as u64;
        if r.offset.checked_add(n).is_none_or(|end| end > r.file.len()) {
            return Err(Error::new(
                ErrorKind::Io,
                format!(
                    "{}: {n} bytes at offset {} run past the end of the file ({} bytes)",
                    r.file.path().display(),
                    r.offset,
                    r.file.len()
                ),
            ));
        }
        len += n;
        files.insert(std::ptr::from_ref(r.file), r.file);
    }
    let file_count = files.len();
    let aligned = |at: u64, buf: &[u8]| {
        at.is_multiple_of(DIRECT_ALIGN)
            && (buf.len() as u64).is_multiple_of(DIRECT_ALIGN)
            && (buf.as_ptr() as u64).is_multiple_of(DIRECT_ALIGN)
    };
    let chunks: Vec<(&SourceFile, bool, u64, &mut [u8])> = reads
        .into_iter()
        .flat_map(|r| {
            let (file, offset, direct) = (r.file, r.offset, r.direct);
            r.dst
                .chunks_mut(CHUNK)
                .enumerate()
                .map(move |(i, c)| (file, direct, offset + (i * CHUNK) as u64, c))
        })
        .collect();
    let count = chunks.len();
    let queue = Mutex::new(chunks.into_iter());
    let totals = Mutex::new((0u64, 0u64, 0u64)); // direct, buffered, remote
    let read = || -> Result<()> {
        let mut reader = backend
            .reader()
            .map_err(|e| Error::with_source(ErrorKind::Io, "cannot start a reader", e))?;
        loop {
            let next = queue.lock().unwrap().next();
            let Some((file, direct, at, buf)) = next else {
                return Ok(());
            };
            let mode = if direct && file.direct_capable() && aligned(at, buf) {
                IoMode::Direct
            } else {
                IoMode::Buffered
            };
            let got = file
                .read_block(reader.as_mut(), mode, at, buf)
                .map_err(|e| {
                    Error::io(file.path(), &format!("read at offset {at} failed in"), e)
                })?;
            if got < buf.len() {
                // Say how the file changed, where it did.
                file.check_unchanged()?;
                return Err(Error::new(
                    ErrorKind::Io,
                    format!(
                        "{}: file ended at byte {} (truncated while reading?)",
                        file.path().display(),
                        at + got as u64
                    ),
                ));
            }
            let mut t = totals.lock().unwrap();
            match mode {
                _ if file.local_fds().is_none() => t.2 += got as u64,
                IoMode::Direct => t.0 += got as u64,
                IoMode::Buffered => t.1 += got as u64,
            }
        }
    };
    let readers = threads.clamp(1, count.max(1));
    let panicked = || Err(Error::invalid("a reader panicked"));
    if readers == 1 {
        // One reader reads on the calling thread: a thread of its own would
        // cost a small read more than the read (a `get_slice` of a few rows).
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(read))
            .unwrap_or_else(|_| panicked())?;
    } else {
        std::thread::scope(|s| {
            let workers: Vec<_> = (0..readers).map(|_| s.spawn(read)).collect();
            workers
                .into_iter()
                .try_for_each(|w| w.join().unwrap_or_else(|_| panicked()))
        })?;
    }
    // A file rewritten or grown meanwhile gave mixed bytes: say so.
    files.values().try_for_each(|f| f.check_unchanged())?;
    let (direct_bytes, buffered_bytes, remote_bytes) = totals.into_inner().unwrap();
    let mut stats = TransferStats {
        device: "host memory (caller's buffer)".into(),
        bytes: len,
        backend: backend.name().to_string(),
        direct_bytes,
        buffered_bytes,
        remote_bytes,
        io_threads: readers,
        files: file_count,
        windows: count,
        ..Default::default()
    };
    stats.finish(started, cpu_before);
    stats.path = format!(
        "host read ({} straight into the destination, no staging)",
        backend.name()
    );
    Ok(stats)
}

//! The storage side's limits, shared by the benchmarks: raw parallel reads
//! and writes of files between storage and host memory, with no device and
//! no engine involved.

use rustix::fs::{Mode, OFlags};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;
use zerohop::cache_drop::drop_from_page_cache;
use zerohop::storage::{self, BackendKind, IoMode, SourceFile};
use zerohop::{Error, Result};

/// Bytes per read of the benchmarks' own raw reads.
pub const RAW_BLOCK: usize = 8 << 20;

/// Reads the whole file once so it sits in the page cache.
pub fn warm(path: &Path) -> Result<()> {
    raw_read(&[path], BackendKind::Pread, IoMode::Buffered, 4, RAW_BLOCK).map(|_| ())
}

/// What a raw read did.
pub struct RawRead {
    /// The read backend (`io_uring`, `pread`).
    pub backend: &'static str,
    pub bytes: u64,
    pub seconds: f64,
    /// Decimal: bytes / seconds / 1e9.
    pub gbps: f64,
    /// User + system CPU time of this process during the reads.
    pub cpu_seconds: f64,
}

/// Reads whole files into host memory (not the GPU) with `threads`
/// readers, each taking the next `block` bytes of the files in order from
/// one shared cursor into a buffer of its own: the storage side's limit.
/// With `IoMode::Direct`, `block` must be a multiple of 4096, and a file
/// system that refuses O_DIRECT is an error. An `s3://` name is read by
/// ranged GETs of `block` bytes (see `zerohop_names`), `backend` unused.
pub fn raw_read(
    paths: &[&Path],
    backend: BackendKind,
    mode: IoMode,
    threads: usize,
    block: usize,
) -> Result<RawRead> {
    let block = block.max(1);
    if mode == IoMode::Direct && !(block as u64).is_multiple_of(zerohop::storage::DIRECT_ALIGN) {
        return Err(Error::invalid(format!(
            "O_DIRECT reads need a block size that is a multiple of {} bytes, not {block}",
            zerohop::storage::DIRECT_ALIGN
        )));
    }
    let files: Vec<SourceFile> = zerohop_names::open_sources(paths)?;
    if mode == IoMode::Direct {
        if let Some(f) = files.iter().find(|f| !f.direct_capable()) {
            return Err(Error::invalid(format!(
                "the file system of {} refuses O_DIRECT: read it buffered (--direct never)",
                f.path().display()
            )));
        }
    }
    let backend =
        storage::backend(backend).map_err(|e| Error::io(paths[0], "no backend for", e))?;
    let step = block as u64;
    let pieces: Vec<(usize, u64)> = files
        .iter()
        .enumerate()
        .flat_map(|(i, f)| (0..f.len().div_ceil(step)).map(move |k| (i, k * step)))
        .collect();
    let next = AtomicUsize::new(0);
    let cpu = zerohop::stats::cpu_seconds();
    let t = Instant::now();
    std::thread::scope(|s| -> Result<()> {
        let handles: Vec<_> = (0..threads.max(1))
            .map(|_| {
                s.spawn(|| -> Result<()> {
                    let mut reader = backend
                        .reader()
                        .map_err(|e| Error::io(paths[0], "cannot start reader for", e))?;
                    let mut buf = AlignedBuf::new(block);
                    while let Some(&(i, at)) = pieces.get(next.fetch_add(1, Ordering::Relaxed)) {
                        let f = &files[i];
                        let want = (f.len() - at).min(step) as usize;
                        let got = f
                            .read_block(reader.as_mut(), mode, at, &mut buf.as_mut_slice()[..want.next_multiple_of(direct_unit(mode))])
                            .map_err(|e| Error::io(paths[i], "read failed in", e))?;
                        if got < want {
                            return Err(Error::invalid(format!(
                                "{}: short read, {got} of {want} bytes at offset {at} (the file shrank?)",
                                paths[i].display()
                            )));
                        }
                    }
                    Ok(())
                })
            })
            .collect();
        handles.into_iter().try_for_each(|h| {
            h.join()
                .unwrap_or_else(|_| Err(Error::invalid("reader panicked")))
        })
    })?;
    let seconds = t.elapsed().as_secs_f64();
    let bytes: u64 = files.iter().map(|f| f.len()).sum();
    Ok(RawRead {
        backend: if files.iter().all(|f| f.local_fds().is_none()) {
            "ranged GETs"
        } else {
            backend.name()
        },
        bytes,
        seconds,
        gbps: bytes as f64 / seconds / 1e9,
        cpu_seconds: zerohop::stats::cpu_seconds() - cpu,
    })
}

/// The unit a read's length is rounded up to: O_DIRECT reads whole
/// 4 KiB blocks (the kernel stops at the end of the file).
fn direct_unit(mode: IoMode) -> usize {
    match mode {
        IoMode::Direct => zerohop::storage::DIRECT_ALIGN as usize,
        IoMode::Buffered => 1,
    }
}

/// A page-aligned heap buffer (O_DIRECT needs aligned memory).
struct AlignedBuf {
    ptr: *mut u8,
    layout: std::alloc::Layout,
}

impl AlignedBuf {
    fn new(len: usize) -> Self {
        let layout = std::alloc::Layout::from_size_align(len, 4096).expect("valid layout");
        // SAFETY: non-zero size; checked for null below.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            std::alloc::handle_alloc_error(layout);
        }
        AlignedBuf { ptr, layout }
    }

    fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: we own `layout.size()` initialised (zeroed) bytes at `ptr`.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.layout.size()) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) };
    }
}

/// Where a raw writer's bytes come from.
#[derive(Clone, Copy)]
pub enum Source {
    /// One 8 MiB buffer per writer, written again and again: it stays in
    /// the CPU's caches, so the file system alone sets the rate.
    Cached,
    /// 256 MiB per writer (gigabytes in all, far beyond any cache), written
    /// piece after piece, as data to save is read from RAM.
    Ram,
}

impl Source {
    fn bytes_per_writer(self) -> usize {
        match self {
            Source::Cached => RAW_PIECE,
            Source::Ram => 256 << 20,
        }
    }
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Source::Cached => "from a cache-resident 8 MiB buffer",
            Source::Ram => "from 256 MiB of RAM per writer",
        })
    }
}

/// Bytes per raw write call.
const RAW_PIECE: usize = 8 << 20;

pub struct RawFiles {
    pub paths: Vec<PathBuf>,
    pub how: &'static str,
    pub gbps: f64,
}

/// Writes `total` bytes split over `threads` files in `dir`, one writer
/// each, 8 MiB at a time from `source` with O_DIRECT (buffered where
/// refused), then fsyncs them and the directory: the storage side's write
/// limit.
pub fn raw_write_files(dir: &Path, total: u64, threads: usize, source: Source) -> Result<RawFiles> {
    let per = total
        .div_ceil(threads as u64)
        .next_multiple_of(RAW_PIECE as u64);
    let paths: Vec<PathBuf> = (0..threads)
        .map(|t| dir.join(format!(".zerohop-raw-{}-{t}", std::process::id())))
        .collect();
    let direct = create(&paths[0], OFlags::DIRECT).is_ok();
    let extra = if direct {
        OFlags::DIRECT
    } else {
        OFlags::empty()
    };
    let open = |p: &Path| create(p, extra).map_err(|e| Error::io(p, "cannot create", e));
    // Writers fill their sources before the clock starts (first touches of
    // fresh memory are slow on some VMs), with random bytes: a constant
    // would be shrunk by a file system that compresses.
    let ready = std::sync::Barrier::new(threads + 1);
    let mut started = Instant::now();
    std::thread::scope(|s| -> Result<()> {
        let ready = &ready;
        let handles: Vec<_> = paths
            .iter()
            .map(|p| {
                s.spawn(move || -> Result<()> {
                    let mut buf = AlignedBuf::new(source.bytes_per_writer());
                    fill_random(buf.as_mut_slice());
                    let opened = open(p);
                    ready.wait();
                    let f: File = opened?;
                    let pieces = buf.as_mut_slice().chunks(RAW_PIECE).cycle();
                    for (at, piece) in (0..per).step_by(RAW_PIECE).zip(pieces) {
                        f.write_all_at(piece, at)
                            .map_err(|e| Error::io(p, "raw write failed in", e))?;
                    }
                    f.sync_all().map_err(|e| Error::io(p, "cannot fsync", e))
                })
            })
            .collect();
        ready.wait();
        started = Instant::now();
        handles.into_iter().try_for_each(|h| {
            h.join()
                .unwrap_or_else(|_| Err(Error::invalid("writer panicked")))
        })
    })?;
    zerohop::storage::sync_dir(dir)?;
    Ok(RawFiles {
        gbps: (per * threads as u64) as f64 / started.elapsed().as_secs_f64() / 1e9,
        paths,
        how: if direct { "O_DIRECT" } else { "buffered" },
    })
}

/// Reads the raw files back after dropping them from the page cache, with
/// `threads` readers (io_uring, O_DIRECT where allowed) taking 8 MiB pieces
/// of any file: the storage side's read limit, read the way restores read.
pub fn raw_read_files(paths: &[PathBuf], threads: usize) -> Result<(String, f64)> {
    for p in paths {
        drop_from_page_cache(p).map_err(|e| Error::io(p, "cannot drop the cache of", e))?;
    }
    let direct = paths
        .iter()
        .map(|p| SourceFile::open(p).map(|f| f.direct_capable()))
        .collect::<Result<Vec<_>>>()?;
    let mode = if direct.iter().all(|&d| d) {
        IoMode::Direct
    } else {
        IoMode::Buffered
    };
    let paths: Vec<&Path> = paths.iter().map(PathBuf::as_path).collect();
    let r = raw_read(&paths, BackendKind::Auto, mode, threads, RAW_BLOCK)?;
    Ok((format!("{} {mode:?}", r.backend), r.gbps))
}

/// Creates (or truncates) `path` for writing, with `extra` open flags.
fn create(path: &Path, extra: OFlags) -> std::io::Result<File> {
    let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::TRUNC | OFlags::CLOEXEC | extra;
    Ok(rustix::fs::open(path, flags, Mode::from_raw_mode(0o666))?.into())
}

/// Fills `bytes` (whole 8-byte words of it) with the same pseudo-random
/// sequence each time: data no file system or object store shrinks.
pub fn fill_random(bytes: &mut [u8]) {
    let mut s = 0x2545_F491_4F6C_DD1Du64;
    for c in bytes.chunks_exact_mut(8) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        c.copy_from_slice(&s.to_le_bytes());
    }
}

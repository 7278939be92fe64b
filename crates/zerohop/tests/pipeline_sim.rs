//! The pipeline on the simulated device: real files, real io_uring and
//! pread, copies done late by worker threads, and injected faults.

mod common;

use common::{pattern, skip, write, TestDir};
use std::sync::Arc;
use std::time::Duration;
use zerohop::plan::TransferPlan;
use zerohop::staging::StagingConfig;
use zerohop::storage::{self, BackendKind, ReadBackend};
use zerohop::testing::{Fault, FaultyBackend, SimConfig, SimDevice};
use zerohop::{Device, DeviceBuffer, DirectIo, Engine, EngineConfig, ErrorKind, HotRoute};

fn sim(delay_us: u64) -> Arc<dyn Device> {
    sim_with(delay_us, SimConfig::default())
}

fn sim_with(delay_us: u64, config: SimConfig) -> Arc<dyn Device> {
    Arc::new(SimDevice::new(SimConfig {
        max_copy_delay: Duration::from_micros(delay_us),
        ..config
    }))
}

/// A simulated device given the page-cache DMA route, as a GPU has (no file
/// changes under these tests, so its CPU copies from mappings are safe).
fn sim_dma(delay_us: u64) -> Arc<dyn Device> {
    sim_with(
        delay_us,
        SimConfig {
            copies_by_dma: true,
            ..SimConfig::default()
        },
    )
}

fn config(
    slot: usize,
    slots: usize,
    threads: usize,
    direct: DirectIo,
    hot: HotRoute,
) -> EngineConfig {
    EngineConfig {
        staging: StagingConfig {
            total_bytes: slot * slots,
            slot_bytes: slot,
        },
        io_threads: threads,
        direct_io: direct,
        hot_route: hot,
        dma_window_bytes: 16 << 10,
        ..EngineConfig::default()
    }
}

fn backends() -> Vec<Arc<dyn ReadBackend>> {
    let mut v: Vec<Arc<dyn ReadBackend>> = vec![storage::backend(BackendKind::Pread).unwrap()];
    match storage::backend(BackendKind::IoUring) {
        Ok(b) => v.push(b),
        Err(e) => skip(&format!("io_uring backend unavailable here ({e})")),
    }
    v
}

/// Loads one whole file and checks the device holds exactly `data`.
fn load_exact(engine: &Engine, path: &std::path::Path, data: &[u8]) -> zerohop::TransferStats {
    let (bufs, stats) = engine.load_files(&[path], None).unwrap();
    assert!(
        read_all(engine.device().as_ref(), &bufs[0]) == data,
        "{}",
        stats.path
    );
    // The profile's parts are disjoint stretches of the workers' time.
    let p = stats.profile;
    let parts =
        p.io_seconds + p.pin_seconds + p.check_seconds + p.queue_seconds + p.copy_wait_seconds;
    assert!(parts <= p.worker_seconds * 1.001 + 1e-6, "{p:?}");
    if stats.buffered_bytes + stats.direct_bytes > 0 {
        assert!(p.io_seconds > 0.0, "{p:?}");
    }
    stats
}

fn read_all(dev: &dyn Device, buf: &DeviceBuffer) -> Vec<u8> {
    let mut out = vec![0u8; buf.len()];
    dev.read_back(buf, 0, &mut out).unwrap();
    out
}

/// Random extents (unaligned, zero-length, overlapping in the file,
/// spanning files) into two buffers; every route, backend and slot geometry.
#[test]
fn scattered_extents_arrive_exactly() {
    let dir = TestDir::new("scatter");
    let data: Vec<Vec<u8>> = (0..3)
        .map(|i| pattern(300_000 + i * 77_777, i as u64 + 1))
        .collect();
    let paths: Vec<_> = data
        .iter()
        .enumerate()
        .map(|(i, d)| write(&dir.path(&format!("f{i}")), d))
        .collect();
    let mut r = 42u64;
    let mut next = |m: u64| {
        r ^= r << 13;
        r ^= r >> 7;
        r ^= r << 17;
        r % m
    };
    for backend in backends() {
        for (direct, hot) in [
            (DirectIo::Always, HotRoute::Staged),
            (DirectIo::Never, HotRoute::Staged),
            (DirectIo::Never, HotRoute::Mapped),
            (DirectIo::Never, HotRoute::PageCacheDma),
        ] {
            for (slot, slots, threads) in [(4096, 2, 1), (8192, 6, 3), (65536, 8, 4)] {
                let dev = if hot == HotRoute::PageCacheDma {
                    sim_dma(30)
                } else {
                    sim(30)
                };
                let engine = Engine::with_backend(
                    dev.clone(),
                    config(slot, slots, threads, direct, hot),
                    backend.clone(),
                )
                .unwrap();
                let files = Engine::open_files(&paths).unwrap();
                let bufs = [dev.alloc(500_000).unwrap(), dev.alloc(123_457).unwrap()];
                let mut expect = [vec![0u8; 500_000], vec![0u8; 123_457]];
                let mut plan = TransferPlan::new();
                // Destinations never overlap (each extent gets fresh bytes).
                let mut cursor = [0u64; 2];
                for _ in 0..60 {
                    let f = next(3) as usize;
                    let b = next(2) as usize;
                    let len = next(9000).min(bufs[b].len() as u64 - cursor[b]);
                    let off = next(data[f].len() as u64 - len + 1);
                    plan.add(&files, f, off, len, &bufs[b], cursor[b]).unwrap();
                    expect[b][cursor[b] as usize..(cursor[b] + len) as usize]
                        .copy_from_slice(&data[f][off as usize..(off + len) as usize]);
                    cursor[b] += len;
                }
                let stats = engine.transfer(&files, &plan, None).unwrap();
                assert_eq!(stats.bytes, cursor.iter().sum::<u64>());
                assert_eq!(
                    stats.direct_bytes
                        + stats.buffered_bytes
                        + stats.mapped_bytes
                        + stats.page_cache_dma_bytes,
                    stats.bytes
                );
                for b in 0..2 {
                    assert!(
                        read_all(dev.as_ref(), &bufs[b]) == expect[b],
                        "{} {direct:?} {hot:?} slot {slot}",
                        backend.name()
                    );
                }
                match hot {
                    HotRoute::PageCacheDma => assert_eq!(stats.page_cache_dma_bytes, stats.bytes),
                    HotRoute::Mapped => assert_eq!(stats.mapped_bytes, stats.bytes),
                    _ => {}
                }
            }
        }
    }
}

#[test]
fn whole_files_tiny_empty_and_many_windows() {
    let dir = TestDir::new("whole");
    let sizes = [0usize, 1, 4095, 4096, 4097, 1 << 20, (1 << 20) + 13];
    let paths: Vec<_> = sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| write(&dir.path(&format!("w{i}")), &pattern(n, i as u64)))
        .collect();
    let dev = sim(20);
    // 4 KiB slots: a 1 MiB file takes 256 windows through 2 slots per worker.
    let engine = Engine::new(
        dev.clone(),
        config(4096, 4, 2, DirectIo::Auto, HotRoute::Staged),
    )
    .unwrap();
    let (bufs, stats) = engine.load_files(&paths, None).unwrap();
    assert!(stats.windows > 500);
    for (i, b) in bufs.iter().enumerate() {
        assert!(
            read_all(dev.as_ref(), b) == std::fs::read(&paths[i]).unwrap(),
            "file {i}"
        );
    }
    assert_eq!(stats.staging_bytes, 4 * 4096, "staging stays at its bound");
}

/// Reads of one window (a `get_slice`'s few rows) run on the calling
/// thread, their copy out of the mapping shared with the engine's helpers:
/// each arrives exactly, at any offset and length, one read after another
/// and from several threads at once.
#[test]
fn one_window_hot_reads_shared_with_helpers_arrive_exactly() {
    let dir = TestDir::new("one-window");
    let data = pattern((8 << 20) + 333, 7);
    let path = write(&dir.path("hot"), &data);
    let dev = sim(20);
    let engine = Engine::new(
        dev.clone(),
        config(4 << 20, 8, 4, DirectIo::Auto, HotRoute::Mapped),
    )
    .unwrap();
    let files = Engine::open_files(&[&path]).unwrap();
    let reads = [
        (0, 4 << 20),
        (4097, (1 << 20) + 5),
        (3 << 20, 512 << 10),
        (12345, 300 << 10),
        ((8 << 20) - 1000, 1000),
    ];
    let read = |(offset, len): (usize, usize)| {
        let buf = dev.alloc(len).unwrap();
        let mut plan = TransferPlan::new();
        plan.add(&files, 0, offset as u64, len as u64, &buf, 0)
            .unwrap();
        let stats = engine.transfer(&files, &plan, None).unwrap();
        assert_eq!((stats.io_threads, stats.mapped_bytes), (1, len as u64));
        assert!(
            read_all(dev.as_ref(), &buf) == data[offset..offset + len],
            "{len} bytes at {offset}"
        );
    };
    reads.into_iter().for_each(read);
    std::thread::scope(|s| {
        for _ in 0..3 {
            s.spawn(|| reads.into_iter().for_each(read));
        }
    });
}

/// A tensor-parallel rank's rows: the first half of each of many small
/// tensors, into one block. The mapped route gathers the scattered halves
/// into shared slots, and halves that follow each other in the block go to
/// the device as one copy (inside one buffer); the last ones in smaller
/// claims.
#[test]
fn halves_of_small_tensors_are_gathered_into_few_device_copies() {
    let dir = TestDir::new("halves");
    let tensors: Vec<u64> = (0..64).map(|i| (i % 4 + 1) * 48_000 + i).collect();
    let data = pattern(tensors.iter().sum::<u64>() as usize, 11);
    let path = write(&dir.path("halves"), &data);
    let sim = Arc::new(SimDevice::new(SimConfig {
        max_copy_delay: Duration::from_micros(20),
        ..SimConfig::default()
    }));
    let dev: Arc<dyn Device> = sim.clone();
    let engine = Engine::new(
        dev.clone(),
        config(1 << 20, 8, 2, DirectIo::Never, HotRoute::Mapped),
    )
    .unwrap();
    let files = Engine::open_files(&[&path]).unwrap();
    let halves: u64 = tensors.iter().map(|n| n / 2).sum();
    let block = dev.alloc(halves as usize).unwrap();
    let (mut plan, mut expect) = (TransferPlan::new(), Vec::new());
    let (mut at, mut to) = (0u64, 0u64);
    for n in &tensors {
        plan.add(&files, 0, at, n / 2, &block, to).unwrap();
        expect.extend_from_slice(&data[at as usize..(at + n / 2) as usize]);
        (at, to) = (at + n, to + n / 2);
    }
    let stats = engine.transfer(&files, &plan, None).unwrap();
    assert_eq!(stats.mapped_bytes, halves);
    assert!(read_all(dev.as_ref(), &block) == expect);
    // 3.8 MB of halves, 24 - 96 KB each, in claims of up to 1 MiB, and of
    // 256 KiB in the last 2 MiB (two workers' slots, see `plan::taper`):
    // about a dozen device copies, never one per half.
    let (copies, _) = sim.copy_counts();
    assert!(copies <= 20, "{copies} device copies for 64 halves");

    // Each half into a buffer of its own, side by side: buffers may be
    // allocations of their own, which no copy may span, so every half is
    // a device copy of its own.
    let other = dev.alloc(halves as usize).unwrap();
    let mut plan = TransferPlan::new();
    let (mut at, mut to, mut own) = (0u64, 0u64, Vec::new());
    for n in &tensors {
        // SAFETY: a range of `other`, which outlives the transfer.
        let buf =
            unsafe { DeviceBuffer::borrowed(other.addr() + to, (n / 2) as usize, other.device()) };
        plan.add(&files, 0, at, n / 2, &buf, 0).unwrap();
        own.push(buf);
        (at, to) = (at + n, to + n / 2);
    }
    engine.transfer(&files, &plan, None).unwrap();
    assert!(read_all(dev.as_ref(), &other) == expect);
    let (all, _) = sim.copy_counts();
    assert!(
        all - copies >= 64,
        "{} device copies for 64 halves in 64 buffers",
        all - copies
    );
}

/// Offsets beyond 4 GiB in a sparse file, and a bound on staging far below
/// the bytes moved.
#[test]
fn multi_gib_sparse_file_offsets() {
    let dir = TestDir::new("sparse");
    let path = dir.path("sparse");
    let f = std::fs::File::create(&path).unwrap();
    let size = (5u64 << 30) + 12345;
    f.set_len(size).unwrap();
    use std::os::unix::fs::FileExt;
    let marks = [
        (0u64, 1u64),
        (1 << 32, 2),
        ((1 << 32) + 5003, 3),
        (size - 5000, 4),
    ];
    for &(at, seed) in &marks {
        f.write_all_at(&pattern(5000, seed), at).unwrap();
    }
    drop(f);
    let dev = sim(0);
    let engine = Engine::new(
        dev.clone(),
        config(64 << 10, 4, 2, DirectIo::Auto, HotRoute::Staged),
    )
    .unwrap();
    let files = Engine::open_files(&[&path]).unwrap();
    let buf = dev.alloc(4 * 5000 + (1 << 22)).unwrap();
    let mut plan = TransferPlan::new();
    for (i, &(at, _)) in marks.iter().enumerate() {
        plan.add(&files, 0, at, 5000, &buf, i as u64 * 5000)
            .unwrap();
    }
    // 4 MiB of holes right past the 4 GiB boundary: reads of zeros.
    plan.add(&files, 0, (1 << 32) + 20_480, 1 << 22, &buf, 20_000)
        .unwrap();
    let stats = engine.transfer(&files, &plan, None).unwrap();
    let got = read_all(dev.as_ref(), &buf);
    for (i, &(_, seed)) in marks.iter().enumerate() {
        assert!(
            got[i * 5000..(i + 1) * 5000] == pattern(5000, seed)[..],
            "mark {i}"
        );
    }
    assert!(got[20_000..].iter().all(|&b| b == 0));
    assert!(stats.staging_bytes <= 4 * (64 << 10));
}

/// O_DIRECT asked for on tmpfs: older kernels refuse it there and the
/// load falls back to buffered reads; Linux 6.6 and later accept it, and
/// the reads are direct. Either way every byte arrives.
#[test]
fn tmpfs_loads_direct_where_it_accepts_o_direct_else_buffered() {
    let shm = std::path::Path::new("/dev/shm");
    if !shm.is_dir() {
        return skip("no /dev/shm");
    }
    let dir = TestDir::under(shm, "tmpfs");
    let data = pattern(200_000, 9);
    let path = write(&dir.path("m"), &data);
    let dev = sim(10);
    let engine = Engine::new(
        dev.clone(),
        config(8192, 4, 2, DirectIo::Always, HotRoute::Staged),
    )
    .unwrap();
    let stats = load_exact(&engine, &path, &data);
    let len = data.len() as u64;
    let want = match zerohop::machine::o_direct_supported(&path) {
        Ok(()) => (len, 0),
        Err(_) => (0, len),
    };
    let got = (stats.direct_bytes, stats.buffered_bytes);
    assert_eq!(got, want, "(direct, buffered) bytes via {}", stats.path);
}

#[test]
fn refused_direct_reads_fall_back_to_buffered() {
    let dir = TestDir::under(std::path::Path::new(env!("CARGO_TARGET_TMPDIR")), "refuse");
    let data = pattern(700_001, 6);
    let path = write(&dir.path("r"), &data);
    for backend in backends() {
        let dev = sim(10);
        let b = Arc::new(FaultyBackend::new(backend, vec![Fault::RefuseDirect]));
        let engine = Engine::with_backend(
            dev.clone(),
            config(65536, 4, 2, DirectIo::Always, HotRoute::Staged),
            b,
        )
        .unwrap();
        let stats = load_exact(&engine, &path, &data);
        assert_eq!(
            (stats.direct_bytes, stats.buffered_bytes),
            (0, data.len() as u64),
            "{}",
            stats.path
        );
    }
}

#[test]
fn direct_reads_are_used_where_allowed() {
    let dir = TestDir::under(std::path::Path::new(env!("CARGO_TARGET_TMPDIR")), "direct");
    let data = pattern(1_000_003, 5);
    let path = write(&dir.path("d"), &data);
    if let Err(why) = zerohop::machine::o_direct_supported(&path) {
        return skip(&format!(
            "O_DIRECT unavailable in {} ({why})",
            dir.0.display()
        ));
    }
    let dev = sim(10);
    let engine = Engine::new(
        dev.clone(),
        config(65536, 4, 2, DirectIo::Always, HotRoute::Staged),
    )
    .unwrap();
    let stats = load_exact(&engine, &path, &data);
    assert_eq!(stats.direct_bytes, data.len() as u64, "{}", stats.path);
}

fn faulty(faults: Vec<Fault>, backend: Arc<dyn ReadBackend>) -> zerohop::Error {
    let dir = TestDir::new("fault");
    let path = write(&dir.path("f"), &pattern(1 << 20, 3));
    let dev = sim(50);
    let b = Arc::new(FaultyBackend::new(backend, faults));
    let engine = Engine::with_backend(
        dev,
        config(16384, 8, 4, DirectIo::Never, HotRoute::Staged),
        b,
    )
    .unwrap();
    engine
        .load_files(&[&path], None)
        .expect_err("a fault must fail the transfer")
}

#[test]
fn injected_eio_and_short_reads_fail_cleanly() {
    for backend in backends() {
        let e = faulty(vec![Fault::Eio { at: 700_000 }], backend.clone());
        assert_eq!(e.kind(), ErrorKind::Io);
        assert!(e.to_string().contains("Input/output error"), "{e}");
        let e = faulty(vec![Fault::ShortRead { at: 500_001 }], backend.clone());
        assert_eq!(e.kind(), ErrorKind::Io);
        assert!(
            e.to_string().contains("file ended at byte") && e.to_string().contains("truncated"),
            "{e}"
        );
    }
}

#[test]
fn failed_copies_and_out_of_memory_are_errors() {
    let dir = TestDir::new("copyfail");
    let path = write(&dir.path("f"), &pattern(300_000, 3));
    let dev: Arc<dyn Device> = Arc::new(SimDevice::new(SimConfig {
        fail_copy: Some(7),
        ..Default::default()
    }));
    let engine = Engine::new(dev, config(8192, 4, 2, DirectIo::Never, HotRoute::Staged)).unwrap();
    let e = engine.load_files(&[&path], None).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Device);
    assert!(e.to_string().contains("injected copy failure"), "{e}");

    let dev: Arc<dyn Device> = Arc::new(SimDevice::new(SimConfig {
        memory_limit: Some(100_000),
        ..Default::default()
    }));
    let engine = Engine::new(dev, config(8192, 4, 2, DirectIo::Never, HotRoute::Staged)).unwrap();
    let e = engine.load_files(&[&path], None).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::OutOfMemory, "{e}");
}

/// A staging pool whose pinning failed fails the load that met it, with
/// the device's error, and is made again by the next load, which arrives
/// exactly.
#[test]
fn a_pool_that_failed_to_pin_is_made_again() {
    let dir = TestDir::new("pool-fails");
    let data = pattern(300_000, 6);
    let path = write(&dir.path("f"), &data);
    let dev = sim_with(
        50,
        SimConfig {
            failing_pools: 1,
            ..SimConfig::default()
        },
    );
    let engine = Engine::new(dev, config(8192, 6, 3, DirectIo::Never, HotRoute::Staged)).unwrap();
    let e = engine.load_files(&[&path], None).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Device, "{e}");
    assert!(e.to_string().contains("pin the staging pool"), "{e}");
    load_exact(&engine, &path, &data);
}

/// The engine makes its copy queues up front and loads keep them: loads
/// make none, and a load after a failed one still arrives exactly (a queue
/// is kept only once idle).
#[test]
fn copy_queues_are_kept_between_loads() {
    let dir = TestDir::new("queues");
    let data = pattern(300_000, 4);
    let path = write(&dir.path("f"), &data);
    let sim = Arc::new(SimDevice::new(SimConfig {
        fail_copy: Some(7),
        max_copy_delay: Duration::from_micros(50),
        ..Default::default()
    }));
    let dev: Arc<dyn Device> = sim.clone();
    let engine = Engine::new(dev, config(8192, 6, 3, DirectIo::Never, HotRoute::Staged)).unwrap();
    assert_eq!(sim.queues_made(), 3, "one per I/O thread");
    let e = engine.load_files(&[&path], None).unwrap_err();
    assert!(e.to_string().contains("injected copy failure"), "{e}");
    // The failed queue is dropped, and replaced when a later load has more
    // workers at once than the pool holds (whether one does is a matter of
    // thread timing); the others are kept, so loads never make more.
    for _ in 0..5 {
        load_exact(&engine, &path, &data);
    }
    let made = sim.queues_made();
    assert!(
        (3..=4).contains(&made),
        "later loads reuse the queues: {made} made"
    );
}

#[test]
fn bad_paths_are_clear_errors() {
    let dir = TestDir::new("badpath");
    let e = Engine::open_files(&[dir.path("missing")]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound);
    let e = Engine::open_files(&[&dir.0]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput);
    assert!(e.to_string().contains("directory"), "{e}");
}

#[test]
fn unreadable_files_are_permission_errors() {
    let dir = TestDir::new("unreadable");
    // SAFETY: geteuid has no preconditions.
    let p = if unsafe { libc_geteuid() } == 0 {
        // Root bypasses file modes, but not a sysfs attribute that has
        // nothing to read.
        let rescan = std::path::PathBuf::from("/sys/bus/pci/rescan");
        if !rescan.exists() {
            return skip("running as root, and no write-only sysfs file to try");
        }
        rescan
    } else {
        use std::os::unix::fs::PermissionsExt;
        let p = write(&dir.path("secret"), b"x");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o000)).unwrap();
        p
    };
    let e = Engine::open_files(&[&p]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::PermissionDenied, "{e}");
}

extern "C" {
    #[link_name = "geteuid"]
    fn libc_geteuid() -> u32;
}

#[test]
fn plan_rejects_out_of_range_extents() {
    let dir = TestDir::new("range");
    let path = write(&dir.path("f"), &pattern(1000, 1));
    let dev = sim(0);
    let files = Engine::open_files(&[&path]).unwrap();
    let buf = dev.alloc(100).unwrap();
    let mut plan = TransferPlan::new();
    assert_eq!(
        plan.add(&files, 0, 990, 20, &buf, 0).unwrap_err().kind(),
        ErrorKind::Io
    );
    assert_eq!(
        plan.add(&files, 0, 0, 101, &buf, 0).unwrap_err().kind(),
        ErrorKind::InvalidInput
    );
    assert_eq!(
        plan.add(&files, 1, 0, 1, &buf, 0).unwrap_err().kind(),
        ErrorKind::InvalidInput
    );
    assert_eq!(
        plan.add(&files, 0, u64::MAX, 2, &buf, 0)
            .unwrap_err()
            .kind(),
        ErrorKind::Io
    );
    // A plan run with fewer files than it was planned with.
    let two = Engine::open_files(&[&path, &path]).unwrap();
    let mut plan = TransferPlan::new();
    plan.add(&two, 1, 0, 10, &buf, 0).unwrap();
    let engine = Engine::new(dev, config(4096, 2, 1, DirectIo::Never, HotRoute::Staged)).unwrap();
    let e = engine.transfer(&files, &plan, None).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput, "{e}");
}

#[test]
fn device_names_are_checked() {
    assert_eq!(
        zerohop::open_device("tpu:0").err().unwrap().kind(),
        ErrorKind::InvalidInput
    );
    assert_eq!(
        zerohop::open_device("cuda:x").err().unwrap().kind(),
        ErrorKind::InvalidInput
    );
    // cuda:99 is either no GPU at all here, or an invalid index on a GPU machine.
    let k = zerohop::open_device("cuda:99").err().unwrap().kind();
    assert!(
        matches!(k, ErrorKind::NoGpu | ErrorKind::InvalidInput),
        "{k:?}"
    );
}

#[test]
fn files_read_into_caller_host_memory() {
    let dir = TestDir::under(std::path::Path::new(env!("CARGO_TARGET_TMPDIR")), "host");
    let data = pattern((20 << 20) + 4096 * 3 + 17, 12);
    let path = write(&dir.path("h"), &data);
    let files = Engine::open_files(&[&path]).unwrap();
    for backend in backends() {
        for direct in [DirectIo::Never, DirectIo::Always] {
            let engine = Engine::with_backend(
                sim(0),
                config(8192, 4, 3, direct, HotRoute::Staged),
                backend.clone(),
            )
            .unwrap();
            // An aligned destination (O_DIRECT possible) and an odd one.
            let layout = std::alloc::Layout::from_size_align(data.len(), 4096).unwrap();
            // SAFETY: non-zero size; freed below.
            let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
            // SAFETY: we own `data.len()` zeroed bytes at `ptr`.
            let aligned = unsafe { std::slice::from_raw_parts_mut(ptr, data.len()) };
            let stats = engine
                .read_to_host(&files[0], 0, &mut aligned[..20 << 20])
                .unwrap();
            assert!(aligned[..20 << 20] == data[..20 << 20]);
            assert_eq!(stats.direct_bytes + stats.buffered_bytes, 20 << 20);
            if direct == DirectIo::Always && files[0].direct_capable() {
                assert_eq!(stats.direct_bytes, 20 << 20, "{}", stats.path);
            }
            let mut odd = vec![0u8; 5_000_001];
            engine.read_to_host(&files[0], 777, &mut odd).unwrap();
            assert!(odd[..] == data[777..777 + odd.len()]);
            let e = engine
                .read_to_host(&files[0], data.len() as u64 - 10, &mut odd)
                .unwrap_err();
            assert_eq!(e.kind(), ErrorKind::Io);
            // SAFETY: allocated above with this layout.
            unsafe { std::alloc::dealloc(ptr, layout) };
        }
    }
}

/// A file truncated to half its size during a load, on every hot route
/// (the mapped one copies with the CPU out of the shrinking mapping): a
/// clear error that says how the file changed, never a crash.
#[test]
fn a_file_truncated_during_a_load_is_a_clear_error() {
    let dir = TestDir::new("truncate");
    for hot in [HotRoute::Staged, HotRoute::Mapped, HotRoute::PageCacheDma] {
        let path = write(&dir.path("t"), &pattern(4 << 20, 17));
        let dev = if hot == HotRoute::PageCacheDma {
            sim_dma(50)
        } else {
            sim(50)
        };
        let engine = Engine::new(dev, config(8192, 4, 2, DirectIo::Never, hot)).unwrap();
        let once = std::sync::Once::new();
        let truncate = |_: u64| {
            once.call_once(|| {
                let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
                f.set_len(2 << 20).unwrap();
            })
        };
        let e = engine.load_files(&[&path], Some(&truncate)).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Io, "{hot:?}: {e}");
        assert!(
            e.to_string()
                .contains("shrank from 4 MiB to 2 MiB since it was opened"),
            "{hot:?}: {e}"
        );
    }
}

/// A file rewritten in place (same size) during a load is an error too.
#[test]
fn a_file_modified_during_a_load_is_a_clear_error() {
    let dir = TestDir::new("modified");
    let path = write(&dir.path("m"), &pattern(1 << 20, 18));
    let engine = Engine::new(
        sim(10),
        config(8192, 4, 2, DirectIo::Never, HotRoute::Staged),
    )
    .unwrap();
    let once = std::sync::Once::new();
    let rewrite = |_: u64| {
        once.call_once(|| {
            let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
            // A modification time no earlier write can have had.
            f.set_modified(std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(1000))
                .unwrap();
        })
    };
    let e = engine.load_files(&[&path], Some(&rewrite)).unwrap_err();
    assert!(
        e.to_string().contains("was modified since it was opened"),
        "{e}"
    );
    // Host reads check too.
    let files = Engine::open_files(&[&path]).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(1000)
        .unwrap();
    let mut dst = vec![0u8; 1 << 20];
    let e = engine.read_to_host(&files[0], 0, &mut dst).unwrap_err();
    assert!(e.to_string().contains("shrank from 1 MiB to 1000 B"), "{e}");
}

/// Two different files under one label (as a client's descriptors may be)
/// are two files to a host read: both counted, both checked for changes.
#[test]
fn host_reads_tell_files_apart_by_identity_not_label() {
    let dir = TestDir::new("same-label");
    let (a, b) = (
        write(&dir.path("a"), &pattern(1 << 20, 19)),
        write(&dir.path("b"), &pattern(1 << 20, 20)),
    );
    let label = std::path::Path::new("model.safetensors");
    let open = |p: &std::path::Path| {
        zerohop::storage::SourceFile::from_descriptors(std::fs::File::open(p).unwrap(), None, label)
            .unwrap()
    };
    let (fa, fb) = (open(&a), open(&b));
    let engine = Engine::new(
        sim(10),
        config(8192, 4, 2, DirectIo::Never, HotRoute::Staged),
    )
    .unwrap();
    let (mut da, mut db) = (vec![0u8; 1 << 20], vec![0u8; 1 << 20]);
    let stats = engine
        .read_many_to_host(vec![(&fa, 0, &mut da[..]), (&fb, 0, &mut db[..])])
        .unwrap();
    assert_eq!(stats.files, 2);
    assert!(da == pattern(1 << 20, 19) && db == pattern(1 << 20, 20));
    // The first of the two changes: still seen, though the second has the
    // same label.
    std::fs::OpenOptions::new()
        .write(true)
        .open(&a)
        .unwrap()
        .set_modified(std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(1000))
        .unwrap();
    let e = engine
        .read_many_to_host(vec![(&fa, 0, &mut da[..]), (&fb, 0, &mut db[..])])
        .unwrap_err();
    assert!(
        e.to_string().contains("was modified since it was opened"),
        "{e}"
    );
}

/// A FIFO (or any file that is not regular) is refused at once, naming the
/// path and what it is; the open runs on a thread so a regression fails
/// the test instead of hanging the suite.
#[test]
fn a_fifo_is_refused_without_blocking() {
    let dir = TestDir::new("fifo");
    let fifo = dir.path("pipe");
    rustix::fs::mknodat(
        rustix::fs::CWD,
        &fifo,
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o600),
        0,
    )
    .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let opening = fifo.clone();
    std::thread::spawn(move || {
        let _ = tx.send(Engine::open_files(&[&opening]).map(drop));
    });
    let e = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("opening a FIFO must not block")
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput);
    let msg = e.to_string();
    assert!(
        msg.contains(&fifo.display().to_string()) && msg.contains("FIFO"),
        "{msg}"
    );
    // Nor does opening one to write into it.
    let (tx, rx) = std::sync::mpsc::channel();
    let opening = fifo.clone();
    std::thread::spawn(move || {
        let _ = tx.send(zerohop::storage::SinkFile::open_for_update(&opening, 0).map(drop));
    });
    let e = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("opening a FIFO must not block")
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput);
    assert!(e.to_string().contains("FIFO"), "{e}");
}

/// A device whose copies are CPU copies never reads file mappings: asked for
/// page-cache DMA, it takes the mapped-copy route, and the transfer says why.
#[test]
fn page_cache_dma_needs_a_device_that_copies_by_dma() {
    let dir = TestDir::new("no-dma");
    let data = pattern(1 << 20, 5);
    let path = write(&dir.path("f"), &data);
    let dev = sim(20);
    let c = config(8192, 4, 2, DirectIo::Never, HotRoute::PageCacheDma);
    let stats = load_exact(&Engine::new(dev, c).unwrap(), &path, &data);
    assert_eq!(
        (stats.page_cache_dma_bytes, stats.mapped_bytes),
        (0, data.len() as u64)
    );
    assert!(
        stats.notes.iter().any(|n| n.contains("copies by DMA")),
        "{:?}",
        stats.notes
    );
}

#[test]
fn auto_measures_both_hot_routes_then_keeps_the_faster() {
    let dir = TestDir::new("dma-auto");
    let data = pattern(3 << 20, 21);
    let path = write(&dir.path("hot"), &data);
    let mut c = config(65536, 8, 2, DirectIo::Auto, HotRoute::Auto);
    c.hot_probe_bytes = 256 << 10;
    let engine = Engine::new(sim_dma(20), c).unwrap();
    let first = load_exact(&engine, &path, &data);
    assert!(
        first.notes.iter().any(|n| n.contains("hot route measured")),
        "{:?}",
        first.notes
    );
    assert!(
        first.mapped_bytes >= 256 << 10 && first.page_cache_dma_bytes >= 256 << 10,
        "{first:?}"
    );
    let second = load_exact(&engine, &path, &data);
    assert!(
        second.notes.iter().all(|n| n.contains("measured earlier")),
        "{:?}",
        second.notes
    );
    assert!(
        second.mapped_bytes == 0 || second.page_cache_dma_bytes == 0,
        "one route after the choice"
    );
}

#[test]
fn the_hot_choice_is_remembered_across_engines_in_a_file() {
    let dir = TestDir::new("dma-choice");
    let path = write(&dir.path("hot"), &pattern(2 << 20, 4));
    let mut c = config(65536, 8, 2, DirectIo::Auto, HotRoute::Auto);
    c.hot_probe_bytes = 128 << 10;
    c.hot_choice_file = Some(dir.path("cache/hot-route.json"));
    let notes = |c: EngineConfig| {
        let engine = Engine::new(sim_dma(20), c).unwrap();
        engine.load_files(&[&path], None).unwrap().1.notes
    };
    let first = notes(c.clone());
    assert!(
        first
            .iter()
            .any(|n| n.contains("measured on this transfer")),
        "{first:?}"
    );
    let second = notes(c);
    assert!(
        second
            .iter()
            .any(|n| n.contains("measured earlier (kept in")),
        "{second:?}"
    );
}

#[test]
fn refused_pins_fall_back_to_staging_with_a_note() {
    let dir = TestDir::new("dma-pinfail");
    let data = pattern(1 << 20, 8);
    let path = write(&dir.path("f"), &data);
    let dev = sim_with(
        20,
        SimConfig {
            refuse_pin: true,
            copies_by_dma: true,
            ..SimConfig::default()
        },
    );
    let c = config(8192, 4, 2, DirectIo::Never, HotRoute::PageCacheDma);
    let stats = load_exact(&Engine::new(dev, c).unwrap(), &path, &data);
    assert_eq!(
        (stats.page_cache_dma_bytes, stats.buffered_bytes),
        (0, data.len() as u64)
    );
    assert!(
        stats
            .notes
            .iter()
            .any(|n| n.contains("injected pin refusal")),
        "{:?}",
        stats.notes
    );
}

//! The write pipeline on the simulated device: device ranges into real
//! files (O_DIRECT where aligned), copies done late by worker threads,
//! injected write faults, and the safetensors writer.

mod common;

use common::{pattern, skip, TestDir};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use zerohop::plan::TransferPlan;
use zerohop::safetensors::{load_safetensors, save_safetensors, Allocation, Dtype, TensorToSave};
use zerohop::staging::StagingConfig;
use zerohop::storage::{PwriteBackend, SinkFile};
use zerohop::testing::{FaultyWriteBackend, SimConfig, SimDevice, WriteFault};
use zerohop::{Device, Direction, Engine, EngineConfig, ErrorKind};

fn engine(slot: usize, slots: usize, threads: usize) -> Engine {
    let dev: Arc<dyn Device> = Arc::new(SimDevice::new(SimConfig {
        max_copy_delay: Duration::from_micros(300),
        ..Default::default()
    }));
    let config = EngineConfig {
        staging: StagingConfig {
            total_bytes: slot * slots,
            slot_bytes: slot,
        },
        io_threads: threads,
        ..EngineConfig::default()
    };
    Engine::new(dev, config).unwrap()
}

fn upload(e: &Engine, data: &[u8]) -> zerohop::DeviceBuffer {
    let b = e.device().alloc(data.len()).unwrap();
    e.device().write_from_host(&b, 0, data).unwrap();
    b
}

/// Scattered device ranges (unaligned, zero-length, across two files and
/// two buffers) arrive at their file offsets; untouched bytes stay zero.
#[test]
fn scattered_ranges_land_exactly() {
    let dir = TestDir::new("write-scatter");
    let e = engine(16 << 10, 8, 3);
    let src = [pattern(300_001, 1), pattern(77_777, 2)];
    let bufs: Vec<_> = src.iter().map(|d| upload(&e, d)).collect();
    let lens = [400_000u64, 123_457];
    let files: Vec<SinkFile> = lens
        .iter()
        .enumerate()
        .map(|(i, &n)| SinkFile::create_new(&dir.path(&format!("f{i}")), n).unwrap())
        .collect();
    let mut expect: Vec<Vec<u8>> = lens.iter().map(|&n| vec![0u8; n as usize]).collect();
    let mut plan = TransferPlan::new();
    // (file, file offset, len, buffer, buffer offset): disjoint in each file.
    let pieces = [
        (0, 0, 4096, 0, 0),
        (0, 4096, 200_000, 0, 5),
        (0, 204_096, 0, 1, 0),
        (0, 250_001, 99_999, 0, 200_001),
        (1, 17, 77_000, 1, 777),
        (1, 100_000, 23_457, 0, 1),
        (0, 350_000, 50_000, 1, 0),
    ];
    for (f, off, len, b, boff) in pieces {
        plan.add(&files, f, off, len, &bufs[b], boff).unwrap();
        expect[f][off as usize..(off + len) as usize]
            .copy_from_slice(&src[b][boff as usize..(boff + len) as usize]);
    }
    let stats = e.write(&files, &plan, None, None).unwrap();
    assert_eq!(stats.direction, Direction::Save);
    assert_eq!(stats.direct_bytes + stats.buffered_bytes, plan.bytes());
    assert!(stats.path.contains("fsync"), "{}", stats.path);
    if files[0].direct_capable() {
        // Aligned runs went around the page cache.
        assert!(
            stats.direct_bytes > 0 && stats.buffered_bytes > 0,
            "{stats:?}"
        );
    } else {
        skip("the O_DIRECT part (the temp file system refuses O_DIRECT)");
    }
    drop(files);
    for (i, want) in expect.iter().enumerate() {
        assert!(
            std::fs::read(dir.path(&format!("f{i}"))).unwrap() == *want,
            "file {i}"
        );
    }
}

/// One file of a memory file system written by several workers goes
/// through a mapping of it (tmpfs serializes `write()`s into one file), and
/// every byte lands; written by as many workers as files, it does not.
#[test]
fn one_file_on_tmpfs_shared_by_workers_is_written_through_a_mapping() {
    let shm = std::path::Path::new("/dev/shm");
    let on_tmpfs = std::fs::File::open(shm).is_ok_and(|d| zerohop::storage::in_memory(&d));
    if !on_tmpfs {
        return skip("/dev/shm is not a memory file system here");
    }
    let dir = TestDir::under(shm, "write-mapped");
    let e = engine(16 << 10, 8, 4);
    let data = pattern((600 << 10) + 77, 9);
    let buf = upload(&e, &data);
    let files = vec![SinkFile::create_new(&dir.path("one"), data.len() as u64 + 4096).unwrap()];
    let mut plan = TransferPlan::new();
    plan.add(&files, 0, 4096, data.len() as u64, &buf, 0)
        .unwrap();
    e.write_host_bytes(&files[0], 0, b"head").unwrap();
    let stats = e.write(&files, &plan, None, None).unwrap();
    assert_eq!(stats.mapped_bytes, data.len() as u64, "{stats:?}");
    assert!(stats.path.contains("file mappings"), "{}", stats.path);
    drop(files);
    let back = std::fs::read(dir.path("one")).unwrap();
    assert_eq!(&back[..4], b"head");
    assert!(back[4..4096].iter().all(|&b| b == 0));
    assert!(back[4096..] == data[..], "the mapped write put other bytes");

    let per_worker: Vec<SinkFile> = (0..4)
        .map(|i| SinkFile::create_new(&dir.path(&format!("f{i}")), 8192).unwrap())
        .collect();
    let mut plan = TransferPlan::new();
    for i in 0..4 {
        plan.add(&per_worker, i, 0, 8192, &buf, i as u64 * 8192)
            .unwrap();
    }
    let stats = e.write(&per_worker, &plan, None, None).unwrap();
    assert_eq!(stats.mapped_bytes, 0, "{stats:?}");
}

/// Writes into local files go in windows of `write_window_bytes` (finer
/// than the slots), and every byte lands; a write a filter sees keeps
/// windows of whole slots (a filter's chunks lie inside one window).
#[test]
fn write_windows_are_cut_finer_than_slots_unless_filtered() {
    let dir = TestDir::new("write-windows");
    let slot = 64 << 10;
    let dev: Arc<dyn Device> = Arc::new(SimDevice::new(SimConfig::default()));
    let config = EngineConfig {
        staging: StagingConfig {
            total_bytes: slot * 8,
            slot_bytes: slot,
        },
        io_threads: 3,
        write_window_bytes: 16 << 10,
        ..EngineConfig::default()
    };
    let e = Engine::new(dev, config).unwrap();
    let data = pattern((1 << 20) + 333, 4);
    let buf = upload(&e, &data);
    let write = |name: &str, filter: Option<zerohop::WriteFilter<'_>>| {
        let files = vec![SinkFile::create_new(&dir.path(name), data.len() as u64).unwrap()];
        let mut plan = TransferPlan::new();
        plan.add(&files, 0, 0, data.len() as u64, &buf, 0).unwrap();
        let stats = e.write(&files, &plan, filter, None).unwrap();
        drop(files);
        assert!(
            std::fs::read(dir.path(name)).unwrap() == data,
            "{name}: other bytes"
        );
        stats.windows
    };
    assert_eq!(write("plain", None), data.len().div_ceil(16 << 10));
    let all = |_: usize, _: u64, bytes: &[u8]| Ok(std::iter::once(0..bytes.len() as u64).collect());
    assert_eq!(write("filtered", Some(&all)), data.len().div_ceil(slot));
}

#[test]
fn overlapping_ranges_are_refused() {
    let dir = TestDir::new("write-overlap");
    let e = engine(16 << 10, 4, 2);
    let b = upload(&e, &pattern(8192, 3));
    let files = vec![SinkFile::create_new(&dir.path("f"), 8192).unwrap()];
    let mut plan = TransferPlan::new();
    plan.add(&files, 0, 0, 5000, &b, 0).unwrap();
    plan.add(&files, 0, 4999, 100, &b, 0).unwrap();
    let err = e.write(&files, &plan, None, None).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
    // And past the end of the file is refused when planning.
    assert!(plan.add(&files, 0, 8000, 193, &b, 0).is_err());
}

/// A simulated device that claims DMA copies still stages through plain
/// host memory, and the stats say so.
#[test]
fn stats_report_staging_as_it_is() {
    let dir = TestDir::new("write-unpinned");
    let dev: Arc<dyn Device> = Arc::new(SimDevice::new(SimConfig {
        copies_by_dma: true,
        ..Default::default()
    }));
    let e = Engine::new(dev, EngineConfig::default()).unwrap();
    let b = upload(&e, &pattern(8192, 4));
    let files = vec![SinkFile::create_new(&dir.path("f"), 8192).unwrap()];
    let mut plan = TransferPlan::new();
    plan.add(&files, 0, 0, 8192, &b, 0).unwrap();
    let stats = e.write(&files, &plan, None, None).unwrap();
    assert!(!stats.pinned_staging);
}

/// ENOSPC, EIO and a failed fsync are errors, never success.
#[test]
fn write_faults_surface() {
    let dir = TestDir::new("write-faults");
    let data = pattern(1 << 20, 4);
    for (i, (fault, kind)) in [
        (WriteFault::NoSpace { at: 700_000 }, ErrorKind::StorageFull),
        (WriteFault::Eio { at: 300_000 }, ErrorKind::Io),
        (WriteFault::SyncFails, ErrorKind::Io),
    ]
    .into_iter()
    .enumerate()
    {
        let e = engine(64 << 10, 6, 3).with_write_backend(Arc::new(FaultyWriteBackend::new(
            Arc::new(PwriteBackend),
            vec![fault],
        )));
        let b = upload(&e, &data);
        let files =
            vec![SinkFile::create_new(&dir.path(&format!("f{i}")), data.len() as u64).unwrap()];
        let mut plan = TransferPlan::new();
        plan.add(&files, 0, 0, data.len() as u64, &b, 0).unwrap();
        let err = e.write(&files, &plan, None, None).unwrap_err();
        assert_eq!(err.kind(), kind, "{fault:?}: {err}");
    }
}

/// A failing device copy fails the save.
#[test]
fn copy_failure_fails_the_save() {
    let dir = TestDir::new("write-copyfail");
    let dev: Arc<dyn Device> = Arc::new(SimDevice::new(SimConfig {
        fail_copy: Some(3),
        ..Default::default()
    }));
    let e = Engine::new(
        dev,
        EngineConfig {
            staging: StagingConfig {
                total_bytes: 8 * 4096,
                slot_bytes: 4096,
            },
            io_threads: 2,
            ..EngineConfig::default()
        },
    )
    .unwrap();
    let b = upload(&e, &pattern(100_000, 5));
    let files = vec![SinkFile::create_new(&dir.path("f"), 100_000).unwrap()];
    let mut plan = TransferPlan::new();
    plan.add(&files, 0, 0, 100_000, &b, 0).unwrap();
    let err = e.write(&files, &plan, None, None).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Device, "{err}");
}

/// Saves take their copy queues from the engine's, as loads do: five saves
/// make none, and a save after a failed copy still lands exactly (a queue
/// is kept only once idle).
#[test]
fn saves_keep_the_engines_copy_queues() {
    let dir = TestDir::new("write-queues");
    let sim = Arc::new(SimDevice::new(SimConfig {
        fail_copy: Some(3),
        max_copy_delay: Duration::from_micros(50),
        ..Default::default()
    }));
    let dev: Arc<dyn Device> = sim.clone();
    let config = EngineConfig {
        staging: StagingConfig {
            total_bytes: 8 * 4096,
            slot_bytes: 4096,
        },
        io_threads: 2,
        ..EngineConfig::default()
    };
    let e = Engine::new(dev, config).unwrap();
    assert_eq!(sim.queues_made(), 2, "one per I/O thread");
    let data = pattern(100_000, 6);
    let b = upload(&e, &data);
    let save = |name: &str| {
        let files = vec![SinkFile::create_new(&dir.path(name), 100_000).unwrap()];
        let mut plan = TransferPlan::new();
        plan.add(&files, 0, 0, 100_000, &b, 0).unwrap();
        e.write(&files, &plan, None, None).map(|_| ())
    };
    let err = save("failed").unwrap_err();
    assert!(err.to_string().contains("injected copy failure"), "{err}");
    for i in 0..5 {
        save(&format!("f{i}")).unwrap();
        assert_eq!(std::fs::read(dir.path(&format!("f{i}"))).unwrap(), data);
    }
    // The failed queue is dropped and replaced once; the rest are reused.
    let made = sim.queues_made();
    assert!(
        (2..=3).contains(&made),
        "saves reuse the queues: {made} made"
    );
}

/// The safetensors writer's output loads back through the loader with the
/// same names, types, shapes and bytes; a failed save leaves the old file.
#[test]
fn safetensors_round_trip_and_atomic_replace() {
    let dir = TestDir::new("write-st");
    let e = engine(16 << 10, 8, 3);
    let specs: [(&str, Dtype, Vec<u64>); 4] = [
        ("embed", Dtype::BF16, vec![123, 77]),
        ("empty", Dtype::F32, vec![0, 5]),
        ("scale", Dtype::F8_E4M3, vec![1]),
        ("w", Dtype::I64, vec![3, 1001]),
    ];
    let mut tensors = Vec::new();
    let mut want = BTreeMap::new();
    for (i, (name, dtype, shape)) in specs.iter().enumerate() {
        let n = dtype.byte_len(shape).unwrap();
        let data = pattern(n as usize, 10 + i as u64);
        tensors.push(TensorToSave {
            name: name.to_string(),
            dtype: *dtype,
            shape: shape.clone(),
            data: upload(&e, &data),
        });
        want.insert(name.to_string(), data);
    }
    let meta = BTreeMap::from([("format".to_string(), "pt".to_string())]);
    let path = dir.path("m.safetensors");
    let stats = save_safetensors(&e, &path, &tensors, &meta, None).unwrap();
    assert_eq!(
        stats.bytes,
        want.values().map(|v| v.len() as u64).sum::<u64>()
    );
    let loaded = load_safetensors(&e, &[&path], Allocation::PerTensor, None).unwrap();
    assert_eq!(loaded.tensors.len(), 4);
    for t in &loaded.tensors {
        let mut got = vec![0u8; t.buffer.len()];
        e.device().read_back(&t.buffer, 0, &mut got).unwrap();
        assert!(got == want[&t.name], "{}", t.name);
    }
    // A save that fails (disk full) leaves the previous file as it was and
    // no temporary file behind.
    let before = std::fs::read(&path).unwrap();
    let full = engine(16 << 10, 8, 3).with_write_backend(Arc::new(FaultyWriteBackend::new(
        Arc::new(PwriteBackend),
        vec![WriteFault::NoSpace { at: 20_000 }],
    )));
    let again = copy_to(&e, &full, &tensors);
    let err = save_safetensors(&full, &path, &again, &meta, None).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::StorageFull, "{err}");
    assert!(std::fs::read(&path).unwrap() == before);
    // Full already while writing the header.
    let no_room = engine(16 << 10, 8, 3).with_write_backend(Arc::new(FaultyWriteBackend::new(
        Arc::new(PwriteBackend),
        vec![WriteFault::NoSpace { at: 100 }],
    )));
    let err = save_safetensors(
        &no_room,
        &path,
        &copy_to(&e, &no_room, &tensors),
        &meta,
        None,
    )
    .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::StorageFull, "{err}");
    assert!(std::fs::read(&path).unwrap() == before);
    let names: Vec<_> = std::fs::read_dir(&dir.0)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, vec![std::ffi::OsString::from("m.safetensors")]);
}

/// The same tensors, copied from `from`'s device memory into `to`'s.
fn copy_to(from: &Engine, to: &Engine, tensors: &[TensorToSave]) -> Vec<TensorToSave> {
    tensors
        .iter()
        .map(|t| {
            let mut bytes = vec![0u8; t.data.len()];
            from.device().read_back(&t.data, 0, &mut bytes).unwrap();
            TensorToSave {
                data: upload(to, &bytes),
                ..t.clone()
            }
        })
        .collect()
}

#[test]
fn bad_tensors_are_refused() {
    let dir = TestDir::new("write-bad");
    let e = engine(16 << 10, 4, 2);
    let t = |name: &str, shape: Vec<u64>, n: usize| TensorToSave {
        name: name.into(),
        dtype: Dtype::F32,
        shape,
        data: upload(&e, &vec![1u8; n]),
    };
    let meta = BTreeMap::new();
    for tensors in [
        vec![t("a", vec![2], 7)],
        vec![t("a", vec![1], 4), t("a", vec![1], 4)],
        vec![t("__metadata__", vec![1], 4)],
    ] {
        let err =
            save_safetensors(&e, &dir.path("x.safetensors"), &tensors, &meta, None).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
    }
    assert!(!dir.path("x.safetensors").exists());
}

/// Buffers borrowed with the framework's stream: loads and saves wait for
/// that stream's queued work first (once per stream per transfer), and the
/// bytes land as for any buffer.
#[test]
fn borrowed_buffers_wait_for_their_stream() {
    let dir = TestDir::new("write-stream");
    let sim = Arc::new(SimDevice::new(SimConfig::default()));
    let dev: Arc<dyn Device> = sim.clone();
    let e = Engine::new(dev, EngineConfig::default()).unwrap();
    let data = pattern(300_000, 21);
    let owned = upload(&e, &data);
    // SAFETY: `owned` outlives the borrowed views; the stream ids are
    // opaque to the simulated device.
    let (a, b) = unsafe {
        (
            zerohop::DeviceBuffer::borrowed_on_stream(
                owned.addr(),
                150_000,
                zerohop::DeviceKind::Host,
                7,
            ),
            zerohop::DeviceBuffer::borrowed_on_stream(
                owned.addr() + 150_000,
                150_000,
                zerohop::DeviceKind::Host,
                9,
            ),
        )
    };
    assert_eq!(a.slice(10, 10).unwrap().stream(), Some(7));
    let files = vec![SinkFile::create_new(&dir.path("f"), 300_000).unwrap()];
    let mut plan = TransferPlan::new();
    plan.add(&files, 0, 0, 150_000, &a, 0).unwrap();
    plan.add(&files, 0, 150_000, 150_000, &b, 0).unwrap();
    e.write(&files, &plan, None, None).unwrap();
    assert_eq!(sim.stream_waits(), vec![7, 9]);
    assert!(std::fs::read(dir.path("f")).unwrap() == data);

    // Load it back into a borrowed buffer on stream 7.
    let target = e.device().alloc(300_000).unwrap();
    // SAFETY: as above, `target` outlives `view`.
    let view = unsafe {
        zerohop::DeviceBuffer::borrowed_on_stream(
            target.addr(),
            300_000,
            zerohop::DeviceKind::Host,
            7,
        )
    };
    let sources = vec![zerohop::storage::SourceFile::open(&dir.path("f")).unwrap()];
    let mut plan = TransferPlan::new();
    plan.add(&sources, 0, 0, 300_000, &view, 0).unwrap();
    e.transfer(&sources, &plan, None).unwrap();
    assert_eq!(sim.stream_waits(), vec![7, 9, 7]);
    let mut got = vec![0u8; 300_000];
    e.device().read_back(&target, 0, &mut got).unwrap();
    assert!(got == data);
}

/// A copy that cannot be queued half-way through a window fails the save;
/// the copies queued before it (with no fence behind them) have still all
/// finished when the save returns, so the next save on the same engine,
/// reusing the same slots, writes exactly its own bytes.
#[test]
fn failed_enqueue_leaves_no_late_copies_behind() {
    let dir = TestDir::new("write-enqueue");
    let data = pattern(100_000, 31);
    // Fail at several points, so some land in the middle of a window.
    for fail_at in [1, 3, 6, 10, 14, 21] {
        let sim = Arc::new(SimDevice::new(SimConfig {
            max_copy_delay: Duration::from_millis(3),
            fail_enqueue: Some(fail_at),
            ..Default::default()
        }));
        let e = Engine::new(
            sim.clone(),
            EngineConfig {
                staging: StagingConfig {
                    total_bytes: 4 * 4096,
                    slot_bytes: 4096,
                },
                io_threads: 2,
                ..EngineConfig::default()
            },
        )
        .unwrap();
        let b = upload(&e, &data);
        let save = |name: &str| {
            let files = vec![SinkFile::create_new(&dir.path(name), 100_000).unwrap()];
            let mut plan = TransferPlan::new();
            let mut want = vec![0u8; 100_000];
            // 1000-byte pieces from scattered sources: several copies a window.
            for k in 0..100u64 {
                let from = (k * 37 % 100) * 1000;
                plan.add(&files, 0, k * 1000, 1000, &b, from).unwrap();
                want[(k * 1000) as usize..][..1000].copy_from_slice(&data[from as usize..][..1000]);
            }
            (e.write(&files, &plan, None, None), want)
        };
        let (first, _) = save(&format!("a{fail_at}"));
        assert_eq!(first.unwrap_err().kind(), ErrorKind::Device);
        // Every copy queued before the failure had finished when it returned.
        let (accepted, done) = sim.copy_counts();
        assert_eq!(
            accepted, done,
            "copies still pending after a failure at {fail_at}"
        );
        let (second, want) = save(&format!("b{fail_at}"));
        second.unwrap();
        assert!(std::fs::read(dir.path(&format!("b{fail_at}"))).unwrap() == want);
    }
}

/// A remote object kept in memory: each part must come whole, once; it
/// appears (`finished`) only when finished.
#[derive(Debug, Default)]
struct MemoryObject {
    len: u64,
    part_bytes: u64,
    parts: std::sync::Mutex<BTreeMap<u64, Vec<u8>>>,
    finished: std::sync::Mutex<Option<Vec<u8>>>,
}

impl MemoryObject {
    fn new(len: u64, part_bytes: u64) -> Arc<Self> {
        Arc::new(MemoryObject {
            len,
            part_bytes,
            ..Default::default()
        })
    }
}

/// The engine owns its sink; the test keeps a handle on the object.
#[derive(Debug)]
struct Shared(Arc<MemoryObject>);

impl zerohop::storage::RemoteSink for Shared {
    fn part_bytes(&self) -> u64 {
        self.0.part_bytes
    }
    fn write_part(&self, offset: u64, buf: &[u8]) -> std::io::Result<()> {
        let o = &self.0;
        assert_eq!(offset % o.part_bytes, 0, "a part starts on a part boundary");
        assert_eq!(buf.len() as u64, o.part_bytes.min(o.len - offset), "whole");
        let again = o.parts.lock().unwrap().insert(offset, buf.to_vec());
        assert!(again.is_none(), "part at {offset} written twice");
        Ok(())
    }
    fn finish(&self) -> std::io::Result<()> {
        let parts = self.0.parts.lock().unwrap();
        let whole: Vec<u8> = parts.values().flatten().copied().collect();
        assert_eq!(whole.len() as u64, self.0.len, "every part written");
        *self.0.finished.lock().unwrap() = Some(whole);
        Ok(())
    }
}

/// A remote object gets whole slot-sized parts: the device ranges at
/// their offsets, host bytes (a header) laid over their part, zeros where
/// nothing was written; it appears only once the write is done.
#[test]
fn remote_objects_get_whole_parts_with_host_bytes_and_zeros() {
    let slot = 16 << 10;
    let e = engine(slot, 6, 3);
    let len = 2 * slot as u64 + 5000;
    let object = MemoryObject::new(len, slot as u64);
    let files = vec![SinkFile::remote(
        "mem://object",
        len,
        Box::new(Shared(object.clone())),
    )];
    let src = pattern(40_000, 4);
    let buf = upload(&e, &src);
    let header = pattern(300, 5);
    let mut expect = vec![0u8; len as usize];
    expect[..300].copy_from_slice(&header);
    let mut plan = TransferPlan::new();
    // Across the first part boundary, then a gap, then into the last part.
    for (off, n, boff) in [(4096u64, 20_000u64, 0u64), (30_000, 7_000, 20_000)] {
        plan.add(&files, 0, off, n, &buf, boff).unwrap();
        expect[off as usize..(off + n) as usize]
            .copy_from_slice(&src[boff as usize..(boff + n) as usize]);
    }
    e.write_host_bytes(&files[0], 0, &header).unwrap();
    assert!(object.finished.lock().unwrap().is_none());
    let stats = e.write(&files, &plan, None, None).unwrap();
    assert_eq!(stats.remote_bytes, plan.bytes());
    assert!(stats.path.contains("object parts"), "{}", stats.path);
    assert_eq!(object.parts.lock().unwrap().len(), 3);
    assert!(object.finished.lock().unwrap().as_deref() == Some(&expect[..]));

    // Parts of another size than the slots: refused.
    let odd = MemoryObject::new(len, 2 * slot as u64);
    let files = vec![SinkFile::remote("mem://odd", len, Box::new(Shared(odd)))];
    let mut plan = TransferPlan::new();
    plan.add(&files, 0, 0, 100, &buf, 0).unwrap();
    let err = e.write(&files, &plan, None, None).unwrap_err();
    assert!(
        err.to_string()
            .contains("each part is written from one slot"),
        "{err}"
    );

    // A filter sees every part (to checksum it); a part it keeps any of is
    // sent whole, and one it keeps none of the object must fill itself.
    let seen = std::sync::Mutex::new(Vec::new());
    let look = |_: usize, start: u64, b: &[u8]| {
        seen.lock().unwrap().push((start, b.len()));
        // What the plan copied: 100 bytes at the start of the first part.
        Ok(std::iter::once(0..100).filter(|_| start == 0).collect())
    };
    let again = MemoryObject::new(len, slot as u64);
    let files = vec![SinkFile::remote(
        "mem://again",
        len,
        Box::new(Shared(again.clone())),
    )];
    let mut plan = TransferPlan::new();
    plan.add(&files, 0, 0, 100, &buf, 0).unwrap();
    e.write(&files, &plan, Some(&look), None).unwrap();
    let mut parts = seen.lock().unwrap().clone();
    parts.sort_unstable();
    assert_eq!(
        parts,
        [(0, slot), (slot as u64, slot), (2 * slot as u64, 5000)]
    );
    assert!(again.finished.lock().unwrap().as_deref().unwrap()[..100] == src[..100]);
    let skip = |_: usize, _: u64, _: &[u8]| Ok(Vec::new());
    let files = vec![SinkFile::remote(
        "mem://skip",
        len,
        Box::new(Shared(object)),
    )];
    let mut plan = TransferPlan::new();
    plan.add(&files, 0, 0, 100, &buf, 0).unwrap();
    let err = e.write(&files, &plan, Some(&skip), None).unwrap_err();
    assert!(
        err.to_string().contains("cannot copy it from elsewhere"),
        "{err}"
    );
}

/// A remote object whose `write_part` holds each part until `want` parts
/// have been in flight together (or a second has passed), and counts the
/// most that were.
#[derive(Debug, Default)]
struct SlowObject {
    want: usize,
    part_bytes: u64,
    sending: std::sync::Mutex<(usize, usize)>,
    changed: std::sync::Condvar,
}

/// The engine owns its sink; the test keeps a handle on the object.
#[derive(Debug)]
struct SlowSink(Arc<SlowObject>);

impl zerohop::storage::RemoteSink for SlowSink {
    fn part_bytes(&self) -> u64 {
        self.0.part_bytes
    }
    fn write_part(&self, _: u64, _: &[u8]) -> std::io::Result<()> {
        let o = &self.0;
        let mut g = o.sending.lock().unwrap();
        g.0 += 1;
        g.1 = g.1.max(g.0);
        o.changed.notify_all();
        let (mut g, _) = o
            .changed
            .wait_timeout_while(g, Duration::from_secs(1), |g| g.1 < o.want)
            .unwrap();
        g.0 -= 1;
        Ok(())
    }
    fn finish(&self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Writes to remote objects wait on the server, so every I/O thread sends
/// a part at once from a slot of its own: four threads and four slots keep
/// four parts in flight (two slots per thread would halve that).
#[test]
fn remote_writes_keep_a_part_in_flight_per_thread() {
    let slot = 16 << 10;
    let e = engine(slot, 4, 4);
    let len = 8 * slot as u64;
    let object = Arc::new(SlowObject {
        want: 4,
        part_bytes: slot as u64,
        ..Default::default()
    });
    let files = vec![SinkFile::remote(
        "mem://slow",
        len,
        Box::new(SlowSink(object.clone())),
    )];
    let buf = upload(&e, &pattern(len as usize, 6));
    let mut plan = TransferPlan::new();
    plan.add(&files, 0, 0, len, &buf, 0).unwrap();
    let stats = e.write(&files, &plan, None, None).unwrap();
    assert_eq!(stats.io_threads, 4);
    assert_eq!(object.sending.lock().unwrap().1, 4);
}

//! Checkpoints on the simulated device: round trips, damage detection,
//! incremental saves, out-of-space, and leftovers of crashed saves.

mod by_dir;
#[path = "../../zerohop/tests/common/mod.rs"]
mod common;

use by_dir::{remove, restore, restore_into, save, verify};
use common::{pattern, TestDir};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use zerohop::safetensors::Dtype;
use zerohop::staging::StagingConfig;
use zerohop::storage::PwriteBackend;
use zerohop::testing::{FaultyWriteBackend, SimConfig, SimDevice, WriteFault};
use zerohop::{Device, DeviceBuffer, Engine, EngineConfig, ErrorKind};
use zerohop_checkpoint::{ChecksumSite, Manifest, Region, Restored, SaveOptions, MANIFEST_FILE};

const CHUNK: u64 = 16 << 10;

/// The names in `dir`, sorted.
fn names(dir: &TestDir) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(&dir.0)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

fn engine() -> Engine {
    engine_on(SimConfig::default())
}

fn engine_on(sim: SimConfig) -> Engine {
    let dev: Arc<dyn Device> = Arc::new(SimDevice::new(SimConfig {
        max_copy_delay: Duration::from_micros(200),
        ..sim
    }));
    Engine::new(
        dev,
        EngineConfig {
            staging: StagingConfig {
                total_bytes: 8 * 2 * CHUNK as usize,
                slot_bytes: 2 * CHUNK as usize,
            },
            io_threads: 3,
            // Mapped-copy windows smaller than a chunk: restores, which
            // check whole chunks, must copy whole slots all the same.
            mapped_window_bytes: 4096,
            ..EngineConfig::default()
        },
    )
    .unwrap()
}

fn opts() -> SaveOptions {
    SaveOptions {
        chunk_bytes: CHUNK,
        shards: Some(3),
        ..SaveOptions::default()
    }
}

/// Regions of odd sizes (zero, one byte, around chunk and slot sizes), some
/// typed, some raw, with their contents.
fn regions(e: &Engine, seed: u64) -> (Vec<Region>, Vec<Vec<u8>>) {
    let sizes = [0usize, 1, 4095, 16_384, 16_385, 70_001, 200_000, 3, 65_536];
    let mut regions = Vec::new();
    let mut data = Vec::new();
    for (i, &n) in sizes.iter().enumerate() {
        let bytes = pattern(n, seed + i as u64);
        let b = e.device().alloc(n).unwrap();
        e.device().write_from_host(&b, 0, &bytes).unwrap();
        regions.push(if i % 3 == 1 || n % 2 == 1 {
            Region::raw(format!("raw.{i}"), b)
        } else {
            Region::tensor(format!("t.{i}"), Dtype::BF16, vec![2, n as u64 / 4], b)
        });
        data.push(bytes);
    }
    (regions, data)
}

fn contents(e: &Engine, b: &DeviceBuffer) -> Vec<u8> {
    let mut v = vec![0u8; b.len()];
    e.device().read_back(b, 0, &mut v).unwrap();
    v
}

/// Every entry `r` restored holds the bytes of the region of its name.
fn assert_restored(e: &Engine, r: &Restored, regions: &[Region], data: &[Vec<u8>]) {
    for (entry, buf) in r.manifest.entries.iter().zip(&r.buffers) {
        let i = regions.iter().position(|g| g.name == entry.name).unwrap();
        assert!(contents(e, buf) == data[i], "{}", entry.name);
    }
}

#[test]
fn round_trip_new_and_existing_regions() {
    let dir = TestDir::new("roundtrip");
    let e = engine();
    let (regions, data) = regions(&e, 1);
    let ck = dir.path("step-1");
    let saved = save(&e, &regions, &ck, &opts(), None).unwrap();
    assert_eq!(saved.manifest.files.len(), 3);
    assert_eq!(
        saved.written_bytes,
        data.iter().map(|d| d.len() as u64).sum::<u64>()
    );
    assert_eq!(names(&dir), vec!["step-1"]);

    let r = restore(&e, &ck, None).unwrap();
    assert_restored(&e, &r, &regions, &data);

    let fresh: Vec<DeviceBuffer> = data
        .iter()
        .map(|d| e.device().alloc(d.len()).unwrap())
        .collect();
    let targets: Vec<(&str, DeviceBuffer)> = regions
        .iter()
        .zip(&fresh)
        .map(|(g, b)| (g.name.as_str(), b.clone()))
        .collect();
    restore_into(&e, &ck, &targets, None).unwrap();
    for (b, d) in fresh.iter().zip(&data) {
        assert!(contents(&e, b) == *d);
    }
    let v = verify(&ck, 2, None).unwrap();
    assert_eq!(v.chunks, saved.manifest.chunks.len());
    assert_eq!(v.referenced_chunks, 0);

    // The data files are plain safetensors our own loader reads.
    let files: Vec<PathBuf> = saved
        .manifest
        .files
        .iter()
        .map(|f| ck.join(&f.name))
        .collect();
    let loaded = zerohop::safetensors::load_safetensors(
        &e,
        &files,
        zerohop::safetensors::Allocation::PerTensor,
        None,
    )
    .unwrap();
    // A region larger than a file's share (200,000 bytes of 372,405 over
    // 3 files) is stored as pieces, each a tensor of its own.
    let pieces: usize = saved
        .manifest
        .entries
        .iter()
        .map(|e| e.placement().len())
        .sum();
    assert_eq!(pieces, regions.len() + 1);
    assert_eq!(loaded.tensors.len(), pieces);
    assert_eq!(saved.manifest.version, 2);

    // Saving over an existing checkpoint is refused.
    let err = save(&e, &regions, &ck, &opts(), None).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::AlreadyExists, "{err}");
}

/// One large region is cut into pieces over every data file, as many
/// regions would be spread over them; it comes back whole, also into a
/// target given, and an incremental save of it writes only what changed.
#[test]
fn one_large_region_is_split_over_the_data_files() {
    let dir = TestDir::new("split");
    let e = engine();
    let n = 10 * CHUNK as usize + 123;
    let bytes = pattern(n, 40);
    let b = e.device().alloc(n).unwrap();
    e.device().write_from_host(&b, 0, &bytes).unwrap();
    let regions = vec![Region::raw("slab", b.clone())];
    let ck = dir.path("one");
    let saved = save(&e, &regions, &ck, &opts(), None).unwrap();
    assert_eq!(saved.manifest.files.len(), 3);
    let entry = &saved.manifest.entries[0];
    assert_eq!(entry.pieces.len(), 3);
    let sizes: Vec<u64> = entry.pieces.iter().map(|p| p.bytes).collect();
    assert_eq!(sizes, vec![4 * CHUNK, 4 * CHUNK, 2 * CHUNK + 123]);
    let r = restore(&e, &ck, None).unwrap();
    assert!(contents(&e, &r.buffers[0]) == bytes);
    let target = e.device().alloc(n).unwrap();
    restore_into(&e, &ck, &[("slab", target.clone())], None).unwrap();
    assert!(contents(&e, &target) == bytes);

    // One chunk changes: the child writes that chunk alone.
    let mut changed = bytes.clone();
    changed[5 * CHUNK as usize + 7] ^= 0xff;
    e.device().write_from_host(&b, 0, &changed).unwrap();
    let child = dir.path("two");
    let o = SaveOptions {
        parent: Some(by_dir::at(&ck)),
        ..opts()
    };
    let saved = save(&e, &regions, &child, &o, None).unwrap();
    assert_eq!(saved.written_bytes, CHUNK);
    let r = restore(&e, &child, None).unwrap();
    assert!(contents(&e, &r.buffers[0]) == changed);
}

/// Unless told, a save spreads over as many data files as the engine keeps
/// windows in flight (`Engine::write_spread`), fewer where each would hold
/// under 16 MiB.
#[test]
fn by_default_a_save_spreads_over_the_engines_write_spread() {
    let dir = TestDir::new("spread");
    let dev: Arc<dyn Device> = Arc::new(SimDevice::new(SimConfig::default()));
    let slot = 1 << 20;
    let config = EngineConfig {
        staging: StagingConfig {
            total_bytes: 4 * slot,
            slot_bytes: slot,
        },
        io_threads: 2,
        ..EngineConfig::default()
    };
    let e = Engine::new(dev, config).unwrap();
    assert_eq!(e.write_spread(), 4);
    let o = SaveOptions {
        chunk_bytes: CHUNK,
        ..SaveOptions::default()
    };
    for (mib, files) in [(20, 2), (80, 4)] {
        let b = e.device().alloc(mib << 20).unwrap();
        let regions = vec![Region::raw("slab", b)];
        let saved = save(&e, &regions, &dir.path(&format!("{mib}")), &o, None).unwrap();
        assert_eq!(saved.manifest.files.len(), files, "{mib} MiB");
    }
}

#[test]
fn restore_refuses_mismatched_targets() {
    let dir = TestDir::new("mismatch");
    let e = engine();
    let (regions, _) = regions(&e, 2);
    let ck = dir.path("c");
    save(&e, &regions, &ck, &opts(), None).unwrap();
    let mut targets: Vec<(&str, DeviceBuffer)> = regions
        .iter()
        .map(|g| (g.name.as_str(), e.device().alloc(g.data.len()).unwrap()))
        .collect();
    targets[5].1 = e.device().alloc(regions[5].data.len() + 1).unwrap();
    let err = restore_into(&e, &ck, &targets, None).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput);
    assert!(err.to_string().contains(&regions[5].name), "{err}");
    targets[5].1 = e.device().alloc(regions[5].data.len()).unwrap();
    let last = targets.pop().unwrap();
    let err = restore_into(&e, &ck, &targets, None).unwrap_err();
    assert!(err.to_string().contains("no target"), "{err}");
    targets.push(last);
    targets.push(("stray", e.device().alloc(4096).unwrap()));
    let err = restore_into(&e, &ck, &targets, None).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput);
    assert!(
        err.to_string()
            .contains("\"stray\" is not in the checkpoint"),
        "{err}"
    );
}

fn flip(path: &Path, at: u64) {
    let mut b = std::fs::read(path).unwrap();
    b[at as usize] ^= 0x40;
    std::fs::write(path, b).unwrap();
}

/// One flipped byte in a chunk, a header or the manifest fails both verify
/// and restore, naming the place.
#[test]
fn damage_is_found_and_named() {
    let dir = TestDir::new("damage");
    let e = engine();
    let (regions, _) = regions(&e, 3);
    let ck = dir.path("c");
    let m = save(&e, &regions, &ck, &opts(), None).unwrap().manifest;
    let big = m.entries.iter().find(|x| x.name == "t.6").unwrap();
    let data_file = ck.join(&m.files[big.file].name);

    let at = big.offset + 100_123;
    let chunk_start = at / CHUNK * CHUNK;
    flip(&data_file, at);
    for err in [
        verify(&ck, 3, None).unwrap_err(),
        restore(&e, &ck, None).err().unwrap(),
    ] {
        assert_eq!(err.kind(), ErrorKind::Integrity, "{err}");
        let msg = err.to_string();
        let place = format!("\"t.6\" at byte {} ", chunk_start - big.offset);
        assert!(
            msg.contains(&place) && msg.contains(&format!("offset {chunk_start}")),
            "{msg}"
        );
    }
    flip(&data_file, big.offset + 100_123);
    verify(&ck, 3, None).unwrap();

    flip(&data_file, 20);
    for err in [
        verify(&ck, 3, None).unwrap_err(),
        restore(&e, &ck, None).err().unwrap(),
    ] {
        assert_eq!(err.kind(), ErrorKind::Integrity, "{err}");
        assert!(err.to_string().contains("header"), "{err}");
    }
    flip(&data_file, 20);

    let manifest = ck.join(MANIFEST_FILE);
    let len = std::fs::metadata(&manifest).unwrap().len();
    flip(&manifest, len / 2);
    for err in [
        verify(&ck, 3, None).unwrap_err(),
        restore(&e, &ck, None).err().unwrap(),
    ] {
        assert!(
            matches!(err.kind(), ErrorKind::Integrity | ErrorKind::Format),
            "{err}"
        );
        assert!(err.to_string().contains("manifest"), "{err}");
    }
}

/// Where the device cannot hash, a restore of files in the page cache
/// copies them out of their mapping in whole slots (the engine's mapped
/// windows are smaller than a chunk), checking every chunk there: the bytes
/// come back, and a flipped one is found.
#[test]
fn a_restore_from_the_page_cache_copies_from_the_mapping_and_checks_every_chunk() {
    let dir = TestDir::new("mapped-restore");
    let e = engine_on(SimConfig {
        no_checksum_kernel: true,
        ..SimConfig::default()
    });
    let (regions, data) = regions(&e, 5);
    let ck = dir.path("c");
    let m = save(&e, &regions, &ck, &opts(), None).unwrap().manifest;
    // Through the page cache: every data file resident, so hot.
    for f in &m.files {
        std::fs::read(ck.join(&f.name)).unwrap();
    }
    let r = restore(&e, &ck, None).unwrap();
    assert_eq!(r.stats.mapped_bytes, r.stats.bytes, "{}", r.stats.path);
    assert_restored(&e, &r, &regions, &data);
    let big = m.entries.iter().find(|x| x.name == "t.6").unwrap();
    flip(&ck.join(&m.files[big.file].name), big.offset + 70_000);
    let err = restore(&e, &ck, None).err().unwrap();
    assert_eq!(err.kind(), ErrorKind::Integrity, "{err}");
    assert!(err.to_string().contains("\"t.6\""), "{err}");
}

/// Targets that share a block (as `checkpoint.load`'s tensors share
/// blocks) and follow each other there as in their data file are filled by
/// fewer device copies than targets allocated alone; targets of a block in
/// another order come back right all the same.
#[test]
fn targets_in_one_block_are_filled_by_fewer_copies() {
    let dir = TestDir::new("restore-blocks");
    let sim = Arc::new(SimDevice::new(SimConfig {
        max_copy_delay: Duration::from_micros(200),
        ..SimConfig::default()
    }));
    let e = Engine::new(
        sim.clone(),
        EngineConfig {
            staging: StagingConfig {
                total_bytes: 8 * 2 * CHUNK as usize,
                slot_bytes: 2 * CHUNK as usize,
            },
            io_threads: 3,
            ..EngineConfig::default()
        },
    )
    .unwrap();
    const N: usize = 12;
    const SIZE: usize = 4096;
    let data: Vec<Vec<u8>> = (0..N).map(|i| pattern(SIZE, 90 + i as u64)).collect();
    let regions: Vec<Region> = data
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let b = e.device().alloc(SIZE).unwrap();
            e.device().write_from_host(&b, 0, d).unwrap();
            Region::raw(format!("w.{i:02}"), b)
        })
        .collect();
    let ck = dir.path("c");
    let one_file = SaveOptions {
        shards: Some(1),
        ..opts()
    };
    let m = save(&e, &regions, &ck, &one_file, None).unwrap().manifest;
    // Hot, as a checkpoint just written to tmpfs: copied out of its mapping.
    std::fs::read(ck.join(&m.files[0].name)).unwrap();
    let at = by_dir::at(&ck);
    let copies = |targets: &[(&str, DeviceBuffer)], blocks: &[DeviceBuffer]| {
        let before = sim.copy_counts().0;
        zerohop_checkpoint::restore_manifest_into(&e, &at, &m, targets, blocks, None).unwrap();
        sim.copy_counts().0 - before
    };
    let names: Vec<&str> = regions.iter().map(|g| g.name.as_str()).collect();

    let alone: Vec<DeviceBuffer> = (0..N).map(|_| e.device().alloc(SIZE).unwrap()).collect();
    let targets: Vec<(&str, DeviceBuffer)> =
        names.iter().copied().zip(alone.iter().cloned()).collect();
    let each_alone = copies(&targets, &[]);
    assert!(
        each_alone >= N as u64,
        "{each_alone} copies for {N} targets alone"
    );

    let block = e.device().alloc(N * SIZE).unwrap();
    let in_block = |order: &dyn Fn(usize) -> usize| -> Vec<(&str, DeviceBuffer)> {
        (0..N)
            .map(|i| (names[i], block.slice(order(i) * SIZE, SIZE).unwrap()))
            .collect()
    };
    let in_order = in_block(&|i| i);
    let joined = copies(&in_order, std::slice::from_ref(&block));
    assert!(
        joined * 2 <= each_alone,
        "{joined} copies into one block against {each_alone} into targets alone"
    );
    for (i, (_, b)) in in_order.iter().enumerate() {
        assert!(contents(&e, b) == data[i], "{}", names[i]);
    }

    let reversed = in_block(&|i| N - 1 - i);
    copies(&reversed, std::slice::from_ref(&block));
    for (i, (_, b)) in reversed.iter().enumerate() {
        assert!(contents(&e, b) == data[i], "{}", names[i]);
    }
}

/// A restore checks every chunk on the device where it can hash them, in
/// staging where it cannot, and reads again, checking in staging, where the
/// device's hashing fails: each way the bytes come back, a flipped byte is
/// found and named, and the report says where the chunks were checked.
#[test]
fn restores_check_every_chunk_on_the_device_or_in_staging() {
    let dir = TestDir::new("restore-checks");
    let e = engine();
    let (regions, data) = regions(&e, 11);
    let ck = dir.path("c");
    let m = save(&e, &regions, &ck, &opts(), None).unwrap().manifest;
    let big = m.entries.iter().find(|x| x.name == "t.6").unwrap();
    let data_file = ck.join(&m.files[big.file].name);
    let ways = [
        (SimConfig::default(), Some("on the device")),
        (
            SimConfig {
                no_checksum_kernel: true,
                ..SimConfig::default()
            },
            None,
        ),
        (
            SimConfig {
                fail_checksums: true,
                ..SimConfig::default()
            },
            Some("hashing failed"),
        ),
    ];
    for (sim, note) in ways {
        let e = engine_on(sim);
        let r = restore(&e, &ck, None).unwrap();
        assert_restored(&e, &r, &regions, &data);
        let noted = r.stats.notes.iter().find(|n| n.contains("chunk"));
        assert_eq!(noted.is_some(), note.is_some(), "{:?}", r.stats.notes);
        if let (Some(noted), Some(note)) = (noted, note) {
            assert!(noted.contains(note), "{noted}");
        }
        flip(&data_file, big.offset + 30_000);
        let err = restore(&e, &ck, None).err().unwrap();
        flip(&data_file, big.offset + 30_000);
        assert_eq!(err.kind(), ErrorKind::Integrity, "{err}");
        assert!(err.to_string().contains("\"t.6\""), "{err}");
    }
}

/// An incremental save rewrites only the changed chunks, restores to the
/// same bytes as a full save, and keeps its parent from being deleted.
/// A device that hashes chunks itself and one whose chunks are hashed on
/// the host as they pass must agree on every checksum: a child saved on
/// one finds its parent's chunks, saved on the other, unchanged.
#[test]
fn device_and_host_checksums_agree() {
    let dir = TestDir::new("sites");
    let on_device = engine();
    let on_host = engine_on(SimConfig {
        no_checksum_kernel: true,
        ..SimConfig::default()
    });
    let (a_regions, _) = regions(&on_device, 9);
    let (b_regions, data) = regions(&on_host, 9);
    let a = dir.path("by-device");
    let saved_a = save(&on_device, &a_regions, &a, &opts(), None).unwrap();
    assert!(
        matches!(
            saved_a.checksums,
            ChecksumSite::Device {
                overlapped: true,
                ..
            }
        ),
        "{}",
        saved_a.checksums
    );
    let b = dir.path("by-host");
    let child = SaveOptions {
        parent: Some(by_dir::at(&a)),
        ..opts()
    };
    let saved_b = save(&on_host, &b_regions, &b, &child, None).unwrap();
    assert!(
        saved_b.checksums.to_string().contains("no checksum kernel"),
        "{}",
        saved_b.checksums
    );
    assert_eq!(saved_b.written_bytes, 0, "every chunk is unchanged");
    let sums = |m: &Manifest| m.chunks.iter().map(|c| c.xxh3.clone()).collect::<Vec<_>>();
    assert_eq!(sums(&saved_a.manifest), sums(&saved_b.manifest));

    // A device whose hashing fails mid-save: the written files are hashed.
    let failing = engine_on(SimConfig {
        fail_checksums: true,
        ..SimConfig::default()
    });
    let (c_regions, _) = regions(&failing, 9);
    let c = dir.path("by-files");
    let saved_c = save(&failing, &c_regions, &c, &opts(), None).unwrap();
    assert!(
        saved_c.checksums.to_string().contains("hashing failed"),
        "{}",
        saved_c.checksums
    );
    assert_eq!(sums(&saved_a.manifest), sums(&saved_c.manifest));
    verify(&c, 2, None).unwrap();
    let r = restore(&on_host, &b, None).unwrap();
    for (entry, buf) in r.manifest.entries.iter().zip(&r.buffers) {
        let i = b_regions.iter().position(|g| g.name == entry.name).unwrap();
        assert!(contents(&on_host, buf) == data[i], "{}", entry.name);
    }
}

#[test]
fn incremental_saves_write_only_changed_chunks() {
    let dir = TestDir::new("incr");
    let e = engine();
    let (regions, mut data) = regions(&e, 4);
    let a = dir.path("step-1");
    save(&e, &regions, &a, &opts(), None).unwrap();

    // Change one byte of one region.
    let i = regions.iter().position(|g| g.name == "t.6").unwrap();
    data[i][150_000] ^= 1;
    e.device()
        .write_from_host(&regions[i].data, 150_000, &data[i][150_000..150_001])
        .unwrap();
    let b = dir.path("step-2");
    let child = SaveOptions {
        parent: Some(by_dir::at(&a)),
        ..opts()
    };
    let saved = save(&e, &regions, &b, &child, None).unwrap();
    assert!(
        saved.written_bytes <= CHUNK,
        "wrote {}",
        saved.written_bytes
    );
    assert!(saved.written_bytes > 0);
    assert_eq!(saved.manifest.parent.as_deref(), Some("step-1"));
    // The sums decide what to write, so the device hashed before the copies.
    assert!(
        matches!(
            saved.checksums,
            ChecksumSite::Device {
                overlapped: false,
                ..
            }
        ),
        "{}",
        saved.checksums
    );

    // A third save on top of the second references the first's chunks
    // directly.
    let c = dir.path("step-3");
    let grandchild = SaveOptions {
        parent: Some(by_dir::at(&b)),
        ..opts()
    };
    let saved3 = save(&e, &regions, &c, &grandchild, None).unwrap();
    assert_eq!(saved3.written_bytes, 0);
    assert!(saved3
        .manifest
        .chunks
        .iter()
        .any(|c| c.stored_in.as_deref() == Some("step-1")));

    for ck in [&b, &c] {
        let r = restore(&e, ck, None).unwrap();
        for (entry, buf) in r.manifest.entries.iter().zip(&r.buffers) {
            let j = regions.iter().position(|g| g.name == entry.name).unwrap();
            assert!(contents(&e, buf) == data[j], "{}", entry.name);
        }
        assert!(verify(ck, 2, None).unwrap().referenced_chunks > 0);
    }

    let err = remove(&a).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::AlreadyExists);
    assert!(
        err.to_string().contains("step-2") && err.to_string().contains("step-3"),
        "{err}"
    );
    remove(&c).unwrap();
    remove(&b).unwrap();
    remove(&a).unwrap();
    assert!(names(&dir).is_empty(), "{:?}", names(&dir));
}

/// Out of space mid-save: a clear error, the previous checkpoint intact,
/// nothing left behind.
#[test]
fn out_of_space_leaves_the_previous_checkpoint() {
    let dir = TestDir::new("enospc");
    let e = engine();
    let (regions, data) = regions(&e, 5);
    let a = dir.path("step-1");
    save(&e, &regions, &a, &opts(), None).unwrap();
    let full = engine().with_write_backend(Arc::new(FaultyWriteBackend::new(
        Arc::new(PwriteBackend),
        vec![WriteFault::NoSpace { at: 30_000 }],
    )));
    let moved: Vec<Region> = regions
        .iter()
        .zip(&data)
        .map(|(g, d)| {
            let b = full.device().alloc(d.len()).unwrap();
            full.device().write_from_host(&b, 0, d).unwrap();
            Region {
                data: b,
                ..g.clone()
            }
        })
        .collect();
    let err = save(&full, &moved, &dir.path("step-2"), &opts(), None).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::StorageFull, "{err}");
    assert_eq!(names(&dir), vec!["step-1"]);
    verify(&a, 2, None).unwrap();
}

/// Headers that cannot be written: the first file's error, and nothing
/// left behind.
#[test]
fn a_header_that_cannot_be_written_fails_the_save_cleanly() {
    let dir = TestDir::new("header-eio");
    let broken = engine().with_write_backend(Arc::new(FaultyWriteBackend::new(
        Arc::new(PwriteBackend),
        vec![WriteFault::Eio { at: 0 }],
    )));
    let (regions, _) = regions(&broken, 40);
    let o = SaveOptions {
        shards: Some(8),
        ..opts()
    };
    let err = save(&broken, &regions, &dir.path("c"), &o, None).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Io, "{err}");
    assert!(err.to_string().contains("data-00000"), "{err}");
    assert!(names(&dir).is_empty(), "{:?}", names(&dir));
}

/// A crashed save's temporary directory is recognised (its writer on this
/// host is gone) and removed by the next save in the same directory; those
/// of a live writer, or of a writer on another host, are left alone.
#[test]
fn leftovers_of_crashed_saves_are_cleaned() {
    let dir = TestDir::new("leftover");
    let e = engine();
    let (regions, _) = regions(&e, 6);
    let mut sleeper = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .unwrap();
    // A temporary name of ours, with the pid swapped for another one.
    let ours = zerohop::storage::atomic::temp_sibling(&dir.path("step-2")).unwrap();
    let ours = ours.file_name().unwrap().to_str().unwrap().to_string();
    let me = format!("-{}-", std::process::id());
    let with_pid = |pid: u32| ours.replace(&me, &format!("-{pid}-"));
    // pid 0x7fff_fff0 does not exist.
    let dead = dir.path(&with_pid(0x7fff_fff0));
    let live = dir.path(&with_pid(sleeper.id()).replace(".step-2.", ".step-9."));
    let foreign = dir.path(".step-4.zerohop-tmp-some-other-host-2147483632-0");
    for d in [&dead, &live, &foreign] {
        std::fs::create_dir(d).unwrap();
        std::fs::write(d.join("data-00000.safetensors"), b"partial").unwrap();
    }
    save(&e, &regions, &dir.path("step-3"), &opts(), None).unwrap();
    let _ = sleeper.kill();
    let _ = sleeper.wait();
    assert!(!dead.exists());
    assert!(live.exists() && foreign.exists());
    Manifest::read(&dir.path("step-3")).unwrap();
}

/// An incremental save after regions changed size restores exactly, and
/// duplicate region names are refused before anything is written.
#[test]
fn incremental_after_resize_and_duplicate_names() {
    let dir = TestDir::new("resize");
    let e = engine();
    let (mut regions, mut data) = regions(&e, 8);
    // One data file, so a resize of the last region changes its length
    // and leaves the chunks before it where they were.
    let one = SaveOptions {
        shards: Some(1),
        ..opts()
    };
    let mut parent = dir.path("a");
    save(&e, &regions, &parent, &one, None).unwrap();
    let last = regions.len() - 1;
    for (step, n) in [(1, 100_000usize), (2, 3_000)] {
        data[last] = pattern(n, 99 + step);
        let b = e.device().alloc(n).unwrap();
        e.device().write_from_host(&b, 0, &data[last]).unwrap();
        regions[last].data = b;
        regions[last].tensor = None;
        let child = dir.path(&format!("step-{step}"));
        let opts = SaveOptions {
            parent: Some(by_dir::at(&parent)),
            ..one.clone()
        };
        let saved = save(&e, &regions, &child, &opts, None).unwrap();
        assert!(saved.stats.skipped_bytes > 0, "nothing was referenced");
        let r = restore(&e, &child, None).unwrap();
        for (entry, buf) in r.manifest.entries.iter().zip(&r.buffers) {
            let k = regions.iter().position(|g| g.name == entry.name).unwrap();
            assert!(contents(&e, buf) == data[k], "{}", entry.name);
        }
        verify(&child, 2, None).unwrap();
        parent = child;
    }

    let mut twice = regions.clone();
    twice[1].name = twice[0].name.clone();
    let err = save(&e, &twice, &dir.path("c"), &opts(), None).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
    assert!(!dir.path("c").exists());
}

#[test]
fn engine_geometry_and_parent_location_are_checked() {
    let dir = TestDir::new("geometry");
    let e = engine();
    let (regions, _) = regions(&e, 7);
    let big_chunks = SaveOptions {
        chunk_bytes: 4 * CHUNK,
        ..opts()
    };
    let err = save(&e, &regions, &dir.path("a"), &big_chunks, None).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
    let other = TestDir::new("geometry-other");
    save(&e, &regions, &other.path("p"), &opts(), None).unwrap();
    let far_parent = SaveOptions {
        parent: Some(by_dir::at(&other.path("p"))),
        ..opts()
    };
    let err = save(&e, &regions, &dir.path("b"), &far_parent, None).unwrap_err();
    assert!(err.to_string().contains("sibling"), "{err}");
    assert!(names(&dir).is_empty(), "{:?}", names(&dir));
}

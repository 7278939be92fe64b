//! The page-cache DMA route and the hot-route measurement, run on the
//! simulated device. That device copies with the CPU, so engines refuse it
//! the route (a file truncated meanwhile would crash the process); these
//! tests grant it, as no file changes under them.

#[path = "../../tests/common/mod.rs"]
mod common;

use super::{DirectIo, Engine, EngineConfig, HotRoute};
use crate::device::{Device, DeviceBuffer, SimConfig, SimDevice};
use crate::plan::TransferPlan;
use crate::staging::StagingConfig;
use crate::{storage, TransferStats};
use common::{pattern, write, TestDir};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

impl Engine {
    /// Lets the page-cache DMA route run on a device that copies with the
    /// CPU.
    fn granting_page_cache_dma(mut self) -> Self {
        self.dma_copies = true;
        self
    }
}

fn sim(config: SimConfig) -> Arc<dyn Device> {
    Arc::new(SimDevice::new(SimConfig {
        max_copy_delay: Duration::from_micros(20),
        ..config
    }))
}

fn config(slot: usize, slots: usize, threads: usize, hot: HotRoute) -> EngineConfig {
    EngineConfig {
        staging: StagingConfig {
            total_bytes: slot * slots,
            slot_bytes: slot,
        },
        io_threads: threads,
        direct_io: DirectIo::Never,
        hot_route: hot,
        dma_window_bytes: 16 << 10,
        ..EngineConfig::default()
    }
}

fn engine(dev: &Arc<dyn Device>, config: EngineConfig) -> Engine {
    Engine::new(dev.clone(), config)
        .unwrap()
        .granting_page_cache_dma()
}

fn read_all(dev: &dyn Device, buf: &DeviceBuffer) -> Vec<u8> {
    let mut out = vec![0u8; buf.len()];
    dev.read_back(buf, 0, &mut out).unwrap();
    out
}

fn load_exact(engine: &Engine, path: &Path, data: &[u8]) -> TransferStats {
    let (bufs, stats) = engine.load_files(&[path], None).unwrap();
    assert!(
        read_all(engine.device().as_ref(), &bufs[0]) == data,
        "{}",
        stats.path
    );
    stats
}

/// Random extents (unaligned, zero-length, overlapping in the file,
/// spanning files) into two buffers, on both backends and several window
/// geometries, all by page-cache DMA.
#[test]
fn scattered_extents_arrive_exactly_by_page_cache_dma() {
    let dir = TestDir::new("dma-scatter");
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
    let mut backends = vec![storage::backend(storage::BackendKind::Pread).unwrap()];
    backends.extend(storage::backend(storage::BackendKind::IoUring).ok());
    for backend in backends {
        for (slot, slots, threads) in [(4096, 2, 1), (8192, 6, 3), (65536, 8, 4)] {
            let dev = sim(SimConfig::default());
            let engine = Engine::with_backend(
                dev.clone(),
                config(slot, slots, threads, HotRoute::PageCacheDma),
                backend.clone(),
            )
            .unwrap()
            .granting_page_cache_dma();
            let files = Engine::open_files(&paths).unwrap();
            let bufs = [dev.alloc(500_000).unwrap(), dev.alloc(123_457).unwrap()];
            let mut expect = [vec![0u8; 500_000], vec![0u8; 123_457]];
            let mut plan = TransferPlan::new();
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
            assert_eq!(stats.page_cache_dma_bytes, stats.bytes);
            assert_eq!(stats.bytes, cursor.iter().sum::<u64>());
            for b in 0..2 {
                assert!(
                    read_all(dev.as_ref(), &bufs[b]) == expect[b],
                    "{} slot {slot}",
                    backend.name()
                );
            }
        }
    }
}

#[test]
fn auto_measures_both_hot_routes_then_keeps_the_faster() {
    let dir = TestDir::new("dma-auto");
    let data = pattern(3 << 20, 21);
    let path = write(&dir.path("hot"), &data);
    let dev = sim(SimConfig::default());
    let mut c = config(65536, 8, 2, HotRoute::Auto);
    c.direct_io = DirectIo::Auto;
    c.hot_probe_bytes = 256 << 10;
    let engine = engine(&dev, c);
    let first = load_exact(&engine, &path, &data);
    assert!(
        first.notes.iter().any(|n| n.contains("hot route measured")),
        "{:?}",
        first.notes
    );
    assert!(
        first.buffered_bytes >= 256 << 10 && first.page_cache_dma_bytes >= 256 << 10,
        "{first:?}"
    );
    let second = load_exact(&engine, &path, &data);
    assert!(
        second.notes.iter().all(|n| n.contains("measured earlier")),
        "{:?}",
        second.notes
    );
    assert!(
        second.buffered_bytes == 0 || second.page_cache_dma_bytes == 0,
        "one route after the choice"
    );
}

#[test]
fn the_hot_choice_is_remembered_across_engines_in_a_file() {
    let dir = TestDir::new("dma-choice");
    let path = write(&dir.path("hot"), &pattern(2 << 20, 4));
    let mut c = config(65536, 8, 2, HotRoute::Auto);
    c.direct_io = DirectIo::Auto;
    c.hot_probe_bytes = 128 << 10;
    c.hot_choice_file = Some(dir.path("cache/hot-route.json"));
    let first = engine(&sim(SimConfig::default()), c.clone())
        .load_files(&[&path], None)
        .unwrap()
        .1;
    assert!(
        first
            .notes
            .iter()
            .any(|n| n.contains("measured on this transfer")),
        "{:?}",
        first.notes
    );
    let second = engine(&sim(SimConfig::default()), c)
        .load_files(&[&path], None)
        .unwrap()
        .1;
    assert!(
        second
            .notes
            .iter()
            .any(|n| n.contains("measured earlier (kept in")),
        "{:?}",
        second.notes
    );
}

#[test]
fn refused_pins_fall_back_to_staging_with_a_note() {
    let dir = TestDir::new("dma-pinfail");
    let data = pattern(1 << 20, 8);
    let path = write(&dir.path("f"), &data);
    let dev = sim(SimConfig {
        refuse_pin: true,
        ..Default::default()
    });
    let engine = engine(&dev, config(8192, 4, 2, HotRoute::PageCacheDma));
    let stats = load_exact(&engine, &path, &data);
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

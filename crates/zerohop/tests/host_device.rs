//! The production host device through the engine: loads on every route
//! (page-cache DMA staged instead) and saves land byte for byte, and
//! buffers of another device, or loads into one byte twice, are refused
//! before any copy.

mod common;

use common::{pattern, write, TestDir};
use std::sync::Arc;
use zerohop::device::HostDevice;
use zerohop::plan::TransferPlan;
use zerohop::staging::StagingConfig;
use zerohop::storage::{SinkFile, SourceFile};
use zerohop::{DeviceBuffer, DeviceKind, DirectIo, Engine, EngineConfig, ErrorKind, HotRoute};

fn engine(direct_io: DirectIo, hot_route: HotRoute) -> Engine {
    let config = EngineConfig {
        staging: StagingConfig {
            total_bytes: 8 << 16,
            slot_bytes: 1 << 16,
        },
        io_threads: 3,
        direct_io,
        hot_route,
        dma_window_bytes: 1 << 18,
        ..EngineConfig::default()
    };
    Engine::new(Arc::new(HostDevice::new()), config).unwrap()
}

fn contents(e: &Engine, b: &DeviceBuffer) -> Vec<u8> {
    let mut v = vec![0u8; b.len()];
    e.device().read_back(b, 0, &mut v).unwrap();
    v
}

#[test]
fn loads_on_every_route_and_saves_land_exactly() {
    let dir = TestDir::new("host-device");
    let data = pattern((3 << 20) + 4097, 5);
    let path = write(&dir.path("blob"), &data);
    for (direct, hot) in [
        (DirectIo::Always, HotRoute::Staged),
        (DirectIo::Never, HotRoute::Staged),
        (DirectIo::Never, HotRoute::Mapped),
        (DirectIo::Never, HotRoute::PageCacheDma),
    ] {
        let e = engine(direct, hot);
        assert_eq!(e.device().kind(), DeviceKind::Host);
        let (bufs, stats) = e.load_files(&[&path], None).unwrap();
        assert!(contents(&e, &bufs[0]) == data, "{direct:?}/{hot:?}");
        // Host copies are CPU copies: never from a file's mapping.
        assert_eq!(stats.page_cache_dma_bytes, 0, "{direct:?}/{hot:?}");
        assert!(!stats.pinned_staging);

        let out = dir.path(&format!("out-{direct:?}-{hot:?}"));
        let files = vec![SinkFile::create_new(&out, data.len() as u64).unwrap()];
        let mut plan = TransferPlan::new();
        plan.add(&files, 0, 0, data.len() as u64, &bufs[0], 0)
            .unwrap();
        e.write(&files, &plan, None, None).unwrap();
        assert!(std::fs::read(&out).unwrap() == data, "{direct:?}/{hot:?}");
    }
}

#[test]
fn buffers_of_another_device_are_refused() {
    let dir = TestDir::new("host-device-other");
    let path = write(&dir.path("f"), &pattern(8192, 1));
    let e = engine(DirectIo::Auto, HotRoute::Auto);
    // SAFETY: refused before any copy touches it.
    let gpu = unsafe { DeviceBuffer::borrowed(0x7000_0000_0000, 8192, DeviceKind::Cuda(0)) };
    let sources = vec![SourceFile::open(&path).unwrap()];
    let mut plan = TransferPlan::new();
    plan.add(&sources, 0, 0, 8192, &gpu, 0).unwrap();
    let e1 = e.transfer(&sources, &plan, None).unwrap_err();
    assert_eq!(e1.kind(), ErrorKind::InvalidInput, "{e1}");
    assert!(e1.to_string().contains("cuda:0"), "{e1}");

    let sinks = vec![SinkFile::create_new(&dir.path("g"), 8192).unwrap()];
    let mut plan = TransferPlan::new();
    plan.add(&sinks, 0, 0, 8192, &gpu, 0).unwrap();
    let e2 = e.write(&sinks, &plan, None, None).unwrap_err();
    assert_eq!(e2.kind(), ErrorKind::InvalidInput, "{e2}");
}

#[test]
fn loads_into_overlapping_ranges_are_refused() {
    let dir = TestDir::new("host-device-overlap");
    let path = write(&dir.path("f"), &pattern(8192, 2));
    let e = engine(DirectIo::Never, HotRoute::Staged);
    let buf = e.device().alloc(8192).unwrap();
    // A second borrow of the same bytes, as two tensors sharing storage.
    // SAFETY: `buf` stays allocated; the plan is refused before any copy.
    let alias = unsafe { e.device().borrow(buf.addr() + 4096, 4096, None) }.unwrap();
    let sources = vec![SourceFile::open(&path).unwrap()];
    let mut plan = TransferPlan::new();
    plan.add(&sources, 0, 0, 8192, &buf, 0).unwrap();
    plan.add(&sources, 0, 0, 100, &alias, 10).unwrap();
    let err = e.transfer(&sources, &plan, None).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
    assert!(contents(&e, &buf).iter().all(|&b| b == 0), "nothing copied");
}

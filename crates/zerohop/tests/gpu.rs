//! The engine on a real GPU. Ignored by a plain `cargo test` (reported as
//! ignored, not passed); scripts/gpu.sh runs them with `--include-ignored`
//! on the accelerator machine, where a missing GPU fails them.

mod common;

use common::{pattern, write, TestDir};
use std::path::Path;
use std::sync::Arc;
use zerohop::device::CudaDevice;
use zerohop::safetensors::{load_safetensors, write_synthetic, Allocation};
use zerohop::{Device, DeviceBuffer, DirectIo, Engine, EngineConfig, ErrorKind, HotRoute};

fn gpu() -> Arc<dyn Device> {
    match CudaDevice::open(0) {
        Ok(d) => Arc::new(d),
        Err(e) => panic!("this test needs an NVIDIA GPU: {e}"),
    }
}

fn read_all(dev: &dyn Device, buf: &DeviceBuffer) -> Vec<u8> {
    let mut out = vec![0u8; buf.len()];
    dev.read_back(buf, 0, &mut out).unwrap();
    out
}

fn engine(dev: &Arc<dyn Device>, direct: DirectIo, hot: HotRoute) -> Engine {
    let c = EngineConfig {
        direct_io: direct,
        hot_route: hot,
        dma_window_bytes: 8 << 20,
        ..EngineConfig::default()
    };
    Engine::new(dev.clone(), c).unwrap()
}

/// Disk (temp dir) and tmpfs files through every route, checked byte for byte.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn every_route_delivers_exact_bytes() {
    let dev = gpu();
    let mut dirs = vec![TestDir::new("gpu")];
    if Path::new("/dev/shm").is_dir() {
        dirs.push(TestDir::under(Path::new("/dev/shm"), "gpu"));
    }
    for dir in &dirs {
        let data = pattern((48 << 20) + 12345, 77);
        let path = write(&dir.path("blob"), &data);
        for (direct, hot) in [
            (DirectIo::Always, HotRoute::Staged),
            (DirectIo::Never, HotRoute::Staged),
            (DirectIo::Never, HotRoute::Mapped),
            (DirectIo::Never, HotRoute::PageCacheDma),
        ] {
            let (bufs, stats) = engine(&dev, direct, hot)
                .load_files(&[&path], None)
                .unwrap();
            assert!(
                read_all(dev.as_ref(), &bufs[0]) == data,
                "{direct:?}/{hot:?} in {}",
                dir.0.display()
            );
            eprintln!(
                "{} {direct:?}/{hot:?}: {:.2} GB/s via {}",
                dir.0.display(),
                stats.gbps,
                stats.path
            );
            if hot == HotRoute::PageCacheDma {
                assert_eq!(stats.page_cache_dma_bytes, data.len() as u64);
            }
        }
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn safetensors_into_borrowed_and_owned_memory() {
    let dev = gpu();
    let dir = TestDir::new("gpu-st");
    let path = dir.path("m.safetensors");
    write_synthetic(&path, 64 << 20, 3, None).unwrap();
    for alloc in [Allocation::PerFile, Allocation::PerTensor] {
        let e = engine(&dev, DirectIo::Auto, HotRoute::Auto);
        let model = load_safetensors(&e, &[&path], alloc, None).unwrap();
        let file = std::fs::read(&path).unwrap();
        for t in &model.tensors {
            let start = t.file_offset as usize;
            assert!(
                read_all(dev.as_ref(), &t.buffer) == file[start..start + t.buffer.len()],
                "{}",
                t.name
            );
        }
    }
    // A framework's allocation, borrowed by pointer and length.
    let owner = dev.alloc(1 << 20).unwrap();
    // SAFETY: `owner` keeps the memory alive for the whole test.
    let borrowed = unsafe { DeviceBuffer::borrowed(owner.addr() + 4096, 65536, owner.device()) };
    let data = pattern(65536, 5);
    let p = write(&dir.path("raw"), &data);
    let files = Engine::open_files(&[&p]).unwrap();
    let mut plan = zerohop::plan::TransferPlan::new();
    plan.add(&files, 0, 0, 65536, &borrowed, 0).unwrap();
    engine(&dev, DirectIo::Auto, HotRoute::Auto)
        .transfer(&files, &plan, None)
        .unwrap();
    assert!(read_all(dev.as_ref(), &borrowed) == data);
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gpu_errors_are_typed() {
    let dev = gpu();
    assert_eq!(
        dev.alloc(1 << 50).unwrap_err().kind(),
        ErrorKind::OutOfMemory
    );
    assert_eq!(
        zerohop::open_device("cuda:99").err().unwrap().kind(),
        ErrorKind::InvalidInput
    );
}

/// Device memory saved as safetensors (D2H copies into slots, O_DIRECT
/// writes on disk, buffered on tmpfs) and loaded back byte for byte.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn save_from_gpu_memory_round_trips() {
    use std::collections::BTreeMap;
    use zerohop::safetensors::{save_safetensors, Dtype, TensorToSave};
    let dev = gpu();
    let e = engine(&dev, DirectIo::Auto, HotRoute::Staged);
    let mut dirs = vec![TestDir::new("gpu-save")];
    if Path::new("/dev/shm").is_dir() {
        dirs.push(TestDir::under(Path::new("/dev/shm"), "gpu-save"));
    }
    let sizes = [(9 << 20) + 6, 2, 0, 3 << 20];
    let data: Vec<Vec<u8>> = sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| pattern(n, 40 + i as u64))
        .collect();
    let tensors: Vec<TensorToSave> = data
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let b = dev.alloc(d.len()).unwrap();
            dev.write_from_host(&b, 0, d).unwrap();
            TensorToSave {
                name: format!("t{i}"),
                dtype: Dtype::I16,
                shape: vec![d.len() as u64 / 2],
                data: b,
            }
        })
        .collect();
    for dir in &dirs {
        let path = dir.path("saved.safetensors");
        let s = save_safetensors(&e, &path, &tensors, &BTreeMap::new(), None).unwrap();
        eprintln!(
            "{}: save {:.2} GB/s via {}",
            dir.0.display(),
            s.gbps,
            s.path
        );
        let m = load_safetensors(&e, &[&path], Allocation::PerTensor, None).unwrap();
        for t in &m.tensors {
            let i: usize = t.name[1..].parse().unwrap();
            assert!(read_all(dev.as_ref(), &t.buffer) == data[i], "{}", t.name);
        }
    }
}

/// A buffer borrowed with a framework's stream (here the legacy default
/// stream, 0): the load waits for that stream, then lands byte for byte.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn borrowed_buffer_on_a_stream_loads() {
    let dev = gpu();
    let dir = TestDir::new("gpu-stream");
    let data = pattern((5 << 20) + 77, 60);
    let path = write(&dir.path("f"), &data);
    let e = engine(&dev, DirectIo::Auto, HotRoute::Staged);
    let owned = dev.alloc(data.len()).unwrap();
    // SAFETY: `owned` outlives `view`; stream 0 is the default stream of
    // every context.
    let view = unsafe { DeviceBuffer::borrowed_on_stream(owned.addr(), data.len(), dev.kind(), 0) };
    let files = Engine::open_files(&[&path]).unwrap();
    let mut plan = zerohop::plan::TransferPlan::new();
    plan.add(&files, 0, 0, data.len() as u64, &view, 0).unwrap();
    e.transfer(&files, &plan, None).unwrap();
    assert!(read_all(dev.as_ref(), &owned) == data);
}

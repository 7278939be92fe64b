//! Suspending GPU memory: the memory goes back to the driver (its free
//! memory rises by the heap's size) and comes back at the same addresses
//! with the same bytes. Ignored by a plain `cargo test`; scripts/gpu.sh
//! runs it with `--include-ignored` on the accelerator machine.

#[path = "../../zerohop/tests/common/mod.rs"]
mod common;

use common::{pattern, TestDir};
use std::sync::Arc;
use zerohop::device::CudaDevice;
use zerohop::{Device, Engine, EngineConfig};
use zerohop_cuda::Context;
use zerohop_suspend::SuspendableHeap;

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn gpu_memory_is_handed_back_and_restored_at_the_same_addresses() {
    let dev: Arc<dyn Device> = match CudaDevice::open(0) {
        Ok(d) => Arc::new(d),
        Err(e) => panic!("this test needs an NVIDIA GPU: {e}"),
    };
    let ctx = Context::new(0).unwrap();
    let heap = SuspendableHeap::new(Arc::new(
        Engine::new(dev.clone(), EngineConfig::default()).unwrap(),
    ));
    let dir = TestDir::under(std::path::Path::new("/dev/shm"), "suspend-gpu");
    let mut data = Vec::new();
    for (i, n) in [(256 << 20) + 3, 1000, 512 << 20].into_iter().enumerate() {
        let addr = heap.alloc(n).unwrap();
        let bytes = pattern(n, 30 + i as u64);
        // SAFETY: a live allocation of the heap, which nothing else touches.
        let b = unsafe { dev.borrow(addr, n, None) }.unwrap();
        dev.write_from_host(&b, 0, &bytes).unwrap();
        data.push((addr, bytes));
    }
    let (free_before, _) = ctx.memory_info().unwrap();
    let path = dir.path("s");
    // SAFETY: nothing else touches the heap's memory in this test.
    let s = unsafe { heap.suspend(&path, None, None) }.unwrap();
    let (free_suspended, _) = ctx.memory_info().unwrap();
    eprintln!(
        "suspended {} MiB in {:.3} s ({}); driver's free memory {} -> {} MiB",
        s.released_bytes >> 20,
        s.saved.seconds,
        s.saved.checksums,
        free_before >> 20,
        free_suspended >> 20
    );
    assert!(
        free_suspended >= free_before + s.released_bytes,
        "the memory went back to the driver"
    );
    // SAFETY: as above.
    let stats = unsafe { heap.resume(&path, None) }.unwrap();
    eprintln!("resumed at {:.2} GB/s", stats.gbps);
    for (addr, bytes) in &data {
        // SAFETY: as above; resumed, so backed again at the same address.
        let b = unsafe { dev.borrow(*addr, bytes.len(), None) }.unwrap();
        let mut back = vec![0u8; bytes.len()];
        dev.read_back(&b, 0, &mut back).unwrap();
        assert!(back == *bytes, "{addr:#x}");
    }
}

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

/// Allocations of `sizes` bytes from `heap`, each filled with a pattern
/// (seeds from `seed` on): their addresses and bytes.
fn filled(
    heap: &SuspendableHeap,
    dev: &dyn Device,
    sizes: &[usize],
    seed: u64,
) -> Vec<(u64, Vec<u8>)> {
    sizes
        .iter()
        .zip(seed..)
        .map(|(&n, seed)| {
            let addr = heap.alloc(n).unwrap();
            let bytes = pattern(n, seed);
            // SAFETY: a live allocation of the heap, which nothing else touches.
            let b = unsafe { dev.borrow(addr, n, None) }.unwrap();
            dev.write_from_host(&b, 0, &bytes).unwrap();
            (addr, bytes)
        })
        .collect()
}

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
    let data = filled(&heap, dev.as_ref(), &[(256 << 20) + 3, 1000, 512 << 20], 30);
    let (free_before, _) = ctx.memory_info().unwrap();
    let stack = ctx.thread_stack_bytes().unwrap();
    let path = dir.path("s");
    // SAFETY: nothing else touches the heap's memory in this test.
    let s = unsafe { heap.suspend(&path, None, None) }.unwrap();
    let (free_suspended, _) = ctx.memory_info().unwrap();
    eprintln!(
        "suspended {} MiB in {:.3} s ({}); driver's free memory {} -> {} MiB (per-thread stack {} -> {} bytes)",
        s.released_bytes >> 20,
        s.saved.seconds,
        s.saved.checksums,
        free_before >> 20,
        free_suspended >> 20,
        stack,
        ctx.thread_stack_bytes().unwrap(),
    );
    assert_eq!(
        ctx.thread_stack_bytes().unwrap(),
        0,
        "the stack reserve went back"
    );
    // The save itself may take a little device memory for good (its
    // first use loads the checksum kernel: 10 MiB on the H200), so the
    // driver gets back at least 95 % of what was released.
    assert!(
        free_suspended >= free_before + s.released_bytes / 20 * 19,
        "the memory went back to the driver"
    );
    // SAFETY: as above.
    let r = unsafe { heap.resume(&path, None) }.unwrap();
    assert_eq!(ctx.thread_stack_bytes().unwrap(), stack, "and came back");
    eprintln!(
        "resumed at {:.2} GB/s after {:.3} s of backing",
        r.stats.gbps, r.backing_seconds
    );
    for (addr, bytes) in &data {
        // SAFETY: as above; resumed, so backed again at the same address.
        let b = unsafe { dev.borrow(*addr, bytes.len(), None) }.unwrap();
        let mut back = vec![0u8; bytes.len()];
        dev.read_back(&b, 0, &mut back).unwrap();
        assert!(back == *bytes, "{addr:#x}");
    }
}

/// A suspend's checkpoint is an ordinary one: restored into fresh memory
/// (not the heap's), it holds the heap's bytes. Prints the resume's rate
/// beside that restore's, same files, to tell the destination's share.
#[test]
#[ignore = "needs an NVIDIA GPU"]
fn a_suspend_is_an_ordinary_checkpoint_and_resumes_at_its_restore_rate() {
    let dev: Arc<dyn Device> =
        Arc::new(CudaDevice::open(0).expect("this test needs an NVIDIA GPU"));
    let engine = Arc::new(Engine::new(dev.clone(), EngineConfig::default()).unwrap());
    let heap = SuspendableHeap::new(engine.clone());
    let dir = TestDir::under(std::path::Path::new("/dev/shm"), "suspend-rate");
    let data = filled(&heap, dev.as_ref(), &[256 << 20; 16], 60);
    let path = dir.path("s");
    // SAFETY: nothing else touches the heap's memory in this test.
    unsafe { heap.suspend(&path, None, None) }.unwrap();
    // SAFETY: as above.
    let resumed = unsafe { heap.resume(&path, None) }.unwrap();
    let ordinary = zerohop_checkpoint::restore(
        &engine,
        &zerohop_checkpoint::Location::dir(&path).unwrap(),
        None,
    )
    .unwrap();
    // Once more into the heap's memory, which the resume has touched.
    let targets: Vec<(String, zerohop::DeviceBuffer)> = heap
        .allocations()
        .into_iter()
        // SAFETY: live, backed allocations that nothing else touches.
        .map(|(addr, len)| {
            (
                format!("{addr:#x}"),
                unsafe { dev.borrow(addr, len, None) }.unwrap(),
            )
        })
        .collect();
    let named: Vec<(&str, zerohop::DeviceBuffer)> = targets
        .iter()
        .map(|(n, b)| (n.as_str(), b.clone()))
        .collect();
    let again = zerohop_checkpoint::restore_into(
        &engine,
        &zerohop_checkpoint::Location::dir(&path).unwrap(),
        &named,
        None,
    )
    .unwrap();
    eprintln!(
        "4 GiB from tmpfs, verified: resume {:.1} GB/s into the heap's new memory (backed in {:.3} s), restore {:.1} GB/s into fresh cuMemAlloc memory, {:.1} GB/s into the heap's memory again (all {})",
        resumed.stats.gbps, resumed.backing_seconds, ordinary.stats.gbps, again.gbps, ordinary.stats.path
    );
    for (e, buf) in ordinary.manifest.entries.iter().zip(&ordinary.buffers) {
        let want = &data
            .iter()
            .find(|(addr, _)| format!("{addr:#x}") == e.name)
            .expect("an entry per allocation")
            .1;
        let mut back = vec![0u8; buf.len()];
        dev.read_back(buf, 0, &mut back).unwrap();
        assert!(back == *want, "{}", e.name);
    }
}

//! Suspending a heap on the simulated device: contents and addresses
//! survive, memory is released, incremental suspends write only what
//! changed, and a resume that fails leaves the heap suspended.

#[path = "../../zerohop/tests/common/mod.rs"]
mod common;

use common::{pattern, TestDir};
use std::sync::Arc;
use std::time::Duration;
use zerohop::testing::{SimConfig, SimDevice};
use zerohop::{Device, Engine, EngineConfig, ErrorKind};
use zerohop_suspend::SuspendableHeap;

fn heap() -> (SuspendableHeap, Arc<dyn Device>) {
    let dev: Arc<dyn Device> = Arc::new(SimDevice::new(SimConfig {
        max_copy_delay: Duration::from_micros(200),
        ..SimConfig::default()
    }));
    let engine = Engine::new(dev.clone(), EngineConfig::default()).unwrap();
    (SuspendableHeap::new(Arc::new(engine)), dev)
}

/// Writes `bytes` into the heap's memory at `addr`.
fn fill(dev: &dyn Device, addr: u64, bytes: &[u8]) {
    // SAFETY: a live allocation of the heap, which nothing else touches.
    let b = unsafe { dev.borrow(addr, bytes.len(), None) }.unwrap();
    dev.write_from_host(&b, 0, bytes).unwrap();
}

/// The heap's memory at `addr`.
fn contents(dev: &dyn Device, addr: u64, len: usize) -> Vec<u8> {
    // SAFETY: as in `fill`.
    let b = unsafe { dev.borrow(addr, len, None) }.unwrap();
    let mut out = vec![0u8; len];
    dev.read_back(&b, 0, &mut out).unwrap();
    out
}

#[test]
fn a_suspended_heap_comes_back_at_the_same_addresses_with_the_same_bytes() {
    let (heap, dev) = heap();
    let dir = TestDir::new("suspend");
    let sizes = [1 << 20, 4097, 9 << 20, 1];
    let mut data = Vec::new();
    for (i, &n) in sizes.iter().enumerate() {
        let addr = heap.alloc(n).unwrap();
        data.push((addr, pattern(n, 7 + i as u64)));
        fill(dev.as_ref(), addr, &data[i].1);
    }
    let first = dir.path("s1");
    // SAFETY: nothing else touches the heap's memory in this test.
    let s = unsafe { heap.suspend(&first, None, None) }.unwrap();
    assert_eq!(s.allocations, 4);
    assert!(s.released_bytes >= sizes.iter().sum::<usize>() as u64);
    assert_eq!(heap.backed_bytes(), 0);
    assert_eq!(heap.suspended_to(), Some(first.clone()));
    assert_eq!(
        dev.thread_stack_bytes().unwrap(),
        Some(0),
        "the stack reserve is handed back too"
    );
    let refused = heap.alloc(10).unwrap_err();
    assert!(
        refused.to_string().contains("the heap is suspended to"),
        "{refused}"
    );
    // SAFETY: as above.
    assert!(unsafe { heap.suspend(&dir.path("again"), None, None) }.is_err());

    // SAFETY: as above.
    unsafe { heap.resume(&first, None) }.unwrap();
    assert_eq!(heap.suspended_to(), None);
    assert_eq!(dev.thread_stack_bytes().unwrap(), Some(1024), "put back");
    assert_eq!(heap.backed_bytes(), s.released_bytes);
    let mut want: Vec<(u64, usize)> = data.iter().map(|(a, d)| (*a, d.len())).collect();
    want.sort();
    assert_eq!(heap.allocations(), want);
    for (addr, bytes) in &data {
        assert!(
            contents(dev.as_ref(), *addr, bytes.len()) == *bytes,
            "{addr:#x}"
        );
    }

    // One allocation changed: the next suspend, against the first, writes
    // only the chunk that holds the change.
    data[2].1[5 << 20] ^= 1;
    fill(dev.as_ref(), data[2].0, &data[2].1);
    let second = dir.path("s2");
    // SAFETY: as above.
    let s = unsafe { heap.suspend(&second, Some(&first), None) }.unwrap();
    assert!(
        s.saved.written_bytes <= 4 << 20,
        "{} bytes written",
        s.saved.written_bytes
    );
    // SAFETY: as above.
    unsafe { heap.resume(&second, None) }.unwrap();
    assert!(contents(dev.as_ref(), data[2].0, data[2].1.len()) == data[2].1);
    heap.free(data[1].0).unwrap();
    assert!(heap.free(data[1].0).is_err());
    // SAFETY: as above. A resume needs a heap that is suspended.
    assert!(unsafe { heap.resume(&second, None) }.is_err());
}

#[test]
fn a_resume_from_a_damaged_or_missing_checkpoint_leaves_the_heap_suspended() {
    let (heap, dev) = heap();
    let dir = TestDir::new("suspend-damaged");
    let addr = heap.alloc(3 << 20).unwrap();
    let bytes = pattern(3 << 20, 3);
    fill(dev.as_ref(), addr, &bytes);
    let good = dir.path("good");
    // SAFETY: nothing else touches the heap's memory in this test.
    unsafe { heap.suspend(&good, None, None) }.unwrap();

    // A copy with one byte changed in its data file.
    let bad = dir.path("bad");
    std::fs::create_dir(&bad).unwrap();
    for f in std::fs::read_dir(&good).unwrap() {
        let f = f.unwrap();
        let mut content = std::fs::read(f.path()).unwrap();
        if f.file_name().to_string_lossy().ends_with(".safetensors") {
            let last = content.len() - 1;
            content[last] ^= 0x40;
        }
        std::fs::write(bad.join(f.file_name()), content).unwrap();
    }
    // SAFETY: as above.
    let e = unsafe { heap.resume(&bad, None) }.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Integrity, "{e}");
    assert!(e.to_string().contains("the heap stays suspended"), "{e}");
    assert_eq!(heap.suspended_to(), Some(good.clone()));
    assert_eq!(
        heap.backed_bytes(),
        0,
        "released again after the failed resume"
    );
    assert_eq!(dev.thread_stack_bytes().unwrap(), Some(0), "and the stack");
    // SAFETY: as above.
    let e = unsafe { heap.resume(&dir.path("missing"), None) }.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");

    // The intact checkpoint still resumes it.
    // SAFETY: as above.
    unsafe { heap.resume(&good, None) }.unwrap();
    assert!(contents(dev.as_ref(), addr, bytes.len()) == bytes);
    assert_eq!(dev.thread_stack_bytes().unwrap(), Some(1024));
}

#[test]
fn serving_replaces_a_stale_socket_but_never_another_file() {
    use zerohop_suspend::control::{serve, QuietPoint};
    let (heap, _) = heap();
    let heap = Arc::new(heap);
    let dir = TestDir::new("suspend-serve");
    let quiet = || QuietPoint {
        pause: Box::new(|| Ok(())),
        unpause: Box::new(|| ()),
    };
    let file = dir.path("not-a-socket");
    std::fs::write(&file, b"keep me").unwrap();
    // SAFETY: nothing uses the heap's memory (it has none).
    assert!(unsafe { serve(heap.clone(), &file, quiet()) }.is_err());
    assert_eq!(std::fs::read(&file).unwrap(), b"keep me");

    let sock = dir.path("s.sock");
    // SAFETY: as above.
    let first = unsafe { serve(heap.clone(), &sock, quiet()) }.unwrap();
    std::mem::forget(first); // a crashed server leaves its socket behind
                             // SAFETY: as above.
    let second = unsafe { serve(heap, &sock, quiet()) }.unwrap();
    assert_eq!(second.path(), sock.as_path());
    drop(second);
    assert!(!sock.exists(), "the socket is removed when serving stops");
}

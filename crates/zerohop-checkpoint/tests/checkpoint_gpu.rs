//! Checkpoints of GPU memory: the GPU hashes the chunks itself (waiting
//! for the buffers' streams first), and its sums are the host's. Ignored by
//! a plain `cargo test`; scripts/gpu.sh runs it with `--include-ignored` on
//! the accelerator machine, where a missing GPU fails it.

mod by_dir;
#[path = "../../zerohop/tests/common/mod.rs"]
mod common;

use by_dir::{restore, save, verify};
use common::{pattern, TestDir};
use std::sync::Arc;
use zerohop::device::CudaDevice;
use zerohop::{DeviceBuffer, Engine, EngineConfig};
use zerohop_checkpoint::{ChecksumSite, Region, SaveOptions};

fn gpu_engine() -> Engine {
    match CudaDevice::open(0) {
        Ok(d) => Engine::new(Arc::new(d), EngineConfig::default()).unwrap(),
        Err(e) => panic!("this test needs an NVIDIA GPU: {e}"),
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn the_gpu_hashes_chunks_as_the_host_does() {
    let e = gpu_engine();
    let dir = TestDir::new("checkpoint-gpu");
    // Short chunks (hashed on the host), one just over a chunk, several.
    let sizes = [100usize, (4 << 20) + 7, 9 << 20, 1];
    let (mut owned, mut regions, mut data) = (Vec::new(), Vec::new(), Vec::new());
    for (i, &n) in sizes.iter().enumerate() {
        let bytes = pattern(n, 50 + i as u64);
        let b = e.device().alloc(n).unwrap();
        e.device().write_from_host(&b, 0, &bytes).unwrap();
        // Every other region is borrowed on the default stream, as a
        // framework's tensor is: hashing waits for that stream first.
        // SAFETY: `owned` keeps the memory allocated until the test ends.
        let region = unsafe { e.device().borrow(b.addr(), n, Some(0)) }.unwrap();
        let region = if i % 2 == 1 { region } else { b.clone() };
        regions.push(Region::raw(format!("r.{i}"), region));
        owned.push(b);
        data.push(bytes);
    }
    let full = dir.path("full");
    let saved = save(&e, &regions, &full, &SaveOptions::default(), None).unwrap();
    assert!(
        matches!(
            saved.checksums,
            ChecksumSite::Device {
                overlapped: true,
                ..
            }
        ),
        "{}",
        saved.checksums
    );
    // `verify` hashes the files on the host against the GPU's sums.
    verify(&full, 2, None).unwrap();

    // One byte changed: the GPU's sums, taken before the copies, pick the
    // one chunk to write.
    data[2][5 << 20] ^= 1;
    e.device()
        .write_from_host(&owned[2], 5 << 20, &data[2][5 << 20..(5 << 20) + 1])
        .unwrap();
    let child = dir.path("child");
    let opts = SaveOptions {
        parent: Some(by_dir::at(&full)),
        ..SaveOptions::default()
    };
    let saved = save(&e, &regions, &child, &opts, None).unwrap();
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
    assert!(saved.written_bytes > 0 && saved.written_bytes <= 4 << 20);
    verify(&child, 2, None).unwrap();
    let back = restore(&e, &child, None).unwrap();
    for (entry, buf) in back.manifest.entries.iter().zip(&back.buffers) {
        let i: usize = entry.name[2..].parse().unwrap();
        assert!(read(&e, buf) == data[i], "{}", entry.name);
    }
}

fn read(e: &Engine, b: &DeviceBuffer) -> Vec<u8> {
    let mut v = vec![0u8; b.len()];
    e.device().read_back(b, 0, &mut v).unwrap();
    v
}

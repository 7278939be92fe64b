//! The XXH3 kernel must give XXH3-64's values for chunks of any length,
//! alignment and number of pieces: its source run on the host with each
//! warp's 32 lanes as threads (kernels/host_harness.cc), and the kernel as
//! loaded, SASS or PTX, on the GPU (ignored unless run with
//! `--include-ignored`). Without g++ the host part cannot run: it fails
//! where the `CI` environment variable is set (CI installs g++), and
//! elsewhere passes saying `skipped:`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

fn build_harness(out: &Path) -> Option<PathBuf> {
    let kernels = Path::new(env!("CARGO_MANIFEST_DIR")).join("kernels");
    let exe = out.join("xxh3-harness");
    let built = Command::new("g++")
        .args(["-std=c++20", "-O2", "-pthread", "-o"])
        .arg(&exe)
        .arg(kernels.join("host_harness.cc"))
        .status();
    match built {
        Ok(s) if s.success() => Some(exe),
        Ok(s) => panic!("the kernel harness failed to compile: {s}"),
        Err(e) => {
            let why = format!("no g++ to build the kernel harness ({e})");
            assert!(
                std::env::var_os("CI").is_none(),
                "{why}: CI must run this test, not skip it"
            );
            eprintln!("skipped: {why}");
            None
        }
    }
}

/// A deterministic byte pattern (xorshift), so failures reproduce.
fn pattern(len: usize) -> Vec<u8> {
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Chunks as (offset, len) pieces of `pattern`: lengths at the edges of
/// XXH3's blocks and stripes, odd start addresses, and chunks split over
/// many pieces (also mid-word, and with pieces shorter than a word).
fn chunk_shapes() -> Vec<Vec<(usize, usize)>> {
    let mut chunks: Vec<Vec<(usize, usize)>> = Vec::new();
    for len in [
        241, 255, 256, 257, 1023, 1024, 1025, 1088, 2048, 4096, 65_536, 100_003,
    ] {
        chunks.push(vec![(0, len)]);
        chunks.push(vec![(3, len)]);
    }
    chunks.push(vec![
        (1, 100),
        (5000, 3),
        (7, 500),
        (20_001, 1),
        (9000, 4096),
    ]);
    chunks.push((0..400).map(|i| (i * 37 % 200_000, 1 + i % 9)).collect());
    chunks.push(vec![(8, 120), (1000, 121)]);
    chunks
}

fn expected(data: &[u8], chunk: &[(usize, usize)]) -> u64 {
    let bytes: Vec<u8> = chunk
        .iter()
        .flat_map(|&(o, l)| data[o..o + l].to_vec())
        .collect();
    twox_hash::XxHash3_64::oneshot(&bytes)
}

#[test]
fn kernel_source_matches_xxh3_on_emulated_warps() {
    let dir = std::env::temp_dir().join(format!("zerohop-xxh3-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let Some(exe) = build_harness(&dir) else {
        return;
    };
    let data = pattern(300_000);
    let data_path = dir.join("data.bin");
    std::fs::write(&data_path, &data).unwrap();
    let chunks = chunk_shapes();
    let spec: String = chunks
        .iter()
        .map(|c| {
            let words: Vec<String> = c.iter().map(|(o, l)| format!("{o}:{l}")).collect();
            words.join(" ") + "\n"
        })
        .collect();
    let mut child = Command::new(&exe)
        .arg(&data_path)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(spec.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "harness failed: {:?}", out.status);
    let got: Vec<String> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    assert_eq!(got.len(), chunks.len());
    for (c, got) in chunks.iter().zip(&got) {
        assert_eq!(got, &format!("{:016x}", expected(&data, c)), "chunk {c:?}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn kernel_matches_xxh3_on_the_gpu() {
    use zerohop_cuda::{Context, DeviceAllocation, DeviceRange, KernelImage, Xxh3Kernel};
    let ctx = Context::new(0).expect("this test needs an NVIDIA GPU");
    let t = std::time::Instant::now();
    let kernel = Xxh3Kernel::load(&ctx).unwrap();
    let load_secs = t.elapsed().as_secs_f64();
    let (major, minor) = ctx.compute_capability().unwrap();
    // For PTX, the time depends on the driver's JIT cache (~/.nv): a
    // machine's first load compiles, later ones may not.
    eprintln!(
        "xxh3 kernel: {} loaded in {:.1} ms on a GPU of compute capability {major}.{minor}",
        kernel.image(),
        load_secs * 1e3
    );
    // The SASS shipped for sm_80, sm_90 and sm_100 covers these majors.
    if (8..=10).contains(&major) {
        assert_eq!(
            kernel.image(),
            KernelImage::Sass {
                sm: major as u32 * 10
            }
        );
    }
    let data = pattern(300_000);
    let dev = DeviceAllocation::new(&ctx, data.len()).unwrap();
    let stream = zerohop_cuda::Stream::new(&ctx).unwrap();
    // SAFETY: both ranges are ours and live until the synchronize below.
    unsafe {
        stream
            .copy_h2d(data.as_ptr(), dev.ptr(), data.len())
            .unwrap()
    };
    stream.synchronize().unwrap();
    let chunks = chunk_shapes();
    let ranges: Vec<Vec<DeviceRange>> = chunks
        .iter()
        .map(|c| {
            c.iter()
                .map(|&(o, l)| DeviceRange {
                    ptr: dev.ptr() + o as u64,
                    len: l as u64,
                })
                .collect()
        })
        .collect();
    // SAFETY: every range lies in `dev`, which nothing writes meanwhile.
    let got = unsafe { kernel.hash(&ranges) }.unwrap();
    for (c, got) in chunks.iter().zip(got) {
        assert_eq!(got, expected(&data, c), "chunk {c:?}");
    }
    // Throughput, for the record: 1 GiB in 4 MiB chunks.
    let big = DeviceAllocation::new(&ctx, 1 << 30).unwrap();
    big.fill(7).unwrap();
    let chunks: Vec<Vec<DeviceRange>> = (0..256u64)
        .map(|i| {
            vec![DeviceRange {
                ptr: big.ptr() + (i << 22),
                len: 1 << 22,
            }]
        })
        .collect();
    let t = std::time::Instant::now();
    // SAFETY: every range lies in `big`, which nothing writes meanwhile.
    let sums = unsafe { kernel.hash(&chunks) }.unwrap();
    let secs = t.elapsed().as_secs_f64();
    assert_eq!(sums[0], twox_hash::XxHash3_64::oneshot(&vec![7u8; 1 << 22]));
    assert!(sums.iter().all(|&s| s == sums[0]));
    eprintln!(
        "xxh3 kernel: 1 GiB in 4 MiB chunks in {:.2} ms ({:.0} GB/s)",
        secs * 1e3,
        (1u64 << 30) as f64 / secs / 1e9
    );
}

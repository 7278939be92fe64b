//! The CUDA crate: a typed error without a driver (on any machine), real
//! copies with one (ignored unless run with `--include-ignored`, as
//! scripts/gpu.sh does on the accelerator machine).

use zerohop_cuda::{Context, CudaErrorKind, DeviceAllocation, Driver, Event, PinnedBuffer, Stream};

/// Either way the driver's answer is checked: a driver found answers
/// for its version and devices, a missing one is a typed error.
#[test]
fn missing_driver_is_an_error_not_a_panic() {
    match Driver::get() {
        Ok(d) => {
            let count = d
                .device_count()
                .expect("a loaded driver counts its devices");
            eprintln!("driver present: CUDA {:?}, {count} device(s)", d.version());
            assert!(d.version().0 > 0, "{:?}", d.version());
            if count == 0 {
                assert!(Context::new(0).is_err());
            }
        }
        Err(e) => {
            assert!(
                matches!(
                    e.kind(),
                    CudaErrorKind::DriverNotFound | CudaErrorKind::NoDevice
                ),
                "{e}"
            );
            assert!(Context::new(0).is_err());
            eprintln!("no CUDA driver here: {e}");
        }
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU"]
fn pinned_round_trip_through_the_gpu() {
    let ctx = Context::new(0).expect("this test needs an NVIDIA GPU");
    let n = 32 << 20;
    let mut src = PinnedBuffer::new(&ctx, n).unwrap();
    // SAFETY: we own the pinned buffer; fill it with a pattern.
    let s = unsafe { std::slice::from_raw_parts_mut(src.as_mut_ptr(), n) };
    for (i, b) in s.iter_mut().enumerate() {
        *b = (i * 31 + 7) as u8;
    }
    let dev = DeviceAllocation::new(&ctx, n).unwrap();
    dev.fill(0xAB).unwrap();
    let stream = Stream::new(&ctx).unwrap();
    let (start, end) = (Event::timed(&ctx).unwrap(), Event::timed(&ctx).unwrap());
    start.record(&stream).unwrap();
    // SAFETY: both ranges are ours and live until the synchronize below.
    unsafe { stream.copy_h2d(src.as_ptr(), dev.ptr(), n).unwrap() };
    end.record(&stream).unwrap();
    end.synchronize().unwrap();
    let ms = end.elapsed_ms_since(&start).unwrap();
    let mut back = vec![0u8; n];
    dev.read(0, &mut back).unwrap();
    assert!(back == s, "device contents differ from the source");
    eprintln!(
        "32 MiB pinned H2D in {ms:.3} ms ({:.1} GB/s)",
        n as f64 / ms as f64 / 1e6
    );
    assert!(
        dev.read(n - 1, &mut [0u8; 2]).is_err(),
        "out-of-range read must fail"
    );
    let e = DeviceAllocation::new(&ctx, 1 << 50).unwrap_err();
    assert_eq!(*e.kind(), CudaErrorKind::OutOfMemory, "{e}");
    let e = Context::new(999).unwrap_err();
    assert_eq!(*e.kind(), CudaErrorKind::InvalidDevice, "{e}");
}

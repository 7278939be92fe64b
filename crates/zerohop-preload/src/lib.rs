//! `libzerohop_preload.so`: preloaded into a CUDA program
//! (`LD_PRELOAD=libzerohop_preload.so program`), it takes the program's
//! device allocations (`cudaMalloc`/`cudaFree` of the runtime,
//! `cuMemAlloc`/`cuMemFree` of the driver, and those two when fetched
//! through `cuGetProcAddress`) from a zerohop suspendable heap, and serves
//! `zerohop suspend PID DIR` / `zerohop resume PID DIR` for it.
//!
//! A suspend waits for the program's next quiet point: a thread of it
//! calling `cudaDeviceSynchronize`, allocating or freeing, or calling
//! `zerohop_quiet_point()`; that thread stays there, the device's work is
//! waited for, and the memory is written out and released. The resume
//! lets the thread go. A program whose other threads keep the GPU busy
//! meanwhile must not be suspended this way.
//!
//! One heap: the device of the program's first allocation. Allocations on
//! other devices, and anything when the heap cannot be made (no GPU), go
//! to the driver as if this library were not there.

mod gate;

use gate::QuietGate;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use zerohop::device::CudaDevice;
use zerohop::{Engine, EngineConfig, ErrorKind};
use zerohop_cuda::next_symbol;
use zerohop_suspend::control::{self, ControlServer, QuietPoint};
use zerohop_suspend::SuspendableHeap;

/// How long a suspend waits for the program's next quiet point.
const QUIET_WAIT: Duration = Duration::from_secs(60);

const SUCCESS: c_int = 0;
/// `cudaErrorMemoryAllocation` and `CUDA_ERROR_OUT_OF_MEMORY` alike.
const OUT_OF_MEMORY: c_int = 2;
/// `cudaErrorInvalidValue` and `CUDA_ERROR_INVALID_VALUE` alike.
const INVALID_VALUE: c_int = 1;

/// The heap and its server, for the device of the first allocation.
struct Preloaded {
    device: c_int,
    heap: Arc<SuspendableHeap>,
    _server: ControlServer,
}

static GATE: QuietGate = QuietGate::new();
static PRELOADED: OnceLock<Option<Preloaded>> = OnceLock::new();

fn preloaded(device: c_int) -> Option<&'static Preloaded> {
    PRELOADED
        .get_or_init(|| match make(device) {
            Ok(p) => Some(p),
            Err(e) => {
                eprintln!("zerohop-preload: allocations go to the driver unchanged: {e}");
                None
            }
        })
        .as_ref()
        .filter(|p| p.device == device)
}

fn make(device: c_int) -> zerohop::Result<Preloaded> {
    let ordinal =
        usize::try_from(device).map_err(|_| zerohop::Error::invalid("a negative device"))?;
    let dev = CudaDevice::open(ordinal)?;
    let context = dev.context().clone();
    // The hot-route measurement of every zerohop process on the machine:
    // else the process's first resume measures it, in two pipeline runs
    // of its own, right after its suspend wrote the files (which can
    // disturb it: see `zerohop::hot_choice`).
    let heap = Arc::new(SuspendableHeap::new(Arc::new(Engine::new(
        Arc::new(dev),
        EngineConfig::keeping_hot_choice(),
    )?)));
    let quiet = QuietPoint {
        pause: Box::new(move || {
            if !GATE.stop(QUIET_WAIT) {
                return Err(zerohop::Error::invalid(format!(
                    "the process reached no quiet point (cudaDeviceSynchronize, an allocation or zerohop_quiet_point) within {} s",
                    QUIET_WAIT.as_secs()
                )));
            }
            // A thread is parked: the device's work in flight is all that
            // can still touch the memory.
            context.synchronize().map_err(|e| {
                GATE.go();
                zerohop::Error::from(e)
            })
        }),
        unpause: Box::new(|| GATE.go()),
    };
    // Off the allocating thread: in a process with threads, each growth of
    // the descriptor table waits for an RCU grace period, which a
    // suspend's opens of its data files would otherwise pay. Best effort.
    let _ = std::thread::Builder::new()
        .name("zerohop-fds".into())
        .spawn(zerohop::storage::grow_descriptor_table);
    let path = zerohop_wire::suspend::socket_path(std::process::id());
    // SAFETY: `pause` returns once a program thread is parked at a quiet
    // point and the device is idle; the documented contract of this
    // library is that the program's other threads then leave the GPU
    // alone, until `unpause` lets the parked thread go.
    let server = unsafe { control::serve(heap.clone(), &path, quiet) }.map_err(|e| {
        zerohop::Error::with_source(
            ErrorKind::Io,
            format!("cannot serve at {}", path.display()),
            e,
        )
    })?;
    Ok(Preloaded {
        device,
        heap,
        _server: server,
    })
}

/// `size` bytes from the heap, if `current_device` (the runtime's or the
/// driver's) names the heap's device: the status to return, after handing
/// the address to `write`; `None` for the caller to forward the call. Any
/// failure is out of memory to the caller, as the driver's own would be.
fn allocate(
    size: usize,
    current_device: Option<next_symbol::GetDeviceFn>,
    write: impl FnOnce(u64),
) -> Option<c_int> {
    let get = current_device.filter(|_| size > 0)?;
    let mut device = -1;
    // SAFETY: writes one int (a device ordinal or a CUdevice, the same).
    if unsafe { get(&mut device) } != SUCCESS {
        return None;
    }
    Some(match preloaded(device)?.heap.alloc(size) {
        Ok(addr) => {
            write(addr);
            SUCCESS
        }
        Err(_) => OUT_OF_MEMORY,
    })
}

/// Frees `addr` if the heap holds it, after the device's work is done (as
/// the driver's own free does); `None` if it is not the heap's.
fn heap_free(addr: u64) -> Option<c_int> {
    let p = PRELOADED.get()?.as_ref()?;
    if !p.heap.owns(addr) {
        return None;
    }
    let synced = next_symbol::cuda_device_synchronize().map(|f| {
        // SAFETY: the runtime's own function, no arguments.
        unsafe { f() }
    });
    if synced.is_some_and(|s| s != SUCCESS) {
        return synced;
    }
    Some(match p.heap.free(addr) {
        Ok(()) => SUCCESS,
        Err(_) => INVALID_VALUE,
    })
}

thread_local! {
    /// Whether this thread's runtime context was made current.
    static RUNTIME_READY: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f` without letting a panic unwind into the C caller.
fn guarded(f: impl FnOnce() -> c_int) -> c_int {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or(OUT_OF_MEMORY)
}

/// The runtime's `cudaMalloc`.
///
/// # Safety
/// As the runtime's: `ptr` is writable.
#[no_mangle]
pub unsafe extern "C" fn cudaMalloc(ptr: *mut *mut c_void, size: usize) -> c_int {
    GATE.pass();
    guarded(|| {
        let Some(real) = next_symbol::cuda_malloc() else {
            return INVALID_VALUE;
        };
        // The runtime's own first call makes its context current on this
        // thread (libraries such as cuBLAS look for it); `cudaFree(NULL)`
        // is the runtime's way of doing only that.
        RUNTIME_READY.with(|ready| {
            if !ready.replace(true) {
                if let Some(free) = next_symbol::cuda_free() {
                    // SAFETY: freeing null frees nothing.
                    unsafe { free(std::ptr::null_mut()) };
                }
            }
        });
        let device = (!ptr.is_null())
            .then(next_symbol::cuda_get_device)
            .flatten();
        // SAFETY: the caller's out-pointer, checked non-null.
        allocate(size, device, |addr| unsafe { *ptr = addr as *mut c_void })
            // SAFETY: the caller's arguments, forwarded.
            .unwrap_or_else(|| unsafe { real(ptr, size) })
    })
}

/// The runtime's `cudaFree`.
///
/// # Safety
/// As the runtime's.
#[no_mangle]
pub unsafe extern "C" fn cudaFree(ptr: *mut c_void) -> c_int {
    GATE.pass();
    guarded(|| match heap_free(ptr as u64) {
        Some(status) => status,
        None => match next_symbol::cuda_free() {
            // SAFETY: the caller's argument, forwarded.
            Some(real) => unsafe { real(ptr) },
            None => INVALID_VALUE,
        },
    })
}

/// The runtime's `cudaDeviceSynchronize`: a quiet point once it returns.
///
/// # Safety
/// As the runtime's.
#[no_mangle]
pub unsafe extern "C" fn cudaDeviceSynchronize() -> c_int {
    let status = match next_symbol::cuda_device_synchronize() {
        // SAFETY: the runtime's own function, no arguments.
        Some(real) => unsafe { real() },
        None => INVALID_VALUE,
    };
    GATE.pass();
    status
}

/// The driver's `cuMemAlloc_v2`.
///
/// # Safety
/// As the driver's: `dptr` is writable.
#[no_mangle]
pub unsafe extern "C" fn cuMemAlloc_v2(dptr: *mut u64, size: usize) -> c_int {
    GATE.pass();
    guarded(|| {
        let Some(real) = next_symbol::cu_mem_alloc() else {
            return INVALID_VALUE;
        };
        let device = (!dptr.is_null())
            .then(next_symbol::cu_ctx_get_device)
            .flatten();
        // SAFETY: the caller's out-pointer, checked non-null.
        allocate(size, device, |addr| unsafe { *dptr = addr })
            // SAFETY: the caller's arguments, forwarded.
            .unwrap_or_else(|| unsafe { real(dptr, size) })
    })
}

/// The driver's `cuMemFree_v2`.
///
/// # Safety
/// As the driver's.
#[no_mangle]
pub unsafe extern "C" fn cuMemFree_v2(dptr: u64) -> c_int {
    GATE.pass();
    guarded(|| match heap_free(dptr) {
        Some(status) => status,
        None => match next_symbol::cu_mem_free() {
            // SAFETY: the caller's argument, forwarded.
            Some(real) => unsafe { real(dptr) },
            None => INVALID_VALUE,
        },
    })
}

/// Our entry point for `symbol` as fetched through `cuGetProcAddress`
/// (those versions of the allocation calls that take `_v2` arguments).
fn ours(symbol: *const c_char, version: c_int) -> Option<*mut c_void> {
    if symbol.is_null() || version < 3020 {
        return None;
    }
    // SAFETY: the caller's NUL-terminated symbol name.
    match unsafe { CStr::from_ptr(symbol) }.to_bytes() {
        b"cuMemAlloc" => Some(cuMemAlloc_v2 as *mut c_void),
        b"cuMemFree" => Some(cuMemFree_v2 as *mut c_void),
        _ => None,
    }
}

/// The driver's `cuGetProcAddress_v2`: its answer, with ours for the
/// allocation calls.
///
/// # Safety
/// As the driver's.
#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
    status: *mut c_int,
) -> c_int {
    let Some(real) = next_symbol::cu_get_proc_address_v2() else {
        return INVALID_VALUE;
    };
    // SAFETY: the caller's arguments, forwarded.
    let r = unsafe { real(symbol, pfn, version, flags, status) };
    if let (SUCCESS, Some(f), false) = (r, ours(symbol, version), pfn.is_null()) {
        // SAFETY: the caller's out-pointer, non-null.
        unsafe { *pfn = f };
    }
    r
}

/// The driver's `cuGetProcAddress` (before `_v2`).
///
/// # Safety
/// As the driver's.
#[no_mangle]
pub unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: c_int,
    flags: u64,
) -> c_int {
    let Some(real) = next_symbol::cu_get_proc_address() else {
        return INVALID_VALUE;
    };
    // SAFETY: the caller's arguments, forwarded.
    let r = unsafe { real(symbol, pfn, version, flags) };
    if let (SUCCESS, Some(f), false) = (r, ours(symbol, version), pfn.is_null()) {
        // SAFETY: the caller's out-pointer, non-null.
        unsafe { *pfn = f };
    }
    r
}

/// A quiet point a program may call between its steps, so a suspend need
/// not wait for its next synchronize or allocation.
#[no_mangle]
pub extern "C" fn zerohop_quiet_point() {
    GATE.pass();
}

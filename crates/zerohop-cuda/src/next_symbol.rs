//! The CUDA runtime's and driver's own entry points as the dynamic linker
//! finds them after the library that asks (`dlsym(RTLD_NEXT, ...)`): what
//! `zerohop-preload`, whose exports of the same names stand in front of
//! them, forwards to. Each is looked up once; `None` where the process has
//! not loaded it (no runtime library, say).

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::OnceLock;

/// `cudaError_t cudaMalloc(void**, size_t)`
pub type MallocFn = unsafe extern "C" fn(*mut *mut c_void, usize) -> c_int;
/// `cudaError_t cudaFree(void*)`
pub type FreeFn = unsafe extern "C" fn(*mut c_void) -> c_int;
/// `cudaGetDevice(int*)` and `cuCtxGetDevice(CUdevice*)`
pub type GetDeviceFn = unsafe extern "C" fn(*mut c_int) -> c_int;
/// `cudaError_t cudaDeviceSynchronize(void)`
pub type SynchronizeFn = unsafe extern "C" fn() -> c_int;
/// `CUresult cuMemAlloc_v2(CUdeviceptr*, size_t)`
pub type CuAllocFn = unsafe extern "C" fn(*mut u64, usize) -> c_int;
/// `CUresult cuMemFree_v2(CUdeviceptr)`
pub type CuFreeFn = unsafe extern "C" fn(u64) -> c_int;
/// `CUresult cuGetProcAddress_v2(const char*, void**, int, cuuint64_t, CUdriverProcAddressQueryResult*)`
pub type ProcAddressV2Fn =
    unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64, *mut c_int) -> c_int;
/// `CUresult cuGetProcAddress(const char*, void**, int, cuuint64_t)`
pub type ProcAddressFn = unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64) -> c_int;

/// The next definition of `name`, as a function of type `F`.
///
/// # Safety
/// `F` must be the function pointer type the CUDA headers declare for
/// `name`.
unsafe fn lookup<F: Copy>(name: &CStr) -> Option<F> {
    assert_eq!(size_of::<F>(), size_of::<*mut c_void>());
    // SAFETY: looks a symbol up; `name` is NUL-terminated.
    let f = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) };
    // SAFETY: the caller names F for `name`; both are pointer-sized.
    (!f.is_null()).then(|| unsafe { std::mem::transmute_copy::<*mut c_void, F>(&f) })
}

macro_rules! next_fns {
    ($($(#[$doc:meta])* $fn_name:ident: $symbol:literal => $ty:ty;)*) => {$(
        $(#[$doc])*
        pub fn $fn_name() -> Option<$ty> {
            static F: OnceLock<Option<$ty>> = OnceLock::new();
            // SAFETY: the type is the one the headers declare for the symbol.
            *F.get_or_init(|| unsafe { lookup::<$ty>($symbol) })
        }
    )*};
}

next_fns! {
    /// The runtime's `cudaMalloc`.
    cuda_malloc: c"cudaMalloc" => MallocFn;
    /// The runtime's `cudaFree`.
    cuda_free: c"cudaFree" => FreeFn;
    /// The runtime's `cudaGetDevice`.
    cuda_get_device: c"cudaGetDevice" => GetDeviceFn;
    /// The runtime's `cudaDeviceSynchronize`.
    cuda_device_synchronize: c"cudaDeviceSynchronize" => SynchronizeFn;
    /// The driver's `cuMemAlloc_v2`.
    cu_mem_alloc: c"cuMemAlloc_v2" => CuAllocFn;
    /// The driver's `cuMemFree_v2`.
    cu_mem_free: c"cuMemFree_v2" => CuFreeFn;
    /// The driver's `cuCtxGetDevice`.
    cu_ctx_get_device: c"cuCtxGetDevice" => GetDeviceFn;
    /// The driver's `cuGetProcAddress_v2`.
    cu_get_proc_address_v2: c"cuGetProcAddress_v2" => ProcAddressV2Fn;
    /// The driver's `cuGetProcAddress`.
    cu_get_proc_address: c"cuGetProcAddress" => ProcAddressFn;
}

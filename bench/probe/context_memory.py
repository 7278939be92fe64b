"""How much device memory a CUDA context holds beyond any allocation, and
how much of it the context's limits (per-thread stack, printf FIFO, malloc
heap) account for: what the driver's process checkpoint stages in host RAM
after zerohop has suspended every allocation (issue 14).

Prints the device memory in use (cuMemGetInfo) after each step: a bare
context, then PyTorch's after some kernels ran (allocator cache emptied),
then after each limit is set to 0 (the driver keeps what loaded kernels
need), after the kernels ran again, and after the limits are put back.
Needs a GPU (the accelerator machine: `bash scripts/gpu.sh device
context-memory`).
"""
import ctypes
import subprocess
import sys

LIMITS = {"stack": 0x00, "printf_fifo": 0x01, "malloc_heap": 0x02}
# The rest of CUlimit, tried on a bare context only.
OTHER_LIMITS = {"dev_runtime_sync_depth": 0x03, "dev_runtime_pending_launch_count": 0x04,
                "max_l2_fetch_granularity": 0x05, "persisting_l2_cache_size": 0x06}


def driver():
    cuda = ctypes.CDLL("libcuda.so.1")
    cuda.cuCtxSetLimit.argtypes = [ctypes.c_int, ctypes.c_size_t]
    return cuda


def limits(cuda, which: dict = LIMITS) -> dict:
    out = {}
    for name, code in which.items():
        v = ctypes.c_size_t()
        rc = cuda.cuCtxGetLimit(ctypes.byref(v), code)
        out[name] = v.value if rc == 0 else f"error {rc}"
    return out


def used_mib(cuda) -> float:
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    assert cuda.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)) == 0
    return (total.value - free.value) / 2**20


def bare() -> None:
    cuda = driver()
    assert cuda.cuInit(0) == 0
    dev, ctx = ctypes.c_int(), ctypes.c_void_p()
    assert cuda.cuDeviceGet(ctypes.byref(dev), 0) == 0
    assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev) == 0
    assert cuda.cuCtxSetCurrent(ctx) == 0
    print(f"bare context: device memory in use {used_mib(cuda):.0f} MiB, limits {limits(cuda)}", flush=True)
    print(f"bare context: other limits {limits(cuda, OTHER_LIMITS)}", flush=True)
    for name, code in {**LIMITS, **OTHER_LIMITS}.items():
        rc = cuda.cuCtxSetLimit(code, 0)
        print(f"bare context: {name} set to 0 (rc {rc}): in use {used_mib(cuda):.0f} MiB", flush=True)


def torch_process() -> None:
    import torch
    cuda = driver()

    def work():
        x = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
        y = torch.nn.functional.softmax((x @ x).float(), dim=-1)
        z = torch.nn.functional.layer_norm(y, (4096,))
        torch.cuda.synchronize()
        del x, y, z
        torch.cuda.empty_cache()

    work()
    base = used_mib(cuda)
    print(f"torch: in use {base:.0f} MiB after kernels ran (allocator cache emptied), limits {limits(cuda)}", flush=True)
    before = limits(cuda)
    for name, code in LIMITS.items():
        rc = cuda.cuCtxSetLimit(code, 0)
        cuda.cuCtxSynchronize()
        print(f"torch: {name} set to 0 (rc {rc}): in use {used_mib(cuda):.0f} MiB, limits {limits(cuda)}", flush=True)
    work()
    print(f"torch: kernels ran again: in use {used_mib(cuda):.0f} MiB, limits {limits(cuda)}", flush=True)
    stack_kernel(cuda)
    for name, code in LIMITS.items():
        if isinstance(before[name], int):
            rc = cuda.cuCtxSetLimit(code, before[name])
            print(f"torch: {name} put back to {before[name]} (rc {rc}): in use {used_mib(cuda):.0f} MiB", flush=True)
    work()
    print(f"torch: kernels ran after the limits were put back: in use {used_mib(cuda):.0f} MiB", flush=True)


def stack_kernel(cuda) -> None:
    """A kernel compiled to need 16 KiB of stack per thread, launched with
    the stack limit at 0 over every thread the device holds: does the
    driver give it its stack, and are its results right?"""
    import cupy
    k = cupy.RawKernel(r"""
extern "C" __global__ void deep(const int* idx, int* out) {
    volatile int local[4096];
    for (int i = 0; i < 4096; i++) local[i] = i * idx[0];
    int t = threadIdx.x + blockIdx.x * blockDim.x;
    out[t] = local[(t * 7 + idx[1]) & 4095];
}""", "deep")
    n = cupy.cuda.Device().attributes["MultiProcessorCount"] * 2048
    idx = cupy.array([3, 5], dtype=cupy.int32)
    out = cupy.zeros(n, dtype=cupy.int32)
    k((n // 256,), (256,), (idx, out))
    cupy.cuda.Device().synchronize()
    t = cupy.arange(n, dtype=cupy.int64)
    right = bool((out == ((t * 7 + 5) & 4095) * 3).all())
    print(f"stack kernel: {k.attributes['local_size_bytes']} bytes of stack per thread, {n} threads, "
          f"results right: {right}; in use {used_mib(cuda):.0f} MiB, limits {limits(cuda)}", flush=True)


if __name__ == "__main__":
    if len(sys.argv) > 1:
        {"bare": bare, "torch": torch_process}[sys.argv[1]]()
    else:
        # Each in a fresh process: a context's memory is the process's.
        for what in ("bare", "torch"):
            subprocess.run([sys.executable, __file__, what], check=True)

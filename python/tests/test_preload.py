"""libzerohop_preload.so (ZEROHOP_PRELOAD names it): preloaded into a
program that knows nothing of zerohop, its cudaMalloc'd memory is
suspended from outside (`zerohop suspend PID DIR`) at the program's next
synchronize, and resumed with the same bytes at the same addresses."""

import os
import subprocess
import sys
import time

import workers
import pytest

PRELOAD = os.environ.get("ZEROHOP_PRELOAD")
BIN = os.environ.get("ZEROHOP_BIN")

needs_library = pytest.mark.skipif(not PRELOAD or not BIN, reason="ZEROHOP_PRELOAD or ZEROHOP_BIN is not set")


@needs_library
def test_the_library_loads_into_any_process_and_fails_cleanly_without_cuda():
    # Its calls, made directly, in a process that has not loaded the CUDA
    # runtime: an allocation is refused with an error status
    # (cudaErrorInvalidValue), never a crash; a quiet point just returns.
    code = (
        "import ctypes, sys\n"
        "lib = ctypes.CDLL(sys.argv[1])\n"
        "lib.zerohop_quiet_point()\n"
        "p = ctypes.c_void_p()\n"
        "print(lib.cudaMalloc(ctypes.byref(p), 1 << 20), lib.cudaFree(p))\n"
    )
    done = subprocess.run([sys.executable, "-c", code, PRELOAD], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "LD_PRELOAD": PRELOAD})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1", "1"], done.stdout


def gpu_present():
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


@needs_library
@pytest.mark.skipif(not gpu_present(), reason="no CUDA GPU (or no torch)")
def test_a_program_unaware_of_zerohop_is_suspended_at_its_next_synchronize(tmp_path):
    import torch

    p, ask = workers.start("preload", env={**os.environ, "LD_PRELOAD": PRELOAD})
    try:
        free_before = torch.cuda.mem_get_info()[0]
        done = subprocess.run([BIN, "suspend", str(p.pid), str(tmp_path / "s")], capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, done.stderr
        freed = torch.cuda.mem_get_info()[0] - free_before
        assert freed >= 1 << 30, (freed, done.stdout)  # the 1 GiB tensor at least
        stepped = int(ask("steps"))
        time.sleep(0.3)
        assert int(ask("steps")) == stepped, "the program is parked while suspended"
        back = subprocess.run([BIN, "resume", str(p.pid), str(tmp_path / "s")], capture_output=True, text=True,
                              timeout=300)
        assert back.returncode == 0, back.stderr
        time.sleep(0.3)
        assert int(ask("steps")) > stepped and ask("check") == "intact"
    finally:
        workers.stop(p)

"""Where one thread's time goes inside a native call, without strace or
perf (the GPU machine has neither): a background thread reads the
thread's /proc state (the system call it is in, or `running`; its wait
channel; the top of its kernel stack where readable) every ~0.1 ms while
the call runs, and `spans` merges equal samples into a timeline. A native
call that releases the GIL leaves the sampler free to run."""

from __future__ import annotations

import os
import threading
import time

# x86_64 system call numbers met in a transfer's setup.
SYSCALLS = {0: "read", 1: "write", 3: "close", 7: "poll", 9: "mmap", 10: "mprotect", 11: "munmap", 12: "brk",
            16: "ioctl", 17: "pread64", 18: "pwrite64", 24: "sched_yield", 28: "madvise", 56: "clone",
            74: "fsync", 77: "ftruncate", 82: "rename", 83: "mkdir", 84: "rmdir", 87: "unlink", 202: "futex",
            217: "getdents64", 230: "clock_nanosleep", 232: "epoll_wait", 257: "openat", 262: "newfstatat",
            281: "epoll_pwait", 285: "fallocate", 318: "getrandom", 332: "statx", 435: "clone3"}


def _read(path: str) -> str:
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            return os.read(fd, 4096).decode(errors="replace")
        finally:
            os.close(fd)
    except OSError:
        return ""


def _state(base: str) -> str:
    call = _read(base + "syscall").split()
    if not call:
        return "?"
    if call[0] == "running":
        return "running"
    if call[0] == "-1":
        return "in the kernel (no system call)"
    name = SYSCALLS.get(int(call[0]), f"syscall {call[0]}")
    wchan = _read(base + "wchan").strip()
    frames = [line.split()[-1] for line in _read(base + "stack").splitlines() if line.strip()]
    where = " < ".join(f for f in frames[:3]) if frames else wchan
    return f"{name} ({where})" if where and where != "0" else name


class Sampler:
    """Samples thread `tid` (default: the calling thread) between
    `start()` and `stop()`."""

    def __init__(self, tid: int | None = None, every: float = 1e-4) -> None:
        self.base = f"/proc/self/task/{tid or threading.get_native_id()}/"
        self.every = every
        self.samples: list = []
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._done.is_set():
            self.samples.append((time.perf_counter(), _state(self.base)))
            time.sleep(self.every)

    def start(self) -> "Sampler":
        self.t0 = time.perf_counter()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._done.set()
        self._thread.join()

    def spans(self, least_ms: float = 0.5) -> list:
        """(start ms, end ms, state) of runs of equal samples lasting at
        least `least_ms`, from `start()`."""
        out, begin, state = [], None, None
        for t, s in self.samples + [(time.perf_counter(), None)]:
            if s != state:
                if state is not None and (t - begin) * 1e3 >= least_ms:
                    out.append(((begin - self.t0) * 1e3, (t - self.t0) * 1e3, state))
                begin, state = t, s
        return out

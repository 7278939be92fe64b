"""Where one thread's time goes inside a native call, without strace or
perf (the GPU machine has neither): a background thread reads the
thread's /proc state (the system call it is in, or `running`; its wait
channel; the top of its kernel stack where readable; its page faults and
CPU time, and every other thread's CPU time) every ~0.1 ms while
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
        self.tid = tid or threading.get_native_id()
        self.base = f"/proc/self/task/{self.tid}/"
        self.every = every
        self.samples: list = []
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        skip = {self.tid, threading.get_native_id()}
        while not self._done.is_set():
            self.samples.append((time.perf_counter(), _state(self.base), _counters(self.base), _others(skip)))
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
        least `least_ms`, from `start()`; the state ends with the run's
        time on a CPU, split into user and system time (in clock ticks, so
        coarse), and its page faults."""
        out, begin, state, before, others = [], None, None, None, {}
        end = (time.perf_counter(), None, _counters(self.base), _others({self.tid, threading.get_native_id()}))
        for t, s, c, o in self.samples + [end]:
            if s != state:
                if state is not None and (t - begin) * 1e3 >= least_ms:
                    faults, user, system, on_cpu = (c[k] - before[k] for k in range(4))
                    out.append(((begin - self.t0) * 1e3, (t - self.t0) * 1e3,
                                f"{state}; on a CPU {on_cpu:.1f} ms (user {user:.0f}, system {system:.0f}),"
                                f" {faults} page faults; {_busiest(others, o)}"))
                begin, state, before, others = t, s, c, o
        return out


_TICK_MS = 1e3 / os.sysconf("SC_CLK_TCK")


def _counters(base: str) -> tuple:
    """The thread's minor page faults, user and system CPU ms, and ms on
    a CPU (schedstat, in ns) so far."""
    fields = _read(base + "stat").rsplit(")", 1)[-1].split()
    sched = _read(base + "schedstat").split()
    on_cpu = int(sched[0]) / 1e6 if sched else 0.0
    if len(fields) < 13:
        return (0, 0.0, 0.0, on_cpu)
    # After the command: state is field 3, minflt 10, utime 14, stime 15.
    return (int(fields[7]), int(fields[11]) * _TICK_MS, int(fields[12]) * _TICK_MS, on_cpu)


def _others(skip: set) -> dict:
    """The process's threads but `skip`: tid -> (name, ns on a CPU)."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        if int(tid) in skip:
            continue
        sched = _read(f"/proc/self/task/{tid}/schedstat").split()
        if sched:
            out[tid] = (_read(f"/proc/self/task/{tid}/comm").strip(), int(sched[0]))
    return out


def _busiest(before: dict, after: dict, top: int = 3) -> str:
    """The other threads' CPU ms between two samples, busiest first, by name."""
    by_name: dict = {}
    for tid, (name, ns) in after.items():
        spent = (ns - before.get(tid, (name, ns))[1]) / 1e6
        if spent >= 0.1:
            ms, count = by_name.get(name, (0.0, 0))
            by_name[name] = (ms + spent, count + 1)
    busy = sorted(((ms, count, name) for name, (ms, count) in by_name.items()), reverse=True)[:top]
    return "others: " + (", ".join(f"{name} x{count} {ms:.1f} ms" for ms, count, name in busy) or "idle")

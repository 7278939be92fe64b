"""A process that serves suspend requests for its heap of host memory (the
test drives it with `zerohop suspend/resume PID DIR`), with MiB more of it
than the small allocations (argv[1], default 0): it prints "ready PID",
then answers lines on stdin: "check" (are the bytes intact?),
"state" (bytes of memory behind the heap, and where it is suspended to),
"work" (takes the lock, as a process's step would).
"""

import ctypes
import sys
import threading

import zerohop
from zerohop import _native

lock = threading.Lock()
allocations = []
extra = int(sys.argv[1]) << 20 if len(sys.argv) > 1 else 0
for i, n in enumerate([(1 << 20) + 3, 3 << 20] + ([extra] if extra else [])):
    addr = _native.heap_alloc("cpu", n)
    period = bytes((j * 13 + i) % 251 for j in range(251))  # the pattern repeats every 251 bytes
    data = (period * (n // 251 + 1))[:n]
    ctypes.memmove(addr, data, n)
    allocations.append((addr, data))
server = zerohop.serve_suspend(device="cpu", lock=lock)
print("ready", server.path, flush=True)
for line in sys.stdin:
    command = line.strip()
    if command == "check":
        with lock:
            ok = all(ctypes.string_at(a, len(d)) == d for a, d in allocations)
        print("intact" if ok else "damaged", flush=True)
    elif command == "state":
        _, backed, suspended_to = _native.heap_state("cpu")
        print(backed, suspended_to, flush=True)
    elif command == "work":
        got = lock.acquire(timeout=0.5)
        if got:
            lock.release()
        print("worked" if got else "paused", flush=True)
server.close()

"""A PyTorch process on a GPU whose tensors live in zerohop's suspendable
heap and which serves suspend requests (test_suspend_gpu.py drives it with
`zerohop suspend/resume/checkpoint-process/restore-process PID DIR`).

Its workload: a transformer layer run eagerly and captured in a CUDA graph,
plus MiB of filler tensors (argv[1]). It prints "ready PID", then answers
lines on stdin: "check" (do the eager pass, the graph's replay and the
filler give exactly what they gave before?), "work" (takes the lock, as a
step of the process would), "mib" (MiB of device memory behind its heap).
"""

import sys
import threading

import gpu_workload

import zerohop
from zerohop import _native

lock = threading.Lock()
check, pool = gpu_workload.build(zerohop.suspendable(), int(sys.argv[1]))

server = zerohop.serve_suspend(lock=lock)
print("ready", server.path, flush=True)
for line in sys.stdin:
    command = line.strip()
    if command == "check":
        with lock:
            bad = check()
        print("intact" if not bad else "changed: " + ",".join(bad), flush=True)
    elif command == "work":
        got = lock.acquire(timeout=0.5)
        if got:
            lock.release()
        print("worked" if got else "paused", flush=True)
    elif command == "mib":
        _, backed, _ = _native.heap_state("cuda:0")
        print(backed >> 20, flush=True)
server.close()
del pool

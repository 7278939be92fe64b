"""A process CRIU can freeze and thaw whole: nothing ties it to the test
(stdin is /dev/null, its output goes to a file, it leads its own session),
and it takes requests as files in a spool directory (test_freeze.py drives it).

    spool_worker.py SPOOL MODE MIB

MODE "cpu": MIB MiB of random host memory. MODE "zerohop": a transformer
layer, a CUDA graph captured over it and MIB MiB of filler tensors in
zerohop's suspendable heap, served to `zerohop suspend` (what a freeze
uses). MODE "driver": the same in PyTorch's own memory, serving nothing
(the driver then checkpoints all of it). Requests: "check" (is every value
what it was at the start? "intact" or what changed), "pid", "stop".
"""

import hashlib
import os
import sys
import threading
import time

spool, mode, mib = sys.argv[1], sys.argv[2], int(sys.argv[3])
lock = threading.Lock()

if mode == "cpu":
    state = bytearray(os.urandom(mib << 20))
    want = hashlib.sha256(state).hexdigest()

    def check():
        return [] if hashlib.sha256(state).hexdigest() == want else ["memory"]
else:
    import contextlib

    import gpu_workload

    import zerohop

    where = zerohop.suspendable() if mode == "zerohop" else contextlib.nullcontext()
    check, pool = gpu_workload.build(where, mib)
    server = zerohop.serve_suspend(lock=lock) if mode == "zerohop" else None


def answer(name, text):
    tmp = os.path.join(spool, name + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
    os.rename(tmp, os.path.join(spool, name + ".ans"))


answer("ready", str(os.getpid()))
while True:
    requests = sorted(n for n in os.listdir(spool) if n.endswith(".req"))
    for name in requests:
        path = os.path.join(spool, name)
        with open(path) as f:
            command = f.read().strip()
        os.unlink(path)
        with lock:
            if command == "check":
                bad = check()
                answer(name[:-4], "intact" if not bad else "changed: " + ",".join(bad))
            elif command == "pid":
                answer(name[:-4], str(os.getpid()))
            elif command == "stop":
                answer(name[:-4], "stopping")
                sys.exit(0)
            else:
                answer(name[:-4], f"unknown request {command!r}")
    time.sleep(0.005)
